"""A small, version-aware adapter over the ``swebench`` package (4.1+ and 5.x), imported lazily.

Only three things are taken from swebench: building a ``TestSpec`` (its eval script), and
grading a log with ``get_eval_report`` / ``get_logs_eval``. Nothing of its log parsing is
re-implemented here; the log is written to a file and handed to swebench as it is.

* swebench 5.x: ``swebench.harness.utils.make_test_spec(instance)`` needs a row carrying
  ``eval_script``, ``log_parser`` and ``eval_type`` (the 5.x dataset shape). It cannot build a
  script from ``repo`` + ``version``.
* swebench 4.x: ``swebench.harness.test_spec.test_spec.make_test_spec`` builds the script from
  ``repo`` + ``version``. For repos whose environment script would fetch ``requirements.txt`` /
  ``environment.yml`` from GitHub, the TestSpec is composed from swebench's own pure
  ``make_eval_script_list`` with no environment script, so nothing touches the network.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._errors import SpecBuildError as SpecBuildError  # re-exported: raised from here
from ._types import InstanceMetadata, SweBenchGrading

#: The command that fixes a missing swebench, or one that cannot build classic rows' scripts.
INSTALL_HINT = "pip install 'trio-swe[swebench]' (swebench>=4.1,<5)"
#: The command for datasets of 5.x-shape rows whose parser swebench 4.x lacks.
INSTALL_HINT_V5 = "pip install 'trio-swe[swebench5]' (swebench>=5)"
#: Reasons a row cannot be graded that installing another swebench fixes.
VERSION_REASONS = (
    "swebench_import_failed",
    "classic_row_needs_swebench_4",
    "v5_row_needs_swebench_5",
)
#: What swebench 5.x's ``record_test_exit_code`` prints after the test command.
TEST_EXIT_CODE = ">>>>> Test Exit Code"
_END_TEST_OUTPUT = ">>>>> End Test Output"


@dataclass(frozen=True)
class _Api:
    version: str
    major: int
    get_eval_report: Any
    get_logs_eval: Any
    make_test_spec: Any
    parsers: Any = None  # parser name -> function (5.x: PARSER_REGISTRY)
    # 4.x only
    test_spec_cls: Any = None
    make_eval_script_list: Any = None
    specs: Any = None
    repo_to_ext: Any = None
    repo_to_parser: Any = None
    fail_only_repos: frozenset[str] = frozenset()


_lock = threading.Lock()
_api: _Api | None = None
_error: str | None = None


def _load() -> _Api:
    grading = importlib.import_module("swebench.harness.grading")
    try:
        version = importlib.metadata.version("swebench")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path
        version = str(getattr(importlib.import_module("swebench"), "__version__", "0"))
    try:
        ts4 = importlib.import_module("swebench.harness.test_spec.test_spec")
    except ModuleNotFoundError:
        utils5 = importlib.import_module("swebench.harness.utils")
        parsers5 = importlib.import_module("swebench.harness.log_parsers")
        return _Api(
            version=version,
            major=5,
            get_eval_report=grading.get_eval_report,
            get_logs_eval=grading.get_logs_eval,
            make_test_spec=utils5.make_test_spec,
            parsers=parsers5.PARSER_REGISTRY,
        )
    scripts = importlib.import_module("swebench.harness.test_spec.create_scripts")
    constants = importlib.import_module("swebench.harness.constants")
    parsers = importlib.import_module("swebench.harness.log_parsers")
    # 4.x has no registry by name: its parsers live in per-language modules.
    named: dict[str, Any] = {}
    for lang in ("c", "go", "java", "javascript", "php", "python", "ruby", "rust"):
        with contextlib.suppress(ImportError):
            mod = importlib.import_module(f"swebench.harness.log_parsers.{lang}")
            named.update({n: getattr(mod, n) for n in dir(mod) if n.startswith("parse_log_")})
    return _Api(
        version=version,
        major=4,
        get_eval_report=grading.get_eval_report,
        get_logs_eval=grading.get_logs_eval,
        make_test_spec=ts4.make_test_spec,
        parsers=named,
        test_spec_cls=ts4.TestSpec,
        fail_only_repos=frozenset(getattr(constants, "FAIL_ONLY_REPOS", ())),
        make_eval_script_list=scripts.make_eval_script_list,
        specs=constants.MAP_REPO_VERSION_TO_SPECS,
        repo_to_ext=constants.MAP_REPO_TO_EXT,
        repo_to_parser=parsers.MAP_REPO_TO_PARSER,
    )


def get_api() -> _Api | None:
    """The loaded adapter, importing swebench on first use; None if it cannot be imported."""
    global _api, _error
    with _lock:
        if _api is None and _error is None:
            try:
                _api = _load()
            except Exception as exc:  # any import-time failure of a heavy optional package
                _error = f"swebench is not importable ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        return _api


def unavailable_reason() -> str | None:
    """Why swebench cannot be used (naming the fix), or None."""
    return _error if get_api() is None else None


def build_test_spec(md: InstanceMetadata) -> Any:
    """Build swebench's ``TestSpec`` for ``md``; its ``.eval_script`` is the script to run.

    Raises:
        SpecBuildError: swebench missing, or the row cannot produce a script with this version.
    """
    api = get_api()
    if api is None:
        raise SpecBuildError("swebench_import_failed", _error or "")
    g = md.grading
    if not isinstance(g, SweBenchGrading):
        raise SpecBuildError("not_a_swebench_row")
    inst = g.instance(md.instance_id, md.image)
    parser = api.parsers.get(g.log_parser or "") if g.is_v5_row else None
    if parser is None and api.repo_to_parser is not None:
        parser = api.repo_to_parser.get(g.repo)
    if parser is not None:
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            inst[key] = as_parser_ids(parser, inst[key])
    if api.major >= 5:
        if not g.is_v5_row:
            raise SpecBuildError(
                "classic_row_needs_swebench_4",
                f"swebench {api.version} builds no eval script from repo+version (a classic "
                f"SWE-bench row); fix: {INSTALL_HINT}",
            )
        if g.log_parser not in api.parsers:
            raise SpecBuildError(
                "unknown_log_parser", f"swebench {api.version} has no parser {g.log_parser!r}"
            )
        try:
            return api.make_test_spec(inst)
        except Exception as exc:
            raise SpecBuildError("make_test_spec_failed", f"{type(exc).__name__}: {exc}") from exc
    return _build_v4(api, g, inst)


def _build_v4(api: _Api, g: SweBenchGrading, inst: dict[str, Any]) -> Any:
    if g.is_v5_row:
        # A 5.x row on 4.x: run the row's script. 4.x picks the parser (and fail-only grading)
        # by repo, so that must be the parser and eval type the row names.
        parser = api.parsers.get(g.log_parser or "")
        if api.repo_to_parser.get(g.repo) is not parser or parser is None:
            raise SpecBuildError(
                "v5_row_needs_swebench_5",
                f"swebench {api.version} parses {g.repo!r} logs with "
                f"{getattr(api.repo_to_parser.get(g.repo), '__name__', 'no parser')}, the row "
                f"names {g.log_parser!r}; fix: {INSTALL_HINT_V5}",
            )
        fail_only = g.repo in api.fail_only_repos
        if fail_only != (g.eval_type == "fail_only"):
            raise SpecBuildError(
                "v5_row_needs_swebench_5",
                f"swebench {api.version} grades {g.repo!r} as "
                f"{'fail_only' if fail_only else 'pass_and_fail'}, the row says "
                f"{g.eval_type!r}; fix: {INSTALL_HINT_V5}",
            )
        lines = [
            ln
            for ln in (g.eval_script or "").strip().split("\n")
            if ln not in ("#!/bin/bash", "set -uxo pipefail")
        ]
        return _spec_v4(api, inst, lines)
    if g.repo not in api.repo_to_parser:
        raise SpecBuildError(
            "unknown_repo", f"swebench {api.version} has no log parser for {g.repo!r}"
        )
    specs = api.specs.get(g.repo, {}).get(g.version)
    if specs is None:
        raise SpecBuildError(
            "unknown_repo_version",
            f"swebench {api.version} has no specs for {g.repo} {g.version!r}",
        )
    try:
        if specs.get("packages") in ("requirements.txt", "environment.yml"):
            # make_test_spec would fetch these from GitHub (no timeout); grading needs only the
            # eval script, which swebench builds offline.
            lines = api.make_eval_script_list(
                inst, specs, "testbed", "/testbed", g.base_commit, g.test_patch
            )
            return _spec_v4(api, inst, lines)
        return _spec_v4(api, inst, api.make_test_spec(inst).eval_script_list)
    except SpecBuildError:
        raise
    except Exception as exc:
        raise SpecBuildError("make_test_spec_failed", f"{type(exc).__name__}: {exc}") from exc


_PROBE_ID = "trio_swe_probe.py::test_id[with space]"
_cuts_at_space: dict[Any, bool] = {}


def as_parser_ids(parser: Any, ids: list[str]) -> list[str]:
    """The row's test ids as ``parser`` spells them in its status map.

    swebench's pytest parsers split summary lines on whitespace, so a test whose id has a space
    (``test_make_error[required-Missing data]``) is reported as
    ``test_make_error[required-Missing``; a row listing the full id would then count a passing
    test as missing. Whether a parser cuts is asked of the parser itself, once, on a probe line;
    for one that does, ids are cut the same way (SWE-bench's own datasets store them so).
    """
    if not any(" " in t for t in ids):
        return ids
    cuts = _cuts_at_space.get(parser)
    if cuts is None:
        try:
            status = dict(parser(f"PASSED {_PROBE_ID}\n", None))
        except Exception:  # a parser that needs a TestSpec: leave its ids alone
            status = {}
        cuts = _PROBE_ID not in status and _PROBE_ID.split(" ")[0] in status
        _cuts_at_space[parser] = cuts
    return [t.split(" ")[0] if cuts else t for t in ids]


def record_test_exit_code(lines: list[str]) -> list[str]:
    """Make a 4.x eval script print its test command's exit status, as 5.x's scripts do.

    The script ends with a ``git checkout`` reset and has no ``set -e``, so its own status is
    the reset's; ``$?`` right before the end marker is the test command's. Printed after the
    marker, it stays out of the parsed region. Scripts that already record it are unchanged.
    ``lines`` are the script's lines; a marker's text inside a here-document (a test patch
    that carries it) is not the marker.
    """
    shell = [ln for ln, in_body in _shell_lines(lines) if not in_body]
    if any(TEST_EXIT_CODE in ln for ln in shell):
        return list(lines)
    i = _end_marker(lines)
    if i is None:
        return list(lines)
    return [
        *lines[:i],
        "__trio_swe_test_rc=$?",
        lines[i],
        f'echo "{TEST_EXIT_CODE}: $__trio_swe_test_rc"',
        *lines[i + 1 :],
    ]


#: The eval scripts' grant of git access to the repository, which the graded command's
#: environment already gives (``safe.directory=*``, the first pair of ``GIT_SAFE_ENV``).
_SAFE_DIRECTORY = "git config --global --add safe.directory "
#: The grant, guarded: it runs only when the environment does not grant it already.
_SAFE_DIRECTORY_GUARD = (
    '[ "${GIT_CONFIG_COUNT:-0}" != 0 ] && '
    '[ "${GIT_CONFIG_KEY_0-}=${GIT_CONFIG_VALUE_0-}" = "safe.directory=*" ] || '
)


def run_script(script: str) -> str:
    """The eval script as a grading runs it (the one an artifact records).

    Two steps that cannot change a verdict are left out, each an exec of git (about 3 ms in a
    local sandbox, of a fixed cost per grading near 50 ms):

    * everything after the end-of-test-output marker (and the recorded exit code right after
      it): it resets the test files, or removes the test patch's, for a container that lives
      on. The eval sandbox is killed right after, and swebench grades only what is between the
      markers (its checks for bad codes look at the whole log, and a reset's output carries
      none);
    * ``git config --global --add safe.directory <dir>`` when the environment grants
      ``safe.directory=*`` already (every graded command's does: ``GIT_SAFE_ENV``): it is
      guarded by that test, in the script, so it still runs wherever the grant is missing.

    Lines inside here-documents (the test patch) are never touched. A script without the end
    marker is returned unchanged but for the guard.
    """
    lines = script.split("\n")
    out: list[str] = []
    for line, in_body in _shell_lines(lines):
        if not in_body and line.startswith(_SAFE_DIRECTORY):
            line = _SAFE_DIRECTORY_GUARD + line
        out.append(line)
    end = _end_marker(lines)
    if end is not None:
        stop = end + 1
        if stop < len(lines) and lines[stop].startswith(f'echo "{TEST_EXIT_CODE}'):
            stop += 1
        out = out[:stop]
    text = "\n".join(out)
    return text if text.endswith("\n") else text + "\n"


#: ``<<WORD``, ``<<'WORD'``, ``<<"WORD"``, ``<<-WORD``: a here-document's opener.
_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*(['\"]?)([A-Za-z0-9_]+)\2")


def _shell_lines(lines: list[str]) -> Iterator[tuple[str, bool]]:
    """Each line with whether it is inside a here-document's body (its text, not shell)."""
    word: str | None = None
    strip_tabs = False
    for line in lines:
        if word is not None:
            yield line, True
            if (line.lstrip("\t") if strip_tabs else line) == word:
                word = None
            continue
        yield line, False
        m = _HEREDOC.search(line)
        if m is not None:
            strip_tabs, word = m.group(1) == "-", m.group(3)


def _end_marker(lines: list[str]) -> int | None:
    """The index of the script's end-of-test-output line (a shell line, not one of the test
    patch's), or None."""
    for i, (line, in_body) in enumerate(_shell_lines(lines)):
        if not in_body and _END_TEST_OUTPUT in line:
            return i
    return None


def _spec_v4(api: _Api, inst: dict[str, Any], eval_lines: list[str]) -> Any:
    # One line per element: an element may be a whole here-document (the test patch).
    eval_lines = record_test_exit_code("\n".join(eval_lines).split("\n"))
    return api.test_spec_cls(
        instance_id=inst["instance_id"],
        repo=inst["repo"],
        version=inst["version"],
        repo_script_list=[],
        eval_script_list=list(eval_lines),
        env_script_list=[],
        arch="x86_64",
        FAIL_TO_PASS=list(inst["FAIL_TO_PASS"]),
        PASS_TO_PASS=list(inst["PASS_TO_PASS"]),
        language=api.repo_to_ext.get(inst["repo"], "py"),
        docker_specs={},
        namespace=None,
    )


@dataclass(frozen=True)
class LogGrade:
    """swebench's verdict on one log."""

    resolved: bool
    gradable: bool  # swebench's ``patch_successfully_applied``: markers found, no bad codes
    tests_status: dict[str, str]
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    infra_reason: str | None
    report: dict[str, Any]


def grade_log(test_spec: Any, instance_id: str, patch: str, log_text: str) -> LogGrade:
    """Grade ``log_text`` with swebench's ``get_eval_report`` (blocking; run it in a thread)."""
    api = get_api()
    if api is None:
        raise SpecBuildError("swebench_import_failed", _error or "")
    fd, path = tempfile.mkstemp(prefix="trio_swe_eval_", suffix=".log")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
            f.write(log_text)
        report = api.get_eval_report(
            test_spec=test_spec,
            prediction={
                "instance_id": instance_id,
                "model_patch": patch,
                "model_name_or_path": "trio_swe",
            },
            test_log_path=path,
            include_tests_status=True,
        )
        status_map, _found = api.get_logs_eval(test_spec, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    info = report.get(instance_id, {})
    ts = info.get("tests_status") or {}
    f2p = ts.get("FAIL_TO_PASS") or {"success": [], "failure": []}
    p2p = ts.get("PASS_TO_PASS") or {"success": [], "failure": []}
    return LogGrade(
        resolved=bool(info.get("resolved")),
        gradable=bool(info.get("patch_successfully_applied")),
        tests_status={str(k): str(v) for k, v in dict(status_map).items()},
        f2p_passed=len(f2p["success"]),
        f2p_total=len(f2p["success"]) + len(f2p["failure"]),
        p2p_passed=len(p2p["success"]),
        p2p_total=len(p2p["success"]) + len(p2p["failure"]),
        infra_reason=info.get("infra_failure_reason"),
        report=info,
    )


def parse_log(parser_name: str, log_text: str) -> dict[str, str]:
    """Test id -> status from swebench's parser ``parser_name`` (for logs of other graders).

    Raises:
        SpecBuildError: swebench missing or without that parser.
    """
    api = get_api()
    if api is None:
        raise SpecBuildError("swebench_import_failed", _error or "")
    parser = api.parsers.get(parser_name)
    if parser is None:
        raise SpecBuildError(
            "unknown_log_parser", f"swebench {api.version} has no parser {parser_name!r}"
        )
    status = parser(log_text, None)  # the Python parsers ignore the TestSpec
    return {str(k): str(getattr(v, "value", v)) for k, v in dict(status).items()}


def has_parser(parser_name: str) -> str | None:
    """None if swebench can parse with ``parser_name``, else the reason (naming the fix)."""
    api = get_api()
    if api is None:
        return f"swebench_import_failed:{_error or ''}"
    if parser_name not in api.parsers:
        return f"unknown_log_parser:swebench {api.version} has no parser {parser_name!r}"
    return None
