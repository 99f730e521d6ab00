"""envd's ``filesystem.Filesystem`` unary RPCs (Stat, ListDir, MakeDir, Remove, Move).

Each call runs a short Python program inside the sandbox as the requesting user (so
permissions are the user's, as in envd), which prints the answer as proto3 JSON. The sandbox
needs ``/usr/bin/python3`` or ``python3`` on its PATH (the local backend sees the host's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Final

import trio

from ._processes import ProcessHost

_SCRIPT: Final = r"""
import datetime, grp, json, os, pwd, shutil, stat, sys

def name_of(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)

def entry(path):
    st = os.lstat(path)
    link = stat.S_ISLNK(st.st_mode)
    out = {}
    if link:
        out["symlinkTarget"] = os.path.realpath(path)
        out["isSymlink"] = True
        try:
            st = os.stat(path)
        except OSError:
            pass
    if stat.S_ISDIR(st.st_mode):
        kind = "FILE_TYPE_DIRECTORY"
    elif stat.S_ISREG(st.st_mode):
        kind = "FILE_TYPE_FILE"
    else:
        kind = "FILE_TYPE_UNSPECIFIED"
    mtime = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
    out.update(
        name=os.path.basename(path.rstrip("/")) or "/",
        type=kind,
        path=path,
        size=str(st.st_size),
        mode=st.st_mode & 0o7777,
        permissions=stat.filemode(st.st_mode),
        owner=name_of(pwd.getpwuid, st.st_uid),
        group=name_of(grp.getgrgid, st.st_gid),
        modifiedTime=mtime.isoformat().replace("+00:00", "Z"),
    )
    return out

def listing(root, depth):
    found = []
    def walk(path, level):
        for name in sorted(os.listdir(path)):
            child = os.path.join(path, name)
            found.append(entry(child))
            if level < depth and os.path.isdir(child) and not os.path.islink(child):
                walk(child, level + 1)
    if not os.path.lexists(root):
        raise FileNotFoundError(root + " does not exist")
    if not os.path.isdir(root):
        raise NotADirectoryError(root + " is not a directory")
    walk(root, 1)
    return found

op, args = sys.argv[1], json.loads(sys.argv[2])
try:
    if op == "Stat":
        out = {"entry": entry(args["path"])}
    elif op == "ListDir":
        out = {"entries": listing(args["path"], max(1, int(args.get("depth") or 1)))}
    elif op == "MakeDir":
        # envd: an existing directory is already_exists (the SDK answers False); anything
        # else in the way is an invalid argument.
        if os.path.isdir(args["path"]):
            raise FileExistsError(args["path"] + " already exists")
        if os.path.lexists(args["path"]):
            raise NotADirectoryError(args["path"] + " exists and is not a directory")
        os.makedirs(args["path"])
        out = {"entry": entry(args["path"])}
    elif op == "Remove":
        path = args["path"]
        if not os.path.lexists(path):
            pass  # envd: removing what is not there succeeds
        elif os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        out = {}
    elif op == "Move":
        dest = args["destination"]
        os.makedirs(os.path.dirname(dest) or "/", exist_ok=True)
        os.rename(args["source"], dest)
        out = {"entry": entry(dest)}
    else:
        out = {"error": ["unimplemented", op]}
except FileNotFoundError as exc:
    out = {"error": ["not_found", str(exc)]}
except FileExistsError as exc:
    out = {"error": ["already_exists", str(exc)]}
except PermissionError as exc:
    out = {"error": ["permission_denied", str(exc)]}
except (NotADirectoryError, IsADirectoryError) as exc:
    out = {"error": ["invalid_argument", str(exc)]}
except OSError as exc:
    out = {"error": ["internal", str(exc)]}
sys.stdout.write(json.dumps(out))
"""

#: The system interpreter when the host has one (local sandboxes see the host's root, and a
#: PATH entry such as a pyenv shim under /root is not readable by unprivileged users).
_PYTHON: Final = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"

#: The RPCs served, with the request fields that hold paths.
PATH_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "Stat": ("path",),
    "ListDir": ("path",),
    "MakeDir": ("path",),
    "Remove": ("path",),
    "Move": ("source", "destination"),
}


class FsError(Exception):
    """A filesystem RPC failed with a Connect code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def fs_call(
    host: ProcessHost, method: str, args: Mapping[str, Any], *, user: str, env: Mapping[str, str]
) -> dict[str, Any]:
    """Run one filesystem RPC in the sandbox; returns the response message as JSON-ready data.

    Raises:
        FsError: the RPC failed (``not_found``, ``already_exists``, ...).
    """
    proc = await host.start_process(
        [_PYTHON, "-c", _SCRIPT, method, json.dumps(dict(args))], user=user, env=env, cwd="/"
    )
    try:
        out = bytearray()
        err = bytearray()

        async def drain(stream: trio.abc.ReceiveStream | None, buf: bytearray) -> None:
            if stream is None:
                return
            while chunk := await stream.receive_some(65536):
                buf += chunk

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, proc.stdout, out)
            nursery.start_soon(drain, proc.stderr, err)
        status = await proc.wait()
    finally:
        with trio.CancelScope(shield=True):
            await proc.aclose()
    if status != 0:
        raise FsError("internal", f"filesystem helper failed ({status}): {err.decode()[-300:]}")
    result: dict[str, Any] = json.loads(out)
    if "error" in result:
        code, message = result["error"]
        raise FsError(code, message)
    return result
