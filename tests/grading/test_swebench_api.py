"""The swebench adapter against the installed swebench (4.1 or 5.x): eval scripts and log grading.

Logs are graded by swebench's own ``get_eval_report`` and parsers; these tests only feed them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe.grading import _swebench_api as sw
from trio_swe.grading import evaluability_check, get_metadata
from trio_swe.grading._patch import GIT_SAFE_ENV

pytestmark = pytest.mark.swebench

ROWS = Path(__file__).parent / "rows"  # real dataset rows, see rows/README.md
F2P = ["tests/test_x.py::test_fixed"]
P2P = ["tests/test_x.py::test_old"]


def _major() -> int:
    api = sw.get_api()
    assert api is not None, sw.unavailable_reason()
    return api.major


def _row(prefix: str) -> dict[str, Any]:
    (path,) = ROWS.glob(f"{prefix}*.json")
    row: dict[str, Any] = json.loads(path.read_text())
    return row


def _v5_row(**over: Any) -> dict[str, Any]:
    row = {
        "instance_id": "pytest-dev__pytest-1",
        "repo": "pytest-dev/pytest",
        "version": "5.4",
        "base_commit": "0" * 40,
        "test_patch": "",
        "image": "img",
        "eval_script": "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\npytest -rA\n: '>>>>> End Test Output'\n",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "FAIL_TO_PASS": F2P,
        "PASS_TO_PASS": P2P,
    }
    return {**row, **over}


def _log(*lines: str, exit_code: int | None = None, end: bool = True) -> str:
    out = ["+ : '>>>>> Start Test Output'", "+ pytest -rA", *lines]
    if exit_code is not None:
        out.append(f"+ SWEBENCH_TEST_EXIT_CODE={exit_code}")
    if end:
        out.append("+ : '>>>>> End Test Output'")
    if exit_code is not None:
        out.append(f">>>>> Test Exit Code: {exit_code}")
    return "\n".join(out) + "\n"


def _grade(log: str, **over: Any) -> sw.LogGrade:
    md = get_metadata(_v5_row(**over), "swebench")
    spec = sw.build_test_spec(md)
    return sw.grade_log(spec, md.instance_id, "diff", log)


def test_resolved_log() -> None:
    g = _grade(_log(f"PASSED {F2P[0]}", f"PASSED {P2P[0]}", exit_code=0))
    assert (g.gradable, g.resolved) == (True, True)
    assert (g.f2p_passed, g.f2p_total, g.p2p_passed, g.p2p_total) == (1, 1, 1, 1)
    assert g.tests_status == {F2P[0]: "PASSED", P2P[0]: "PASSED"}


def test_failing_f2p_is_not_resolved() -> None:
    g = _grade(_log(f"FAILED {F2P[0]} - assert 1 == 2", f"PASSED {P2P[0]}", exit_code=1))
    assert (g.gradable, g.resolved) == (True, False)
    assert (g.f2p_passed, g.p2p_passed) == (0, 1)


def test_missing_f2p_is_a_failure() -> None:
    g = _grade(_log(f"PASSED {P2P[0]}", exit_code=0))
    assert (g.gradable, g.resolved, g.f2p_passed) == (True, False, 0)


def test_log_without_end_marker_is_ungradable() -> None:
    g = _grade(_log(f"PASSED {F2P[0]}", f"PASSED {P2P[0]}", end=False))
    assert (g.gradable, g.resolved) == (False, False)


def test_apply_failed_marker_is_ungradable() -> None:
    log = _log(f"PASSED {F2P[0]}", f"PASSED {P2P[0]}") + ">>>>> Patch Apply Failed\n"
    assert _grade(log).gradable is False


def test_spoofed_passed_lines_with_a_failing_exit_code() -> None:
    # PASSED lines printed by, e.g., a conftest, while pytest itself exited 1.
    g = _grade(_log(f"PASSED {F2P[0]}", f"PASSED {P2P[0]}", exit_code=1))
    if _major() >= 5:
        assert (g.gradable, g.resolved) == (False, False)  # 5.x's exit-code check
    else:
        assert g.resolved  # 4.x has no such check (documented)


def test_build_v5_row_spec() -> None:
    md = get_metadata(_v5_row(), "swebench")
    spec = sw.build_test_spec(md)
    assert "pytest -rA" in spec.eval_script
    assert spec.FAIL_TO_PASS == F2P
    # 5.x: its record_test_exit_code; 4.x: ours, the same line.
    assert ">>>>> Test Exit Code" in spec.eval_script


@pytest.mark.parametrize("prefix", ["swebench_v5__markedjs", "swebench_v5__chartjs"])
def test_real_v5_rows_build(prefix: str) -> None:
    row = _row(prefix)
    md = get_metadata(row, "swebench")
    assert evaluability_check(md) is None
    spec = sw.build_test_spec(md)
    assert ">>>>> Start Test Output" in spec.eval_script
    assert row["FAIL_TO_PASS"] == spec.FAIL_TO_PASS


@pytest.mark.parametrize("prefix", ["swebench_classic__pvlib", "swebench_classic__pallets"])
async def test_real_classic_rows(prefix: str) -> None:
    row = _row(prefix)
    md = get_metadata(row, "swebench")
    if _major() >= 5:
        reason = evaluability_check(md)
        assert reason is not None
        assert reason.startswith("classic_row_needs_swebench_4:")
        assert "swebench>=4.1,<5" in reason
        return
    # flask's environment script would fetch requirements.txt from GitHub (no network here):
    # the eval script is still built, offline, in well under the time a fetch would take.
    with trio.fail_after(20):
        reason = await trio.to_thread.run_sync(evaluability_check, md)
    assert reason is None
    spec = sw.build_test_spec(md)
    script = spec.eval_script
    assert row["test_patch"].strip().splitlines()[0] in script
    assert "pytest" in script
    assert ">>>>> End Test Output" in script
    for test_file in {t.split("::")[0] for t in json.loads(row["FAIL_TO_PASS"])}:
        assert test_file in script


def test_unknown_repo_version_is_flagged() -> None:
    md = get_metadata(
        {
            "repo": "pytest-dev/pytest",
            "version": "99.9",
            "base_commit": "c",
            "test_patch": "d",
            "FAIL_TO_PASS": ["t"],
        },
        "swebench",
    )
    reason = evaluability_check(md) or ""
    expected = "classic_row_needs_swebench_4" if _major() >= 5 else "unknown_repo_version"
    assert reason.startswith(expected)


def test_no_graded_tests_is_flagged() -> None:
    # F2P = P2P = [] is vacuously RESOLVED_FULL for any patch: refused before an episode.
    md = get_metadata(_v5_row(FAIL_TO_PASS=[], PASS_TO_PASS=[]), "swebench")
    assert evaluability_check(md) == "no_graded_tests"


def test_unknown_log_parser_is_flagged() -> None:
    md = get_metadata(_v5_row(log_parser="parse_log_nonexistent"), "swebench")
    reason = evaluability_check(md)
    if _major() >= 5:
        assert (reason or "").startswith("unknown_log_parser")
    else:
        # 4.x picks the parser by repo: a row naming another one needs 5.x.
        assert (reason or "").startswith("v5_row_needs_swebench_5")
        assert "trio-swe[swebench5]" in (reason or "")


def test_classic_eval_script_builds_without_network() -> None:
    """swebench 4.x's make_test_spec fetches flask's requirements.txt from GitHub; ours must not."""
    if _major() >= 5:
        pytest.skip("swebench 5.x builds no scripts from repo+version")
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to cut the network")
    code = (
        "import json, sys\n"
        "from trio_swe.grading import get_metadata, evaluability_check\n"
        "from trio_swe.grading._swebench_api import build_test_spec\n"
        "md = get_metadata(json.load(open(sys.argv[1])), 'swebench')\n"
        "print('REASON', evaluability_check(md))\n"
        "print('HAS_TESTS', 'tests/test_config.py' in build_test_spec(md).eval_script)\n"
    )
    (row,) = ROWS.glob("swebench_classic__pallets*.json")
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("cannot create a network namespace here")
    out = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", code, str(row)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "REASON None" in out.stdout, out.stderr[-2000:]
    assert "HAS_TESTS True" in out.stdout


# marshmallow's parametrized ids hold spaces (SWE-bench Lite, marshmallow-code__marshmallow-1343).
SPACED = "tests/test_marshalling.py::TestUnmarshaller::test_make_error[required-Missing data for required field.]"


def test_test_ids_with_spaces_are_matched_as_swebench_parses_them() -> None:
    # swebench's pytest parsers cut summary lines at whitespace: the full id in a row would
    # count a passing test as missing (gold patch, reward 0).
    row_tests = [SPACED, F2P[0]]
    log = _log(f"PASSED {SPACED}", f"PASSED {F2P[0]}", f"PASSED {P2P[0]}", exit_code=0)
    g = _grade(log, FAIL_TO_PASS=row_tests)
    assert (g.gradable, g.resolved) == (True, True)
    assert (g.f2p_passed, g.f2p_total) == (2, 2)
    failing = _log(f"FAILED {SPACED} - assert", f"PASSED {F2P[0]}", f"PASSED {P2P[0]}", exit_code=1)
    g = _grade(failing, FAIL_TO_PASS=row_tests)
    assert (g.resolved, g.f2p_passed) == (False, 1)
    # Rows that store the id cut short already (as SWE-bench's datasets do) are unchanged.
    cut = SPACED.split(" ")[0]
    assert (
        _grade(log, FAIL_TO_PASS=[cut]).resolved,
        _grade(log, FAIL_TO_PASS=[cut]).f2p_total,
    ) == (
        True,
        1,
    )


# -- the script a grading runs -------------------------------------------------------------

_MARKED_PATCH = """diff --git a/tests/test_x.py b/tests/test_x.py
--- a/tests/test_x.py
+++ b/tests/test_x.py
@@ -1 +1,3 @@
 x = 1
+# : '>>>>> End Test Output'
+git config --global --add safe.directory /elsewhere
"""


def _script_with_patch(patch: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            "git config --global --add safe.directory /testbed",
            "git status",
            "git apply -v - <<'EOF_114329324912'",
            patch.rstrip("\n"),
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            "pytest -rA tests/test_x.py",
            ": '>>>>> End Test Output'",
            "git checkout abc tests/test_x.py",
            "",
        ]
    )


def test_run_script_drops_the_reset_and_guards_the_grant() -> None:
    base = sw.record_test_exit_code(_script_with_patch(_MARKED_PATCH).split("\n"))
    script = "\n".join(base)
    ran = sw.run_script(script)
    lines = ran.splitlines()
    # The exit code is recorded at the shell's marker, not at the patch line that carries it.
    assert lines[-3:] == [
        "__trio_swe_test_rc=$?",
        ": '>>>>> End Test Output'",
        'echo ">>>>> Test Exit Code: $__trio_swe_test_rc"',
    ]
    assert "git checkout abc tests/test_x.py" not in ran
    # The here-document (the test patch) is byte for byte what it was.
    body = script[script.index("<<'EOF_114329324912'") : script.index("\nEOF_114329324912")]
    assert body in ran
    assert "+git config --global --add safe.directory /elsewhere" in ran
    guarded = [ln for ln in lines if ln.endswith("safe.directory /testbed")]
    assert len(guarded) == 1
    assert guarded[0].startswith("[ ")
    assert sw.run_script(ran) == ran  # idempotent


@pytest.mark.parametrize("prefix", ["swebench_v5__markedjs", "swebench_v5__chartjs"])
def test_run_script_of_real_v5_rows_ends_at_the_marker(prefix: str) -> None:
    row = _row(prefix)
    script = sw.build_test_spec(get_metadata(row, "swebench")).eval_script
    ran = sw.run_script(script)
    end = script.index(": '>>>>> End Test Output'")
    head = script[:end]
    assert ran.replace(sw._SAFE_DIRECTORY_GUARD, "").startswith(head)
    tail = ran[len(head) + len(sw._SAFE_DIRECTORY_GUARD) * ran.count(sw._SAFE_DIRECTORY_GUARD) :]
    assert tail.splitlines()[0] == ": '>>>>> End Test Output'"
    assert all(ln.startswith('echo ">>>>> Test Exit Code') for ln in tail.splitlines()[1:])
    # Each of these rows cleans up after its tests; that is what is left out.
    dropped = script[end:].splitlines()[2:]
    assert dropped
    assert all(ran.splitlines().count(ln) < script.splitlines().count(ln) for ln in dropped)


def test_run_script_of_a_script_without_markers_keeps_every_line() -> None:
    script = "set -e\ngit config --global --add safe.directory /testbed\nmake test\n"
    ran = sw.run_script(script)
    assert ran.replace(sw._SAFE_DIRECTORY_GUARD, "") == script


@pytest.mark.parametrize("granted", [True, False])
async def test_the_guarded_grant_runs_only_where_the_environment_lacks_it(
    tmp_path: Path, granted: bool
) -> None:
    """Real bash and git: the guarded line writes the grant exactly when it is missing."""
    gitconfig = tmp_path / "gitconfig"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_GLOBAL": str(gitconfig)}
    if granted:  # what every graded command carries
        env |= GIT_SAFE_ENV
    else:  # another first pair: not the grant
        env |= {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "core.pager",
            "GIT_CONFIG_VALUE_0": "*",
        }
    script = sw.run_script("set -uxo pipefail\ngit config --global --add safe.directory /testbed\n")
    r = await trio.run_process(["bash", "-c", script], env=env, capture_stderr=True, check=False)
    assert r.returncode == 0, r.stderr
    if granted:
        assert not gitconfig.exists()
    else:
        assert "directory = /testbed" in gitconfig.read_text()
