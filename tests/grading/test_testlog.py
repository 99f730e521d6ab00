"""Per-test statuses of scaleswe logs (pytest's -rA summary) and truncated SWE-bench ids."""

from __future__ import annotations

from trio_swe.grading._testlog import (
    is_truncated,
    parse_pytest_summary,
    selectable,
    split_counts,
    status_of,
)

SPACED = "tests/test_m.py::test_make_error[required-Missing data]"
CUT = "tests/test_m.py::test_make_error[required-Missing"

LOG = f"""\
============================= short test summary info ==============================
PASSED tests/test_calc.py::test_add
PASSED {SPACED}
FAILED tests/test_m.py::test_make_error[type-Invalid value] - AssertionError: x - y
\x1b[31mERROR\x1b[0m tests/test_broken.py - ModuleNotFoundError: No module named 'q'
SKIPPED [1] tests/test_calc.py:9: no reason
XFAIL tests/test_calc.py::test_x - reason
"""


def test_summary_lines_keep_ids_with_spaces_whole() -> None:
    status = parse_pytest_summary(LOG)
    assert status == {
        "tests/test_calc.py::test_add": "PASSED",
        SPACED: "PASSED",
        "tests/test_m.py::test_make_error[type-Invalid value]": "FAILED",
        "tests/test_broken.py": "ERROR",
        "tests/test_calc.py::test_x": "XFAIL",
    }


def test_truncated_ids_select_their_function_and_take_the_worst_status() -> None:
    assert is_truncated(CUT)
    assert not is_truncated(SPACED)
    assert selectable(CUT) == "tests/test_m.py::test_make_error"
    assert selectable(SPACED) == SPACED
    status = parse_pytest_summary(LOG)
    assert status_of(status, CUT) == "PASSED"
    assert status_of(status, "tests/test_m.py::test_make_error[type-Invalid") == "FAILED"
    assert status_of(status, "tests/test_m.py::test_make_error[nothing") is None
    assert split_counts(status, [CUT, "tests/test_calc.py::test_add", "tests/nope.py::t"]) == (2, 3)
    assert split_counts(status, []) is None
