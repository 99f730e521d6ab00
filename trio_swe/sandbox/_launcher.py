"""Sans-IO core of detached execution: the shell scripts ``exec_and_wait`` sends, and their replies.

Nothing here does I/O. :func:`make_plan` validates the caller's strings and fixes every path of
one call; the ``*_script`` functions build the short POSIX ``sh`` scripts that the I/O layer
(:mod:`trio_swe.sandbox._detached`) runs with ``Sandbox.exec``; :func:`parse_reply` and
:func:`parse_marker` read what they print. The scripts can be run on any POSIX host to test them
(the tests do, with plain subprocesses).

Layout of one call, all inside a private directory ``<base>.<user>/<tag>/`` (``<base>/<tag>/``
for the backend's default user)::

    cmd.<nonce>.sh   the caller's command behind a preamble (cd workdir, export env); written
                     with ``Sandbox.write_file`` so its size is not bounded by argv limits
    run.<nonce>.sh   the private copy the launcher runs, taken whole by the spawn: a late
                     duplicate of the write (a retried RPC whose first attempt the server ran
                     late) may rewrite ``cmd.<nonce>.sh`` at any time, even while it is read
    spawned          symlink -> <nonce>: the replay lock (``ln -s`` is atomic and names its owner)
    spawnlock        flock held while a spawn runs, so a kill never races a half-done spawn
    lock             flock held exclusively by the launcher for its whole life
    pid              the launcher's pid (== its session and process group id)
    out              stdout+stderr of the command
    done             the done marker ``<nonce> <status>``, written to ``done.tmp`` then renamed

Every caller string that reaches a script is validated (tag, user, env names, nonce) and/or
``shlex.quote``d (paths, env values, workdir).
"""

from __future__ import annotations

import math
import re
import shlex
import uuid
from collections.abc import Mapping
from typing import Final, Literal, get_args

import msgspec

from .._errors import InvalidArgumentError, SandboxError
from ._validate import check_abs_path, check_env, check_tag, check_user

#: Private directories live under ``<BASE_DIR>.<user>`` (``<BASE_DIR>`` for the default user);
#: per user so that a directory created by root never blocks an unprivileged caller (``/tmp``
#: is sticky and world-writable).
BASE_DIR: Final = "/tmp/.trio_swe"
#: Environment variable carrying a call's nonce into every process it starts; the kill sweep
#: finds descendants by it, even ones that called ``setsid`` and daemonized.
RUN_ENV: Final = "TRIO_SWE_RUN"
#: Bytes of output returned when the caller did not ask for the full output.
DEFAULT_TAIL_BYTES: Final = 4096
#: Every reply starts with a line ``TRIO_SWE <state> [fields...]``.
REPLY_PREFIX: Final = "TRIO_SWE"
#: Upper bound on sweep rounds, so a fork bomb cannot keep the kill script running forever.
MAX_KILL_ROUNDS: Final = 200

ReplyState = Literal[
    # spawn
    "started",  # launcher running; field: pid
    "replay",  # this call's spawn already happened (a replayed RPC): nothing done
    "busy",  # the tag belongs to another call: nothing done; field: owner
    "noworkdir",  # the workdir is missing or not enterable by the user
    "nosetsid",  # the sandbox has no setsid(1)
    "nocmd",  # the command file is missing or not whole (a late partial write): write it again
    "failed",  # the launcher did not start; the tail says why
    # wait / kill
    "done",  # fields: nonce, status, output size; then the output tail
    "running",  # the launcher still holds its lock
    "lost",  # the launcher is gone and left no done marker
    "unspawned",  # the directory exists but no spawn ever happened
    "gone",  # the call's directory does not exist
    "killed",  # (kill) swept; fields: remaining pids, output size; then the output tail
    "notmine",  # (kill) the tag's directory belongs to another call: only our files removed
    # settle (a plain exec's record, see exec_record_wrapper)
    "fenced",  # the command never ran and now never will (fields: none)
]
_STATES: Final = frozenset(get_args(ReplyState))


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything fixed about one detached call, validated.

    Attributes:
        tag: names the call's directory (caller-given or a fresh uuid4 hex).
        nonce: unique per call even when the caller reuses a tag; marks the call's processes.
        user: the sandbox user every RPC of the call runs as (None: the backend's default).
        workdir: where the command starts.
        dir: the call's private directory.
        command_file: contents of ``cmd.<nonce>.sh``.
    """

    tag: str
    nonce: str
    user: str | None
    workdir: str
    dir: str
    command_file: bytes

    @property
    def cmd_path(self) -> str:
        return f"{self.dir}/cmd.{self.nonce}.sh"

    @property
    def run_path(self) -> str:
        return f"{self.dir}/run.{self.nonce}.sh"

    @property
    def out_path(self) -> str:
        return f"{self.dir}/out"


class Reply(msgspec.Struct, frozen=True):
    """A parsed script reply: the header's state and fields, then the raw text after it."""

    state: ReplyState
    fields: tuple[str, ...]
    tail: str


def _encode(text: str, what: str) -> bytes:
    if "\x00" in text:
        raise InvalidArgumentError(f"{what} must not contain NUL characters")
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(f"{what} is not encodable as UTF-8: {exc}") from None


def build_command_file(cmd: str, *, workdir: str, env: Mapping[str, str]) -> bytes:
    """The file the launcher runs: ``cd`` to ``workdir``, export ``env`` (quoted), then ``cmd``.

    ``cmd`` is a shell script by contract and is kept verbatim; its exit status is the status of
    the whole file, exactly as with ``bash -c cmd``.
    """
    if not isinstance(cmd, str):
        raise InvalidArgumentError(f"cmd must be a str, got {type(cmd).__name__}")
    lines = [f"cd {shlex.quote(workdir)} || exit 126"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    head = "\n".join(lines) + "\n"
    body = cmd if cmd.endswith("\n") else cmd + "\n"
    return _encode(head, "env/workdir") + _encode(body, "cmd")


def make_plan(
    cmd: str,
    *,
    workdir: str,
    tag: str | None = None,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    nonce: str | None = None,
    base_dir: str = BASE_DIR,
) -> Plan:
    """Validate a call's inputs and fix its paths. Raises InvalidArgumentError before anything runs."""
    if tag is not None:
        check_tag(tag)
    if user is not None:
        check_user(user)
    check_abs_path(workdir, what="workdir")
    clean_env = check_env(env)
    for name in clean_env:
        if name == RUN_ENV:
            raise InvalidArgumentError(f"environment variable {RUN_ENV} is reserved")
    base = check_abs_path(base_dir, what="base_dir")
    nonce = nonce or uuid.uuid4().hex
    check_tag(nonce)
    tag = tag or nonce
    return Plan(
        tag=tag,
        nonce=nonce,
        user=user,
        workdir=workdir,
        dir=f"{base}.{user}/{tag}" if user else f"{base}/{tag}",
        command_file=build_command_file(cmd, workdir=workdir, env=clean_env),
    )


def check_budget(value: float, what: str) -> float:
    """A duration in seconds: a non-negative number, ``math.inf`` allowed."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidArgumentError(f"{what} must be a number of seconds, got {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"{what} must not be negative, got {value!r}")
    return float(value)


# -- scripts -----------------------------------------------------------------------------------
#
# Conventions: every script prints exactly one header line ``TRIO_SWE <state> ...`` on stdout
# (stderr of helpers is silenced) and exits 0; a non-zero exit means the script itself broke.
# ``F`` is non-empty when flock(1) exists; without it the scripts fall back to pids and polling.
# Templates use ``@NAME@`` placeholders, filled by :func:`_fill` with quoted or validated values.
# Nothing the scripts set is exported, so the command sees exactly the environment of ``exec``.

_PRELUDE = """\
if command -v flock >/dev/null 2>&1; then F=1; else F=; fi
if command -v bash >/dev/null 2>&1; then B=bash; else B=sh; fi
"""

# The launcher, run as ``$B -c LAUNCHER trio-swe-launcher $B <nonce> $F <cmdfile>`` in a new
# session, with the call's directory as cwd and stdout a pipe to the spawner. It takes the lock,
# records its pid, tells the spawner (one line on the pipe, then the pipe is closed), runs the
# command with the lock fd closed (so daemonized grandchildren never hold the lock), and writes
# the marker atomically. Exiting releases the lock: that is what waiters block on. The launcher's
# own stderr is /dev/null so that a shell's job reports ("Killed") do not end up in the output.
_LAUNCHER = """\
if [ -n "$3" ]; then exec 9>>lock && flock -x 9 || exit 111; fi
printf '%s\\n' "$$" >pid.tmp && mv -f pid.tmp pid || exit 111
printf '%s\\n' "$$"
exec >>out 2>/dev/null
"$1" "$4" 9>&- 2>&1
rc=$?
printf '%s %s\\n' "$2" "$rc" >done.tmp && mv -f done.tmp done
"""

_SPAWN = """\
cd @DIR@ 2>/dev/null || { echo TRIO_SWE gone; exit 0; }
# The command file is private to its user; done here rather than by a separate RPC.
chmod 600 @CMD@ 2>/dev/null
command -v setsid >/dev/null 2>&1 || { echo TRIO_SWE nosetsid; exit 0; }
( cd @WORKDIR@ ) >/dev/null 2>&1 || { echo TRIO_SWE noworkdir; exit 0; }
# Serialize with kill scripts: a kill waits for a spawn in progress, or prevents it.
if [ -n "$F" ]; then exec 8>>spawnlock && flock -x 8; fi
# The launcher runs a copy taken now and checked whole: every write of the command file writes
# the same bytes, so a copy of the expected size is exact, and nothing rewrites the copy.
t=run.@NONCE@.$$
if ! (umask 077 && cat -- @CMD@ >"$t") 2>/dev/null; then rm -f -- "$t"; echo TRIO_SWE nocmd; exit 0; fi
size=$(wc -c <"$t")
if [ $((size)) -ne @SIZE@ ]; then rm -f -- "$t"; echo TRIO_SWE nocmd; exit 0; fi
if ! ln -s @NONCE@ spawned 2>/dev/null; then
  rm -f -- "$t"
  owner=$(readlink spawned 2>/dev/null)
  if [ "$owner" = @NONCE@ ]; then echo TRIO_SWE replay; else echo TRIO_SWE busy "$owner"; fi
  exit 0
fi
mv -f -- "$t" @RUNFILE@
# `setsid -f` forks in the foreground, so the launcher does not inherit the SIGINT/SIGQUIT
# dispositions that sh forces to "ignored" on background jobs (Python would then never raise
# KeyboardInterrupt). Once it has forked it exits 0, so a failure with no pid means nothing
# started: an old setsid that refuses -f (or a failed fork). Then `&`, without its complaint.
pid=$(@RUN@=@NONCE@ setsid -f $B -c @LAUNCHER@ trio-swe-launcher $B @NONCE@ "$F" @RUNFILE@ \\
      </dev/null 2>>out 8>&-)
if [ $? -ne 0 ] && [ -z "$pid" ]; then
  : >out
  pid=$(@RUN@=@NONCE@ setsid $B -c @LAUNCHER@ trio-swe-launcher $B @NONCE@ "$F" @RUNFILE@ \\
        </dev/null 2>>out 8>&- &)
fi
case "$pid" in
  ""|*[!0-9]*) echo TRIO_SWE failed; tail -c 2048 out 2>/dev/null; exit 0;;
esac
echo TRIO_SWE started "$pid"
"""

# Shell function `report`: print `done <nonce> <status> <size>` and, if @TAILCOND@, the tail.
_REPORT = """\
report() {
  m=; read -r m <done
  set -- $m
  if [ -f out ]; then size=$(wc -c <out); else size=0; fi
  echo TRIO_SWE done "$1" "$2" $((size))
  if @TAILCOND@; then tail -c @TAIL@ out 2>/dev/null; fi
}
"""

_WAIT = """\
cd @DIR@ 2>/dev/null || { echo TRIO_SWE gone; exit 0; }
if [ ! -e pid ]; then
  # A spawn may still be running (a replayed or late RPC): wait it out, briefly.
  if [ -n "$F" ]; then flock -s -w 10 spawnlock true >/dev/null 2>&1; fi
  if [ ! -e pid ]; then
    if [ -L spawned ]; then echo TRIO_SWE lost; else echo TRIO_SWE unspawned; fi
    exit 0
  fi
fi
read -r pid <pid
# Without flock: the launcher is alive while its pid exists and is not a zombie.
running() {
  l=; read -r l 2>/dev/null </proc/"$pid"/stat || return 1
  case "${l##*") "}" in Z*|X*) return 1;; esac
}
alive() {
  if [ -n "$F" ]; then ! flock -n -s lock true >/dev/null 2>&1; else running; fi
}
if [ ! -e done ]; then
  if [ -n "$F" ]; then
    # On a descriptor: no child to run once the lock is granted (one process start fewer);
    # the shared lock goes with the descriptor at the end of the group.
    { flock -s -w @WAIT@ 9; } 9<lock >/dev/null 2>&1
  else
    i=0
    while [ ! -e done ] && [ $i -lt @TICKS@ ] && running; do
      sleep 0.05; i=$((i+1))
    done
  fi
fi
if [ -e done ]; then report; exit 0; fi
if alive; then echo TRIO_SWE running; exit 0; fi
# The launcher is gone. It renames the marker before it exits, so look once more.
if [ -e done ]; then report; exit 0; fi
echo TRIO_SWE lost
"""

_KILL = """\
me=$$; run=@RUN@=@NONCE@; pg=; mine=; have=
if cd @DIR@ 2>/dev/null; then
  have=1
  # Wait for a spawn in progress; then make any later spawn of this call a no-op.
  if [ -n "$F" ]; then exec 8>>spawnlock && flock -x -w 10 8; fi
  if ln -s killed.@NONCE@ spawned 2>/dev/null; then mine=1; else
    owner=$(readlink spawned 2>/dev/null)
    case "$owner" in @NONCE@|killed.@NONCE@) mine=1;; esac
  fi
  if [ -n "$mine" ] && [ -f pid ]; then read -r pg <pid; fi
fi
case "$pg" in *[!0-9]*) pg=;; esac
if printf 'a\\000' | grep -qz a 2>/dev/null; then Z=1; else Z=; fi
# Sets $found to the pids of the call: environment marker, or the launcher's session or process
# group. Few forks: this runs several times per kill.
add() {
  [ "$1" = "$me" ] && return
  case " $found " in *" $1 "*) ;; *) found="$found $1";; esac
}
scan() {
  found=
  if [ -n "$Z" ]; then
    for e in $(grep -lzxF "$run" /proc/[0-9]*/environ 2>/dev/null); do
      e=${e#/proc/}; add "${e%/environ}"
    done
  else
    for e in /proc/[0-9]*/environ; do
      if tr '\\000' '\\n' 2>/dev/null <"$e" | grep -qxF "$run"; then
        e=${e#/proc/}; add "${e%/environ}"
      fi
    done
  fi
  if [ -n "$pg" ]; then
    for s in /proc/[0-9]*/stat; do
      l=; read -r l 2>/dev/null <"$s" || continue
      set -- ${l##*") "}
      if [ "$1" = Z ] || [ "$1" = X ]; then continue; fi
      if [ "$3" = "$pg" ] || [ "$4" = "$pg" ]; then s=${s#/proc/}; add "${s%/stat}"; fi
    done
  fi
}
# Freeze until the set is closed under fork (a stopped process cannot fork), then kill the lot;
# repeat until nothing is left.
rounds=0; left=0
while :; do
  if [ $rounds -ge @ROUNDS@ ]; then scan; set -- $found; left=$#; break; fi
  frozen=
  while :; do
    scan
    new=
    for p in $found; do
      case " $frozen " in *" $p "*) ;; *) new="$new $p";; esac
    done
    [ -z "$new" ] && break
    kill -STOP $new 2>/dev/null
    frozen="$frozen$new"
  done
  [ -z "$frozen" ] && break
  kill -KILL $frozen 2>/dev/null
  rounds=$((rounds+1))
  [ $rounds -gt 1 ] && sleep 0.01
done
if [ -z "$have" ]; then echo TRIO_SWE gone $((left)); exit 0; fi
if [ -z "$mine" ]; then rm -f -- @CMD@; echo TRIO_SWE notmine; exit 0; fi
if [ -e done ]; then
  report
else
  if [ -f out ]; then size=$(wc -c <out); else size=0; fi
  echo TRIO_SWE killed $((left)) $((size))
  tail -c @TAIL@ out 2>/dev/null
fi
@REMOVE@
"""

TailWhen = Literal["always", "nonzero", "never"]
_PLACEHOLDER: Final = re.compile(r"@([A-Z]+)@")


def _fill(template: str, **values: str) -> str:
    # One pass, so a value that happens to contain "@NAME@" is never substituted again.
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _report(tail_bytes: int, tail_when: TailWhen) -> str:
    if tail_when == "never" or tail_bytes <= 0:
        cond = "false"
    elif tail_when == "always":
        cond = "true"
    else:
        cond = '[ "$2" != 0 ]'
    return _fill(_REPORT, TAILCOND=cond, TAIL=str(max(tail_bytes, 0)))


def spawn_script(plan: Plan) -> str:
    """Start the launcher once. Replay-safe: a second run of this script changes nothing.

    Prints ``started <pid>`` only after the launcher holds its lock and has written its pid;
    ``replay`` when this call's spawn already happened; ``busy <owner>`` when another call owns
    the tag; ``noworkdir``, ``nosetsid``, ``gone`` or ``failed`` (then the launcher's stderr);
    ``nocmd`` when the command file is missing or not whole (nothing done: write it again).
    """
    return _PRELUDE + _fill(
        _SPAWN,
        DIR=shlex.quote(plan.dir),
        WORKDIR=shlex.quote(plan.workdir),
        NONCE=plan.nonce,
        RUN=RUN_ENV,
        LAUNCHER=shlex.quote(_LAUNCHER),
        CMD=shlex.quote(plan.cmd_path),
        RUNFILE=shlex.quote(plan.run_path),
        SIZE=str(len(plan.command_file)),
    )


def wait_script(
    plan: Plan,
    *,
    wait_sec: float,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    tail_when: TailWhen = "nonzero",
) -> str:
    """Block up to ``wait_sec`` in the sandbox until the launcher exits; report its state.

    With flock(1) the wait is one blocking ``flock -s`` on the launcher's lock: it returns the
    instant the launcher exits, without polling. Without flock it polls the marker every 50 ms.
    Prints ``done <nonce> <status> <size>`` (then the tail per ``tail_when``), ``running``,
    ``lost``, ``unspawned`` or ``gone``. Safe to replay: it only reads.
    """
    wait_sec = max(wait_sec, 0.0)
    return (
        _PRELUDE
        + _report(tail_bytes, tail_when)
        + _fill(
            _WAIT,
            DIR=shlex.quote(plan.dir),
            WAIT=f"{wait_sec:.3f}",
            TICKS=str(max(1, math.ceil(wait_sec / 0.05))),
        )
    )


def kill_script(
    plan: Plan,
    *,
    remove: bool,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    tail_when: TailWhen = "always",
) -> str:
    """Kill every process of the call, prevent a late spawn, report, and maybe remove the dir.

    Victims: processes whose environment holds ``TRIO_SWE_RUN=<nonce>`` (descendants, even
    daemonized ones) and members of the launcher's session or process group (descendants that
    scrubbed their environment). They are frozen with SIGSTOP until no new one appears, then
    SIGKILLed; rounds repeat until none is left. Replay-safe.

    Prints ``done ...`` when the command had finished anyway (tail per ``tail_when``), else
    ``killed <left> <size>`` and the tail; ``gone <left>`` when the directory does not exist; or
    ``notmine`` when the tag's directory belongs to another call (then only this call's command
    file is removed).
    """
    remove_cmd = f"cd / && rm -rf -- {shlex.quote(plan.dir)}" if remove else ":"
    return (
        _PRELUDE
        + _report(tail_bytes, tail_when)
        + _fill(
            _KILL,
            DIR=shlex.quote(plan.dir),
            NONCE=plan.nonce,
            RUN=RUN_ENV,
            CMD=shlex.quote(plan.cmd_path),
            TAIL=str(max(tail_bytes, 0)),
            ROUNDS=str(MAX_KILL_ROUNDS),
            REMOVE=remove_cmd,
        )
    )


def cleanup_script(plan: Plan) -> str:
    """Remove the call's directory. Replay-safe."""
    return f"rm -rf -- {shlex.quote(plan.dir)}\n"


# -- replies -----------------------------------------------------------------------------------


def parse_reply(output: str) -> Reply:
    """Find the ``TRIO_SWE <state> ...`` header in a script's output; the rest is the tail.

    Raises:
        SandboxError: no well-formed header (the script broke, or the backend mangled output).
    """
    start = 0
    while True:
        idx = output.find(REPLY_PREFIX + " ", start)
        if idx < 0:
            raise SandboxError(f"detached execution: malformed reply {output[:300]!r}")
        if idx == 0 or output[idx - 1] == "\n":
            break
        start = idx + 1
    line, _, tail = output[idx:].partition("\n")
    parts = line.split()
    if len(parts) < 2 or parts[1] not in _STATES:
        raise SandboxError(f"detached execution: malformed reply header {line[:300]!r}")
    state: ReplyState = parts[1]  # type: ignore[assignment]
    return Reply(state=state, fields=tuple(parts[2:]), tail=tail)


def parse_marker(nonce_field: str, status_field: str, *, nonce: str) -> int:
    """The exit status from a done marker ``<nonce> <status>``, checked against our nonce.

    Raises:
        SandboxError: the marker belongs to another call or is not a status.
    """
    if nonce_field != nonce:
        raise SandboxError(
            f"detached execution: done marker of another call ({nonce_field!r} != {nonce!r})"
        )
    if not (status_field.isascii() and status_field.isdigit()):
        raise SandboxError(f"detached execution: malformed exit status {status_field!r}")
    return int(status_field)


def parse_done(reply: Reply, *, nonce: str) -> tuple[int, int]:
    """``(exit status, output size)`` of a ``done`` reply."""
    if reply.state != "done" or len(reply.fields) != 3:
        raise SandboxError(f"detached execution: not a done reply: {reply}")
    status = parse_marker(reply.fields[0], reply.fields[1], nonce=nonce)
    return status, _int_field(reply.fields[2])


def _int_field(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise SandboxError(f"detached execution: malformed number {text!r} in reply")
    return int(text)


def parse_killed(reply: Reply) -> tuple[int, int]:
    """``(processes left alive, output size)`` of a ``killed`` reply."""
    if reply.state != "killed" or len(reply.fields) != 2:
        raise SandboxError(f"detached execution: not a killed reply: {reply}")
    return _int_field(reply.fields[0]), _int_field(reply.fields[1])


# -- plain exec records ------------------------------------------------------------------------
#
# A plain ``exec`` streams its command's end over one RPC stream. When that stream is cut before
# the start is acknowledged, and the backend then finds no process by the call's tag, the
# command may have run (the request reached the server), may be starting, or may never run.
# The record settles it with the same two ideas as the detached path: an atomic claim (here an
# ``O_EXCL`` create, the spawn lock's ``ln -s``), and a done marker ``<nonce> <status>``. The
# backend's ``settle`` either fences the record first (then the command provably never runs and
# can be started afresh under a new nonce) or finds it claimed and reads the marker.

#: One record file per plain exec: ``<EXEC_RECORD_BASE>.<user>/<nonce>`` (per user, as above).
EXEC_RECORD_BASE: Final = "/tmp/.trio_swe_exec"
#: What a wrapper exits with when its record was fenced or claimed already (it ran nothing).
EXEC_FENCED_STATUS: Final = 125

# Run as ``/bin/sh -c WRAPPER /bin/sh CMD``. Builtins only on the path of a healthy call (one
# fork more than ``/bin/sh -c CMD``: the command's own shell), and no shell variables: an
# assignment to a name the caller's environment exports would change the command's environment.
# The claim holds the wrapper's pid (``$$``), the settle script's liveness check.
_EXEC_WRAPPER = """\
set -C
if ! { echo $$ >@REC@; } 2>/dev/null; then
  if [ -e @REC@ ] || [ -L @REC@ ]; then
    echo 'trio_swe: exec record @NONCE@ exists: not run again' >&2; exit @FENCED@
  fi
  mkdir -p -m 700 @DIR@ 2>/dev/null && { echo $$ >@REC@; } 2>/dev/null
fi
set +C
@CLEAN@/bin/sh -c "$1"
set -- $?
{ echo "@NONCE@ $1" >>@REC@; } 2>/dev/null
exit "$1"
"""

_EXEC_SETTLE = """\
mkdir -p -m 700 @DIR@ 2>/dev/null
if (set -C; echo fenced >@REC@) 2>/dev/null; then echo TRIO_SWE fenced; exit 0; fi
[ -f @REC@ ] || { echo TRIO_SWE gone; exit 0; }
p=; m=; { read -r p; read -r m; } <@REC@
[ "$p" = fenced ] && { echo TRIO_SWE fenced; exit 0; }
[ -n "$m" ] && { echo TRIO_SWE done $m; exit 0; }
case "$p" in
  "") echo TRIO_SWE running; exit 0;;  # claimed this instant: the pid is being written
  *[!0-9]*) ;;
  *) if grep -qF @NONCE@ /proc/"$p"/cmdline 2>/dev/null; then echo TRIO_SWE running; exit 0; fi;;
esac
# The wrapper is gone: it appends the marker before it exits, so read once more.
p=; m=; { read -r p; read -r m; } <@REC@
[ -n "$m" ] && { echo TRIO_SWE done $m; exit 0; }
echo TRIO_SWE lost
"""

#: Names of finished calls' records removed by a later wrapper of the same user, at most this many.
EXEC_CLEAN_BATCH: Final = 64


def exec_record_dir(user: str, base: str = EXEC_RECORD_BASE) -> str:
    return f"{check_abs_path(base, what='base')}.{check_user(user)}"


def exec_record_path(nonce: str, user: str, base: str = EXEC_RECORD_BASE) -> str:
    check_tag(nonce)
    return f"{exec_record_dir(user, base)}/{nonce}"


def exec_record_wrapper(
    nonce: str, user: str, *, clean: tuple[str, ...] = (), base: str = EXEC_RECORD_BASE
) -> str:
    """The ``sh`` script that runs a plain exec's command (its ``$1``) and records its end.

    It claims ``<dir>/<nonce>`` atomically (``set -C``: an ``O_EXCL`` create) and writes its pid
    there; if the record exists already (fenced by :func:`exec_settle_script`, or a duplicate
    Start), it runs nothing and exits :data:`EXEC_FENCED_STATUS`. Then it runs
    ``/bin/sh -c "$1"`` (exactly what an unwrapped exec runs), appends the done marker
    ``<nonce> <status>`` and exits with the status. A record it cannot create (``/tmp`` not
    writable) does not stop the command: only recovery is lost. ``clean`` names finished calls'
    records (nonces) to remove first, so records do not pile up.
    """
    rec = shlex.quote(exec_record_path(nonce, user, base))
    clean_cmd = ""
    if clean:
        names = " ".join(shlex.quote(exec_record_path(n, user, base)) for n in clean)
        clean_cmd = f"rm -f -- {names} 2>/dev/null\n"
    return _fill(
        _EXEC_WRAPPER,
        REC=rec,
        NONCE=nonce,
        DIR=shlex.quote(exec_record_dir(user, base)),
        FENCED=str(EXEC_FENCED_STATUS),
        CLEAN=clean_cmd,
    )


def unwrap_exec_record(argv: list[str]) -> list[str]:
    """``["/bin/sh", "-c", CMD]`` for the argv of a recorded exec, else ``argv`` unchanged (for
    servers that interpret commands rather than run them)."""
    if (
        len(argv) == 5
        and argv[1] == "-c"
        and argv[3] == "/bin/sh"
        and argv[2].startswith(_EXEC_WRAPPER_HEAD)
    ):
        return [argv[0], "-c", argv[4]]
    return argv


_EXEC_WRAPPER_HEAD: Final = _EXEC_WRAPPER.partition("@")[0]


def exec_settle_script(nonce: str, user: str, base: str = EXEC_RECORD_BASE) -> str:
    """Fence a plain exec's record, or report it. Replay-safe; run as the call's user.

    Prints ``fenced`` (the record did not exist and now does, or a replay of that: the command
    never ran and never will), ``done <nonce> <status>``, ``running`` (claimed, its wrapper
    alive), ``lost`` (claimed, the wrapper gone without a marker: killed by a signal) or ``gone``
    (no record can exist here: the directory is not writable).
    """
    return _fill(
        _EXEC_SETTLE,
        REC=shlex.quote(exec_record_path(nonce, user, base)),
        NONCE=nonce,
        DIR=shlex.quote(exec_record_dir(user, base)),
    )


ExecSettle = Literal["fenced", "done", "running", "lost", "gone"]


def parse_exec_settle(output: str, *, nonce: str) -> tuple[ExecSettle, int | None]:
    """``(state, exit status or None)`` of a settle script's reply.

    Raises:
        SandboxError: a malformed reply, or a marker of another call.
    """
    reply = parse_reply(output)
    if reply.state == "done":
        if len(reply.fields) != 2:
            raise SandboxError(f"exec record: malformed done reply {output[:300]!r}")
        return "done", parse_marker(reply.fields[0], reply.fields[1], nonce=nonce)
    if reply.state in ("fenced", "running", "lost", "gone") and not reply.fields:
        return reply.state, None
    raise SandboxError(f"exec record: unexpected reply {output[:300]!r}")
