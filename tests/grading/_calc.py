"""A tiny real Python repository with a bug, its fix, and rows of every shape that grade it.

``calc.clamp`` ignores its upper bound. The test patch adds ``test_clamp_high`` and
``test_clamp_mid`` (fail before the fix, pass after: FAIL_TO_PASS); ``test_add`` and
``test_clamp_low`` pass throughout (PASS_TO_PASS).
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = textwrap.dedent(
    """\
    def add(a, b):
        return a + b


    def clamp(x, lo, hi):
        return max(lo, min(x, lo))
    """
)
FIXED = SRC.replace("min(x, lo)", "min(x, hi)")
BROKEN_ADD = FIXED.replace("return a + b", "return a - b")
TESTS = textwrap.dedent(
    """\
    from calc import add, clamp


    def test_add():
        assert add(1, 2) == 3


    def test_clamp_low():
        assert clamp(-5, 0, 10) == 0
    """
)
NEW_TESTS = TESTS + textwrap.dedent(
    """\


    def test_clamp_high():
        assert clamp(50, 0, 10) == 10


    def test_clamp_mid():
        assert clamp(5, 0, 10) == 5
    """
)
# A patch that "fixes" the failing tests by editing them instead of the code.
CHEATING_TESTS = NEW_TESTS.replace("== 10\n", "== 0\n").replace("== 5\n", "== 0\n")
F2P = ["tests/test_calc.py::test_clamp_high", "tests/test_calc.py::test_clamp_mid"]
P2P = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_clamp_low"]

F2P_SCRIPT = textwrap.dedent(
    """\
    import pytest
    from calc import clamp


    def test_clamp_high():
        assert clamp(50, 0, 10) == 10


    if __name__ == "__main__":
        pytest.main(["-v", __file__])
    """
)

SWEPRO_RUN = textwrap.dedent(
    """\
    #!/bin/bash
    set -e
    IFS=',' read -r -a files <<< "$1"
    python -m pytest -rA -p no:cacheprovider "${files[@]}"
    """
)
# Writes {"tests": [{"name", "status"}]} from pytest's -rA summary lines.
SWEPRO_PARSER = textwrap.dedent(
    """\
    import json, re, sys
    out = open(sys.argv[1]).read()
    tests = [
        {"name": m.group(2), "status": m.group(1)}
        for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED) (\\S+)", out, re.M)
    ]
    json.dump({"tests": tests}, open(sys.argv[3], "w"))
    """
)


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)
    return out.stdout.decode()


def _diff(repo: Path, rel: str, text: str) -> str:
    """The ``git diff --binary`` that turns ``rel`` into ``text``, leaving the tree unchanged."""
    path = repo / rel
    old = path.read_text() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    git(repo, "add", "-N", rel)
    diff = git(repo, "diff", "--binary", "--", rel)
    if old is None:
        git(repo, "rm", "-q", "--cached", rel)
        path.unlink()
    else:
        path.write_text(old)
    return diff


@dataclass
class CalcRepo:
    """The repository and the patches that grade it."""

    path: Path
    base: str
    test_patch: str
    gold: str
    break_p2p: str
    cheat: str
    cheat_after_setup: str
    fake_f2p: str
    no_apply: str
    hang: str
    hang_marker: str  # in the command line of the process that hangs (unique per repo)

    @property
    def image(self) -> str:
        return f"{self.path}@{self.base}"

    def eval_script(self) -> str:
        """A SWE-bench 5.x-shape eval script for this repo (as the dataset would carry it)."""
        delim = "EOF_114329324912"
        return (
            "#!/bin/bash\nset -uxo pipefail\n"
            "source /opt/miniconda3/bin/activate\nconda activate testbed\ncd /testbed\n"
            "git config --global --add safe.directory /testbed\ngit status\n"
            f"git -c core.fileMode=false diff {self.base}\n"
            "source /opt/miniconda3/bin/activate\nconda activate testbed\n"
            "python -m pip install -e .\n"  # SWE-bench's re-install; fails here, harmlessly
            f"git checkout {self.base} tests/test_calc.py\n"
            f"git apply -v - <<'{delim}'\n{self.test_patch}\n{delim}\n"
            ": '>>>>> Start Test Output'\n"
            "pytest -rA tests/test_calc.py\n"
            ": '>>>>> End Test Output'\n"
            f"git checkout {self.base} tests/test_calc.py\n"
        )

    # -- rows, one per shape -------------------------------------------------------------
    def swebench_classic_row(self, **over: Any) -> dict[str, Any]:
        # pytest-dev/pytest 5.4 is in swebench 4.x's registry; its parser is parse_log_pytest.
        import json

        row = {
            "repo": "pytest-dev/pytest",
            "instance_id": "pytest-dev__pytest-90001",
            "base_commit": self.base,
            "patch": self.gold,
            "test_patch": self.test_patch,
            "problem_statement": "clamp ignores hi",
            "hints_text": "",
            "created_at": "2024-01-01T00:00:00Z",
            "version": "5.4",
            "FAIL_TO_PASS": json.dumps(F2P),
            "PASS_TO_PASS": json.dumps(P2P),
            "environment_setup_commit": self.base,
            "image": self.image,
        }
        return {**row, **over}

    def swebench_v5_row(self, **over: Any) -> dict[str, Any]:
        row = self.swebench_classic_row()
        row.update(
            FAIL_TO_PASS=list(F2P),
            PASS_TO_PASS=list(P2P),
            eval_script=self.eval_script(),
            log_parser="parse_log_pytest",
            eval_type="pass_and_fail",
        )
        return {**row, **over}

    def slime_swebench_sample(self) -> dict[str, Any]:
        rem = self.swebench_classic_row()
        return {
            "prompt": "fix it",
            "label": rem["instance_id"],
            "metadata": {"remote_env_info": rem},
        }

    def scaleswe_f2p_row(self, **over: Any) -> dict[str, Any]:
        row = {
            "instance_id": "calc_calc_pr1",
            "image_url": self.image,
            "workdir": "/testbed",
            "pre_commands": f"git checkout {self.base} -f && git reset --hard HEAD\\n",
            "f2p_script": F2P_SCRIPT,
            "problem_statement": "clamp ignores hi",
            "FAIL_TO_PASS": ["test_fail_to_pass.py::test_clamp_high"],
            "PASS_TO_PASS": list(P2P),
        }
        return {**row, **over}

    def slime_eval_cmd_sample(self, eval_cmd: str | None = None) -> dict[str, Any]:
        # Resets the graded tests itself, so a patch editing them cannot pass.
        cmd = eval_cmd or (
            f"git checkout -q HEAD -- tests && git apply {self._test_patch_file()}"
            " && python -m pytest -q -p no:cacheprovider tests"
        )
        return {
            "prompt": [{"role": "user", "content": "fix clamp"}],
            "label": "calc-eval-cmd",
            "metadata": {
                "image": self.image,
                "workdir": "/testbed",
                "eval_cmd": cmd,
                "remote_env_info": {"pre_commands": [f"git checkout -q {self.base}"]},
            },
        }

    def swepro_row(self, tmp: Path, **over: Any) -> dict[str, Any]:
        run, parser = tmp / "run_script.sh", tmp / "parser.py"
        run.write_text(SWEPRO_RUN)
        parser.write_text(SWEPRO_PARSER)
        import json

        row = {
            "repo": "calc/calc",
            "instance_id": "instance_calc__calc-1",
            "base_commit": self.base,
            "problem_statement": json.dumps("clamp ignores hi"),
            "repo_language": "python",
            "fail_to_pass": repr(F2P),
            "pass_to_pass": json.dumps(P2P),
            "before_repo_set_cmd": (
                f"git reset --hard {self.base}\ngit clean -fd \ngit checkout {self.base} \n"
                f"git apply {self._test_patch_file()}"
            ),
            "selected_test_files_to_run": json.dumps(["tests/test_calc.py"]),
            "image": self.image,
            "workdir": "/testbed",
            "run_script_path": str(run),
            "parser_script_path": str(parser),
        }
        return {**row, **over}

    def binary_patch(self, rel: str, data: bytes) -> str:
        """A ``git diff --binary`` adding the binary file ``rel``."""
        path = self.path / rel
        path.write_bytes(data)
        try:
            git(self.path, "add", "-N", rel)
            return git(self.path, "diff", "--binary", "--", rel)
        finally:
            git(self.path, "rm", "-q", "--cached", rel)
            path.unlink()

    def _test_patch_file(self) -> str:
        """The test patch, committed into the repo at a path outside the graded tests."""
        return "ci/test.patch"


def build_calc_repo(root: Path) -> CalcRepo:
    """Create the repository under ``root`` and every patch."""
    repo = root / "calc"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc").mkdir()
    (repo / "calc" / "__init__.py").write_text(SRC)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    (repo / "conftest.py").write_text("")  # puts the repo root on sys.path for pytest
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "calc with a bug")
    test_patch = _diff(repo, "tests/test_calc.py", NEW_TESTS)
    # The test patch as a file in the repo, for rows whose setup applies it (eval_cmd, swepro).
    (repo / "ci").mkdir()
    (repo / "ci" / "test.patch").write_text(test_patch)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "ship the test patch for setup commands")
    base = git(repo, "rev-parse", "HEAD").strip()
    gold = _diff(repo, "calc/__init__.py", FIXED)
    break_p2p = _diff(repo, "calc/__init__.py", BROKEN_ADD)
    # Edits the graded tests to expect the bug: relative to the base tests (what a swebench
    # agent sees) and relative to the tests after setup (what a swepro agent sees).
    cheat = _diff(repo, "tests/test_calc.py", CHEATING_TESTS)
    cheat_after_setup = _diff_from(repo, "tests/test_calc.py", NEW_TESTS, CHEATING_TESTS)
    no_apply = (
        "diff --git a/calc/__init__.py b/calc/__init__.py\n"
        "--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
        "@@ -1,3 +1,3 @@\n-def nothing_like_this(a, b):\n+def add(a, b):\n     return 42\n \n"
    )
    # Plants a passing test_fail_to_pass.py where Scale-SWE's f2p script goes.
    fake_f2p = _diff(repo, "test_fail_to_pass.py", "def test_clamp_high():\n    pass\n")
    # Fixes the bug but makes importing the package hang: the suite outlives any budget. The
    # process that hangs carries a marker a test can find it by.
    marker = f"calc-hang-{uuid.uuid4().hex}"
    hang_src = f"import os\n\nos.execvp('sh', ['sh', '-c', 'sleep 600', {marker!r}])\n\n\n"
    hang = _diff(repo, "calc/__init__.py", hang_src + FIXED)
    return CalcRepo(
        repo,
        base,
        test_patch,
        gold,
        break_p2p,
        cheat,
        cheat_after_setup,
        fake_f2p,
        no_apply,
        hang,
        marker,
    )


def _diff_from(repo: Path, rel: str, before: str, after: str) -> str:
    """The diff turning ``before`` into ``after`` at ``rel`` (a temporary commit, then undone)."""
    path = repo / rel
    old = path.read_text()
    path.write_text(before)
    git(repo, "commit", "-q", "-am", "tmp")
    diff = _diff(repo, rel, after)
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    assert path.read_text() == old
    return diff
