"""``write_file`` as a user, by a shell in the sandbox, so that the kernel checks the user's rights
(sans-IO: the script, and what its exit status means).

The local backend pipes the bytes to the script. The docker backend's archive API writes with the
daemon's rights, whoever the file is for, so for any user but root it stages the bytes in a
directory of that user's and runs the same script on them as that user.
"""

from __future__ import annotations

import posixpath
from typing import Final

from .._errors import InvalidArgumentError, SandboxError, SandboxPermissionError

#: ``$1`` the path, ``$2`` its mode in octal (empty: leave it), ``$3`` its parent (from
#: :func:`parent`: no ``dirname`` process per write); the bytes on stdin. Parents are made as the
#: user. A refusal has its own status: :data:`NOT_A_FILE_STATUS` (a directory is in the way),
#: :data:`DENIED_STATUS` (permissions or a read-only file system: ``test -w`` asks ``access(2)``,
#: which says both).
WRITE_SCRIPT: Final = """p=$1; d=$3
if [ -d "$p" ]; then echo "a directory" >&2; exit 45; fi
if [ ! -d "$d" ] && { ! mkdir -p -- "$d" 2>/dev/null || [ ! -d "$d" ]; }; then
  if [ -e "$d" ] && [ ! -d "$d" ]; then echo "$d is not a directory" >&2; exit 45; fi
  echo "cannot create $d" >&2; exit 47
fi
if { [ -e "$p" ] && [ ! -w "$p" ]; } || { [ ! -e "$p" ] && [ ! -w "$d" ]; }; then
  echo "not writable" >&2; exit 47
fi
cat > "$p" && if [ -n "$2" ]; then chmod -- "$2" "$p"; fi
"""
#: The path (or a parent) is not what a file path needs.
NOT_A_FILE_STATUS: Final = 45
#: The user may not write there.
DENIED_STATUS: Final = 47


def parent(path: str) -> str:
    """``dirname(1)`` of an absolute path: trailing slashes go first, ``/`` is its own."""
    return posixpath.dirname(path.rstrip("/")) or "/"


def write_args(path: str, mode: int | None) -> list[str]:
    """The positional arguments of :data:`WRITE_SCRIPT` (after ``$0``)."""
    return [path, f"{mode:o}" if mode is not None else "", parent(path)]


def write_error(status: int, path: str, user: str | None, detail: str) -> Exception | None:
    """The error a run of :data:`WRITE_SCRIPT` that exited with ``status`` stands for (None: 0)."""
    if status == 0:
        return None
    if status == NOT_A_FILE_STATUS:
        return InvalidArgumentError(f"write_file {path!r}: {detail}, not a file path")
    if status == DENIED_STATUS:
        return SandboxPermissionError(
            f"write_file {path!r}: not permitted for user {user or 'root'} "
            f"(permissions or a read-only file system): {detail}"
        )
    return SandboxError(f"write_file {path!r} failed ({status}): {detail}")
