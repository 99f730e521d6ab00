"""Reaping the processes we adopt: orphans of a sandbox handed to us by the kernel.

A process whose parent dies goes to its nearest ancestor that is a child subreaper
(``PR_SET_CHILD_SUBREAPER``), or to the init of its parent's pid namespace. When trio_swe runs
as PID 1 of a container, or under a subreaper (systemd user services, tini ``-s``, some
supervisors), that is us: the outer ``bwrap`` once its parent shell is killed, the namespace's
init once the outer ``bwrap`` is, and a command's process inside the sandbox once its host-side
``nsenter`` is killed first. Nobody waits for them, so they stay zombies; and a zombie inside
the sandbox's pid namespace keeps that namespace's init from exiting (the kernel holds the
init's exit until every process of the namespace is reaped), so a kill waited out its bound.

Only processes we never started ourselves are reaped here: trio waits for the ones it started,
and reaping one of those would steal its exit status. A child of ours that lives in a deeper pid
namespace than ours cannot be one we started (we start host-side ``nsenter``/``sh``), nor can a
pid we name explicitly (the outer ``bwrap``).
"""

from __future__ import annotations

import os


def _nspid_depth(pid: int | str) -> int | None:
    """How many pid namespaces ``pid`` is seen in (1: ours only); None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) - 1
    except OSError:
        return None
    return None


def children_of(pid: int | str = "self") -> list[int]:
    """The children of ``pid`` (default: us), from every thread (trio starts processes from
    worker threads); empty once it is gone."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return out


def parent_of(pid: int) -> int:
    """The parent pid of ``pid``; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def comm_of(pid: int) -> str:
    """The command name of ``pid``; "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b") ", 1)[1][:1] == b"Z"
    except (OSError, IndexError):
        return False


def reap(pid: int) -> bool:
    """Reap ``pid`` if it is a finished child of ours; True if it was."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG) is not None
    except ChildProcessError:
        return False


def reap_pidfd(fd: int) -> bool:
    """Reap the process of pidfd ``fd`` if it is a finished child of ours (a pidfd names one
    process, so a recycled pid is never reaped by mistake); True if it was."""
    try:
        return os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG) is not None
    except ChildProcessError:
        return False


def reap_adopted_zombies() -> int:
    """Reap every finished child of ours that lives in a deeper pid namespace than ours (an
    orphan from a sandbox, never one we started); the count reaped."""
    own = _nspid_depth("self")
    if own is None:
        return 0
    reaped = 0
    for pid in children_of():
        depth = _nspid_depth(pid)
        if depth is not None and depth > own and _is_zombie(pid) and reap(pid):
            reaped += 1
    return reaped
