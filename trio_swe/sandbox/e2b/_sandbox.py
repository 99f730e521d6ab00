"""``E2BSandbox``: the :class:`~trio_swe.sandbox.Sandbox` protocol over envd.

``exec`` runs one ``process.Process/Start`` server stream with a client-chosen *tag*. The tag is
what makes the stream survivable: when it is cut (RST_STREAM, GOAWAY, TCP close, a silent stream,
a body without end event), the command keeps running in the sandbox (envd does not kill it), and
``process.Process/Connect`` by tag re-attaches and gets the rest of the output and the exit code
(envd keeps it 30 s after exit). A ``Start`` is sent again only when the command provably did not
start: the request never reached the server, or the server answered with an error and then knew
no process by our tag; or when the call is idempotent and envd no longer knows its process (then
it runs again from the start, and only that run's output is returned). Output emitted while
detached is lost (envd does not replay), so a re-attached result is marked ``output_truncated``.
"""

from __future__ import annotations

import math
import secrets
import shlex
import signal as _signal
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec
import trio

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxNotAFileError,
    SandboxNotRunningError,
    SandboxPermissionError,
    SandboxUnreachableError,
    TrioSweError,
)
from .. import _launcher
from .._base import SandboxBase
from .._bounds import file_time_bound
from .._types import (
    DEFAULT_FILE_TIMEOUT_SEC,
    DEFAULT_READ_MAX_BYTES,
    ExecResult,
    SandboxSpec,
    SandboxStatistics,
)
from .._validate import check_abs_path, check_command, check_env, check_read_args, check_user
from . import _connect, _wire
from ._envd import DeadlinePassed, EnvdClient
from ._rest import RestClient
from ._retry import RetryStats, classify

#: Seconds past ``timeout`` before the client gives up on envd's own deadline kill.
_DEADLINE_GRACE: Final = 1.0
#: Times a settle script is asked again when its reply was lost with its stream.
_SETTLE_TRIES: Final = 8
DEFAULT_MAX_OUTPUT_BYTES: Final = 1 << 20
#: Connect codes with which envd refuses a request it understood: not worth a retry.
_REFUSALS: Final = frozenset(
    {"invalid_argument", "permission_denied", "unauthenticated", "failed_precondition"}
)

_SIGNALS: Final[dict[str, int]] = {
    (_signal.strsignal(s) or "").lower(): int(s) for s in _signal.Signals
}


def signal_number(status: str) -> int | None:
    """The signal in envd's status ``"signal: killed"`` (Go's names match libc's strsignal)."""
    if not status.startswith("signal: "):
        return None
    name = status.removeprefix("signal: ").strip().lower()
    if name.startswith("signal "):
        name = name.removeprefix("signal ")
        return int(name) if name.isascii() and name.isdigit() else None
    return _SIGNALS.get(name)


class _Output:
    """Merged stdout+stderr in arrival order, keeping the last ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.buf = bytearray()
        self.limit = limit
        self.truncated = False

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > 2 * self.limit:
            del self.buf[: len(self.buf) - self.limit]
            self.truncated = True

    def clear(self) -> None:
        """Forget everything so far (a new run of the command starts)."""
        self.buf.clear()
        self.truncated = False

    def text(self) -> str:
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]
            self.truncated = True
        return self.buf.decode("utf-8", "replace")


class _Run:
    """One exec call's state across its attempts.

    ``nonce`` is set for a recorded call (see :meth:`E2BSandbox._settle`); ``tag`` changes only
    when a fenced Start is replaced by a new one under a new nonce, or an idempotent call whose
    process envd forgot runs again.
    """

    __slots__ = ("end", "nonce", "nonces", "pid", "reattached", "tag", "user")

    def __init__(self, tag: str, nonce: str | None, user: str) -> None:
        self.pid: int | None = None
        self.end: _wire.EndEvent | None = None
        self.reattached = False
        self.tag = tag
        self.nonce = nonce
        self.user = user
        self.nonces: list[str] = []  # every nonce whose record was claimed or fenced


class _Deadline(Exception):
    """envd killed the command at ``Connect-Timeout-Ms`` and said so in a trailer."""


class E2BSandboxStatistics(SandboxStatistics, frozen=True, kw_only=True):
    """An E2B sandbox's counters.

    Attributes:
        rpcs: envd RPCs sent (every attempt counts).
        retries: envd calls of this sandbox retried after a transient failure (an idempotent
            exec run again because envd forgot its process counts too).
        reattaches: command streams re-attached (``Connect``) after a cut.
        resets: connection pool resets after protocol errors.
        settles: plain exec records consulted after envd knew no process by a call's tag.
        killed: ``kill`` ran.
    """

    rpcs: int
    retries: int
    reattaches: int
    resets: int
    settles: int
    killed: bool


class E2BSandbox(SandboxBase):
    """One E2B sandbox. Get it from ``open_sandbox(E2BBackend(...), template)``."""

    def __init__(
        self,
        *,
        sandbox_id: str,
        spec: SandboxSpec,
        nursery: trio.Nursery,
        envd: EnvdClient,
        rest: RestClient | None,
        stats: RetryStats,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        on_killed: Any = None,
    ) -> None:
        super().__init__(
            sandbox_id=sandbox_id,
            workdir=spec.workdir,
            nursery=nursery,
            reattaches=0,
            retries=0,
            settles=0,
        )
        self._spec = spec
        self._envd = envd
        self._rest = rest
        self._stats = stats
        self._max_output = max_output_bytes
        self._on_killed = on_killed
        self._killed = False
        # Per user: nonces of finished calls whose records a later wrapper removes.
        self._finished_records: dict[str, list[str]] = {}

    def _check_alive(self) -> None:
        if self._killed:
            raise SandboxNotRunningError(f"sandbox {self._id} was killed")

    async def _gone_verdict(self, bound: float = 10.0) -> bool | None:
        """Is the sandbox provably gone? True: the edge or the REST API says so; False: envd
        answered; None: nobody could tell (each probe bounded by ``bound`` seconds)."""
        with trio.move_on_after(bound):
            try:
                return not await self._envd.health()
            except Exception:
                pass
        if self._rest is not None:
            with trio.move_on_after(bound):
                try:
                    return not await self._rest.exists(self._id)
                except Exception:
                    pass
        return None

    async def _infra_error(self, exc: BaseException, what: str) -> SandboxError:
        """Tell a dead sandbox from an unreachable one: the health probe, then the REST API."""
        if isinstance(exc, _connect.ConnectError) and _gone(exc):
            return SandboxNotRunningError(f"sandbox {self._id} is gone ({what}): {exc}")
        if await self._gone_verdict():
            return SandboxNotRunningError(f"sandbox {self._id} is gone ({what}): {exc}")
        return SandboxUnreachableError(f"sandbox {self._id}: {what} failed: {exc!r}")

    # --- exec ----------------------------------------------------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60.0,
        idempotent: bool = False,
    ) -> ExecResult:
        """Run ``cmd`` with ``/bin/sh -c`` and wait for it (see the module docstring)."""
        if not isinstance(cmd, str):
            raise InvalidArgumentError(f"cmd must be a str, got {type(cmd).__name__}")
        check_command(cmd)
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise InvalidArgumentError(f"timeout must be a positive number or None, got {timeout}")
        user = check_user(user or "root")
        envs = {**self._spec.env, **check_env(env)}
        cwd = check_abs_path(cwd or self._spec.workdir, what="cwd")
        self._check_alive()
        # The Start goes out without waiting (no checkpoint before it): a caller cancelled
        # already sends nothing.
        await trio.lowlevel.checkpoint_if_cancelled()
        self._counts["execs"] += 1
        # A non-idempotent command runs behind a wrapper that records its end (see
        # ``_settle``); an idempotent one can be started again, so it runs bare.
        nonce = secrets.token_hex(16)
        run = _Run(f"trio-swe-{nonce}", None if idempotent else nonce, user)

        def make_start(timeout_ms: int | None) -> _wire.StartRequest:
            if run.nonce is None:
                args = ["-c", cmd]
            else:
                clean = self._clean_batch(user)
                args = [
                    "-c",
                    _launcher.exec_record_wrapper(run.nonce, user, clean=clean),
                    "/bin/sh",
                    cmd,
                ]
            return _wire.StartRequest(
                process=_wire.ProcessConfig(cmd="/bin/sh", args=args, envs=envs, cwd=cwd),
                tag=run.tag,
                stdin=False,
            )

        # envd kills the process when Connect-Timeout-Ms elapses: exactly the semantics of
        # ``timeout``. The client-side deadline is the backstop if envd does not answer: it
        # bounds every attempt, retry, re-attach and shielded wait together.
        timeout_ms = None if timeout is None else max(1, math.ceil(timeout * 1000))
        out = _Output(self._max_output)
        t0 = trio.current_time()
        not_after = math.inf if timeout is None else t0 + timeout + _DEADLINE_GRACE
        end: _wire.EndEvent | None = None
        timed_out = False
        envd_deadline = False
        try:
            end = await self._drive(make_start, user, timeout_ms, out, run, idempotent, not_after)
        except _Deadline:
            timed_out = envd_deadline = True
        except BaseException as exc:
            # Cancelled from outside (or failed oddly): envd does not kill a process whose
            # stream goes away, so kill it by tag before letting go. Our own deadline is not
            # an exception (``_drive`` returns None): it kills after the result is in the
            # caller's hands (below).
            if not isinstance(exc, SandboxError):
                await self._kill_tag(run.tag)
            raise
        finally:
            self._records_done(run)
        elapsed = trio.current_time() - t0
        if end is None and not timed_out:
            timed_out = True  # our backstop fired
        if timed_out or (
            end is not None
            and timeout is not None
            and not end.exited
            and elapsed >= timeout * 0.999
        ):
            if envd_deadline:
                # envd answered (and killed it): one quick kill by tag as well, within the grace.
                await self._kill_tag(run.tag, bound=max(0.25, not_after - trio.current_time()))
            else:
                self._kill_in_background(run.tag)
            return ExecResult(
                exit_code=-1,
                output=out.text(),
                reason="timeout",
                duration_sec=elapsed,
                output_truncated=out.truncated or run.reattached,
            )
        assert end is not None
        if not end.exited:
            sig = signal_number(end.status)
            # A process killed by a signal we did not send: was it the sandbox dying?
            bound = 10.0 if timeout is None else max(0.25, not_after - trio.current_time())
            if await self._gone_verdict(bound):
                raise SandboxNotRunningError(f"sandbox {self._id} died while a command ran")
            return ExecResult(
                exit_code=128 + sig if sig else (end.exit_code if end.exit_code > 0 else -1),
                output=out.text(),
                reason="signal",
                duration_sec=elapsed,
                output_truncated=out.truncated or run.reattached,
            )
        return ExecResult(
            exit_code=end.exit_code,
            output=out.text(),
            reason="exit",
            duration_sec=elapsed,
            output_truncated=out.truncated or run.reattached,
        )

    async def _drive(
        self,
        make_start: Callable[[int | None], _wire.StartRequest],
        user: str,
        timeout_ms: int | None,
        out: _Output,
        run: _Run,
        idempotent: bool,
        not_after: float = math.inf,
    ) -> _wire.EndEvent | None:
        """Start the command, re-attaching by tag through stream failures; return its end, or
        None once ``not_after`` passed without it.

        ``not_after`` (the caller's deadline over all attempts) bounds every wait: the streams'
        waits take it as a deadline (no cancel scope per exec: one cost more than the HTTP/2
        work of a short command), and what follows a failure (the verdict probes, the backoff)
        runs in a cancel scope with it.
        """
        mode = "start"  # "start": send Start; "attach": Connect by tag; "probe": is it there?
        start = make_start(timeout_ms)
        tag = run.tag
        probe_is_proof = False
        retry_index = 0  # consecutive failures without progress
        attempts = 0
        history: list[str] = []  # "<mode>:<failure kind>", for the error message
        while True:
            if run.end is not None:
                return run.end  # read from the call's record (``_settle``)
            if run.tag != tag:
                # The record of the last Start was fenced (it never runs), or an idempotent
                # call's process was lost: a new Start under a new tag, with what is left of
                # the timeout (envd's kill deadline).
                tag = run.tag
                if timeout_ms is not None:
                    left = not_after - _DEADLINE_GRACE - trio.current_time()
                    timeout_ms = max(1, math.ceil(left * 1000))
                start = make_start(timeout_ms)
            self._stats.attempts += 1
            attempts += 1
            progressed = False
            try:
                msg: msgspec.Struct
                if mode == "start":
                    method, msg, tmo = "Start", start, timeout_ms
                else:
                    method = "Connect"
                    msg = _wire.ConnectRequest(process=_wire.ProcessSelector(tag=tag))
                    tmo = None  # a deadline on Connect would not kill anything; ours suffices
                starting = mode == "start"
                async with self._envd.open_stream(
                    method, msg, user=user, timeout_ms=tmo, shield=starting, not_after=not_after
                ) as s:
                    # Until envd says "started" (or the stream fails), cancellation waits (a
                    # shielded wait): then the caller's kill-by-tag finds the process. envd
                    # sends it with the response headers, so it is watched as they are (not
                    # for a long keepalive's 2.5x), and bounded by the caller's own deadline.
                    ev = await s.next_event(
                        not_after,
                        shield=starting,
                        idle=self._envd.start_timeout if starting else None,
                    )
                    while ev is not None:
                        progressed = True
                        if ev.data is not None:
                            out.add(ev.data.stdout or ev.data.stderr or ev.data.pty or b"")
                        elif ev.start is not None:
                            run.pid = ev.start.pid
                            if run.nonce is not None and run.nonce not in run.nonces:
                                run.nonces.append(run.nonce)
                            if mode == "probe":
                                run.reattached = True
                            mode = "attach"
                        elif ev.end is not None:
                            run.end = ev.end
                        ev = await s.next_event(not_after)
                if run.end is None:
                    raise _connect.ProtocolError("stream ended without an end event")
                return run.end
            except DeadlinePassed:
                return run.end  # None unless the exit code arrived just before
            except Exception as exc:
                if run.end is not None:
                    return run.end  # the exit code arrived; what broke afterwards is moot
                with trio.move_on_at(not_after):
                    mode, probe_is_proof, retry_index = await self._after_failure(
                        exc,
                        mode,
                        method,
                        probe_is_proof,
                        retry_index,
                        attempts,
                        history,
                        progressed=progressed,
                        idempotent=idempotent,
                        run=run,
                        out=out,
                        timeout_ms=timeout_ms,
                    )
                    continue
                return None  # our deadline passed while probing or backing off

    async def _after_failure(
        self,
        exc: Exception,
        mode: str,
        method: str,
        probe_is_proof: bool,
        retry_index: int,
        attempts: int,
        history: list[str],
        *,
        progressed: bool,
        idempotent: bool,
        run: _Run,
        out: _Output,
        timeout_ms: int | None,
    ) -> tuple[str, bool, int]:
        """What a failed attempt of :meth:`_drive` means: raise, or back off and return the
        next ``(mode, probe_is_proof, retry_index)``."""
        policy = self._envd.policy
        failure = classify(exc)
        self._stats.by_kind[failure.kind] = self._stats.by_kind.get(failure.kind, 0) + 1
        history.append(f"{mode}:{failure.kind}{'+' if progressed else ''}")
        if isinstance(exc, _connect.ConnectError):
            if _gone(exc):
                raise await self._infra_error(exc, method) from exc
            if exc.code == "deadline_exceeded" and timeout_ms is not None:
                raise _Deadline() from exc
            if exc.code == "not_found" and mode in ("probe", "attach") and run.nonce is not None:
                # envd knows no process by our tag: the call's record tells what happened.
                mode = await self._settle(exc, mode, run)
            elif exc.code == "not_found" and mode == "attach" and idempotent:
                # It ran and ended long enough ago for envd to forget it (its retention): the
                # exit code is gone. Replay-safe, so it runs again from the start, under a new
                # tag, keeping none of the lost run's output (a retry).
                new = secrets.token_hex(16)
                run.tag = f"trio-swe-{new}"
                run.pid = None
                run.reattached = False
                out.clear()
                mode = "start"
            elif exc.code == "not_found" and mode in ("probe", "attach"):
                if mode == "attach":
                    # Not replay-safe: never run twice (such a call has a record, above).
                    raise await self._infra_error(exc, "re-attach (process lost)") from exc
                # No process carries our tag: the Start did not run it.
                if not (probe_is_proof or idempotent):
                    raise SandboxUnreachableError(
                        f"sandbox {self._id}: a Start may or may not have reached envd "
                        f"and the command is not idempotent: {exc}"
                    ) from exc
                mode = "start"
            elif mode == "start" and _tag_taken(exc):
                # An earlier Start of ours arrived after all (the probe raced it): the
                # command runs once already; attach to it instead.
                mode = "attach"
                run.reattached = True
            elif exc.code in _REFUSALS:
                # envd itself refused (bad cwd, unknown user...): not a transport fault,
                # typed as every backend types it.
                what = f"sandbox {self._id}: envd refused {method}"
                raise _refusal(exc, what) or SandboxError(f"{what}: {exc}") from exc
            elif not failure.transient:
                raise await self._infra_error(exc, method) from exc
        elif not failure.transient:
            raise await self._infra_error(exc, method) from exc
        if mode == "start" and failure.transient:
            if run.pid is not None:
                mode = "attach"
            elif failure.reached:
                mode = "probe"
                # A complete error answer means the server is done with that request:
                # if it then knows no process by our tag, none will appear.
                probe_is_proof = isinstance(exc, _connect.ConnectError)
        if run.end is not None:
            return mode, probe_is_proof, retry_index  # the record had it: no backoff
        if mode != "start":
            self._counts["reattaches"] += 1
            run.reattached = run.reattached or run.pid is not None
        # A stream that delivered events made progress: a long command may be re-attached
        # many times, only consecutive fruitless attempts count (and an overall cap).
        retry_index = 1 if progressed else retry_index + 1
        if retry_index >= policy.max_attempts or attempts >= 20 * policy.max_attempts:
            self._stats.gave_up += 1
            raise await self._infra_error(
                exc, f"{method} after {attempts} attempts ({', '.join(history[-12:])})"
            )
        self._stats.retries += 1
        self._counts["retries"] += 1
        await trio.sleep(policy.delay(failure, retry_index - 1, self._envd.rng))
        return mode, probe_is_proof, retry_index

    async def _settle(self, exc: _connect.ConnectError, mode: str, run: _Run) -> str:
        """envd knows no process by the call's tag: ask its record (one replay-safe exec).

        Returns the next mode: ``"start"`` under a new nonce and tag when the record was fenced
        (the earlier Start never runs), ``"attach"`` while the command runs; sets ``run.end``
        from the done marker when it has ended. Raises when nobody can tell.
        """
        assert run.nonce is not None
        nonce = run.nonce
        self._counts["settles"] += 1
        script = _launcher.exec_settle_script(nonce, run.user)
        for attempt in range(_SETTLE_TRIES):
            res = await self.exec(script, user=run.user, cwd="/", timeout=30, idempotent=True)
            try:
                state, status = _launcher.parse_exec_settle(res.output, nonce=nonce)
                break
            except SandboxError:
                # The settle's own stream may be cut and its reply lost (flagged truncated):
                # it is replay-safe, so ask again.
                if not res.output_truncated or attempt == _SETTLE_TRIES - 1:
                    raise
        if state == "fenced":
            # Not run, and now never will be: a new Start, under a new nonce.
            new = secrets.token_hex(16)
            run.nonce, run.tag = new, f"trio-swe-{new}"
            return "start"
        if nonce not in run.nonces:
            run.nonces.append(nonce)  # claimed: its record may be removed once we are done
        if state == "done":
            assert status is not None
            # Its output went with the stream (envd does not replay it): say so.
            run.reattached = True
            run.end = _wire.EndEvent(exit_code=status, exited=True, status=f"exit status {status}")
            return mode
        if state == "running":
            run.reattached = True  # output before the (re-)attach is lost
            return "attach"
        what = (
            "ran, but its wrapper was killed before it recorded the exit status"
            if state == "lost"
            else "may or may not have run: its record cannot be written"
        )
        raise SandboxUnreachableError(
            f"sandbox {self._id}: the command {what}, and envd knows no process by its tag: {exc}"
        ) from exc

    def _clean_batch(self, user: str) -> tuple[str, ...]:
        """Finished calls' records for the next wrapper of ``user`` to remove, once enough."""
        done = self._finished_records.get(user)
        if not done or len(done) < _launcher.EXEC_CLEAN_BATCH:
            return ()
        batch = tuple(done[: _launcher.EXEC_CLEAN_BATCH])
        del done[: _launcher.EXEC_CLEAN_BATCH]
        return batch

    def _records_done(self, run: _Run) -> None:
        # Only claimed records: a fenced one stays, so a Start that arrives late runs nothing.
        if run.nonces:
            self._finished_records.setdefault(run.user, []).extend(run.nonces)

    async def _kill_tag(self, tag: str, bound: float = 10.0) -> bool:
        """Best effort SIGKILL of a command by tag; shielded and bounded. True when sent."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + bound):
            try:
                await self._envd.send_signal(_wire.ProcessSelector(tag=tag), _wire.SIGNAL_SIGKILL)
                return True
            except Exception:
                pass  # gone already, or the sandbox is unreachable: its TTL reclaims it
        return False

    def _kill_in_background(self, tag: str) -> None:
        """Kill by tag after the caller has its result (in the sandbox's nursery)."""
        try:
            self.start_background(self._kill_tag, tag)
        except SandboxNotRunningError:
            pass  # the sandbox is closing: killing it ends the command too

    # --- files ---------------------------------------------------------------------------

    async def write_file(
        self,
        path: str,
        data: bytes | str,
        *,
        user: str | None = None,
        mode: int | None = None,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> None:
        """Create or replace ``path`` (parents created) via ``POST /files``, within
        ``timeout`` (a sent attempt runs to its answer, bounded by the request timeout)."""
        check_abs_path(path)
        user = check_user(user or "root")
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"data must be bytes or str, got {type(data).__name__}")
        if mode is not None and not (isinstance(mode, int) and 0 <= mode <= 0o7777):
            raise InvalidArgumentError(f"mode must be an int in 0..0o7777, got {mode!r}")
        self._check_alive()
        with file_time_bound("write", path, timeout) as not_after:
            await self._write_file(path, data, user, mode, not_after)

    async def _write_file(
        self,
        path: str,
        data: bytes | bytearray | memoryview,
        user: str,
        mode: int | None,
        not_after: float,
    ) -> None:
        try:
            # envd's attempt runs shielded (to its answer): bounded by our deadline too.
            await self._envd.write_file(path, bytes(data), user=user, not_after=not_after)
        except _connect.ConnectError as exc:
            refused = _refusal(exc, f"write_file {path!r} in sandbox {self._id}")
            if refused is not None:
                raise refused from exc
            raise await self._infra_error(exc, f"write_file {path}") from exc
        except Exception as exc:
            raise await self._infra_error(exc, f"write_file {path}") from exc
        if mode is not None:
            res = await self.exec(
                f"chmod {mode:o} {shlex.quote(path)}", user=user, timeout=30, idempotent=True
            )
            if not res.ok:
                raise SandboxError(f"chmod {mode:o} {path} failed: {res!r}")

    async def read_file(
        self,
        path: str,
        *,
        user: str | None = None,
        max_bytes: int | None = DEFAULT_READ_MAX_BYTES,
        special: bool = False,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> bytes:
        """The bytes of ``path``: ``Stat`` (unless ``special``), then a bounded ``GET /files``,
        all within ``timeout``.

        See :meth:`trio_swe.Sandbox.read_file` for the caps. A body shorter than the size the
        ``Stat`` gave is an error, never returned as the file (a server may cut a body).
        """
        check_abs_path(path)
        check_read_args(max_bytes, special)
        user = check_user(user or "root")
        self._check_alive()
        with file_time_bound("read", path, timeout):
            return await self._read_file(path, user, max_bytes, special)

    async def _read_file(self, path: str, user: str, max_bytes: int | None, special: bool) -> bytes:
        size: int | None = None
        try:
            target = path
            if not special:
                # A symlink is followed a few hops; what is not a regular file is never opened
                # (envd would stream /dev/zero forever and block on a FIFO).
                for _hop in range(8):
                    entry = await self._envd.stat(target, user=user)
                    if entry.type == "FILE_TYPE_SYMLINK" and entry.symlink_target:
                        target = entry.symlink_target
                        continue
                    break
                if entry.type == _wire.FILE_TYPE_DIRECTORY:
                    raise SandboxNotAFileError(path, "directory")
                if entry.type != _wire.FILE_TYPE_FILE:
                    raise SandboxNotAFileError(path, "special file")
                size = _wire.as_int(entry.size)
                if max_bytes is not None and size > max_bytes:
                    raise SandboxFileTooLargeError(path, max_bytes, size)
            data, over = await self._envd.read_file_capped(target, user=user, limit=max_bytes)
        except (SandboxNotAFileError, SandboxFileTooLargeError):
            raise
        except _connect.ConnectError as exc:
            if (exc.http_status == 404 or exc.code == "not_found") and not _gone(exc):
                raise SandboxFileNotFoundError(
                    f"{path}: no such file in sandbox {self._id}"
                ) from exc
            if exc.http_status == 400 and "directory" in str(exc):
                raise SandboxNotAFileError(path, "directory") from exc
            refused = _refusal(exc, f"read_file {path!r} in sandbox {self._id}")
            if refused is not None:
                raise refused from exc
            raise await self._infra_error(exc, f"read_file {path}") from exc
        except Exception as exc:
            raise await self._infra_error(exc, f"read_file {path}") from exc
        if over and max_bytes is not None:
            raise SandboxFileTooLargeError(path, max_bytes)
        if size is not None and len(data) < size:
            # envd answered 200/206 with a clean end but fewer bytes than the file has: a cut
            # body (a server's own cap) or a file shrunk meanwhile. Neither is the file.
            raise SandboxError(
                f"read_file {path!r} in sandbox {self._id}: got {len(data)} of the "
                f"{size} bytes the file has (the body was cut short, or the file shrank)"
            )
        return data

    # --- lifecycle -----------------------------------------------------------------------

    async def kill(self) -> None:
        """Kill the sandbox via the REST API. Idempotent; an already reclaimed sandbox is fine."""
        if self._killed:
            return
        self._killed = True
        if self._rest is not None:
            try:
                await self._rest.kill(self._id)
            except Exception as exc:
                self._killed = False
                raise SandboxUnreachableError(
                    f"kill of sandbox {self._id} failed: {exc!r}"
                ) from exc
        if self._on_killed is not None:
            self._on_killed(self)

    async def set_timeout(self, seconds: float) -> None:
        """Make the provider keep the sandbox ``seconds`` from now (no-op in debug mode)."""
        if self._rest is not None:
            await self._rest.set_timeout(self._id, max(1, math.ceil(seconds)))

    def statistics(self) -> E2BSandboxStatistics:
        return E2BSandboxStatistics(
            **self._counts, rpcs=self._envd.rpcs, resets=self._envd.resets, killed=self._killed
        )


def _tag_taken(exc: _connect.ConnectError) -> bool:
    """envd refused a Start because a running process already carries our tag."""
    msg = exc.message.lower()
    return (
        exc.code in ("already_exists", "invalid_argument")
        and "tag" in msg
        and ("already" in msg or "exists" in msg)
    )


def _refusal(exc: _connect.ConnectError, what: str) -> TrioSweError | None:
    """The typed error for a request envd understood and refused, or None (not a refusal).

    The same types as every backend: a bad argument (unknown user, missing cwd, a path that is a
    directory, envd's 401 "invalid user" of ``/files``) is :class:`InvalidArgumentError`; a
    denied access (permissions, read-only file system) is :class:`SandboxPermissionError`.
    """
    if _gone(exc):
        return None
    status, msg = exc.http_status, exc.message
    if exc.code == "permission_denied" or status == 403:
        return SandboxPermissionError(f"{what}: {msg}")
    if exc.code == "invalid_argument" or status == 400 or (status == 401 and "user" in msg.lower()):
        return InvalidArgumentError(f"{what}: {msg}")
    return None


def _gone(exc: _connect.ConnectError) -> bool:
    """The edge's answer for a sandbox that no longer exists (502 "... was not found")."""
    return exc.http_status == 502 and "not found" in exc.message.lower()
