"""The patch-apply ladder, sans-IO: build the script, parse its verdict.

Rungs, in order (SWE-bench's ``GIT_APPLY_CMDS`` plus git's three-way merge):
``git apply``, ``git apply --3way``, ``git apply --reject``, ``patch --batch --forward --fuzz=5
-p1``. Every rung starts from the same tree: before the first rung the script saves the files
the patch touches and git's index, and a failed rung is rolled back (partial hunks, ``.rej`` /
``.orig`` files, conflict markers, a conflicted index) before the next one runs.

An empty (or whitespace-only) patch is "applied" as rung ``empty``. Binary diffs need
``git diff --binary`` output; ``git apply`` handles them, ``patch`` does not.
"""

from __future__ import annotations

import re
import shlex
from typing import Final

#: The ladder's rung names, in order.
RUNGS: Final = ("git_apply", "git_apply_3way", "git_apply_reject", "patch_fuzz")
EMPTY: Final = "empty"
#: The verdict line the script prints last (``@@TRIO_SWE_APPLY ok <rung>`` / ``failed``).
VERDICT: Final = "@@TRIO_SWE_APPLY"

_HEADER = re.compile(r"^(?:--- |\+\+\+ |rename from |rename to |copy from |copy to )(.*)$")
_DIFF_GIT = re.compile(r"^diff --git (.*)$")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def is_empty_patch(patch: str) -> bool:
    """True when there is nothing to apply."""
    return not patch.strip()


def _unquote_c(text: str) -> str:
    """git's C-style quoted path (``"a/p\\303\\244th"``) to a str."""
    if not (len(text) >= 2 and text[0] == '"' and text[-1] == '"'):
        return text
    body = text[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            octal = body[i + 1 : i + 4]
            if len(octal) == 3 and all(ch in "01234567" for ch in octal):
                out.append(int(octal, 8) & 0xFF)
                i += 4
                continue
            nxt = body[i + 1]
            out.extend(_ESCAPES.get(nxt, nxt).encode())
            i += 2
            continue
        out.extend(c.encode())
        i += 1
    return out.decode("utf-8", "replace")


def _strip_prefix(path: str) -> str | None:
    path = _unquote_c(path.split("\t", 1)[0].rstrip("\r"))
    if path == "/dev/null":
        return None
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def _safe(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and "\x00" not in path


def touched_paths(patch: str) -> list[str]:
    """Repository-relative paths a unified diff touches (old and new names), deduplicated.

    Paths that are absolute or climb out with ``..`` are dropped: every rung refuses them anyway.
    """
    seen: dict[str, None] = {}
    for line in patch.splitlines():
        m = _HEADER.match(line)
        if m:
            raw = m.group(1)
            if line.startswith(("rename ", "copy ")):
                path: str | None = _unquote_c(raw)
            else:
                path = _strip_prefix(raw)
        else:
            g = _DIFF_GIT.match(line)
            if not g or '"' in g.group(1):
                continue
            # ``diff --git a/x b/x``: unambiguous only when both halves are equal.
            rest = g.group(1)
            half = len(rest) // 2
            if rest[half] != " " or rest[:half][2:] != rest[half + 1 :][2:]:
                continue
            path = _strip_prefix(rest[:half])
        if path and _safe(path):
            seen.setdefault(path, None)
    return list(seen)


def apply_script(*, workdir: str, patch_path: str, list_path: str, state_dir: str) -> str:
    """The bash script that runs the ladder in ``workdir``.

    Args:
        workdir: the repository.
        patch_path: the diff, already written in the sandbox.
        list_path: NUL-separated :func:`touched_paths`, already written in the sandbox.
        state_dir: a fresh directory for the snapshot and the rungs' log (``apply.log``).

    The script always exits 0 and prints :data:`VERDICT` lines; parse with :func:`parse_verdict`.
    """
    q = shlex.quote
    rungs = [
        ("git_apply", 'g apply --verbose --whitespace=nowarn "$P"'),
        ("git_apply_3way", 'g apply --verbose --3way --whitespace=nowarn "$P"'),
        ("git_apply_reject", 'g apply --verbose --reject --whitespace=nowarn "$P"'),
        (
            "patch_fuzz",
            'patch --batch --forward --fuzz=5 -p1 --no-backup-if-mismatch -i "$P" </dev/null',
        ),
    ]
    lines = [
        "set -u",
        f'P={q(patch_path)}; L={q(list_path)}; S={q(state_dir)}; LOG="$S/apply.log"',
        'mkdir -p "$S" && : >"$LOG"',
        f'cd {q(workdir)} || {{ echo "{VERDICT} failed cd"; exit 0; }}',
        f'if ! grep -q \'[^[:space:]]\' "$P"; then echo "{VERDICT} ok {EMPTY}"; exit 0; fi',
        "g() { git -c safe.directory='*' -c core.quotepath=off \"$@\"; }",
        'GD=$(g rev-parse --absolute-git-dir 2>/dev/null) || GD=""',
        'if [ -n "$GD" ] && [ -f "$GD/index" ]; then cp -p "$GD/index" "$S/index"; fi',
        'tar --null -T "$L" --ignore-failed-read -cf "$S/files.tar" 2>>"$LOG"',
        "restore() {",
        '  while IFS= read -r -d \'\' f; do rm -rf -- "$f" "$f.rej" "$f.orig"; done <"$L"',
        '  tar -xf "$S/files.tar" 2>>"$LOG"',
        '  if [ -f "$S/index" ]; then cp -p "$S/index" "$GD/index"; fi',
        "}",
    ]
    for name, cmd in rungs:
        lines.append(
            f'echo "+ {name}" >>"$LOG"; if {cmd} >>"$LOG" 2>&1; '
            f'then echo "{VERDICT} ok {name}"; exit 0; fi; restore'
        )
    lines.append(f'echo "{VERDICT} failed"')
    return "\n".join(lines) + "\n"


def parse_verdict(output: str) -> tuple[bool, str | None]:
    """``(applied, rung)`` from the script's output; ``(False, None)`` if no rung applied."""
    for line in reversed(output.splitlines()):
        if line.startswith(VERDICT):
            words = line.split()
            if len(words) >= 3 and words[1] == "ok" and words[2] in (EMPTY, *RUNGS):
                return True, words[2]
            return False, None
    return False, None
