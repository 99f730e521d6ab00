"""``python -m trio_swe.cli``: the ``trio-swe`` command."""

from __future__ import annotations

from ._entry import console

console()
