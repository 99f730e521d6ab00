"""Sans-IO planning of a sandbox's root file system as bubblewrap arguments.

The sandbox sees the host's root read-only (so host tools such as git and python work inside),
with private ``/tmp``, ``/dev`` and ``/proc``, and a few mounts of its own (the workdir, homes,
passwd, caller binds). A mount over a path the host already has needs nothing more. But
bubblewrap cannot *create* a mount point inside a read-only bind, so every host directory on the
way to a new mount point is *split*: recreated as a directory in bwrap's tmpfs root, with each of
its host children bound one by one. Splitting only where needed keeps the mount count low, which
matters: mount operations are serialized by the kernel, so boot throughput falls with every
extra bind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePosixPath

# Host paths never exposed as they are: bwrap gives the sandbox its own.
_PRIVATE_TOP = frozenset({"proc", "dev", "tmp"})


# Directories the sandbox's own programs come from: a workdir mounted over one of them, inside
# one or above one would hide the shell every command starts with.
_SYSTEM_DIRS = (
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
    "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
    "/usr/libexec",
)  # fmt: skip
# Kernel file systems the sandbox gets its own of; nothing can be mounted inside them.
_KERNEL_DIRS = ("/proc", "/sys", "/dev")


def workdir_problem(workdir: str) -> str | None:
    """Why ``workdir`` (absolute, normalised) can never hold a local sandbox's repository, or
    None. Such a boot would fail the same way every time, so it is not worth a retry."""
    path = PurePosixPath(workdir)
    if str(path) == "/":
        return "workdir must not be /"
    for d in _KERNEL_DIRS:
        if path == PurePosixPath(d) or PurePosixPath(d) in path.parents:
            return f"workdir {workdir!r} is inside {d}, which the sandbox gets its own of"
    for d in _SYSTEM_DIRS:
        sys_dir = PurePosixPath(d)
        if path == sys_dir or path in sys_dir.parents or sys_dir in path.parents:
            return (
                f"workdir {workdir!r} would hide {d}, where the sandbox's programs come from "
                "(the local backend shows the host's root)"
            )
    return None


def _ancestors(path: str) -> list[str]:
    parts = PurePosixPath(path).parts[1:]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def plan_root_args(
    mounts: Mapping[str, tuple[str, str]],
    *,
    listdir: Callable[[str], Iterable[str]] = os.listdir,
    is_symlink: Callable[[str], bool] = os.path.islink,
    readlink: Callable[[str], str] = os.readlink,
    is_dir: Callable[[str], bool] = os.path.isdir,
    exists: Callable[[str], bool] = os.path.lexists,
) -> list[str]:
    """bwrap arguments exposing the host root read-only plus ``mounts``.

    Args:
        mounts: sandbox path -> (kind, host path), kind one of ``"bind"`` (read-write),
            ``"ro-bind"``. Later entries may live under earlier ones.
        listdir, is_symlink, readlink, is_dir, exists: file-system queries, injectable for tests.
    """
    # A mount point the host lacks must be created, so each existing host directory above it
    # is split; one the host has (e.g. /etc/passwd) is mounted over as it stands.
    split: set[str] = set()
    for target in mounts:
        if exists(target) and not is_symlink(target):
            continue
        for anc in _ancestors(target):
            if is_dir(anc) and not is_symlink(anc):
                split.add(anc)
    args: list[str] = []

    def expose(directory: str) -> None:
        for name in sorted(listdir(directory)):
            host = os.path.join(directory, name)
            if directory == "/" and name in _PRIVATE_TOP:
                continue
            if host in mounts and host not in split:
                continue  # replaced by the mount itself
            if is_symlink(host):
                args.extend(["--symlink", readlink(host), host])
            elif host in split:
                args.extend(["--dir", host])
                expose(host)
            else:
                args.extend(["--ro-bind", host, host])

    expose("/")
    args.extend(["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"])
    # Shallow targets first, so a mount nested in another lands on top of it.
    for target in sorted(mounts, key=lambda p: len(PurePosixPath(p).parts)):
        kind, host = mounts[target]
        args.extend([f"--{kind}", host, target])
    return args
