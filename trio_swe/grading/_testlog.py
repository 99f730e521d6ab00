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


def split_counts(status: Mapping[str, str], tests: Sequence[str]) -> tuple[int, int] | None:
    """(passed, total) of ``tests`` in ``status`` (PASSED or XFAIL pass), None without tests."""
    if not tests:
        return None
    passed = sum(1 for t in tests if status.get(t) in ("PASSED", "XFAIL"))
    return passed, len(tests)
