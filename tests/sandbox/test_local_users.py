"""The unprivileged accounts of local sandboxes (``LocalBackend(users=...)``): E2B's ``user``
next to ``agent``, each with its own uid, group and writable home; root unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe import InvalidArgumentError, open_sandbox
from trio_swe.sandbox.local import LocalBackend
from trio_swe.sandbox.local._users import group_with, passwd_with, pick_users


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir()
    return img


async def test_each_account_has_its_uid_group_and_writable_home(image: Path) -> None:
    probe = "id -un; id -gn; echo $HOME; cd && touch mine && stat -c %U:%G:%a mine; id -u"
    async with open_sandbox(LocalBackend(users=("user", "agent")), str(image)) as sb:
        got = {u: (await sb.exec(probe, user=u)).output.split("\n") for u in ("user", "agent")}
        assert got["user"][:4] == ["user", "user", "/home/user", "user:user:644"]
        assert got["agent"][:4] == ["agent", "agent", "/home/agent", "agent:agent:644"]
        uids = {int(got[u][4]) for u in got}
        assert len(uids) == 2
        assert min(uids) >= 1000
        root = await sb.exec("id -un; echo $HOME", user="root")
        assert root.output == "root\n/root\n"
        # Homes are private: one account cannot write into the other's.
        denied = await sb.exec("touch /home/agent/x", user="user")
        assert denied.exit_code != 0


async def test_only_the_named_accounts_exist(image: Path) -> None:
    async with open_sandbox(LocalBackend(users=("user",)), str(image)) as sb:
        assert (await sb.exec("id -un", user="user")).output == "user\n"
        with pytest.raises(InvalidArgumentError, match="unknown user 'agent'"):
            await sb.exec("true", user="agent")


@pytest.mark.parametrize("users", ["user", ("root",), ("a", "a"), ("Bad Name",)])
def test_bad_user_lists_are_refused(users: object) -> None:
    with pytest.raises(InvalidArgumentError):
        LocalBackend(users=users)  # type: ignore[arg-type]


def test_pick_users_keeps_known_ids_and_skips_taken_ones() -> None:
    passwd = "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nx:x:1001:5::/:\n"
    user, agent = pick_users(passwd, ["user", "agent"])
    assert (user.uid, user.gid, user.home) == (1000, 1000, "/home/user")
    assert (agent.uid, agent.gid, agent.home) == (1002, 1002, "/home/agent")
    text = passwd_with(passwd, user, agent)
    # The passwd file's own line is replaced, not repeated.
    assert [ln for ln in text.splitlines() if ln.startswith("user:")] == [
        "user:x:1000:1000::/home/user:/bin/bash"
    ]
    assert "agent:x:1002:1002::/home/agent:/bin/bash" in text
    assert group_with("root:x:0:\n", user, agent) == "root:x:0:\nuser:x:1000:\nagent:x:1002:\n"
