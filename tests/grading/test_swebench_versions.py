"""Which swebench the install gets, and the start-up check that it can grade the rows being run.

The default extra (``trio-swe[swebench]``) must resolve to a swebench that builds classic
SWE-bench Lite/Verified rows' eval scripts (4.x); a dataset this install cannot grade fails at
start-up (``SweConfig.from_env(rows=...)``, ``SweConfig.check_rows``, ``trio-swe run``) with the
command that fixes it, instead of every sample ending ``unevaluable``. Real rows throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from trio_swe import ConfigError, SweConfig
from trio_swe.grading import _swebench_api as sw
from trio_swe.grading import check_rows, evaluability_check, get_metadata

ROOT = Path(__file__).resolve().parents[2]
ROWS = Path(__file__).parent / "rows"  # real dataset rows, see rows/README.md


def _row(prefix: str) -> dict[str, Any]:
    (path,) = ROWS.glob(f"{prefix}*.json")
    row: dict[str, Any] = json.loads(path.read_text())
    return row


def _extra(name: str) -> Requirement:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (req,) = [Requirement(r) for r in meta["project"]["optional-dependencies"][name]]
    return req


def test_default_extra_resolves_to_a_swebench_that_grades_classic_rows() -> None:
    req = _extra("swebench")
    assert req.name == "swebench"
    assert req.specifier.contains("4.1.0")
    assert not req.specifier.contains("5.0.2")  # 5.x refuses classic rows
    five = _extra("swebench5")
    assert five.specifier.contains("5.0.2")
    assert not five.specifier.contains("4.1.0")
    # The hints name these very extras.
    assert "trio-swe[swebench]" in sw.INSTALL_HINT
    assert "trio-swe[swebench5]" in sw.INSTALL_HINT_V5


def _major() -> int:
    api = sw.get_api()
    assert api is not None, sw.unavailable_reason()
    return api.major


CLASSIC = ("swebench_classic__pallets", "swebench_classic__pvlib")
V5 = ("swebench_v5__markedjs", "swebench_v5__chartjs")


@pytest.mark.swebench
def test_real_rows_of_each_shape_on_the_installed_swebench() -> None:
    classic = [_row(p) for p in CLASSIC]
    v5 = [_row(p) for p in V5]
    # 5.x rows grade on both majors (4.x: the row's script, 4.x's parser of the same name).
    check_rows(v5, "swebench")
    for row in v5:
        assert evaluability_check(get_metadata(row, "swebench")) is None
    if _major() >= 5:
        with pytest.raises(ConfigError) as info:
            check_rows([*v5, *classic], "swebench")
        msg = str(info.value)
        assert "pallets__flask-4992" in msg  # the first classic row
        assert "classic_row_needs_swebench_4" in msg
        assert "pip install 'trio-swe[swebench]'" in msg
    else:
        check_rows([*classic, *v5], "swebench")


@pytest.mark.swebench
def test_a_v5_row_whose_parser_4x_lacks() -> None:
    # The flask row in the 5.x shape, naming a parser other than the one 4.x uses for flask.
    row = _row("swebench_classic__pallets")
    row.update(
        eval_script="#!/bin/bash\n: '>>>>> Start Test Output'\npytest -rA\n: '>>>>> End Test Output'\n",
        log_parser="parse_log_pytest_v2",
        eval_type="pass_and_fail",
    )
    if _major() >= 5:
        check_rows([row], "swebench")
        return
    with pytest.raises(ConfigError, match=r"v5_row_needs_swebench_5.*trio-swe\[swebench5\]"):
        check_rows([row], "swebench")


@pytest.mark.swebench
def test_from_env_checks_the_rows_it_is_given() -> None:
    env = {"SWE_TRAIN_PROTOCOL": "swebench", "SWE_EVAL_PROTOCOL": "swebench"}
    rows = [_row(CLASSIC[0])]
    if _major() >= 5:
        with pytest.raises(ConfigError, match="trio-swe\\[swebench\\]"):
            SweConfig.from_env(env, rows=rows)
    else:
        assert SweConfig.from_env(env, rows=rows).train_protocol == "swebench"
    # Rows of another protocol's shape are that protocol's business (flagged per row).
    SweConfig.from_env({}, rows=rows)


@pytest.mark.swebench
def test_cli_run_fails_at_start_up_naming_the_fix(tmp_path: Path) -> None:
    if _major() >= 5:
        row, fix = _row(CLASSIC[0]), "pip install 'trio-swe[swebench]'"
    else:
        row = _row(CLASSIC[0])
        row.update(eval_script=": '>>>>> Start Test Output'\n", log_parser="parse_log_pytest_v2")
        fix = "pip install 'trio-swe[swebench5]'"
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps(row) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "trio_swe.cli", "run", str(dataset), "--protocol", "swebench"],
        capture_output=True,
        text=True,
        timeout=600,  # a loaded machine: importing swebench and trio_swe can take long
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)},
        cwd=tmp_path,
        check=False,
    )
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2, text
    assert fix in text
    assert "pallets__flask-4992" in text
    assert not (tmp_path / f"trio_swe-{os.getuid()}").exists()  # nothing booted
