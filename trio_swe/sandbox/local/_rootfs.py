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

import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePosixPath
from typing import TypeAlias

from ..._lru import Lru

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


@functools.lru_cache(maxsize=256)
def workdir_problem(workdir: str) -> str | None:
    """Why ``workdir`` (absolute, normalised) can never hold a local sandbox's repository, or
    None. Such a boot would fail the same way every time, so it is not worth a retry.
    Cached: a pure function of the string, asked at every boot (about 0.5 ms uncached)."""
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
    host = plan_host_root(
        mounts,
        listdir=listdir,
        is_symlink=is_symlink,
        readlink=readlink,
        is_dir=is_dir,
        exists=exists,
    )
    return host + mount_args(mounts)


def plan_host_root(
    targets: Iterable[str],
    *,
    listdir: Callable[[str], Iterable[str]] = os.listdir,
    is_symlink: Callable[[str], bool] = os.path.islink,
    readlink: Callable[[str], str] = os.readlink,
    is_dir: Callable[[str], bool] = os.path.isdir,
    exists: Callable[[str], bool] = os.path.lexists,
) -> list[str]:
    """The part of :func:`plan_root_args` that depends only on the mount *targets* (and the
    host's tree): the host root read-only, split where a target needs a new mount point, and
    private ``/dev``, ``/proc``, ``/tmp``; the mounts themselves follow (:func:`mount_args`)."""
    targets = set(targets)
    # A mount point the host lacks must be created, so each existing host directory above it
    # is split; one the host has (e.g. /etc/passwd) is mounted over as it stands.
    split: set[str] = set()
    for target in targets:
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
            if host in targets and host not in split:
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
    return args


def mount_args(mounts: Mapping[str, tuple[str, str]]) -> list[str]:
    """bwrap arguments for ``mounts``, shallow targets first, so that a mount nested in
    another lands on top of it."""
    args: list[str] = []
    for target in sorted(mounts, key=lambda p: len(PurePosixPath(p).parts)):
        kind, host = mounts[target]
        args.extend([f"--{kind}", host, target])
    return args


#: What :class:`HostRootCache` knows of one path: (mode, inode, device, mtime in ns), or None
#: when it does not exist.
PathState: TypeAlias = tuple[int, int, int, int] | None


def lstat_state(path: str) -> PathState:
    """:data:`PathState` of ``path`` by ``lstat``."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mode, st.st_ino, st.st_dev, st.st_mtime_ns)


class HostRootCache:
    """:func:`plan_host_root` per set of mount targets, reused while the host tree it was
    planned from is unchanged (a boot then costs a few ``lstat`` calls, not a listing).

    The plan depends on the targets, their ancestors (directory or not, symlink or not) and
    the listing of the directories it splits (ancestors too, ``/`` first). A listing changes
    only with its directory's mtime, a path's kind only with its ``lstat`` or its parent's
    listing; so a plan is reused while the ``lstat`` of ``/``, every target and every ancestor
    is the same. File systems stamp mtimes coarsely (a change right after a listing can
    carry the mtime seen before it), so a plan is kept only once every one of those mtimes is
    ``settle_sec`` older than the moment it was planned (git's rule for racily clean index
    entries). The ``maxsize`` most recently used sets of targets are kept (a workdir is one of
    the targets, and rows may each name their own). Sans-IO: ``state`` and ``now`` are
    injectable; planning uses ``plan``.
    """

    def __init__(
        self,
        *,
        state: Callable[[str], PathState] = lstat_state,
        now: Callable[[], float] = time.time,
        plan: Callable[[Iterable[str]], list[str]] = plan_host_root,
        settle_sec: float = 1.0,
        maxsize: int = 64,
    ) -> None:
        self._state = state
        self._now = now
        self._plan = plan
        self._settle_ns = int(settle_sec * 1e9)
        self._plans: Lru[frozenset[str], tuple[tuple[PathState, ...], list[str]]] = Lru(maxsize)
        self._paths: Lru[frozenset[str], list[str]] = Lru(maxsize)
        self.planned = 0  # how many times the tree was listed (statistics, tests)

    def host_args(self, targets: Iterable[str]) -> list[str]:
        key = frozenset(targets)
        paths = self._paths.get(key)
        if paths is None:  # the paths to look at, once per key (PurePosixPath is slow)
            paths = sorted({"/", *key, *(a for t in key for a in _ancestors(t))})
            self._paths.put(key, paths)
        t0 = int(self._now() * 1e9)
        seen = tuple(self._state(p) for p in paths)
        hit = self._plans.get(key)
        if hit is not None and hit[0] == seen:
            return list(hit[1])
        args = self._plan(key)
        self.planned += 1
        if all(s is None or s[3] < t0 - self._settle_ns for s in seen):
            self._plans.put(key, (seen, args))
        else:
            self._plans.pop(key)
        return list(args)
