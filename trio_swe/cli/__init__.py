"""The ``trio-swe`` command, one module per subcommand.

* ``run`` (:mod:`.run`, Ray driving in :mod:`._ray`): one episode per dataset row, results
  appended to a resumable file, with a live display (:mod:`._progress`).
* ``grade`` (:mod:`.grade`): existing predictions graded as SWE-bench's harness does.
* ``demo`` (:mod:`.demo`): the bundled demo end to end, without network.
* ``results`` (:mod:`.results`): a results file's summary or export.

The parser is :mod:`._parser`, the tables :mod:`._render`, the dispatch :mod:`._main`. The
console script starts in :mod:`._entry`, which imports none of them before it handles Ctrl-C.
"""

from __future__ import annotations

from ._entry import console, main

__all__ = ["console", "main"]
