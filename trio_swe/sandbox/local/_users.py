"""The sandbox's users: root and an unprivileged ``agent``, with passwd/group files of their own."""

from __future__ import annotations

import msgspec

AGENT = "agent"


class SandboxUser(msgspec.Struct, frozen=True):
    """A user that commands can run as inside a local sandbox."""

    name: str
    uid: int
    gid: int
    home: str


ROOT = SandboxUser("root", 0, 0, "/root")


def pick_agent_user(host_passwd: str) -> SandboxUser:
    """The ``agent`` user, with the first uid >= 1000 that no host account uses.

    Sharing a uid with a host account would make ``ls -l`` and ``id`` inside show the wrong name.
    """
    used = set()
    for line in host_passwd.splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit():
            used.add(int(fields[2]))
        if fields[0] == AGENT and len(fields) > 3 and fields[2].isdigit() and fields[3].isdigit():
            return SandboxUser(AGENT, int(fields[2]), int(fields[3]), f"/home/{AGENT}")
    uid = 1000
    while uid in used:
        uid += 1
    return SandboxUser(AGENT, uid, uid, f"/home/{AGENT}")


def passwd_with(host_passwd: str, user: SandboxUser) -> str:
    """The host's passwd plus ``user`` (unless the host already has it)."""
    lines = [ln for ln in host_passwd.splitlines() if ln and not ln.startswith(f"{user.name}:")]
    lines.append(f"{user.name}:x:{user.uid}:{user.gid}::{user.home}:/bin/bash")
    return "\n".join(lines) + "\n"


def group_with(host_group: str, user: SandboxUser) -> str:
    """The host's group file plus ``user``'s primary group."""
    lines = [ln for ln in host_group.splitlines() if ln and not ln.startswith(f"{user.name}:")]
    lines.append(f"{user.name}:x:{user.gid}:")
    return "\n".join(lines) + "\n"
