"""``exec_and_wait``: run long commands detached from the RPC stream, never losing the exit code.

The I/O half of detached execution; the scripts and reply parsing live in
:mod:`trio_swe.sandbox._launcher` (sans-IO). Only the :class:`~trio_swe.Sandbox` protocol is used
(``exec``, ``write_file``, ``read_file``), so this works on every backend.

One call makes these RPCs:

1. ``write_file`` of the command file (replay-safe: it replaces);
2. one ``exec`` of the spawn script (``idempotent=True``: an atomic lock in the sandbox turns a
   replay into a no-op), which returns once the launcher holds its lock;
3. one ``exec`` per ``poll_interval_sec`` (120 s by default) of the wait script, from a poller task in the sandbox's
   nursery; each blocks in the sandbox until the launcher exits (``flock``), so the end of the
   command is seen at once;
4. ``read_file`` of the output when ``want_output`` and it did not come inline.

The call returns then. Removing its directory is one more ``exec``, run *after* the call has
returned, as a background task of the sandbox (see :class:`_Cleanups`): it never delays the
caller, and a sandbox closed first makes it moot (the kill takes its files with it).

On budget overrun, outside cancellation or any error, one ``exec`` of the kill script (under a
shielded, time-bounded cancel scope) kills every process of the call and removes its files
before the call ends.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import trio

from .._errors import (
    DetachedCommandLostError,
    InvalidArgumentError,
    SandboxError,
    SandboxNotRunningError,
    SandboxUnreachableError,
)
from ._launcher import (
    DEFAULT_TAIL_BYTES,
    Plan,
    Reply,
    check_budget,
    cleanup_script,
    kill_script,
    make_plan,
    parse_done,
    parse_killed,
    parse_reply,
    spawn_script,
    wait_script,
)
from ._protocol import Sandbox
from ._types import EXIT_TIME_BUDGET_EXCEEDED, ExecResult

#: RPC timeout of the spawn, kill and cleanup scripts (they take milliseconds when healthy).
SCRIPT_TIMEOUT_SEC = 60.0
#: Upper bound of the shielded kill/cleanup after a cancellation or an overrun.
KILL_TIMEOUT_SEC = 30.0
#: Extra RPC timeout of a wait script beyond its in-sandbox wait.
_WAIT_RPC_SLACK_SEC = 30.0
#: With ``want_output``, outputs up to this size come back in the wait RPC's reply itself.
INLINE_OUTPUT_BYTES = 64 * 1024
#: With ``want_output``, the most of an output that comes back by default (its tail, with
#: ``output_truncated`` set): a command printing 100 MB must not cost the client 100s of MB.
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024
#: How often a script whose reply came back without its header is run again (each script is
#: replay-safe); a broken backend or script must not loop forever.
_MALFORMED_RETRIES = 5
#: How often a script whose reply the transport cut (``output_truncated``: a stream cut after
#: the process printed and re-attached loses that output) is run again, with backoff: a
#: transport failure, so retried like one. Under a GOAWAY every 0.6 s on a machine so loaded that
#: every RPC takes longer, the fault matrix saw six such cuts of one script in a row.
_LOST_REPLY_RETRIES = 60
#: How often the command file is written again when the spawn finds it not whole.
_REWRITES = 5
#: The longest in-sandbox wait per RPC allowed; gateways cut streams after a few minutes.
MAX_POLL_INTERVAL_SEC = 300.0
#: Default in-sandbox wait per RPC. The end is seen at once (``flock``) whatever this is; it
#: only sets how often a running command costs a wait RPC, and that is the client's steady
#: state: a wait RPC costs ~2 ms of client CPU over E2B, so 10,000 running commands re-polling
#: every 20 s (the old default) need a whole core, every 120 s a sixth of one
#: (docs/e2b.md, "At scale"). Well below gateways' stream limits (a cut stream is re-attached).
DEFAULT_POLL_INTERVAL_SEC = 120.0
#: Backoff between attempts of an RPC whose sandbox did not answer (full jitter, capped).
_UNREACHABLE_BASE_SEC = 0.1
_UNREACHABLE_CAP_SEC = 5.0
#: A finished call's directory is removed this long after the call returned (sooner when
#: :func:`wait_cleanups` or a call with the same tag asks): a sandbox closed meanwhile (the
#: usual end of an episode's last command) never pays that RPC, and a burst of commands ending
#: together hands out every exit code before their cleanups compete for the connection.
CLEANUP_DELAY_SEC = 1.0

T = TypeVar("T")


async def exec_and_wait(
    sb: Sandbox,
    cmd: str,
    *,
    time_budget_sec: float,
    tag: str | None = None,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    want_output: bool = False,
    poll_interval_sec: float = DEFAULT_POLL_INTERVAL_SEC,
    max_output_bytes: int | None = DEFAULT_MAX_OUTPUT_BYTES,
) -> ExecResult:
    """Run ``cmd`` detached in ``sb`` and wait for it, at most ``time_budget_sec`` seconds.

    The command runs in its own session, started by a launcher that records the exit status in a
    done marker (written to a temporary name, then renamed). No RPC stream stays open longer than
    ``poll_interval_sec``, so gateways that cut long streams cannot lose the exit code, and every
    RPC is safe to replay. The command's end is noticed within milliseconds plus one RPC's latency.

    Args:
        sb: any sandbox.
        cmd: a shell script, run with ``bash`` (``sh`` if the sandbox has no bash), stdin
            ``/dev/null``, stdout and stderr merged. Its status is what ``bash -c cmd`` returns:
            the last command's, ``128 + n`` if killed by signal ``n``.
        time_budget_sec: wall-clock budget of the whole call (``math.inf`` for none). On overrun
            every process of the command is killed (even ``setsid`` daemons that keep the
            ``TRIO_SWE_RUN`` environment variable or the launcher's session) and the result has
            ``exit_code == EXIT_TIME_BUDGET_EXCEEDED`` (-1) and ``reason == "time_budget"``.
        tag: names the call's files (``[A-Za-z0-9_.-]``, at most 64). Default: a fresh uuid.
            Calls with the same tag must not overlap; a tag still in use raises
            :class:`InvalidArgumentError`.
        user: the sandbox user to run as (default: the backend's default user).
        env: extra environment variables of the command.
        workdir: where the command starts (default: the sandbox's workdir).
        want_output: return the full output; otherwise the output is ``""`` on success and the
            last 4 KiB (``output_truncated`` set when longer) on failure or overrun.
        poll_interval_sec: the longest a single wait RPC blocks in the sandbox (the end is
            seen at once whatever it is; it sets how often a running command costs an RPC).
        max_output_bytes: with ``want_output``, a longer output comes back as its last
            ``max_output_bytes`` bytes with ``output_truncated`` set (16 MiB by default; the
            tail is cut in the sandbox, so only what is returned crosses the wire). ``None``:
            the whole output, whatever its size.

    Returns:
        The command's :class:`ExecResult`, with ``tag`` set. A non-zero exit is a result.

    Raises:
        InvalidArgumentError: a bad argument (before anything runs), a missing workdir, or a tag
            in use by another call.
        DetachedCommandLostError: the launcher died without writing its done marker.
        SandboxError: the sandbox failed (unreachable, gone, or the kill did not complete).
        trio.Cancelled: cancelled from outside; the command was killed first.
    """
    budget = check_budget(time_budget_sec, "time_budget_sec")
    poll = check_budget(poll_interval_sec, "poll_interval_sec")
    if max_output_bytes is not None and (
        isinstance(max_output_bytes, bool)
        or not isinstance(max_output_bytes, int)
        or max_output_bytes < 0
    ):
        raise InvalidArgumentError(
            f"max_output_bytes must be a non-negative int or None, got {max_output_bytes!r}"
        )
    if not 0 < poll <= MAX_POLL_INTERVAL_SEC:
        raise InvalidArgumentError(
            f"poll_interval_sec must be in (0, {MAX_POLL_INTERVAL_SEC:g}], got {poll_interval_sec!r}"
        )
    plan = make_plan(
        cmd, workdir=workdir if workdir is not None else sb.workdir, tag=tag, user=user, env=env
    )
    # A finished call with this tag may still have its cleanup pending: let it finish first,
    # or it would remove the new call's files.
    await _Cleanups.of(sb).settle(plan.dir)
    call = _Call(sb, plan, want_output=want_output, poll_sec=poll, max_output=max_output_bytes)
    return await call.run(budget)


async def wait_cleanups(sb: Sandbox) -> None:
    """Return once every finished ``exec_and_wait`` call in ``sb`` has removed its files.

    A call returns before its directory is removed (that RPC runs as a background task of the
    sandbox, shortly after); closing the sandbox makes pending removals moot. This runs those still
    pending now (one that failed before is tried once more) and waits for them, for callers that
    need the sandbox's ``/tmp`` clean while it lives (tests do). Removal is best effort: one that
    fails again stays pending, and the sandbox's kill removes its files.
    """
    await _Cleanups.of(sb).settle(None)


class _Removal:
    """One directory's pending removal. ``now`` asks its next attempt to run at once; ``done``
    is set when that attempt has ended (then both are renewed if it failed)."""

    __slots__ = ("done", "now")

    def __init__(self) -> None:
        self.now = trio.Event()
        self.done = trio.Event()

    def failed(self) -> None:
        """The attempt failed: tell its waiters, and wait to be asked again."""
        ended = self.done
        self.now, self.done = trio.Event(), trio.Event()
        ended.set()


class _Cleanups:
    """The deferred directory removals of one sandbox, by sandbox id (so wrappers of a sandbox
    share them). An entry lives while removals are pending, no longer.

    A removal that fails (the sandbox unreachable past ``KILL_TIMEOUT_SEC``, ``rm`` refused)
    stays pending, parked in the sandbox's nursery: :func:`wait_cleanups` and the tag's next
    call run it again, and the sandbox's close ends it (its kill removes the files). Without
    that, a single failure left the tag "in use" for the sandbox's whole life."""

    _by_sandbox: dict[str, _Cleanups] = {}

    def __init__(self, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self.pending: dict[str, _Removal] = {}

    @classmethod
    def of(cls, sb: Sandbox) -> _Cleanups:
        table = cls._by_sandbox.get(sb.id)
        return table if table is not None else cls(sb.id)

    def defer(self, sb: Sandbox, directory: str, remove: Callable[[], Awaitable[bool]]) -> None:
        """Run ``remove`` in the background after ``CLEANUP_DELAY_SEC`` (or when asked); run it
        again when asked while it returns False.

        Not shielded: the sandbox closing cancels it, and its kill removes the files anyway.
        """
        if directory in self.pending:
            return  # already scheduled (a replayed finish): one removal suffices
        removal = _Removal()

        async def task() -> None:
            try:
                with trio.move_on_after(CLEANUP_DELAY_SEC):
                    await removal.now.wait()
                while True:
                    # The sandbox closing cancels this task: then no RPC may begin (a backend
                    # may shield the start of an exec), the kill makes it moot.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    if await remove():
                        return
                    removal.failed()
                    await removal.now.wait()
            finally:
                self._forget(directory, removal)

        self.pending[directory] = removal
        self._by_sandbox[self.sandbox_id] = self
        try:
            sb.start_background(task)
        except SandboxNotRunningError:  # the sandbox is closing: its kill takes the files
            self._forget(directory, removal)

    def _forget(self, directory: str, removal: _Removal) -> None:
        if self.pending.get(directory) is removal:
            del self.pending[directory]
        if not self.pending and self._by_sandbox.get(self.sandbox_id) is self:
            del self._by_sandbox[self.sandbox_id]
        removal.done.set()

    async def settle(self, directory: str | None) -> None:
        """Run the pending removal of ``directory`` (every one when None) now, or once more if
        it failed before, and wait for that attempt."""
        if directory is not None:
            removal = self.pending.get(directory)
            removals = [removal] if removal is not None else []
        else:
            removals = list(self.pending.values())
        waits = [(r.now, r.done) for r in removals]
        for now, _ in waits:
            now.set()
        for _, done in waits:
            await done.wait()


class _Mailbox:
    """Hands the poller task's result to the waiting caller."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.reply: Reply | None = None
        self.error: Exception | None = None


class _Call:
    """One ``exec_and_wait`` call: its plan and the state needed to clean up after it."""

    def __init__(
        self,
        sb: Sandbox,
        plan: Plan,
        *,
        want_output: bool,
        poll_sec: float,
        max_output: int | None = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self.sb = sb
        self.plan = plan
        self.want_output = want_output
        self.max_output = max_output
        self.poll_sec = poll_sec
        self.started = trio.current_time()
        self.touched = False  # an RPC that may have created files was sent
        self.kill_error: BaseException | None = None
        self.malformed_replies = 0
        self.unreachable_retries = 0

    async def run(self, budget: float) -> ExecResult:
        kill_reply: Reply | None = None
        with trio.move_on_after(budget) as budget_scope:
            try:
                await self._spawn()
                reply = await self._wait()
            except BaseException:
                # Overrun (our own Cancelled), outside cancellation, or an error: kill first.
                overrun = budget_scope.cancel_called
                kill_reply = await self._kill(keep_files=overrun and self.want_output)
                raise
        if budget_scope.cancelled_caught:
            return await self._overrun(kill_reply)
        return await self._finish(reply)

    # -- steps ------------------------------------------------------------------------------
    async def _spawn(self) -> None:
        plan = self.plan
        self.touched = True
        for _ in range(_REWRITES):
            # No ``mode``: on E2B that costs a chmod RPC; the spawn script makes the file 0600.
            await self._persist(
                lambda: self.sb.write_file(plan.cmd_path, plan.command_file, user=plan.user)
            )
            reply = await self._run_script(spawn_script(plan), "spawn", SCRIPT_TIMEOUT_SEC)
            if reply.state != "nocmd":
                break
            # A late duplicate of the write cut the file short (its first attempt ran in the
            # server after the retry): write it again, replay-safe like every step here.
        if reply.state in ("started", "replay"):
            return
        if reply.state == "busy":
            raise InvalidArgumentError(
                f"tag {plan.tag!r} is in use by another exec_and_wait call in sandbox {self.sb.id}"
            )
        if reply.state == "noworkdir":
            raise InvalidArgumentError(
                f"workdir {plan.workdir!r} does not exist or cannot be entered by "
                f"user {plan.user or '(default)'} in sandbox {self.sb.id}"
            )
        if reply.state == "nocmd":
            raise SandboxError(
                f"detached spawn of {plan.tag!r}: the command file {plan.cmd_path!r} was not "
                f"whole after {_REWRITES} writes in sandbox {self.sb.id}"
            )
        if reply.state == "nosetsid":
            raise SandboxError(f"sandbox {self.sb.id} has no setsid(1); install util-linux")
        raise SandboxError(
            f"detached spawn of {plan.tag!r} failed ({reply.state}): {reply.tail[-500:]!r}"
        )

    async def _wait(self) -> Reply:
        """Run the poller in the sandbox's nursery and wait for its verdict."""
        box = _Mailbox()
        scope = trio.CancelScope()

        async def poller() -> None:
            with scope:
                try:
                    box.reply = await self._poll()
                except Exception as exc:  # handed to the caller, never to the sandbox's nursery
                    box.error = exc
                finally:
                    box.event.set()

        self.sb.start_background(poller)  # SandboxNotRunningError if the sandbox is closing
        try:
            await box.event.wait()
        finally:
            scope.cancel()
        if box.error is not None:
            raise box.error
        if box.reply is None:
            raise SandboxNotRunningError(
                f"sandbox {self.sb.id} closed while waiting for {self.plan.tag!r}"
            )
        return box.reply

    async def _poll(self) -> Reply:
        """Long-poll the launcher until it is done; raise if it is lost."""
        plan = self.plan
        # With want_output, an output up to INLINE_OUTPUT_BYTES comes back in the same reply
        # (one RPC fewer on the path from the command's end to the caller's wake-up).
        script = wait_script(
            plan,
            wait_sec=self.poll_sec,
            tail_bytes=INLINE_OUTPUT_BYTES if self.want_output else DEFAULT_TAIL_BYTES,
            tail_when="always" if self.want_output else "nonzero",
        )
        suspicious = 0
        backoff = 0.05
        while True:
            t0 = trio.current_time()
            try:
                reply = await self._run_script(
                    script, "wait", self.poll_sec + _WAIT_RPC_SLACK_SEC, retry_timeout=False
                )
            except _RpcTimeout:
                continue  # the RPC itself overran; the command may still run: ask again
            if reply.state == "done":
                return reply
            if reply.state == "running":
                # A "running" reply normally comes after the full in-sandbox wait. If it came
                # back early (flock failing?), back off so a broken wait cannot flood the sandbox.
                if trio.current_time() - t0 < self.poll_sec / 2:
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                else:
                    backoff = 0.05
                continue
            # lost / unspawned / gone: look once more before declaring the command lost.
            suspicious += 1
            if suspicious >= 2:
                raise DetachedCommandLostError(
                    f"detached command {plan.tag!r} in sandbox {self.sb.id} is {reply.state}: "
                    "its launcher ended without writing the done marker"
                )

    async def _finish(self, reply: Reply) -> ExecResult:
        status, size = parse_done(reply, nonce=self.plan.nonce)
        try:
            output, truncated = await self._output(reply.tail, status, size)
        finally:
            self._cleanup_later()
        return ExecResult(
            exit_code=status,
            output=output,
            reason="exit",
            duration_sec=trio.current_time() - self.started,
            output_truncated=truncated,
            tag=self.plan.tag,
        )

    async def _overrun(self, kill_reply: Reply | None) -> ExecResult:
        if kill_reply is None:
            raise SandboxError(
                f"detached command {self.plan.tag!r} overran its budget and could not be killed "
                f"in sandbox {self.sb.id}"
            ) from self.kill_error
        if kill_reply.state == "done":  # it finished just as the budget ran out
            return await self._finish(kill_reply)
        tail, size = "", 0
        if kill_reply.state == "killed":
            _, size = parse_killed(kill_reply)
            tail = kill_reply.tail
        try:
            # Size 0: nothing to read, and no file when the budget ran out before the spawn.
            if self.want_output and kill_reply.state == "killed" and size:
                output, truncated = await self._output("", 0, size, force_full=True)
            else:
                output, truncated = tail, size > DEFAULT_TAIL_BYTES
        finally:
            if self.want_output:
                self._cleanup_later()
        return ExecResult(
            exit_code=EXIT_TIME_BUDGET_EXCEEDED,
            output=output,
            reason="time_budget",
            duration_sec=trio.current_time() - self.started,
            output_truncated=truncated,
            tag=self.plan.tag,
        )

    async def _output(
        self, tail: str, status: int, size: int, *, force_full: bool = False
    ) -> tuple[str, bool]:
        """``(output, truncated)`` per the want_output rules."""
        cap = self.max_output
        if self.want_output and not force_full and size <= INLINE_OUTPUT_BYTES:
            if cap is not None and len(tail) > cap:  # a cap below the inline size
                tail = tail.encode()[-cap:].decode("utf-8", errors="replace")
                return tail, True
            return tail, False  # the whole output came inline
        if self.want_output or force_full:
            path, cut = self.plan.out_path, cap is not None and size > cap
            if cut:
                assert cap is not None
                path = await self._tail_file(cap)
            # Our own regular file: read whole and unchecked (no Stat round trip on E2B).
            data = await self._persist(
                lambda: self.sb.read_file(path, user=self.plan.user, max_bytes=None, special=True)
            )
            if cap is not None and len(data) > cap:  # grew after its size was reported
                data, cut = data[-cap:], True
            return data.decode("utf-8", errors="replace"), cut
        if status == 0:
            return "", False
        return tail, size > DEFAULT_TAIL_BYTES

    async def _tail_file(self, cap: int) -> str:
        """Copy the output's last ``cap`` bytes to a file of the call's own; its path."""
        out = self.plan.out_path
        tail_path = f"{out}.tail"
        q_out, q_tail = shlex.quote(out), shlex.quote(tail_path)
        result = await self._persist(
            lambda: self.sb.exec(
                f"tail -c {int(cap)} -- {q_out} > {q_tail}",
                user=self.plan.user,
                cwd="/",
                timeout=SCRIPT_TIMEOUT_SEC,
                idempotent=True,
            )
        )
        if not result.ok:
            raise SandboxError(
                f"detached command {self.plan.tag!r}: cutting its output to {cap} bytes failed "
                f"(exit {result.exit_code}): {result.output[-500:]!r}"
            )
        return tail_path

    # -- cleanup ----------------------------------------------------------------------------
    async def _kill(self, *, keep_files: bool) -> Reply | None:
        """Kill the call's processes and (unless ``keep_files``) remove its directory.

        Shielded from outside cancellation and bounded by ``KILL_TIMEOUT_SEC``. Returns the kill
        script's reply, or None (and records ``kill_error``) when it could not run.
        """
        if not self.touched:
            return None if self.kill_error else Reply(state="gone", fields=("0",), tail="")
        tail_bytes = INLINE_OUTPUT_BYTES if self.want_output else DEFAULT_TAIL_BYTES
        script = kill_script(self.plan, remove=not keep_files, tail_bytes=tail_bytes)
        with trio.CancelScope(shield=True, deadline=trio.current_time() + KILL_TIMEOUT_SEC):
            try:
                return await self._run_script(script, "kill", SCRIPT_TIMEOUT_SEC)
            except Exception as exc:
                self.kill_error = exc
                return None
        self.kill_error = SandboxError(
            f"killing detached command {self.plan.tag!r} took over {KILL_TIMEOUT_SEC:g} s"
        )
        return None

    def _cleanup_later(self) -> None:
        """Remove the call's directory after the call has returned (see :class:`_Cleanups`)."""
        _Cleanups.of(self.sb).defer(self.sb, self.plan.dir, self._cleanup)

    async def _cleanup(self) -> bool:
        """Remove the call's directory; bounded. True once it is gone (the result is known
        either way: a failure only leaves the removal pending)."""
        with trio.move_on_after(KILL_TIMEOUT_SEC):
            try:
                result = await self._persist(
                    lambda: self.sb.exec(
                        cleanup_script(self.plan),
                        user=self.plan.user,
                        cwd="/",
                        timeout=SCRIPT_TIMEOUT_SEC,
                        idempotent=True,
                    )
                )
            except Exception:
                # In the background: nothing may escape into the sandbox's block. A sandbox
                # being killed under the RPC refuses it in backend-specific ways (a cwd gone...),
                # and its kill removes the directory anyway.
                return False
            return result.ok
        return False

    async def _persist(self, rpc: Callable[[], Awaitable[T]]) -> T:
        """Run a replay-safe RPC until it answers, however many attempts that takes.

        Once anything may have been spawned, giving up on an unreachable sandbox would lose a
        command that runs: so an RPC is asked again (with backoff) until it answers, the
        sandbox is provably gone (:class:`SandboxNotRunningError`, raised), or the enclosing
        budget or cancel scope ends the call. Only transport failures are retried.
        """
        retry = 0
        while True:
            try:
                return await rpc()
            except SandboxUnreachableError:
                self.unreachable_retries += 1
                await _backoff(retry)
                retry += 1

    async def _run_script(
        self, script: str, step: str, timeout: float, *, retry_timeout: bool = True
    ) -> Reply:
        """Run one of our (replay-safe) scripts and parse its reply.

        Transport failures are retried by :meth:`_persist`. A reply without a header or marked
        truncated (output lost by the transport) is asked for again: every script is safe to
        run twice. A timed-out RPC raises :class:`_RpcTimeout` when ``retry_timeout`` is False;
        otherwise it is run again too (the budget bounds the call).
        """
        malformed = lost = 0
        while True:
            result = await self._persist(
                lambda: self.sb.exec(
                    script, user=self.plan.user, cwd="/", timeout=timeout, idempotent=True
                )
            )
            if result.reason == "timeout":
                if not retry_timeout:
                    raise _RpcTimeout
                continue  # the sandbox was too slow or the stream kept failing: ask again
            if result.exit_code != 0:
                raise SandboxError(
                    f"detached {step} script of {self.plan.tag!r} failed in sandbox {self.sb.id} "
                    f"(exit {result.exit_code}): {result.output[-500:]!r}"
                )
            if result.output_truncated and lost < _LOST_REPLY_RETRIES:
                # Our replies are small: "truncated" means the transport lost part of it.
                self.malformed_replies += 1
                if lost >= 2:  # one or two cuts are common: ask again at once, then back off
                    await _backoff(lost - 2)
                lost += 1
                continue
            try:
                return parse_reply(result.output)
            except SandboxError:
                if malformed >= _MALFORMED_RETRIES:
                    raise
                self.malformed_replies += 1
                malformed += 1


async def _backoff(retry: int) -> None:
    """Full jitter, doubling from ``_UNREACHABLE_BASE_SEC`` up to ``_UNREACHABLE_CAP_SEC``."""
    ceiling = min(_UNREACHABLE_CAP_SEC, _UNREACHABLE_BASE_SEC * 2.0 ** min(retry, 30))
    await trio.sleep(random.uniform(ceiling / 2, ceiling))


class _RpcTimeout(Exception):
    """A wait RPC overran its own timeout (the poller simply asks again)."""
