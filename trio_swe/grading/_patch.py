"""The patch-apply ladder, sans-IO: build the script, parse its verdict.

Rungs, in order (SWE-bench's ``GIT_APPLY_CMDS`` plus git's three-way merge):
``git apply``, ``git apply --3way``, ``git apply --reject``, ``patch --batch --forward --fuzz=5
-p1``. Every rung starts from the same tree: once the first rung (atomic: plain ``git apply``
writes nothing unless every hunk applies) has failed, the script saves the files the patch
touches and git's index, and a failed rung is rolled back (partial hunks, ``.rej`` /
``.orig`` files, conflict markers, a conflicted index) before the next one runs.

An empty (or whitespace-only) patch is "applied" as rung ``empty``. Binary diffs need
``git diff --binary`` output; ``git apply`` handles them, ``patch`` does not.

A patch is bytes (it may hold text in any encoding); the parsers here read it as UTF-8 with
``surrogateescape``, so no byte is lost. Before any rung runs, :func:`refused_paths` rejects a
patch that would write into git's own directory (``.git/hooks``, ``.git/config``: code the
grader's git would run), outside the work tree (absolute paths, ``..``), or through a symlink
it creates that points there; ``git apply`` refuses most of these, ``patch`` does not. The
ladder's git runs with hooks and fsmonitor off.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Final

from .._errors import InvalidArgumentError, PatchFailedError

#: The ladder's rung names, in order.
RUNGS: Final = ("git_apply", "git_apply_3way", "git_apply_reject", "patch_fuzz")
EMPTY: Final = "empty"
#: The verdict line the script prints last (``@@TRIO_SWE_APPLY ok <rung>`` / ``failed``).
VERDICT: Final = "@@TRIO_SWE_APPLY"
#: The script's exit status when it applied nothing (any verdict but ``ok``); 0 only after
#: ``ok``, so a shell can gate the tests on it.
NOT_APPLIED_STATUS: Final = 3

#: Configuration every git command of grading runs with, as ``GIT_CONFIG_*`` variables (they
#: outrank the repository's own config and reach the git commands inside eval scripts): no
#: hooks, no fsmonitor command, no automatic gc. ``safe.directory`` lets root use a tree that
#: another user owns.
GIT_SAFE_CONFIG: Final = (
    ("safe.directory", "*"),
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("gc.auto", "0"),
)
GIT_SAFE_ENV: Final = {
    "GIT_CONFIG_COUNT": str(len(GIT_SAFE_CONFIG)),
    **{f"GIT_CONFIG_KEY_{i}": k for i, (k, _) in enumerate(GIT_SAFE_CONFIG)},
    **{f"GIT_CONFIG_VALUE_{i}": v for i, (_, v) in enumerate(GIT_SAFE_CONFIG)},
}

_HEADER = re.compile(r"^(?:--- |\+\+\+ |rename from |rename to |copy from |copy to )(.*)$")
_DIFF_GIT = re.compile(r"^diff --git (.*)$")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def is_empty_patch(patch: str | bytes) -> bool:
    """True when there is nothing to apply."""
    return not patch.strip()


def patch_bytes(patch: str | bytes) -> bytes:
    """The patch as bytes; a str is encoded as UTF-8 (``surrogateescape``: lone surrogates in
    U+DC80..U+DCFF are the bytes a ``surrogateescape`` decode kept).

    Raises:
        InvalidArgumentError: not str or bytes, or a str holding another lone surrogate (no
            encoding can write it).
        PatchFailedError: more than :data:`MAX_PATCH_BYTES`.
    """
    if isinstance(patch, bytes | bytearray | memoryview):
        _check_size(len(patch))
        return bytes(patch)
    if not isinstance(patch, str):
        raise InvalidArgumentError(f"patch must be str or bytes, got {type(patch).__name__}")
    _check_size(len(patch))  # a str's UTF-8 is at least as long: refuse before encoding
    try:
        data = patch.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"patch: the character {patch[exc.start]!r} at index {exc.start} is a lone "
            "surrogate, which no encoding can write; pass the patch as bytes"
        ) from None
    _check_size(len(data))
    return data


#: The largest patch graded: grading holds a few copies of it (text, shell-quoted, its lines),
#: so a bigger one costs the client several times its size. Agents' patches are far smaller;
#: one this big is generated files or junk.
MAX_PATCH_BYTES: Final = 16 * 1024 * 1024


def _check_size(size: int) -> None:
    if size > MAX_PATCH_BYTES:
        raise PatchFailedError(
            f"the patch has {size} bytes, more than MAX_PATCH_BYTES ({MAX_PATCH_BYTES}) "
            "allows grading"
        )


def patch_text(patch: str | bytes) -> str:
    """The patch as str, bytes that are not UTF-8 kept as lone surrogates (``surrogateescape``)."""
    if isinstance(patch, str):
        return patch
    return bytes(patch).decode("utf-8", "surrogateescape")


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
    return out.decode("utf-8", "surrogateescape")


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


def touched_paths(patch: str | bytes) -> list[str]:
    """Repository-relative paths a unified diff touches (old and new names), deduplicated.

    Paths that are absolute or climb out with ``..`` are dropped (:func:`refused_paths` refuses
    such a patch). Bytes that are not UTF-8 come back as lone surrogates: encode the paths with
    ``surrogateescape``.
    """
    seen: dict[str, None] = {}
    for line, _ in _outside_hunks(patch_text(patch)):
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
            # ``diff --git a/x b/x``: unambiguous only when both halves are equal (so its length
            # is odd: two equal halves around one space; an empty rest has none).
            rest = g.group(1)
            half = len(rest) // 2
            if len(rest) % 2 == 0 or rest[half] != " " or rest[:half][2:] != rest[half + 1 :][2:]:
                continue
            path = _strip_prefix(rest[:half])
        if path and _safe(path):
            seen.setdefault(path, None)
    return list(seen)


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_PATH_HEADER = re.compile(
    r"^(?:--- |\+\+\+ |\*\*\* |Index: |rename from |rename to |copy from |copy to "
    r"|rename old |rename new )(.*)$"
)
_SYMLINK_MODE = re.compile(r"^(?:new file mode 120000|new mode 120000|index \S+ 120000)\s*$")


def _lines(text: str) -> list[str]:
    # Only "\n" ends a line for git and patch (str.splitlines also splits at form feeds...).
    return text.split("\n")


def _outside_hunks(text: str) -> list[tuple[str, list[str]]]:
    """The lines outside unified hunks, each with the ``+`` lines of the hunk that follows it
    (used for symlink targets). Hunk bodies are skipped by their line counts, so a removed line
    that reads ``-- a/.git/x`` is content, not a header."""
    out: list[tuple[str, list[str]]] = []
    lines = _lines(text)
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        m = _HUNK.match(line)
        if not m:
            out.append((line, []))
            continue
        old = int(m.group(1)) if m.group(1) is not None else 1
        new = int(m.group(2)) if m.group(2) is not None else 1
        added: list[str] = []
        while i < len(lines) and (old > 0 or new > 0):
            body = lines[i]
            tag = body[:1]
            if tag in (" ", ""):
                old, new = old - 1, new - 1
            elif tag == "-":
                old -= 1
            elif tag == "+":
                new -= 1
                added.append(body[1:])
            elif tag != "\\":
                break  # a malformed hunk ends here; what follows is read as headers
            i += 1
        if out:
            out[-1][1].extend(added)
    return out


def _why_refused(path: str) -> str | None:
    """Why ``path`` (as a patch names it, prefixes included) must not be written, or None."""
    if "\x00" in path:
        return "contains a NUL character"
    if path.startswith("/"):
        return "is an absolute path, outside the work tree"
    parts = path.split("/")
    if ".." in parts:
        return "climbs out with '..'"
    if any(p.lower() == ".git" for p in parts):
        return "is inside git's own directory (hooks and config there are code git runs)"
    return None


def _header_path(raw: str) -> str | None:
    path = _unquote_c(raw.split("\t", 1)[0].rstrip("\r"))
    return None if path == "/dev/null" else path


def refused_paths(patch: str | bytes) -> list[str]:
    """Why the patch must not be applied, one line per offending path; empty when it is fine.

    Refused: any path (old or new name, in any header ``git apply`` or ``patch`` reads) inside
    a ``.git`` directory, absolute, or climbing out with ``..``; a symlink the patch creates
    whose target is absolute, outside the work tree or inside ``.git``.
    """
    found: dict[str, str] = {}
    current: str | None = None  # the file the next hunk belongs to
    symlink = False
    for line, added in _outside_hunks(patch_text(patch)):
        candidates: list[str] = []
        if line.startswith("diff --git "):
            symlink = False
            current = None
            # Names may hold spaces: every whitespace-separated piece is checked.
            candidates = [_unquote_c(t) for t in line[len("diff --git ") :].split()]
        elif _SYMLINK_MODE.match(line):
            symlink = True
        else:
            m = _PATH_HEADER.match(line)
            if m:
                path = _header_path(m.group(1))
                if path is not None:
                    candidates = [path]
                    if line.startswith("+++ "):
                        current = path[2:] if path.startswith("b/") else path
        for path in candidates:
            why = _why_refused(path)
            if why is not None:
                found.setdefault(path, why)
        if symlink and added and current is not None:
            target = added[0]
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
            why = None
            if target.startswith("/"):
                why = f"is a symlink to the absolute path {target!r}"
            elif resolved == ".." or resolved.startswith("../"):
                why = f"is a symlink to {target!r}, outside the work tree"
            elif any(p.lower() == ".git" for p in resolved.split("/")):
                why = f"is a symlink to {target!r}, inside git's own directory"
            if why is not None:
                found.setdefault(current, why)
            symlink = False
    return [f"{path!r} {why}" for path, why in found.items()]


#: Printed before any rung when the caller asked for the checkout's commit
#: (``@@TRIO_SWE_HEAD <sha>``; empty when the workdir has no commit).
HEAD_MARK: Final = "@@TRIO_SWE_HEAD"
_HEX_COMMIT = re.compile(r"[0-9a-f]{7,40}")
#: Bytes written as themselves by :func:`printf_bytes`; every other byte as an octal escape.
_PRINTF_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/-+,:@=")
#: With ``text=True`` also printable ASCII, spaces, tabs and newlines (literal inside single
#: quotes): only ``'``, ``\\``, other control bytes and non-ASCII bytes are escaped.
_PRINTF_TEXT_SAFE = frozenset(b for b in range(0x20, 0x7F) if b not in b"'\\") | frozenset(b"\n\t")
_PRINTF_MAPS = {
    text: {b: f"\\0{b:03o}" for b in range(256) if b not in safe}
    for text, safe in ((False, _PRINTF_SAFE), (True, _PRINTF_TEXT_SAFE))
}


def printf_bytes(data: bytes, *, text: bool = False) -> str:
    """An ASCII argument of bash's ``printf '%b'`` that prints exactly ``data`` (NULs and any
    byte included): every byte outside a safe set becomes ``\\0NNN``. ``text``: the wider safe
    set, for a single-quoted argument (a patch stays about its own size)."""
    return data.decode("latin-1").translate(_PRINTF_MAPS[text])


#: ``up PATH`` sets ``D`` to ``dirname -- PATH`` (POSIX's steps, in bash, without a process;
#: a leading ``//`` becomes ``/``, where GNU keeps it).
DIRNAME_FUNCTION: Final = (
    'up() { D=$1; [ -n "$D" ] || { D=.; return; }; '
    "case $D in *[!/]*) ;; *) D=/; return;; esac; "
    "while [[ $D == */ ]]; do D=${D%/}; done; "
    "case $D in */*) ;; *) D=.; return;; esac; "
    'D=${D%/*}; while [[ $D == */ ]]; do D=${D%/}; done; [ -n "$D" ] || D=/; }'
)


#: Sets ``H`` to the checkout's commit, ``""`` when it has none. A plain ``.git`` directory's
#: ``HEAD`` (a commit id: a detached checkout, as the local backend's ``path@commit`` images
#: are; or ``ref: refs/heads/<name>`` with that branch's loose ref file) is read by bash
#: itself, no process started; anything else (``GIT_DIR`` set, a ``.git`` file, packed or
#: reftable refs, an unborn branch, a symref chain) asks ``git rev-parse``. Never laxer than
#: ``rev-parse`` alone: both give the same commit id for a valid ``HEAD``, and where
#: ``rev-parse`` fails (a ``HEAD`` naming a missing object) it gives ``""``, which no
#: expected commit is refused for, while this gives the id, which must then match.
READ_HEAD: Final = (
    "H=; r=\n"
    'if [ -z "${GIT_DIR:-}${GIT_COMMON_DIR:-}" ] && [ -d .git ]; then\n'
    "  read -r H <.git/HEAD 2>/dev/null || H=\n"
    '  case "$H" in "ref: refs/heads/"*) r=${H#ref: }; H=\n'
    '    case "$r" in *..*) ;; *) [ -f ".git/$r" ] && read -r H <".git/$r" 2>/dev/null || H=;; esac;;\n'
    "  esac\n"
    '  case "$H" in *[!0-9a-f]*) H=;; esac\n'
    "  case ${#H} in 40|64) ;; *) H=;; esac\n"
    "fi\n"
    '[ -n "$H" ] || H=$(g rev-parse --verify -q "HEAD^{commit}" 2>/dev/null) || H=""'
)


def apply_script(
    *,
    workdir: str,
    patch_path: str | None,
    list_path: str,
    state_dir: str,
    paths: bytes | None = None,
    expect_head: str | None = None,
    state_ready: bool = False,
) -> str:
    """The bash script that runs the ladder in ``workdir``.

    Args:
        workdir: the repository.
        patch_path: the diff, already written in the sandbox; None for an empty patch
            (:func:`is_empty_patch`: then the script only does the ``expect_head`` check and
            reports rung ``empty``).
        list_path: where the NUL-separated :func:`touched_paths` are (already written, unless
            ``paths`` is given).
        state_dir: a fresh directory for the snapshot and the rungs' log (``apply.log``).
        paths: the NUL-separated touched paths; the script writes them to ``list_path`` itself
            (one file write fewer; they travel as ASCII escapes, see :func:`printf_bytes`).
        expect_head: the commit the checkout must be (a row's ``base_commit``; a prefix of at
            least 7 hex digits matches). The script prints :data:`HEAD_MARK` and, when the
            checkout is another commit, applies nothing (verdict ``wrong_head``). A workdir
            with no commit is not checked.
        state_ready: ``state_dir`` exists already (one process fewer).

    The script prints :data:`VERDICT` lines; parse with :func:`parse_verdict`,
    :func:`parse_refusal` and :func:`parse_head`. It exits 0 right after an ``ok`` verdict and
    :data:`NOT_APPLIED_STATUS` after any other (an error of its own gives another non-zero
    status): a shell may run the tests only on 0, and the caller checks that both agree.
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
        f'P={q(patch_path or "/dev/null")}; L={q(list_path)}; S={q(state_dir)}; LOG="$S/apply.log"',
        ': >"$LOG"' if state_ready else 'mkdir -p "$S" && : >"$LOG"',
        f'cd {q(workdir)} || {{ echo "{VERDICT} failed cd"; exit {NOT_APPLIED_STATUS}; }}',
        # No hook or fsmonitor of the repository runs (see GIT_SAFE_ENV).
        "g() { git -c safe.directory='*' -c core.quotepath=off -c core.hooksPath=/dev/null "
        '-c core.fsmonitor=false -c gc.auto=0 "$@"; }',
    ]
    if expect_head is not None:
        want = expect_head.strip().lower()
        # A base_commit that is no commit id (too short, not hex) matches no checkout.
        match = f'""|{want}*' if _HEX_COMMIT.fullmatch(want) else '""'
        lines += [
            READ_HEAD,
            f'echo "{HEAD_MARK} $H"',
            f'case "$H" in {match}) ;; *) echo "{VERDICT} wrong_head"; exit {NOT_APPLIED_STATUS};; esac',
        ]
    if patch_path is None:
        lines.append(f'echo "{VERDICT} ok {EMPTY}"; exit 0')
        return "\n".join(lines) + "\n"
    if paths is not None:
        lines.append(f"printf '%b' {q(printf_bytes(paths))} >\"$L\"")
    lines += [
        # Nothing is written through a symlink already in the tree (git 2.39's apply --3way
        # and patch both would); every rung starts from this same tree.
        DIRNAME_FUNCTION,
        "R=0",
        "while IFS= read -r -d '' f; do up \"$f\"; d=$D",
        '  while [ "$d" != . ] && [ "$d" != / ]; do',
        '    if [ -L "$d" ]; then echo "refused: $f is beyond the symlink $d"; R=1; fi',
        '    up "$d"; d=$D; done; done <"$L"',
        f'if [ "$R" = 1 ]; then echo "{VERDICT} refused"; exit {NOT_APPLIED_STATUS}; fi',
    ]
    snapshot = [
        'GD=$(g rev-parse --absolute-git-dir 2>/dev/null) || GD=""',
        'if [ -n "$GD" ] && [ -f "$GD/index" ]; then cp -p "$GD/index" "$S/index"; fi',
        'tar --null -T "$L" --ignore-failed-read -cf "$S/files.tar" 2>>"$LOG"',
        "restore() {",
        '  while IFS= read -r -d \'\' f; do rm -rf -- "$f" "$f.rej" "$f.orig"; done <"$L"',
        '  tar -xf "$S/files.tar" 2>>"$LOG"',
        '  if [ -f "$S/index" ]; then cp -p "$S/index" "$GD/index"; fi',
        "}",
    ]
    for i, (name, cmd) in enumerate(rungs):
        lines.append(
            f'echo "+ {name}" >>"$LOG"; if {cmd} >>"$LOG" 2>&1; '
            f'then echo "{VERDICT} ok {name}"; exit 0; fi' + ("" if i == 0 else "; restore")
        )
        if i == 0:
            # Plain `git apply` is atomic (it writes nothing unless every hunk applies), so the
            # tree is still untouched here: the snapshot is only paid for when rung 1 fails.
            lines += snapshot
    lines.append(f'echo "{VERDICT} failed"; exit {NOT_APPLIED_STATUS}')
    return "\n".join(lines) + "\n"


def parse_head(output: str) -> str | None:
    """The checkout's commit the script printed (``""``: no commit), None if not asked for."""
    for line in output.splitlines():
        if line == HEAD_MARK or line.startswith(HEAD_MARK + " "):
            return line[len(HEAD_MARK) :].strip().lower()
    return None


def wrong_head(output: str) -> bool:
    """Did the script refuse to apply because the checkout is not the expected commit?"""
    return any(line.split()[:2] == [VERDICT, "wrong_head"] for line in output.splitlines())


def parse_refusal(output: str) -> str | None:
    """Why the script refused the patch before any rung (``refused: ...`` lines), or None."""
    if f"{VERDICT} refused" not in output:
        return None
    lines = [ln[len("refused: ") :] for ln in output.splitlines() if ln.startswith("refused: ")]
    return "; ".join(lines[:5]) or "refused by the apply script"


def parse_verdict(output: str) -> tuple[bool, str | None]:
    """``(applied, rung)`` from the script's output; ``(False, None)`` if no rung applied."""
    for line in reversed(output.splitlines()):
        if line.startswith(VERDICT):
            words = line.split()
            if len(words) >= 3 and words[1] == "ok" and words[2] in (EMPTY, *RUNGS):
                return True, words[2]
            return False, None
    return False, None


#: Every agent-defined filter driver is switched off by name (``-c filter.<name>.clean=``...):
#: git has no switch that ignores the repository's filters as a whole.
_NO_FILTERS = (
    "set --\n"
    'while IFS= read -r k; do [ -n "$k" ] && set -- "$@" -c "$k="; done <<TRIO_SWE_EOF\n'
    "$(git -c safe.directory='*' config --name-only --get-regexp "
    "'^filter\\..*\\.(clean|smudge|process|required)$' 2>/dev/null)\n"
    "TRIO_SWE_EOF\n"
)


def diff_script(
    *, workdir: str, base_commit: str, out_path: str, err_path: str, excludes: tuple[str, ...]
) -> str:
    """The sh script that takes a patch (``git add -N``, then ``git diff --binary`` against
    ``base_commit`` into ``out_path``, then prints it) in a tree someone else controlled.

    It runs as root in the agent's sandbox, where the agent could write ``.git/config``, hooks,
    ``.gitattributes`` and the global config under ``/tmp``: no hook, fsmonitor, filter,
    textconv, external diff, automatic gc or global config of theirs runs, and submodules are
    not entered.
    """
    q = shlex.quote
    safe = " ".join(f"-c {q(f'{k}={v}')}" for k, v in GIT_SAFE_CONFIG)
    script = (
        f"cd {q(workdir)} || exit 1\n"
        "export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1\n"
        + _NO_FILTERS
        + f'git {safe} "$@" add -N . 2>{q(err_path)} && '
        f'git {safe} "$@" diff --binary --no-color --no-ext-diff --no-textconv '
        f"--ignore-submodules=dirty {q(base_commit)} -- . "
        + " ".join(q(f":(exclude){name}") for name in excludes)
        + f" > {q(out_path)} 2>{q(err_path)} && cat {q(out_path)} || {{ cat {q(err_path)}; exit 1; }}\n"
    )
    return script
