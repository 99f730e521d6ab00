"""``exec_and_wait`` on every backend (the ``backend`` fixture), through the Sandbox protocol only.

Leak checks read ``/proc`` inside the sandbox (via ``sb.exec``) for a token unique to the test,
so tests running concurrently never see each other's processes.
"""

from __future__ import annotations

import math
import posixpath
import random
import re
import shlex
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import (
    EXIT_TIME_BUDGET_EXCEEDED,
    DetachedCommandLostError,
    ExecResult,
    InvalidArgumentError,
    Sandbox,
    exec_and_wait,
    open_sandbox,
    wait_cleanups,
)
from trio_swe.sandbox import Backend, SandboxStatistics

# A loop that keeps a process alive with ``token`` in its command line.
LOOP = "while :; do sleep 0.2; done"


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir(exist_ok=True)
    (img / "hello.txt").write_text("hello\n")
    return img


@asynccontextmanager
async def sandbox(backend: Backend, image: Path) -> AsyncIterator[Sandbox]:
    async with open_sandbox(backend, str(image)) as sb:
        yield sb


def new_token() -> str:
    return f"tok{uuid.uuid4().hex}"


async def pids_with(sb: Sandbox, token: str) -> list[int]:
    """Pids in ``sb`` whose command line or environment contains ``token`` (zombies excluded)."""
    half = len(token) // 2
    script = (
        f"a='{token[:half]}'; b='{token[half:]}'\n"
        "for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do\n"
        '  p=${f#/proc/}; p=${p%%/*}; [ "$p" = "$$" ] && continue\n'
        '  if tr "\\000" " " 2>/dev/null <"$f" | grep -qF "$a$b"; then echo "$p"; fi\n'
        "done | sort -u\n"
    )
    result = await sb.exec(script, cwd="/", timeout=60)
    assert result.exit_code == 0, result
    return [int(p) for p in result.output.split() if p.isdigit()]


async def leftover_dirs(sb: Sandbox, tags: list[str], user: str | None = None) -> list[str]:
    """Which of ``tags`` still have a private directory (see docs/detached.md for the layout),
    once the removals that calls defer past their return have run."""
    await wait_cleanups(sb)
    base = f"/tmp/.trio_swe.{user}" if user else "/tmp/.trio_swe"
    result = await sb.exec(f"ls -A {base} 2>/dev/null; true", cwd="/")
    present = set(result.output.split())
    return sorted(t for t in tags if t in present)


class ProxySandbox:
    """Wraps a real sandbox, forwarding everything; subclasses change the transport behaviour."""

    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb
        self.calls: list[str] = []

    @property
    def id(self) -> str:
        return self.sb.id

    @property
    def workdir(self) -> str:
        return self.sb.workdir

    def start_background(self, async_fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        self.sb.start_background(async_fn, *args)

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        self.calls.append("exec")
        return await self.sb.exec(cmd, **kw)

    async def write_file(self, path: str, data: bytes | str, **kw: Any) -> None:
        self.calls.append("write_file")
        await self.sb.write_file(path, data, **kw)

    async def read_file(self, path: str, **kw: Any) -> bytes:
        self.calls.append("read_file")
        return await self.sb.read_file(path, **kw)

    async def kill(self) -> None:
        await self.sb.kill()

    def statistics(self) -> SandboxStatistics:
        return self.sb.statistics()


class ReplayingSandbox(ProxySandbox):
    """A transport that loses every response once: each replay-safe call is sent twice.

    ``concurrent``: the retry arrives while the first attempt still runs (a severed stream whose
    server side goes on); otherwise after it finished. The second attempt's result is returned.
    """

    def __init__(self, sb: Sandbox, *, concurrent: bool) -> None:
        super().__init__(sb)
        self.concurrent = concurrent
        self.replayed = 0

    async def _twice(self, make: Any) -> Any:
        self.replayed += 1
        if not self.concurrent:
            await make()
            return await make()
        results: list[Any] = []

        async def one() -> None:
            results.append(await make())

        async with trio.open_nursery() as n:
            n.start_soon(one)
            n.start_soon(one)
        return results[-1]

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        if not kw.get("idempotent"):
            return await self.sb.exec(cmd, **kw)
        result: ExecResult = await self._twice(lambda: self.sb.exec(cmd, **kw))
        return result

    async def write_file(self, path: str, data: bytes | str, **kw: Any) -> None:
        await self._twice(lambda: self.sb.write_file(path, data, **kw))


class LossySandbox(ProxySandbox):
    """A transport that loses the output of every other replay-safe ``exec`` (after running it),
    or of the first ``in_a_row`` ones."""

    def __init__(self, sb: Sandbox, *, in_a_row: int = 0) -> None:
        super().__init__(sb)
        self.lost = 0
        self.in_a_row = in_a_row

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        result = await self.sb.exec(cmd, **kw)
        lose = self.lost < self.in_a_row if self.in_a_row else len(self.calls) % 2 == 0
        if kw.get("idempotent") and lose:
            self.lost += 1
            result = ExecResult(exit_code=0, output="", output_truncated=True)
        self.calls.append("exec")
        return result


# -- results ------------------------------------------------------------------------------------


async def test_exit_codes_and_signals_come_back_exactly(backend: Backend, image: Path) -> None:
    cases = {
        "exit 0": 0,
        "echo out-1; exit 1": 1,
        "echo out-7 >&2; exit 7": 7,
        "echo out-255; exit 255": 255,
        "echo out-kill; kill -9 $$": 128 + 9,
        "echo out-term; kill -TERM $$": 128 + 15,
        "false\ntrue": 0,  # a script's status is its last command's, as with bash -c
    }
    results: dict[str, ExecResult] = {}
    async with sandbox(backend, image) as sb:

        async def run(cmd: str) -> None:
            results[cmd] = await exec_and_wait(sb, cmd, time_budget_sec=60)

        async with trio.open_nursery() as n:
            for cmd in cases:
                n.start_soon(run, cmd)
        tags = [r.tag or "" for r in results.values()]
        assert await leftover_dirs(sb, tags) == []
    for cmd, code in cases.items():
        r = results[cmd]
        assert (r.exit_code, r.reason) == (code, "exit"), (cmd, r)
        assert r.ok == (code == 0)
        if code == 0:
            assert r.output == ""
        else:
            assert r.output.startswith("out-"), r
            assert "Killed" not in r.output
    assert len({r.tag for r in results.values()}) == len(cases)  # a fresh tag per call


async def test_fifty_concurrent_calls_in_ten_sandboxes(backend: Backend, image: Path) -> None:
    got: dict[tuple[int, int], ExecResult] = {}

    async def one_sandbox(i: int) -> None:
        async with sandbox(backend, image) as sb, trio.open_nursery() as n:
            for j in range(5):
                n.start_soon(one_call, sb, i, j)

    async def one_call(sb: Sandbox, i: int, j: int) -> None:
        code = (i * 5 + j) % 256
        got[(i, j)] = await exec_and_wait(
            sb,
            f"echo call-{i}-{j}; cat hello.txt; exit {code}",
            time_budget_sec=120,
            want_output=True,
        )

    async with trio.open_nursery() as n:
        for i in range(10):
            n.start_soon(one_sandbox, i)
    assert len(got) == 50
    for (i, j), r in got.items():
        assert r.exit_code == (i * 5 + j) % 256
        assert r.output == f"call-{i}-{j}\nhello\n"


async def test_output_rules(backend: Backend, image: Path) -> None:
    async with sandbox(backend, image) as sb:
        # Success: "" unless asked; asked: all of it, exactly.
        ok = await exec_and_wait(sb, "seq 1 20000", time_budget_sec=60)
        assert (ok.exit_code, ok.output, ok.output_truncated) == (0, "", False)
        full = await exec_and_wait(sb, "seq 1 20000; exit 3", time_budget_sec=60, want_output=True)
        assert full.exit_code == 3
        assert full.output == "".join(f"{k}\n" for k in range(1, 20001))
        assert not full.output_truncated
        # Failure without want_output: a bounded tail that ends where the output ends.
        tail = await exec_and_wait(sb, "seq 1 20000; exit 2", time_budget_sec=60)
        assert tail.exit_code == 2
        assert tail.output_truncated
        assert 0 < len(tail.output.encode()) <= 4096
        assert tail.output.endswith("19999\n20000\n")
        # Non-UTF-8 output never raises.
        raw = await exec_and_wait(
            sb, r"printf 'a\377\376b\n'; exit 1", time_budget_sec=60, want_output=True
        )
        assert raw.output == "a\ufffd\ufffdb\n"
        raw_tail = await exec_and_wait(sb, r"printf 'a\377b'; exit 1", time_budget_sec=60)
        assert raw_tail.output == "a\ufffdb"


async def test_workdir_env_and_defaults(backend: Backend, image: Path) -> None:
    async with sandbox(backend, image) as sb:
        r = await exec_and_wait(
            sb,
            'pwd; cat hello.txt; printf "%s|" "$A" "$B"',
            time_budget_sec=60,
            env={"A": "x y 'z'", "B": "$(touch /tmp/canary) `id` \n é"},
            want_output=True,
        )
        assert r.output == f"{sb.workdir}\nhello\nx y 'z'|$(touch /tmp/canary) `id` \n é|"
        await sb.exec("mkdir -p '/tmp/a dir/$(x)'", cwd="/")
        r = await exec_and_wait(
            sb, "pwd", time_budget_sec=60, workdir="/tmp/a dir/$(x)", want_output=True
        )
        assert r.output == "/tmp/a dir/$(x)\n"
        with pytest.raises(InvalidArgumentError, match="workdir"):
            await exec_and_wait(sb, "true", time_budget_sec=60, workdir="/does/not/exist")
        assert (await sb.exec("test -e /tmp/canary", cwd="/")).exit_code == 1


async def test_unprivileged_user(backend: Backend, image: Path) -> None:
    async with sandbox(backend, image) as sb:
        r = await exec_and_wait(sb, "id -un", time_budget_sec=60, user="agent", want_output=True)
        assert r.output == "agent\n"


async def test_command_file_is_private_to_its_user(backend: Backend, image: Path) -> None:
    async with sandbox(backend, image) as sb:
        # The launcher runs the command file as `sh FILE`, so $0 is the file itself.
        r = await exec_and_wait(
            sb, 'stat -c "%a %U" "$0"', time_budget_sec=60, user="agent", want_output=True
        )
        assert r.output == "600 agent\n"


# -- budget and cancellation ----------------------------------------------------------------------


def tree_command(token: str) -> str:
    """A command leaving a setsid grandchild, an env-scrubbed child and a double-forked daemon."""
    return (
        f'setsid sh -c "echo up-setsid; {LOOP} # {token}" &\n'
        f'env -i sh -c "echo up-scrubbed; {LOOP} # {token}" &\n'
        f"( setsid sh -c \"sh -c 'echo up-daemon; {LOOP} # {token}' &\" ) &\n"
        f'sh -c "echo up-fg; {LOOP} # {token}"\n'
    )


async def test_budget_overrun_kills_every_process(backend: Backend, image: Path) -> None:
    """Each overrun kills all it started. Positive control: all four processes were running
    when the budget ran out; a loaded machine may not have started them all within a budget,
    so it doubles until one run has (each run is checked for leftovers all the same)."""
    async with sandbox(backend, image) as sb:
        for attempt in range(5):  # budgets of 2 to 32 s
            token, budget = new_token(), 2.0 * 2**attempt
            t0 = trio.current_time()
            r = await exec_and_wait(sb, tree_command(token), time_budget_sec=budget, tag=token)
            elapsed = trio.current_time() - t0
            assert (r.exit_code, r.reason) == (EXIT_TIME_BUDGET_EXCEEDED, "time_budget")
            # The command never ends by itself: returning at all proves the budget cut it. The
            # slack is for a loaded machine (one run at load 30 took 5 s, idle ones 2.1 s).
            assert elapsed <= budget + 15.0
            assert r.duration_sec <= budget + 15.0
            assert await pids_with(sb, token) == []
            assert await leftover_dirs(sb, [token]) == []
            up = [w for w in ("setsid", "scrubbed", "daemon", "fg") if f"up-{w}" in r.output]
            if len(up) == 4:
                break
        assert len(up) == 4, r.output


async def test_overrun_with_want_output_returns_everything(backend: Backend, image: Path) -> None:
    """Everything the command printed before its budget ran out comes back. A loaded machine may
    not have printed it all within a budget (or even started the command): each run must return
    a prefix of it, and the budget doubles until one run has printed it all."""
    everything = "".join(f"{k}\n" for k in range(1, 3001))
    async with sandbox(backend, image) as sb:
        for attempt in range(6):  # budgets of 1 to 32 s
            tag = f"ovr{attempt}"
            r = await exec_and_wait(
                sb, "seq 1 3000; sleep 30", time_budget_sec=2.0**attempt, want_output=True, tag=tag
            )
            assert (r.exit_code, r.reason, r.output_truncated) == (-1, "time_budget", False)
            assert everything.startswith(r.output), r.output[-100:]
            assert await leftover_dirs(sb, [tag]) == []
            if r.output == everything:
                break
        assert r.output == everything


class HeldSpawnSandbox(ProxySandbox):
    """Holds the spawn RPC until the caller is cancelled: the budget runs out with the command
    file written and nothing started (a loaded sandbox slow to answer)."""

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        if "setsid" in cmd:
            await trio.sleep_forever()
        return await super().exec(cmd, **kw)


@pytest.mark.parametrize("want_output", [True, False])
async def test_overrun_before_the_spawn_returns_nothing(
    backend: Backend, image: Path, want_output: bool
) -> None:
    """An overrun before the command started is an overrun with no output (it used to raise
    SandboxFileNotFoundError with want_output: the output file did not exist yet)."""
    token = new_token()
    async with sandbox(backend, image) as sb:
        proxy = HeldSpawnSandbox(sb)
        r = await exec_and_wait(
            proxy,  # type: ignore[arg-type]
            f"echo ran > /tmp/{token}.ran",
            time_budget_sec=0.5,
            want_output=want_output,
            tag=token,
        )
        assert (r.exit_code, r.reason, r.output) == (-1, "time_budget", "")
        assert await leftover_dirs(sb, [token]) == []
        ran = await sb.exec(f"test -e /tmp/{token}.ran", cwd="/")
        assert ran.exit_code == 1  # and no late spawn can start it


async def test_zero_budget(backend: Backend, image: Path) -> None:
    async with sandbox(backend, image) as sb:
        r = await exec_and_wait(sb, "echo never", time_budget_sec=0)
        assert (r.exit_code, r.reason) == (-1, "time_budget")


async def test_outside_cancellation_kills_then_reraises(backend: Backend, image: Path) -> None:
    token = new_token()
    async with sandbox(backend, image) as sb:
        with trio.CancelScope() as scope:

            async def cancel_once_running() -> None:
                # From outside, once the command runs (a fixed delay raced a loaded machine's
                # spawn: cancelled before the command had started, nothing was there to kill).
                with trio.fail_after(120):  # a hang guard only
                    probe = f"test -e /tmp/{token}.up"  # the only sign: no event tells
                    while (await sb.exec(probe, cwd="/")).exit_code:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_once_running)
                await exec_and_wait(
                    sb,
                    f"touch /tmp/{token}.up; {tree_command(token)}",
                    time_budget_sec=math.inf,
                    tag=token,
                )
        assert scope.cancelled_caught
        assert await pids_with(sb, token) == []
        assert await leftover_dirs(sb, [token]) == []


async def test_cancel_at_random_points(backend: Backend, image: Path) -> None:
    """100 cancellations at seeded random moments (before, during and after the spawn), in four
    concurrent lanes of 25 trials so that the test stays fast."""
    rng = random.Random(20260529)
    token = new_token()
    delays = [rng.uniform(0.0, 0.15) for _ in range(100)]
    tags = [f"{token}-{i}" for i in range(100)]
    finished = 0
    async with sandbox(backend, image) as sb:

        async def lane(first: int) -> None:
            nonlocal finished
            for i in range(first, 100, 4):
                with trio.move_on_after(delays[i]):
                    await exec_and_wait(
                        sb, f"sh -c '{LOOP} # {token}'", time_budget_sec=math.inf, tag=tags[i]
                    )
                    finished += 1

        async with trio.open_nursery() as n:
            for first in range(4):
                n.start_soon(lane, first)
        assert finished == 0
        assert await pids_with(sb, token) == []
        assert await leftover_dirs(sb, tags) == []


# -- replay safety and tags -------------------------------------------------------------------


@pytest.mark.parametrize("concurrent", [False, True])
async def test_replayed_rpcs_run_the_command_once(
    backend: Backend, image: Path, concurrent: bool
) -> None:
    token = new_token()
    async with sandbox(backend, image) as sb:
        replaying = ReplayingSandbox(sb, concurrent=concurrent)
        r = await exec_and_wait(
            replaying,  # type: ignore[arg-type]
            f"echo run >> /tmp/{token}.count; exit 3",
            time_budget_sec=60,
        )
        assert replaying.replayed >= 3  # write_file, spawn, wait (and cleanup) were all sent twice
        assert r.exit_code == 3
        count = await sb.exec(f"cat /tmp/{token}.count", cwd="/")
        assert count.output == "run\n"
        # The kill path is replay-safe too.
        r = await exec_and_wait(
            replaying,  # type: ignore[arg-type]
            f"sh -c '{LOOP} # {token}'",
            time_budget_sec=0.5,
        )
        assert r.reason == "time_budget"
        assert await pids_with(sb, token) == []


async def test_lost_replies_are_asked_again(backend: Backend, image: Path) -> None:
    token = new_token()
    async with sandbox(backend, image) as sb:
        lossy = LossySandbox(sb)
        r = await exec_and_wait(
            lossy,  # type: ignore[arg-type]
            f"echo run >> /tmp/{token}.count; echo hello; exit 5",
            time_budget_sec=60,
            want_output=True,
        )
        assert lossy.lost >= 1  # the wait's reply, which carries the exit code and output
        assert (r.exit_code, r.output) == (5, "hello\n")
        count = await sb.exec(f"cat /tmp/{token}.count", cwd="/")
        assert count.output == "run\n"


async def test_many_lost_replies_in_a_row_are_transport_failures(
    backend: Backend, image: Path
) -> None:
    """Replies cut by the transport (re-attached streams) six times in a row, one more than a
    malformed reply is allowed: retried as transport failures, the exit code still exact."""
    async with sandbox(backend, image) as sb:
        lossy = LossySandbox(sb, in_a_row=6)
        r = await exec_and_wait(lossy, "echo hi; exit 3", time_budget_sec=120, want_output=True)  # type: ignore[arg-type]
        assert (r.exit_code, r.output) == (3, "hi\n")
        assert lossy.lost == 6


async def test_same_tag_sequential_runs_again_overlap_refused(
    backend: Backend, image: Path
) -> None:
    token = new_token()
    async with sandbox(backend, image) as sb:
        # slime's bug (PR #2239): a retry with the same tag replayed the first attempt's result.
        for attempt in (1, 2):
            r = await exec_and_wait(
                sb,
                f"echo x >> /tmp/{token}.count; wc -l < /tmp/{token}.count",
                time_budget_sec=60,
                tag="npm-install",
                want_output=True,
            )
            assert r.output.strip() == str(attempt)

        # The first call holds the tag until the test is done with it (a fixed budget raced a
        # loaded machine: it could run out before the tag was even taken).
        first = trio.CancelScope()

        async def run_first() -> None:
            with first:
                await exec_and_wait(
                    sb, f"sh -c '{LOOP} # {token}'", time_budget_sec=math.inf, tag="same"
                )

        async with trio.open_nursery() as n:
            n.start_soon(run_first)
            # Wait in the sandbox until the first call owns the tag, then try to take it.
            owned = await sb.exec(
                "while [ ! -e /tmp/.trio_swe/same/pid ]; do sleep 0.01; done",
                cwd="/",
                timeout=120,
            )
            assert owned.exit_code == 0
            with pytest.raises(InvalidArgumentError, match="in use"):
                await exec_and_wait(sb, "echo second", time_budget_sec=60, tag="same")
            # The first call was not disturbed by the refused second one: it still runs.
            assert await pids_with(sb, token) != []
            first.cancel()
        assert first.cancelled_caught
        assert await pids_with(sb, token) == []
        assert await leftover_dirs(sb, ["same", "npm-install"]) == []


async def test_bad_arguments_refused_before_any_rpc(backend: Backend, image: Path) -> None:
    async with sandbox(backend, image) as sb:
        proxy = ProxySandbox(sb)
        bad: list[dict[str, Any]] = [
            {"tag": "../etc"},
            {"tag": "a b"},
            {"tag": "$(id)"},
            {"user": "root;id"},
            {"env": {"A-B": "x"}},
            {"env": {"A": "x\x00y"}},
            {"workdir": "relative/dir"},
            {"workdir": "/a\nb"},
            {"time_budget_sec": -1},
            {"time_budget_sec": float("nan")},
            {"poll_interval_sec": 0},
        ]
        for kw in bad:
            kw.setdefault("time_budget_sec", 10)
            with pytest.raises(InvalidArgumentError):
                await exec_and_wait(proxy, "true", **kw)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await exec_and_wait(proxy, "echo \x00", time_budget_sec=10)  # type: ignore[arg-type]
        assert proxy.calls == []


# -- waiting ------------------------------------------------------------------------------------


async def test_long_poll_makes_few_rpcs(backend: Backend, image: Path) -> None:
    async with sandbox(backend, image) as sb:
        proxy = ProxySandbox(sb)
        r = await exec_and_wait(
            proxy,  # type: ignore[arg-type]
            "sleep 1.5; exit 4",
            time_budget_sec=60,
            poll_interval_sec=0.4,
        )
        assert r.exit_code == 4
        # write_file + spawn + ceil(1.5 / 0.4) waits (+1 for the one that sees the end)
        assert proxy.calls.count("write_file") == 1
        waits = proxy.calls.count("exec") - 1
        assert 3 <= waits <= 6, proxy.calls
        # With the default long-poll (120 s), a 1.5 s command needs a single wait RPC.
        await wait_cleanups(proxy)  # type: ignore[arg-type]
        proxy.calls.clear()
        r = await exec_and_wait(proxy, "sleep 1.5", time_budget_sec=60)  # type: ignore[arg-type]
        assert r.ok
        assert r.duration_sec < 10  # woken by the command's end, not by the poll bound
        # The call returned before its cleanup RPC: that one runs afterwards, in the background.
        assert proxy.calls == ["write_file", "exec", "exec"]
        await wait_cleanups(proxy)  # type: ignore[arg-type]
        assert proxy.calls == ["write_file", "exec", "exec", "exec"]


async def test_pending_cleanups_never_outlive_or_delay_the_sandbox(
    backend: Backend, image: Path
) -> None:
    """Cleanups deferred past a call's return: a sandbox closed with them pending closes at once
    (its kill makes them moot) and raises nothing; a new call with the same tag waits for the
    previous call's cleanup, so it never removes the new call's files."""
    with trio.fail_after(120):  # a hang guard only
        async with sandbox(backend, image) as sb:
            proxy = ProxySandbox(sb)
            for i in range(3):
                r = await exec_and_wait(
                    proxy,  # type: ignore[arg-type]
                    f"echo {i}",
                    time_budget_sec=60,
                    tag="again",
                    want_output=True,
                )
                assert (r.exit_code, r.output) == (0, f"{i}\n")
            # Each call after the first ran the previous one's cleanup first; the last one's is
            # still pending when the block ends.
            assert proxy.calls.count("exec") == 3 * 2 + 2, proxy.calls
        assert proxy.calls.count("exec") == 3 * 2 + 2, proxy.calls


class FailingCleanupSandbox(ProxySandbox):
    """Refuses the first ``failures`` directory removals (a sandbox that was sick for a while)."""

    def __init__(self, sb: Sandbox, failures: int) -> None:
        super().__init__(sb)
        self.failures = failures
        self.refused = trio.Event()

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        if cmd.startswith("rm -rf -- ") and self.failures > 0:
            self.failures -= 1
            self.refused.set()
            return ExecResult(exit_code=1, output="rm: cannot remove: Device or resource busy")
        return await super().exec(cmd, **kw)


async def test_a_failed_cleanup_stays_pending(backend: Backend, image: Path) -> None:
    """A removal that failed in the background is run again by the tag's next call (so the tag
    is not left "in use" for the rest of the sandbox's life) and by ``wait_cleanups``."""
    with trio.fail_after(120):  # a hang guard only
        async with sandbox(backend, image) as sb:
            proxy = FailingCleanupSandbox(sb, failures=1)
            r = await exec_and_wait(proxy, "echo 1", time_budget_sec=60, tag="sick")  # type: ignore[arg-type]
            assert r.ok
            await proxy.refused.wait()  # the background removal failed
            r = await exec_and_wait(proxy, "echo 2", time_budget_sec=60, tag="sick")  # type: ignore[arg-type]
            assert r.ok
            assert await leftover_dirs(sb, ["sick"]) == []

            proxy = FailingCleanupSandbox(sb, failures=1)
            r = await exec_and_wait(proxy, "echo 3", time_budget_sec=60, tag="sick2")  # type: ignore[arg-type]
            assert r.ok
            await proxy.refused.wait()
            await wait_cleanups(proxy)  # type: ignore[arg-type]
            assert await leftover_dirs(sb, ["sick2"]) == []


class LateWriteSandbox(ProxySandbox):
    """The first attempt of a command file's write lands late, after its retry: cut short just
    before the spawn (``before``), or emptied while the command runs (``after``)."""

    def __init__(self, sb: Sandbox, *, before: bool) -> None:
        super().__init__(sb)
        self.before = before
        self.cmd_path = ""
        self.cuts = 0

    async def write_file(self, path: str, data: bytes | str, **kw: Any) -> None:
        await super().write_file(path, data, **kw)
        if path.endswith(".sh") and self.before and not self.cuts:
            self.cuts += 1
            await self.sb.write_file(path, bytes(data)[: len(data) // 2], **kw)  # type: ignore[arg-type]
        self.cmd_path = path

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        result = await super().exec(cmd, **kw)
        if "setsid" in cmd and not self.before and not self.cuts:
            self.cuts += 1
            await self.sb.write_file(self.cmd_path, b"")
        return result


@pytest.mark.parametrize("before", [True, False], ids=["before-spawn", "while-running"])
async def test_a_late_write_of_the_command_file_changes_nothing(
    backend: Backend, image: Path, before: bool
) -> None:
    """A retried write_file whose first attempt the server runs late rewrites the command file.
    Before the spawn, the file is written again; while the command runs, the run is unaffected
    (it used to end at the cut with status 0: a wrong exit code)."""
    async with sandbox(backend, image) as sb:
        proxy = LateWriteSandbox(sb, before=before)
        r = await exec_and_wait(
            proxy,  # type: ignore[arg-type]
            "sleep 0.5\necho second\nexit 48",
            time_budget_sec=120,
            want_output=True,
        )
        assert (r.exit_code, r.output) == (48, "second\n")
        assert proxy.cuts == 1
        assert proxy.calls.count("write_file") == (2 if before else 1)


async def test_background_children_do_not_delay_the_result(backend: Backend, image: Path) -> None:
    """Daemons a command leaves behind on success keep running (services), and neither they nor
    their hold on the output file keep the caller waiting."""
    token = new_token()
    async with sandbox(backend, image) as sb:
        r = await exec_and_wait(
            sb,
            f"sh -c '{LOOP} # {token}' & echo started; exit 3",
            time_budget_sec=60,
            want_output=True,
        )
        assert (r.exit_code, r.output) == (3, "started\n")
        assert r.duration_sec < 10
        assert len(await pids_with(sb, token)) >= 1


async def test_lost_launcher_raises_and_cleans_up(backend: Backend, image: Path) -> None:
    token = new_token()
    async with sandbox(backend, image) as sb:
        with pytest.raises(DetachedCommandLostError):
            # The command kills its launcher (its parent) and lingers on.
            await exec_and_wait(
                sb, f"kill -9 $PPID; sh -c '{LOOP} # {token}'", time_budget_sec=60, tag=token
            )
        assert await pids_with(sb, token) == []
        assert await leftover_dirs(sb, [token]) == []


# -- quoting -----------------------------------------------------------------------

_PAYLOADS = [
    "$(touch /tmp/canary)",
    "`touch /tmp/canary`",
    "'; touch /tmp/canary; '",
    '"; touch /tmp/canary; "',
    "\ntouch /tmp/canary\n",
    "a b\tc",
    "é漢🙂",
    "--help",
    "-",
]
_ALPHABET = list("ab '\"$`\\;|&<>(){}*?!#~=\n\t-é漢🙂")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def nasty(rng: random.Random) -> str:
    """A payload, or up to 10 characters that shells treat specially."""
    if rng.random() < 0.4:
        return rng.choice(_PAYLOADS)
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 10)))


async def test_caller_strings_work_literally_or_are_refused(backend: Backend, image: Path) -> None:
    """Seeded random env values, workdirs and tags (hypothesis covers the same alphabet without
    I/O in test_launcher.py; here one sandbox serves every case, so it runs on any backend)."""
    rng = random.Random(7)
    async with sandbox(backend, image) as sb:
        accepted = 0
        for i in range(30):
            value, dirname = nasty(rng), nasty(rng)
            tag = (nasty(rng) or None) if i % 3 == 0 else None
            workdir = f"/tmp/w{i}/{dirname.replace('/', '_')}"
            # Create the workdir literally first, so that a refusal never means "missing dir".
            await sb.exec(f"mkdir -p -- {shlex.quote(workdir)} 2>/dev/null; true", cwd="/")
            refusable = "\n" in workdir or "\r" in workdir or (tag and not _TAG.fullmatch(tag))
            try:
                r = await exec_and_wait(
                    sb,
                    'printf "%s|" "$V"; pwd',
                    time_budget_sec=60,
                    env={"V": value},
                    workdir=workdir,
                    tag=tag,
                    want_output=True,
                )
            except InvalidArgumentError:
                assert refusable, (value, workdir, tag)
                continue
            assert not refusable, (value, workdir, tag)
            assert r.output == f"{value}|{posixpath.normpath(workdir)}\n"
            assert r.tag == (tag or r.tag)
            accepted += 1
        assert accepted >= 12  # most cases must really run, not just be refused
        assert (await sb.exec("test -e /tmp/canary", cwd="/")).exit_code == 1
