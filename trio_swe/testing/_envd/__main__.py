"""``python -m trio_swe.testing._envd [--synthetic] [--tls] [--lean] ...``: the test server in a
process of its own (see :mod:`._subprocess`; a module of its own so that ``-m`` does not run a
module the package has already imported)."""

from ._subprocess import main

main()
