"""Checks for caller strings that end up in a sandbox (tags, paths, users, env names).

The rule: a value is either used literally (and ``shlex.quote``d wherever it meets a shell) or
refused here with an :class:`InvalidArgumentError` naming what is wrong, before anything runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .._errors import InvalidArgumentError

_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_tag(tag: str) -> str:
    """A tag names files in the sandbox: 1-64 of ``[A-Za-z0-9_.-]``, not starting with a dot."""
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise InvalidArgumentError(
            f"invalid tag {tag!r}: use 1-64 characters of [A-Za-z0-9_.-], starting with a letter or digit"
        )
    return tag


def check_user(user: str) -> str:
    """A POSIX user name."""
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise InvalidArgumentError(f"invalid user name {user!r}: expected [a-z_][a-z0-9_-]{{0,31}}")
    return user


def check_abs_path(path: str, *, what: str = "path") -> str:
    """An absolute path without NUL or newline characters (both break shells and /proc parsing)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidArgumentError(f"{what} must be an absolute path, got {path!r}")
    if "\x00" in path or "\n" in path or "\r" in path:
        raise InvalidArgumentError(f"{what} must not contain NUL or newline characters: {path!r}")
    return path


#: Linux's ``MAX_ARG_STRLEN``: the longest single argument or ``NAME=value`` environment string,
#: its NUL included. ``execve`` fails with E2BIG beyond it, whatever the total.
MAX_ARG_STRLEN = 32 * 4096


def _arg_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_command(cmd: str) -> str:
    """A shell command given as one argument (``sh -c cmd``): no NUL (an argument ends at one),
    within the kernel's limit. A model's tool call can carry either (``"\\u0000"`` in JSON)."""
    if "\x00" in cmd:
        raise InvalidArgumentError(
            "cmd must not contain NUL characters (one argument of a process cannot hold one)"
        )
    size = _arg_bytes(cmd)
    if size >= MAX_ARG_STRLEN:
        raise InvalidArgumentError(
            f"cmd is too long: {size:,} bytes, at most {MAX_ARG_STRLEN - 1:,} fit in one "
            "argument (write the script with write_file and run the file)"
        )
    return cmd


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Environment names must be identifiers; values anything but NUL, within one argument."""
    out: dict[str, str] = {}
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise InvalidArgumentError(f"invalid environment variable name {name!r}")
        if not isinstance(value, str):
            raise InvalidArgumentError(
                f"environment variable {name} must be a str, got {type(value).__name__}"
            )
        if "\x00" in value:
            raise InvalidArgumentError(f"environment variable {name} contains a NUL character")
        size = len(name) + 1 + _arg_bytes(value)
        if size >= MAX_ARG_STRLEN:
            raise InvalidArgumentError(
                f"environment variable {name} is too long: {name}=value is {size:,} bytes, at "
                f"most {MAX_ARG_STRLEN - 1:,} fit in one environment string (pass it in a file)"
            )
        out[name] = value
    return out


def check_read_args(max_bytes: int | None, special: bool) -> None:
    """``read_file``'s cap: a non-negative int or None; ``special``: a bool."""
    if max_bytes is not None and (
        isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
    ):
        raise InvalidArgumentError(
            f"max_bytes must be a non-negative int or None, got {max_bytes!r}"
        )
    if not isinstance(special, bool):
        raise InvalidArgumentError(f"special must be a bool, got {special!r}")
