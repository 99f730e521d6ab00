"""The apply ladder and a graded script as one shell command, sans-IO: build it, read its output.

One detached command (``exec_and_wait``) runs a row's setup scripts (if any), writes the patch,
runs the ladder and, only when the ladder exits 0 (it applied), writes the graded script and
runs it: three round trips to the sandbox (command write, spawn, wait) where the ladder alone
took two more and each setup script three. The I/O and the verdicts live in
:func:`trio_swe.grading._run.apply_then_run`.

The command's output is a sequence of *stage lines* ``@@TRIO_SWE_STAGE <nonce> <stage> ...``,
each at the start of a line, in a fixed order; between them, the ladder's own output and, last,
the log (the graded script's, or a failed setup script's: the setup scripts write to their own
logs, so before the ladder only the command itself prints). The nonce is fresh per command, so
nothing a patch carries (its paths end up in the ladder's refusal lines) can forge a stage line;
the stages are read in order and each only once, the log last, so nothing a graded script
prints can move a boundary before it.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from typing import Final

import msgspec

from ._patch import printf_bytes

#: Marks the stages of the command: ``@@TRIO_SWE_STAGE <nonce> <stage>``.
STAGE: Final = "@@TRIO_SWE_STAGE"
#: A log up to this size comes back inline after the ladder's output (together well within
#: the 64 KiB one wait reply carries).
INLINE_LOG_BYTES: Final = 60 * 1024
#: What comes back of a failed ``save``/``restore`` hook's output.
HOOK_OUTPUT_BYTES: Final = 4096
#: Budgets from this long on run without a watchdog in the sandbox.
WATCHDOG_MAX_SEC: Final = 10.0**8
_SETUP_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class SetupStep(msgspec.Struct, frozen=True):
    """A setup script of :func:`staged_command`: ``name`` (a word: it travels in a stage line)
    names it in the output; ``script`` is written to ``script_path`` and run with bash, its
    output to ``log_path``."""

    name: str
    script: str
    script_path: str
    log_path: str


def staged_command(
    *,
    nonce: str,
    dirs: tuple[str, ...],
    patch: bytes | None,
    patch_path: str,
    ladder: str,
    script: str,
    script_path: str,
    log_path: str,
    budget_sec: float,
    files: tuple[tuple[str, bytes], ...] = (),
    save: str | None = None,
    restore: str | None = None,
    assets: tuple[tuple[str, bytes], ...] = (),
    setups: tuple[SetupStep, ...] = (),
    setup_budget_sec: float = math.inf,
    exports: tuple[tuple[str, str], ...] = (),
) -> str:
    """The bash command: make ``dirs``, write ``patch`` to ``patch_path`` (None: none), run
    the ladder (``ladder``'s body, in a subshell, stdin ``/dev/null``, stderr merged) and, only
    when it exits 0, write ``files`` (path, bytes: e.g. a grader's test file, which the patch
    must not supply) and ``script`` to ``script_path`` and run it with bash, stdout and
    stderr merged into ``log_path``, its process group killed (job control is on) once it has
    run ``budget_sec`` rounded up to whole seconds (no bound when not finite).

    Output: ``<mark> apply``, the ladder's output, ``<mark> applied <status> <u0> <e0> <u1>
    <e1>``, then ``<mark> tests <status> <u2> <e2> <cut> head`` (``cut``: 1 when the
    watchdog killed the script) followed by the log's first :data:`INLINE_LOG_BYTES` + 1
    bytes (the whole log when it is at most that size). ``u*``: the sandbox's monotonic clock (``/proc/uptime``,
    10 ms steps), ``e*``: its wall clock (``$EPOCHREALTIME``, microseconds); ``x`` when there is
    none. A write that fails prints ``<mark> nodir``, ``nopatch`` or ``noscript`` and ends the
    command. The patch travels as ``printf '%b'`` escapes (any
    byte), the script single-quoted: no process is started to write them.

    ``save`` and ``restore`` (shell, e.g. SWE-bench Pro's graded test files archived, then put
    back over what the patch did to them) run in subshells, their output to
    ``<log_path>.hook``: ``save`` before the ladder, ``restore`` only once the ladder applied,
    before ``files`` and the script. A failure prints ``<mark> nosave`` / ``<mark> norestore``
    and the hook's output (its first :data:`HOOK_OUTPUT_BYTES`), and ends the command.

    ``assets`` (path, bytes; mode 0755) and the ``setups`` come first, before the patch: the
    assets written, then each setup script in order, like the graded script (its own process
    group, killed once it has run ``setup_budget_sec``, each script its own budget). Output:
    ``<mark> setup <name> <u> <e>`` before each, then ``<mark> setupok <u> <e>`` after the
    last; a script that exits non-zero or is killed ends the command with ``<mark> setupfail
    <status> <u> <e> <cut> head`` and its log's first :data:`INLINE_LOG_BYTES` + 1 bytes.
    A write that fails prints ``<mark> noasset``. Then ``exports`` (name, value) are exported:
    the environment of the ladder and the script, not of the setups.
    """
    q = shlex.quote
    mark = f"{STAGE} {nonce}"
    lp, sp = q(log_path), q(script_path)
    made = dict.fromkeys(
        (
            *dirs,
            *(posixpath.dirname(path) for path, _ in assets),
            *(posixpath.dirname(p) for step in setups for p in (step.script_path, step.log_path)),
            posixpath.dirname(script_path),
        )
    )
    parts = [
        "exec 2>/dev/null",  # only the stages reach the output
        f"mkdir -p -- {' '.join(q(d) for d in made)} || {{ echo '{mark} nodir'; exit 0; }}",
    ]
    parts += _setup_lines(mark, assets, setups, setup_budget_sec)
    parts += [f"export {_name(k)}={q(v)}" for k, v in exports]
    if patch is not None:
        parts.append(
            f"printf '%b' {q(printf_bytes(patch, text=True))} > {q(patch_path)} "
            f"|| {{ echo '{mark} nopatch'; exit 0; }}"
        )
    body = script if script.endswith("\n") else script + "\n"
    hook_log = q(f"{log_path}.hook")

    def hook(shell: str, word: str) -> str:
        return (
            f"( {shell.strip()}\n) </dev/null >{hook_log} 2>&1 "
            f"|| {{ echo '{mark} {word}'; head -c {HOOK_OUTPUT_BYTES} -- {hook_log}; exit 0; }}"
        )

    if save is not None:
        parts.append(hook(save, "nosave"))
    parts += [
        _NOW,
        f"echo '{mark} apply'",
        "now; t0=$T",
        f"(\n{ladder.rstrip()}\n) </dev/null 2>&1",
        "a=$?; now",
        # The line feed first: the ladder's output may not end with one.
        f'echo; echo "{mark} applied $a $t0 $T"',
        '[ "$a" = 0 ] || exit 0',
    ]
    if restore is not None:
        parts.append(hook(restore, "norestore"))
    parts += [
        f"printf '%b' {q(printf_bytes(data, text=True))} > {q(path)} "
        f"|| {{ echo '{mark} noscript'; exit 0; }}"
        for path, data in files
    ]
    parts.append(f"printf '%s' {q(body)} > {sp} || {{ echo '{mark} noscript'; exit 0; }}")
    parts += _guarded(sp, lp, q(f"{script_path}.cut"), budget_sec)
    parts += [
        "now",
        # One process: the log's head, one byte past the inline size, so that the reader can
        # tell a whole log from a cut one (see read_stages) without asking for its size.
        f'echo "{mark} tests $s $T $c head"; head -c {INLINE_LOG_BYTES + 1} -- {lp}',
        'exit "$s"',
    ]
    return "\n".join(parts) + "\n"


#: Sets ``T`` to ``<monotonic> <wall>``; no process: `read` of procfs and a bash variable.
_NOW: Final = 'now() { read -r U _ </proc/uptime || U=x; E=${EPOCHREALTIME:-x}; T="$U $E"; }'
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _guarded(script: str, log: str, cut: str, budget_sec: float) -> list[str]:
    """Shell that runs the (quoted) ``script`` with bash, its output merged into ``log``: ``s``
    its status, ``c`` 1 when its budget was spent (then ``cut`` exists)."""
    if not (math.isfinite(budget_sec) and budget_sec < WATCHDOG_MAX_SEC):
        return [f"bash {script} > {log} 2>&1; s=$?; c=0"]
    # The script in a process group of its own (set -m); a watchdog kills that group once the
    # budget is spent (`&&`: a `sleep` that fails kills nothing). Daemons that left the group
    # die with the sandbox. The marker says it fired (made before the kill, so a cut run
    # always has it).
    return [
        "set -m",
        f"bash {script} > {log} 2>&1 &",
        "p=$!",
        f"{{ sleep {math.ceil(budget_sec)} && : > {cut} && kill -KILL -- -$p; }} >/dev/null 2>&1 &",
        "w=$!",
        'wait "$p"; s=$?',
        'kill -KILL -- -"$w"',
        "set +m",
        f"c=0; [ -e {cut} ] && c=1",
    ]


def _setup_lines(
    mark: str,
    assets: tuple[tuple[str, bytes], ...],
    setups: tuple[SetupStep, ...],
    budget_sec: float,
) -> list[str]:
    """The assets and setup stage of :func:`staged_command`."""
    q = shlex.quote
    fail = f"|| {{ echo '{mark} noasset'; exit 0; }}"
    parts = [
        f"printf '%b' {q(printf_bytes(data, text=True))} > {q(path)} {fail}"
        for path, data in assets
    ]
    if assets:
        parts.append(f"chmod 755 -- {' '.join(q(path) for path, _ in assets)} {fail}")
    if not setups:
        return parts
    parts.append(_NOW)
    for step in setups:
        if not _SETUP_NAME.fullmatch(step.name):
            raise ValueError(f"a setup's name must be one word: {step.name!r}")
        body = step.script if step.script.endswith("\n") else step.script + "\n"
        sp, lp = q(step.script_path), q(step.log_path)
        parts += [
            f"printf '%s' {q(body)} > {sp} {fail}",
            "now",
            f'echo "{mark} setup {step.name} $T"',
            *_guarded(sp, lp, q(f"{step.script_path}.cut"), budget_sec),
            # The log's head, one byte past the inline size (see read_stages).
            f'[ "$s" = 0 ] && [ "$c" = 0 ] || {{ now; echo "{mark} setupfail $s $T $c head"; '
            f"head -c {INLINE_LOG_BYTES + 1} -- {lp}; exit 0; }}",
        ]
    parts += ["now", f'echo "{mark} setupok $T"']
    return parts


def _name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"not an environment variable's name: {name!r}")
    return name


class Stages(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`staged_command`'s output says, stage by stage (None: that stage's line
    never came).

    Attributes:
        failed_write: ``"nodir"`` / ``"nopatch"`` / ``"nosave"`` (before the ladder) or
            ``"norestore"`` / ``"noscript"`` (after it applied).
        hook_output: what the failed ``save``/``restore`` hook printed (its head).
        ladder_output: the ladder's own output (None: the ladder never started).
        ladder_status: its exit status (None: it did not finish, or no number).
        apply_sec: the ladder's own time by the sandbox's clocks (None: unknown).
        tests_status: the graded script's exit status (None: no tests line or no number).
        tests_sec: the script's own time by the sandbox's monotonic clock, else its wall
            clock (None: unknown).
        log: the whole log when it came inline (None: it may be longer than what came, or
            did not come: read it from its file).
        tests_ended: the tests line came (the script ended and the command outlived it).
        tests_cut: the watchdog killed the script: it outlived its budget.
        setup_name: the last setup script that started (the failed one, when one failed).
        setup_ok: every setup script exited 0 (the ``setupok`` line came).
        setup_failed: a setup script failed (its ``setupfail`` line came): then nothing after
            it ran.
        setup_status: the failed script's exit status (None: no number).
        setup_cut: its watchdog killed it: it outlived its budget.
        setup_log: the failed script's whole log when it came inline (None: read its file).
        setup_sec: the setup stage's time by the sandbox's clocks, from the first script's
            start to the last one's end (None: unknown).
    """

    failed_write: str | None = None
    hook_output: str = ""
    ladder_output: str | None = None
    ladder_status: int | None = None
    apply_sec: float | None = None
    tests_ended: bool = False
    tests_cut: bool = False
    tests_status: int | None = None
    tests_sec: float | None = None
    log: str | None = None
    setup_name: str | None = None
    setup_ok: bool = False
    setup_failed: bool = False
    setup_status: int | None = None
    setup_cut: bool = False
    setup_log: str | None = None
    setup_sec: float | None = None


def read_stages(output: str, nonce: str, *, setups: int = 0) -> Stages:
    """Read :func:`staged_command`'s output (whole, or what a cut command left); ``setups``:
    how many setup scripts it was built with."""
    lines = _StageLines(output, nonce)
    if not setups:
        return _read_ladder(lines, output)
    start = lines.next("setup")
    if start is None:  # only the frame's failures can come before the first setup line
        for word in ("nodir", "noasset"):
            if lines.next(word) is not None:
                return Stages(failed_write=word)
        return Stages()
    name, u0, e0 = [*start[0], "", "", ""][:3]
    began = 1
    while True:
        # Before ``setupok``/``setupfail`` only the command prints (the scripts' output goes to
        # their logs), so the first of the words that may come next is the next stage.
        words = ("setupok", "setupfail", "noasset") + (("setup",) if began < setups else ())
        found = lines.first(*words)
        if found is None:  # cut inside a setup script
            return Stages(setup_name=name)
        word, (fields, _, end) = found
        if word == "setup":
            name, began = (fields or [""])[0], began + 1
        elif word == "noasset":
            return Stages(setup_name=name, failed_write="noasset")
        elif word == "setupfail":
            status, u1, e1, cut, where = [*fields, "", "", "", "", ""][:5]
            return Stages(
                setup_name=name,
                setup_failed=True,
                setup_status=_int(status),
                setup_cut=cut == "1",
                setup_sec=_first(_elapsed(e0, e1), _elapsed(u0, u1)),
                setup_log=whole_log(output[end:], INLINE_LOG_BYTES) if where == "head" else None,
            )
        else:
            u1, e1 = [*fields, "", ""][:2]
            return msgspec.structs.replace(
                _read_ladder(lines, output),
                setup_name=name,
                setup_ok=True,
                setup_sec=_first(_elapsed(e0, e1), _elapsed(u0, u1)),
            )


def _read_ladder(lines: _StageLines, output: str) -> Stages:
    """The stages from the ladder on."""
    start = lines.next("apply")
    if start is None:
        for word in ("nodir", "nopatch", "nosave"):
            found = lines.next(word)
            if found is not None:
                hook = output[found[2] :] if word == "nosave" else ""
                return Stages(failed_write=word, hook_output=hook)
        return Stages()
    applied = lines.next("applied")
    if applied is None:
        return Stages(ladder_output=output[start[2] :])
    fields, line_start, _ = applied
    status, u0, e0, u1, e1 = [*fields, "", "", "", "", ""][:5]
    ladder = Stages(
        ladder_output=output[start[2] : line_start].removesuffix("\n"),
        ladder_status=_int(status),
        # The wall clock for its microseconds; the monotonic one if there is no other.
        apply_sec=_first(_elapsed(e0, e1), _elapsed(u0, u1)),
    )
    tests = lines.next("tests")
    if tests is None:
        restore = lines.next("norestore")
        if restore is not None:
            return msgspec.structs.replace(
                ladder, failed_write="norestore", hook_output=output[restore[2] :]
            )
        if lines.next("noscript") is not None:
            return msgspec.structs.replace(ladder, failed_write="noscript")
        return ladder
    fields, _, end = tests
    status, u2, e2, cut, where = [*fields, "", "", "", "", ""][:5]
    return msgspec.structs.replace(
        ladder,
        tests_ended=True,
        tests_cut=cut == "1",
        tests_status=_int(status),
        # Decides a timeout: the monotonic clock first (a wall clock may step).
        tests_sec=_first(_elapsed(u1, u2), _elapsed(e1, e2)),
        log=whole_log(output[end:], INLINE_LOG_BYTES) if where == "head" else None,
    )


def whole_log(head: str, limit: int) -> str | None:
    """The log if ``head`` (what ``head -c <limit + 1>`` printed, decoded) is all of it.

    A decoder that replaced undecodable bytes never made the text shorter in UTF-8 than the
    bytes were (each replaced run of 1-3 bytes is one 3-byte U+FFFD, or 3-byte surrogates
    per byte), so at most ``limit`` here means the bytes were at most that: ``head`` printed
    the whole file. More may be a cut log (or one near the limit): None, read the file.
    """
    return head if len(head.encode("utf-8", "surrogatepass")) <= limit else None


class _StageLines:
    """The stage lines of one output, found in order, each once."""

    def __init__(self, output: str, nonce: str) -> None:
        self.output = output
        self.mark = f"{STAGE} {nonce} "
        self.pos = 0

    def next(self, stage: str) -> tuple[list[str], int, int] | None:
        """``(fields, start, end)`` of the next ``stage`` line from the current position (its
        fields after the stage word, its first index, the index after its line feed)."""
        head = self.mark + stage
        i = self.pos
        while True:
            i = self.output.find(head, i)
            if i < 0:
                return None
            end = self.output.find("\n", i)
            end = len(self.output) if end < 0 else end + 1
            words = self.output[i:end].split()
            if (i == 0 or self.output[i - 1] == "\n") and words[2:3] == [stage]:
                self.pos = end
                return words[3:], i, end
            i += len(head)

    def first(self, *stages: str) -> tuple[str, tuple[list[str], int, int]] | None:
        """The earliest line of any of ``stages`` from the current position, as :meth:`next`."""
        found: tuple[str, tuple[list[str], int, int]] | None = None
        pos = self.pos
        for stage in stages:
            self.pos = pos
            line = self.next(stage)
            if line is not None and (found is None or line[1] < found[1][1]):
                found = (stage, line)
        self.pos = pos if found is None else found[1][2]
        return found


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _clock(value: str) -> float | None:
    try:
        t = float(value.replace(",", "."))  # $EPOCHREALTIME follows LC_NUMERIC
    except ValueError:
        return None
    return t if math.isfinite(t) else None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _elapsed(start: str, end: str) -> float | None:
    a, b = _clock(start), _clock(end)
    return b - a if a is not None and b is not None and b >= a else None
