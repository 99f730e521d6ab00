"""take_patch: new files, binary files, agent commits, harness files excluded, clean apply."""

from __future__ import annotations

from pathlib import Path

from trio_swe import open_sandbox
from trio_swe.episode import PROBLEM_STATEMENT_FILE, take_patch
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

    assert "GIT binary patch" in patch
    assert "src/a.py" in patch
    assert "new/file.py" in patch
    assert "gone.txt" in patch
    assert PROBLEM_STATEMENT_FILE not in patch
    assert ".harness" not in patch

    async with open_sandbox(backend, f"{repo}@{base}", network=False) as sb:
        await sb.write_file("/tmp/p.diff", patch)
        applied = await sb.exec("git apply /tmp/p.diff && git status --porcelain", user="root")
        assert applied.ok, applied.output
        assert (await sb.read_file("/testbed/data.bin")) == BINARY
        assert (await sb.read_file("/testbed/src/a.py")) == b"x = 2\n"
        assert (await sb.read_file("/testbed/new/file.py")) == b"fresh\n"
        missing = await sb.exec("test -e gone.txt")
        assert missing.exit_code == 1
    assert backend.statistics()["live"] == 0


async def test_no_change_is_an_empty_patch(make_git_repo: object, tmp_path: Path) -> None:
    repo, base = make_git_repo({"a.txt": "a\n"})  # type: ignore[operator]
    async with open_sandbox(
        LocalBackend(state_dir=tmp_path / "state"), f"{repo}@{base}", network=False
    ) as sb:
        assert await take_patch(sb, "/testbed", base, agent_user="agent") == ""
