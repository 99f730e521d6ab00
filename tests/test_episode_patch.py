"""take_patch: new files, binary files, agent commits, harness files excluded, clean apply."""

from __future__ import annotations

import shlex
from pathlib import Path

from trio_swe import open_sandbox
from trio_swe._workspace import PROBLEM_STATEMENT_FILE, take_patch
from trio_swe.sandbox.local import LocalBackend

BINARY = bytes(range(256)) * 4


async def test_patch_round_trips_through_git_apply(make_git_repo: object, tmp_path: Path) -> None:
    repo, base = make_git_repo(  # type: ignore[operator]
        {"src/a.py": "x = 1\n", "data.bin": "placeholder\n", "gone.txt": "bye\n"}
    )
    backend = LocalBackend(state_dir=tmp_path / "state")
    async with open_sandbox(backend, f"{repo}@{base}", network=False) as sb:
        await sb.exec("chown -R agent: /testbed", user="root")
        await sb.write_file("/testbed/data.bin", BINARY, user="agent")
        await sb.write_file(f"/testbed/{PROBLEM_STATEMENT_FILE}", "the issue", user="agent")
        await sb.write_file("/testbed/.harness/log.txt", "harness", user="agent")
        script = (
            "printf 'x = 2\\n' > src/a.py && rm gone.txt && mkdir -p new && "
            "printf 'fresh\\n' > new/file.py && "
            # The agent commits part of its work: the patch is still taken against the base.
            "git add src/a.py && git -c user.name=a -c user.email=a@a commit -qm wip"
        )
        r = await sb.exec(script, user="agent")
        assert r.ok, r.output
        patch = await take_patch(sb, "/testbed", base, agent_user="agent")

    assert isinstance(patch, bytes)
    assert b"GIT binary patch" in patch
    assert b"src/a.py" in patch
    assert b"new/file.py" in patch
    assert b"gone.txt" in patch
    assert PROBLEM_STATEMENT_FILE.encode() not in patch
    assert b".harness" not in patch

    async with open_sandbox(backend, f"{repo}@{base}", network=False) as sb:
        await sb.write_file("/tmp/p.diff", patch)
        applied = await sb.exec("git apply /tmp/p.diff && git status --porcelain", user="root")
        assert applied.ok, applied.output
        assert (await sb.read_file("/testbed/data.bin")) == BINARY
        assert (await sb.read_file("/testbed/src/a.py")) == b"x = 2\n"
        assert (await sb.read_file("/testbed/new/file.py")) == b"fresh\n"
        missing = await sb.exec("test -e gone.txt")
        assert missing.exit_code == 1
    assert backend.statistics().live == 0


async def test_no_change_is_an_empty_patch(make_git_repo: object, tmp_path: Path) -> None:
    repo, base = make_git_repo({"a.txt": "a\n"})  # type: ignore[operator]
    async with open_sandbox(
        LocalBackend(state_dir=tmp_path / "state"), f"{repo}@{base}", network=False
    ) as sb:
        assert await take_patch(sb, "/testbed", base, agent_user="agent") == b""


async def test_non_utf8_content_survives_byte_for_byte(
    make_git_repo: object, tmp_path: Path
) -> None:
    """An agent writing Latin-1 gets its bytes in the patch, not U+FFFD (issue 9, item 7)."""
    repo, base = make_git_repo({"menu.txt": "tea\n"})  # type: ignore[operator]
    backend = LocalBackend(state_dir=tmp_path / "state")
    async with open_sandbox(backend, f"{repo}@{base}", network=False) as sb:
        await sb.exec("chown -R agent: /testbed", user="root")
        await sb.write_file("/testbed/menu.txt", b"tea\ncaf\xe9\n", user="agent")
        patch = await take_patch(sb, "/testbed", base, agent_user="agent")
    assert isinstance(patch, bytes)
    assert b"+caf\xe9\n" in patch
    assert "\ufffd".encode() not in patch
    async with open_sandbox(backend, f"{repo}@{base}", network=False) as sb:
        await sb.write_file("/tmp/p.diff", patch)
        applied = await sb.exec("git apply /tmp/p.diff", user="root")
        assert applied.ok, applied.output
        assert await sb.read_file("/testbed/menu.txt") == b"tea\ncaf\xe9\n"


async def test_taking_the_patch_runs_nothing_the_agent_configured(
    make_git_repo: object, tmp_path: Path
) -> None:
    """take_patch runs git as root in a tree the agent owned: its hooks, fsmonitor, filters,
    textconv and external diff must not run (each would create its canary)."""
    repo, base = make_git_repo({"a.txt": "a\n"})  # type: ignore[operator]
    backend = LocalBackend(state_dir=tmp_path / "state", env={"GIT_CONFIG_GLOBAL": "/tmp/gc"})
    # Double quotes: a ';' would start a comment in git's config.
    payload = "\"sh -c 'touch /tmp/canary-{0}; cat'\""
    config = (
        "[core]\n"
        '\tfsmonitor = "touch /tmp/canary-fsmonitor; echo"\n'
        f'[filter "evil"]\n\tclean = {payload.format("clean")}\n'
        f"\tsmudge = {payload.format('smudge')}\n\trequired = true\n"
        f'[filter "with space"]\n\tclean = {payload.format("space")}\n'
        f'[diff "evil"]\n\ttextconv = {payload.format("textconv")}\n'
        f"\tcommand = {payload.format('diffcmd')}\n"
        f"[diff]\n\texternal = {payload.format('external')}\n"
    )
    hook = "#!/bin/sh\ntouch /tmp/canary-hook\n"
    async with open_sandbox(backend, f"{repo}@{base}", network=False) as sb:
        await sb.exec("chown -R agent: /testbed", user="root")
        setup = (
            f"cat >> .git/config <<'EOF'\n{config}EOF\n"
            "printf '* filter=evil diff=evil\\n*.sp filter=\"with space\"\\n' > .gitattributes\n"
            "for h in post-index-change pre-commit post-checkout; do "
            f"printf %s {shlex.quote(hook)} > .git/hooks/$h; chmod +x .git/hooks/$h; done\n"
            # The global config the backend points every command at is in world-writable /tmp.
            "printf '[core]\\n\\tfsmonitor = \"touch /tmp/canary-global; echo\"\\n' > /tmp/gc\n"
            "printf 'b\\n' >> a.txt && printf 'x\\n' > new.sp"
        )
        r = await sb.exec(setup, user="agent")
        assert r.ok, r.output
        patch = await take_patch(sb, "/testbed", base, agent_user="agent")
        canaries = await sb.exec("ls /tmp | grep canary; true", user="root")
    assert canaries.output.split() == []
    assert b"+b\n" in patch
    assert b"new.sp" in patch
    assert b".gitattributes" in patch
