"""envd's wire messages as msgspec Structs, with Connect's JSON codec (proto3 JSON mapping).

The shapes follow ``spec/envd/process/process.proto``, ``spec/envd/filesystem/filesystem.proto``
and the REST API's ``spec/openapi.yml`` of e2b-dev/E2B. proto3 JSON rules that matter here:

* field names are lowerCamelCase (``exit_code`` -> ``exitCode``); unknown fields are ignored;
* zero values are omitted (``exitCode`` 0 is absent, ``{"start": {}}`` means pid 0), so every
  scalar has its zero as default and ``omit_defaults=True`` reproduces the omission;
* ``bytes`` are base64 (msgspec's JSON codec does that for ``bytes`` fields);
* ``int64``/``uint64`` are JSON *strings* (parsers accept numbers too): such fields are typed
  ``int | str``; build them with :func:`i64` and read them with :func:`as_int`;
* a ``oneof`` is a set of optional fields of which at most one is present;
* enums are their names (``"SIGNAL_SIGKILL"``).

Nothing here does I/O; the server in :mod:`trio_swe.testing` uses the same Structs.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec

T = TypeVar("T")


class _Msg(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Base of every envd message: camelCase names, zero values omitted."""


def i64(value: int) -> str:
    """Return ``value`` as proto3 JSON writes an ``int64``: a decimal string."""
    return str(int(value))


def as_int(value: int | str) -> int:
    """Read an ``int64`` field that the peer wrote as a string or as a number."""
    return int(value)


# --- process.Process -------------------------------------------------------------------------

SIGNAL_SIGKILL: Final = "SIGNAL_SIGKILL"
SIGNAL_SIGTERM: Final = "SIGNAL_SIGTERM"


class PTYSize(_Msg):
    cols: int = 0
    rows: int = 0


class PTY(_Msg):
    size: PTYSize | None = None


class ProcessConfig(_Msg):
    """``process.ProcessConfig``: what to run (envd runs ``cmd`` with ``args``, no shell)."""

    cmd: str = ""
    args: list[str] = msgspec.field(default_factory=list)
    envs: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None


class ProcessSelector(_Msg):
    """``process.ProcessSelector``: oneof ``pid`` | ``tag``."""

    pid: int | None = None
    tag: str | None = None


class StartRequest(_Msg):
    """``process.StartRequest``. ``stdin`` defaults to true on envd when absent: send it."""

    process: ProcessConfig | None = None
    pty: PTY | None = None
    tag: str | None = None
    stdin: bool | None = None


class ConnectRequest(_Msg):
    """``process.ConnectRequest``: re-attach to a running (or recently ended) process."""

    process: ProcessSelector | None = None


class StartEvent(_Msg):
    pid: int = 0


class DataEvent(_Msg):
    """oneof ``output``: ``stdout`` | ``stderr`` | ``pty`` (raw bytes, base64 on the wire)."""

    stdout: bytes | None = None
    stderr: bytes | None = None
    pty: bytes | None = None


class EndEvent(_Msg):
    exit_code: int = 0
    exited: bool = False
    status: str = ""
    error: str | None = None


class KeepAlive(_Msg):
    pass


class ProcessEvent(_Msg):
    """oneof ``event``: ``start`` | ``data`` | ``end`` | ``keepalive``."""

    start: StartEvent | None = None
    data: DataEvent | None = None
    end: EndEvent | None = None
    keepalive: KeepAlive | None = None


class StartResponse(_Msg):
    event: ProcessEvent | None = None


class ConnectResponse(_Msg):
    event: ProcessEvent | None = None


class SendSignalRequest(_Msg):
    process: ProcessSelector | None = None
    signal: str = "SIGNAL_UNSPECIFIED"


class SendSignalResponse(_Msg):
    pass


class ProcessInput(_Msg):
    stdin: bytes | None = None
    pty: bytes | None = None


class SendInputRequest(_Msg):
    process: ProcessSelector | None = None
    input: ProcessInput | None = None


class SendInputResponse(_Msg):
    pass


class CloseStdinRequest(_Msg):
    process: ProcessSelector | None = None


class CloseStdinResponse(_Msg):
    pass


class ListRequest(_Msg):
    pass


class ProcessInfo(_Msg):
    config: ProcessConfig | None = None
    pid: int = 0
    tag: str | None = None


class ListResponse(_Msg):
    processes: list[ProcessInfo] = msgspec.field(default_factory=list)


# --- filesystem.Filesystem (the subset trio_swe uses) ----------------------------------------

FILE_TYPE_FILE: Final = "FILE_TYPE_FILE"
FILE_TYPE_DIRECTORY: Final = "FILE_TYPE_DIRECTORY"


class EntryInfo(_Msg):
    name: str = ""
    type: str = "FILE_TYPE_UNSPECIFIED"
    path: str = ""
    size: int | str = 0  # int64: a string on the wire
    mode: int = 0
    permissions: str = ""
    owner: str = ""
    group: str = ""
    modified_time: str | None = None  # google.protobuf.Timestamp, RFC 3339
    symlink_target: str | None = None


class StatRequest(_Msg):
    path: str = ""


class StatResponse(_Msg):
    entry: EntryInfo | None = None


class MakeDirRequest(_Msg):
    path: str = ""


class MakeDirResponse(_Msg):
    entry: EntryInfo | None = None


class RemoveRequest(_Msg):
    path: str = ""


class RemoveResponse(_Msg):
    pass


class ListDirRequest(_Msg):
    path: str = ""
    depth: int = 0


class ListDirResponse(_Msg):
    entries: list[EntryInfo] = msgspec.field(default_factory=list)


# --- envd HTTP API (/files, /health) ---------------------------------------------------------


class WrittenFile(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One element of ``POST /files``' JSON answer."""

    path: str
    name: str = ""
    type: str = "file"


class HTTPError(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Error body of envd's HTTP API and of the REST API: ``{"code", "message"}``."""

    code: int = 0
    message: str = ""


# --- REST API (spec/openapi.yml), only the lifecycle subset ----------------------------------


class NewSandbox(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Body of ``POST /v2/sandboxes`` (``NewSandboxV2``)."""

    template_id: str = msgspec.field(name="templateID")
    timeout: int | None = None
    auto_pause: bool = msgspec.field(default=False, name="autoPause")
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = msgspec.field(default=None, name="envVars")
    allow_internet_access: bool | None = None


class SandboxInfo(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Answer of ``POST /v2/sandboxes`` (201) and ``POST /sandboxes/{id}/connect`` (200/201)."""

    template_id: str = msgspec.field(name="templateID")
    sandbox_id: str = msgspec.field(name="sandboxID")
    client_id: str = msgspec.field(default="", name="clientID")
    envd_version: str = msgspec.field(default="", name="envdVersion")
    envd_access_token: str | None = msgspec.field(default=None, name="envdAccessToken")
    traffic_access_token: str | None = msgspec.field(default=None, name="trafficAccessToken")
    domain: str | None = None


class ListedSandbox(msgspec.Struct, kw_only=True):
    """One entry of ``GET /v2/sandboxes`` (``ListedSandbox``), the fields used here."""

    sandbox_id: str = msgspec.field(name="sandboxID")
    template_id: str = msgspec.field(default="", name="templateID")
    state: str = "running"
    metadata: dict[str, str] | None = None


class TimeoutRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /sandboxes/{id}/timeout`` and ``POST /sandboxes/{id}/connect``."""

    timeout: int


# --- codec -----------------------------------------------------------------------------------

_encoder: Final = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def encode(message: msgspec.Struct) -> bytes:
    """Encode a message with Connect's JSON codec."""
    return _encoder.encode(message)


def decode(data: bytes | bytearray | memoryview, type_: type[T]) -> T:
    """Decode a Connect JSON message into ``type_``.

    Lenient like protojson: unknown fields are ignored, and numbers written as strings
    (int64, or peers that quote every integer) are accepted.

    Raises:
        msgspec.DecodeError: the payload is not valid JSON for ``type_``.
    """
    dec = _decoders.get(type_)
    if dec is None:
        dec = _decoders[type_] = msgspec.json.Decoder(type_, strict=False)
    try:
        result: T = dec.decode(data)
    except RecursionError:  # nested past the interpreter's limit (an unknown field's too)
        raise msgspec.DecodeError("JSON nested too deeply to decode") from None
    return result
