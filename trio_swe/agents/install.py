"""``python -m trio_swe.agents.install [NAME...|all]``: install pinned CLI agents into the cache."""

from __future__ import annotations

from ._install import main

if __name__ == "__main__":
    raise SystemExit(main())
