"""Per-test statuses from a test log, and the F2P/P2P split (sans-IO).

The ``scaleswe`` graders decide by exit status; this only says which of the row's tests ran and
how, so results carry ``tests_status`` and an F2P/P2P split, and an environment that ran none
of them is told apart from a patch that failed them. A row naming a swebench ``log_parser`` is
parsed by that parser (``_swebench_api.parse_log``); otherwise pytest's ``-rA`` short test
summary is read here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

#: pytest's ``-rA`` short summary lines: ``PASSED tests/x.py::test_y`` or
#: ``FAILED tests/x.py::test_y[a b] - AssertionError: ...``. Test ids may contain spaces.
_SUMMARY: Final = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S.*?)(?: - .*)?$")
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")


def parse_pytest_summary(log: str) -> dict[str, str]:
    """Test id -> status from pytest's ``-rA`` short summary (the last status of an id wins)."""
    out: dict[str, str] = {}
    for raw in log.splitlines():
        m = _SUMMARY.match(_ANSI.sub("", raw).rstrip())
        if m:
            out[m.group(2)] = m.group(1)
    return out


def is_truncated(test_id: str) -> bool:
    """A parametrized id cut short (``test_x[a-Missing``), as SWE-bench datasets store ids
    that had a space: more ``[`` than ``]``."""
    return test_id.count("[") > test_id.count("]")


def selectable(test_id: str) -> str:
    """An id pytest can select: a truncated parametrized id selects its whole function."""
    return test_id.split("[", 1)[0] if is_truncated(test_id) else test_id


def status_of(status: Mapping[str, str], test_id: str) -> str | None:
    """``test_id``'s status; a truncated id takes the status of the ids it is a prefix of
    (the worst of them: a FAILED one among PASSED ones is a failure)."""
    if test_id in status:
        return status[test_id]
    if not is_truncated(test_id):
        return None
    found = [v for k, v in status.items() if k.startswith(test_id)]
    if not found:
        return None
    bad = [v for v in found if v not in ("PASSED", "XFAIL")]
    return bad[0] if bad else found[0]


def split_counts(status: Mapping[str, str], tests: Sequence[str]) -> tuple[int, int] | None:
    """(passed, total) of ``tests`` in ``status`` (PASSED or XFAIL pass), None without tests."""
    if not tests:
        return None
    passed = sum(1 for t in tests if status_of(status, t) in ("PASSED", "XFAIL"))
    return passed, len(tests)
