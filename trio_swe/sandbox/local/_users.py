"""The sandbox's users: root and unprivileged accounts (``agent`` by default; the envd test
server adds E2B's ``user``), with passwd/group files of their own."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

AGENT = "agent"


class SandboxUser(msgspec.Struct, frozen=True):
    """A user that commands can run as inside a local sandbox."""

    name: str
    uid: int
    gid: int
    home: str


ROOT = SandboxUser("root", 0, 0, "/root")


def pick_users(host_passwd: str, names: Sequence[str]) -> tuple[SandboxUser, ...]:
    """Unprivileged accounts ``names``, each at ``/home/<name>``: an account the passwd file
    already has keeps its uid and gid; a new one gets the first uid >= 1000 that no account
    uses.

    Sharing a uid with a host account would make ``ls -l`` and ``id`` inside show the wrong name.
    """
    used = set()
    known: dict[str, tuple[int, int]] = {}
    for line in host_passwd.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit():
            used.add(int(fields[2]))
            if len(fields) > 3 and fields[3].isdigit():
                known.setdefault(fields[0], (int(fields[2]), int(fields[3])))
    users = []
    for name in names:
        if name in known:
            uid, gid = known[name]
        else:
            uid = 1000
            while uid in used:
                uid += 1
            gid = uid
        used.add(uid)
        users.append(SandboxUser(name, uid, gid, f"/home/{name}"))
    return tuple(users)


def passwd_with(host_passwd: str, *users: SandboxUser) -> str:
    """The host's passwd plus ``users`` (replacing the host's entries of the same names)."""
    names = {u.name for u in users}
    lines = [ln for ln in host_passwd.splitlines() if ln and ln.split(":")[0] not in names]
    lines += [f"{u.name}:x:{u.uid}:{u.gid}::{u.home}:/bin/bash" for u in users]
    return "\n".join(lines) + "\n"


def group_with(host_group: str, *users: SandboxUser) -> str:
    """The host's group file plus each user's primary group."""
    names = {u.name for u in users}
    lines = [ln for ln in host_group.splitlines() if ln and ln.split(":")[0] not in names]
    lines += [f"{u.name}:x:{u.gid}:" for u in users]
    return "\n".join(lines) + "\n"
