"""envd messages and Connect's JSON codec (proto3 JSON mapping). No I/O."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_swe.sandbox.e2b import _wire as w


def test_start_request_matches_the_sdk_wire_form() -> None:
    req = w.StartRequest(
        process=w.ProcessConfig(
            cmd="/bin/bash", args=["-l", "-c", "echo hi"], envs={"A": "1"}, cwd="/testbed"
        ),
        stdin=False,
        tag="t1",
    )
    assert msgspec.json.decode(w.encode(req)) == {
        "process": {
            "cmd": "/bin/bash",
            "args": ["-l", "-c", "echo hi"],
            "envs": {"A": "1"},
            "cwd": "/testbed",
        },
        "tag": "t1",
        "stdin": False,
    }


def test_zero_values_are_omitted_and_absent_fields_default() -> None:
    ev = w.ProcessEvent(end=w.EndEvent(exited=True, status="exit status 0"))
    assert w.encode(w.StartResponse(event=ev)) == (
        b'{"event":{"end":{"exited":true,"status":"exit status 0"}}}'
    )
    got = w.decode(b'{"event":{"end":{"exited":true,"status":"exit status 0"}}}', w.StartResponse)
    assert got.event is not None
    assert got.event.end is not None
    assert got.event.end.exit_code == 0
    assert w.decode(b'{"event":{"start":{}}}', w.StartResponse).event == w.ProcessEvent(
        start=w.StartEvent(pid=0)
    )
    assert w.encode(w.ProcessEvent(keepalive=w.KeepAlive())) == b'{"keepalive":{}}'


def test_camel_case_bytes_base64_and_unknown_fields() -> None:
    raw = b'{"event":{"data":{"stdout":"aGk="},"future":1},"x":[1]}'
    got = w.decode(raw, w.ConnectResponse)
    assert got.event is not None
    assert got.event.data == w.DataEvent(stdout=b"hi")
    end = w.decode(b'{"exitCode":-9,"status":"signal: killed","error":"x"}', w.EndEvent)
    assert (end.exit_code, end.exited, end.error) == (-9, False, "x")
    assert b'"exitCode":3' in w.encode(w.EndEvent(exit_code=3))


def test_selector_oneof_and_signal_enum_by_name() -> None:
    req = w.SendSignalRequest(process=w.ProcessSelector(pid=0), signal=w.SIGNAL_SIGKILL)
    assert msgspec.json.decode(w.encode(req)) == {
        "process": {"pid": 0},
        "signal": "SIGNAL_SIGKILL",
    }
    assert w.encode(w.ConnectRequest(process=w.ProcessSelector(tag="a"))) == (
        b'{"process":{"tag":"a"}}'
    )


def test_int64_is_a_string_and_numbers_are_accepted() -> None:
    entry = w.EntryInfo(name="f", size=w.i64(2**40), modified_time="2026-01-01T00:00:00Z")
    data = w.encode(entry)
    assert b'"size":"1099511627776"' in data
    assert b'"modifiedTime"' in data
    assert w.as_int(w.decode(data, w.EntryInfo).size) == 2**40
    assert w.as_int(w.decode(b'{"size":12}', w.EntryInfo).size) == 12
    # Peers that quote 32-bit integers are accepted too (protojson does).
    assert w.decode(b'{"pid":"42"}', w.StartEvent).pid == 42


def test_rest_models_use_the_openapi_names() -> None:
    body = w.NewSandbox(template_id="base", timeout=300, metadata={"k": "v"}, env_vars={"E": "1"})
    assert msgspec.json.decode(w.encode(body)) == {
        "templateID": "base",
        "timeout": 300,
        "metadata": {"k": "v"},
        "envVars": {"E": "1"},
    }
    info = w.decode(
        b'{"templateID":"base","sandboxID":"sb1","clientID":"c","envdVersion":"0.6.13",'
        b'"envdAccessToken":"tok","domain":null}',
        w.SandboxInfo,
    )
    assert (info.sandbox_id, info.envd_access_token, info.domain) == ("sb1", "tok", None)


def test_bad_payload_raises_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        w.decode(b'{"event":{"start":{"pid":"x"}}}', w.StartResponse)
    # Nested past the interpreter's limit, in a field we do not know (skipped) or one we do:
    # msgspec raised RecursionError, which no caller of decode() handles.
    deep = b"[" * 100_000
    for body in (b'{"unknownField": ' + deep, b'{"event": {"data": ' + deep):
        with pytest.raises(msgspec.DecodeError):
            w.decode(body, w.StartResponse)


@given(
    out=st.binary(max_size=200),
    code=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    pid=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_events_roundtrip(out: bytes, code: int, pid: int) -> None:
    for ev in (
        w.ProcessEvent(start=w.StartEvent(pid=pid)),
        w.ProcessEvent(data=w.DataEvent(stderr=out)),
        w.ProcessEvent(end=w.EndEvent(exit_code=code, exited=True, status=f"exit status {code}")),
    ):
        assert w.decode(w.encode(w.StartResponse(event=ev)), w.StartResponse).event == ev
