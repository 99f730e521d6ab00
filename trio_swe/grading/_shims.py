"""Shims that let SWE-bench eval scripts run unmodified on the local backend.

SWE-bench's scripts assume its Docker images: ``source /opt/miniconda3/bin/activate``,
``conda activate testbed``, the package installed in that env, a writable ``$HOME`` for
``git config --global``, and often a re-install (``python -m pip install -e .``). On the local
backend the host root is read-only, so:

* ``/opt/miniconda3/bin/activate`` is a small script defining a ``conda`` function whose
  ``activate`` / ``deactivate`` succeed (other subcommands fail loudly);
* the Python environment you name (default: the running interpreter's) is first on ``PATH``
  and bound at ``/opt/miniconda3/envs/testbed`` (a virtualenv whole: its ``pyvenv.cfg`` and
  ``lib/`` come with its ``bin``, else ``python`` there would run as the bare base interpreter;
  a plain interpreter directory is bound at ``.../envs/testbed/bin``);
* the activation puts the repository (``/testbed``, and ``/testbed/src`` when present) first on
  ``PYTHONPATH``, which is what the image's editable install provides; the in-script re-install
  (``python -m pip install -e .``, ``pip install -e .``, ``python setup.py develop|install``)
  is skipped with a note on stderr (it could only fail here, and cost about 1.5 s per
  grading); ``TRIO_SWE_REINSTALL=1`` runs it (``PIP_NO_INDEX`` is set either way);
* ``GIT_CONFIG_GLOBAL`` points at a writable file under ``/tmp``.

Compiled extensions are not rebuilt: a patch to C code is not graded faithfully here.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from ..sandbox.local._backend import venv_root

ACTIVATE_PATH: Final = "/opt/miniconda3/bin/activate"
ENV_PATH: Final = "/opt/miniconda3/envs/testbed"
ENV_BIN_PATH: Final = f"{ENV_PATH}/bin"

_ACTIVATE = """\
# trio_swe shim for SWE-bench's /opt/miniconda3/bin/activate (local backend).
conda() {
  case "${1:-}" in
    activate|deactivate) return 0 ;;
    *) echo "trio_swe conda shim: 'conda $*' is not available on the local backend" >&2; return 1 ;;
  esac
}
__trio_swe_pp=/testbed
if [ -d /testbed/src ]; then __trio_swe_pp=/testbed/src:/testbed; fi
case ":${PYTHONPATH:-}:" in
  *":/testbed:"*) ;;
  *) export PYTHONPATH="$__trio_swe_pp${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
unset __trio_swe_pp
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 CONDA_DEFAULT_ENV=testbed
# The eval scripts' re-install of the repository (`python -m pip install -e .`, `python setup.py
# develop`...) is skipped: /testbed on PYTHONPATH stands in for the installed package, and the
# re-install could only fail here (no index, a read-only environment), costing seconds.
# TRIO_SWE_REINSTALL=1 runs it anyway.
__trio_swe_pip_reinstall() {
  [ "${1:-}" = install ] || return 1
  shift
  for __a in "$@"; do
    case "$__a" in -e|--editable|--editable=*|-e.|.|./|.[[]*) return 0 ;; esac
  done
  return 1
}
__trio_swe_reinstall() {
  case "${1:-}" in
    -m) [ "${2:-}" = pip ] || return 1; shift 2; __trio_swe_pip_reinstall "$@" ;;
    setup.py) case "${2:-}" in develop|install) return 0 ;; esac; return 1 ;;
    *) return 1 ;;
  esac
}
__trio_swe_skip() {
  echo "trio_swe shim: skipped '$*' (the environment is installed; TRIO_SWE_REINSTALL=1 runs it)" >&2
}
python() {
  if [ "${TRIO_SWE_REINSTALL:-}" != 1 ] && __trio_swe_reinstall "$@"; then __trio_swe_skip python "$@"; return 0; fi
  command python "$@"
}
python3() {
  if [ "${TRIO_SWE_REINSTALL:-}" != 1 ] && __trio_swe_reinstall "$@"; then __trio_swe_skip python3 "$@"; return 0; fi
  command python3 "$@"
}
pip() {
  if [ "${TRIO_SWE_REINSTALL:-}" != 1 ] && __trio_swe_pip_reinstall "$@"; then __trio_swe_skip pip "$@"; return 0; fi
  command pip "$@"
}
"""


def _shim_dir() -> Path:
    digest = hashlib.sha256(_ACTIVATE.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"trio_swe-shims-{os.getuid()}" / digest


def _write_once(path: Path, text: str) -> None:
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)  # atomic: concurrent callers never see a partial shim


def local_backend_shims(python_bin_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``LocalBackend`` so SWE-bench eval scripts run unmodified.

    Args:
        python_bin_dir: the ``bin`` directory of the Python environment that has the
            repository's test dependencies (pytest...), a virtualenv's or an interpreter's.
            Default: the running interpreter's. The backend shows a virtualenv whole (root,
            ``pyvenv.cfg``, ``lib/``), wherever it lives (``/tmp`` and ``/root`` included).

    Returns:
        ``{"ro_binds": ..., "extra_path": ..., "env": ...}``; use as
        ``LocalBackend(**local_backend_shims())``.
    """
    bin_dir = os.path.abspath(python_bin_dir or os.path.dirname(sys.executable))
    shim = _shim_dir() / "activate"
    _write_once(shim, _ACTIVATE)
    root = venv_root(bin_dir)
    env_bind = {ENV_PATH: root} if root is not None else {ENV_BIN_PATH: bin_dir}
    return {
        "ro_binds": {ACTIVATE_PATH: str(shim), **env_bind},
        "extra_path": [bin_dir],
        "env": {"GIT_CONFIG_GLOBAL": "/tmp/.trio_swe_gitconfig"},
    }
