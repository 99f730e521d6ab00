"""Pinned CLI coding agents, installed once on the host into a cache and reused by every episode.

Each agent is a package at a pinned version (npm for Claude Code, Codex, Qwen Code and opencode,
PyPI for mini-swe-agent) installed into its own prefix directory
``<cache>/<name>-<version>``: ``npm install --prefix`` or a virtualenv. The install goes into a
staging directory renamed into place only once the agent's ``--version`` check passed, under a
file lock, so concurrent processes install it once and a half-done install is never used. It
is retried as :class:`~trio_swe.config.NpmOptions` says (``install_retries`` attempts, full-jitter
backoff of base ``install_backoff_sec``).

The cache is ``SWE_AGENT_CACHE``, else ``/var/cache/trio-swe/agents`` when writable, else
``~/.cache/trio-swe/agents``. Local sandboxes see the host's file system read-only, so a cache
outside ``/tmp`` and ``/root`` is visible in them as it is (no copy per episode).

``python -m trio_swe.agents.install NAME...`` installs from the command line (CI's bootstrap
uses it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec
import trio

from .._errors import AgentInstallError, ConfigError
from .._retry import full_jitter
from ..config import NPM_BACKOFF_MAX_SEC, SweConfig

__all__ = [
    "CLI_PACKAGES",
    "CliPackage",
    "agent_cache_dir",
    "ensure_installed",
    "ensure_installed_sync",
]

_MARKER = ".trio_swe-installed"


class CliPackage(msgspec.Struct, frozen=True, kw_only=True):
    """A CLI coding agent at a pinned version.

    Attributes:
        name: the agent's name (``SWE_AGENT``).
        registry: ``"npm"`` or ``"pypi"``.
        package: the package's name in that registry.
        version: the pinned version (newer releases of some need Node 22; these run on Node 20).
        binary: the executable the package installs.
        needs_node: ``binary`` is a Node.js script (Claude Code's and opencode's are native
            executables; a Python agent runs on the interpreter its virtualenv was made with).
        native: the native executable a Node.js wrapper starts, relative to the prefix (run
            directly in sandboxes whose image has no ``node``).
    """

    name: str
    registry: Literal["npm", "pypi"]
    package: str
    version: str
    binary: str
    needs_node: bool = False
    native: str | None = None

    def native_path(self, root: Path) -> Path | None:
        """The platform's own executable, which runs without Node.js (``native``), if any."""
        return root / self.native if self.native else None

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.version}"

    def bin_path(self, root: Path) -> Path:
        """Where the executable is once installed under ``root`` (a prefix directory)."""
        if self.registry == "npm":
            return root / "node_modules" / ".bin" / self.binary
        return root / "bin" / self.binary


#: The five supported CLI agents and their pins.
CLI_PACKAGES: dict[str, CliPackage] = {
    p.name: p
    for p in (
        CliPackage(
            name="claude-code",
            registry="npm",
            package="@anthropic-ai/claude-code",
            version="2.1.197",
            binary="claude",
        ),
        CliPackage(
            name="codex",
            registry="npm",
            package="@openai/codex",
            version="0.171.0",
            binary="codex",
            needs_node=True,
            native="node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
        ),
        CliPackage(
            name="qwen-code",
            registry="npm",
            package="@qwen-code/qwen-code",
            version="0.15.10",
            binary="qwen",
            needs_node=True,
        ),
        CliPackage(
            name="opencode",
            registry="npm",
            package="opencode-ai",
            version="1.18.33",
            binary="opencode",
        ),
        CliPackage(
            name="mini-swe-agent",
            registry="pypi",
            package="mini-swe-agent",
            version="2.4.6",
            binary="mini",
        ),
    )
}


def agent_cache_dir() -> Path:
    """The directory holding installed agents (see the module docstring)."""
    env = os.environ.get("SWE_AGENT_CACHE", "").strip()
    if env:
        return Path(env)
    system = Path("/var/cache/trio-swe/agents")
    try:
        system.mkdir(parents=True, exist_ok=True)
        if os.access(system, os.W_OK):
            return system
    except OSError:
        pass
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trio-swe" / "agents"


def _base_python() -> str:
    """The interpreter of a Python agent's virtualenv: the system's ``/usr/bin/python3`` when
    it has ``venv`` (a venv's ``python`` links into its base, which must be readable by the
    sandbox's unprivileged user: an interpreter under ``/root`` is not), else the running
    one's base."""
    system = Path("/usr/bin/python3")
    if system.exists():
        probe = subprocess.run(
            [str(system), "-c", "import venv, ensurepip"], capture_output=True, timeout=60
        )
        if probe.returncode == 0:
            return str(system)
    for cand in (
        Path(sys.base_prefix) / "bin" / "python3",
        Path(sys.base_prefix) / "bin" / "python",
    ):
        if cand.exists():
            return str(cand)
    return sys.executable


def _install_commands(pkg: CliPackage, staging: Path) -> list[list[str]]:
    if pkg.registry == "npm":
        npm = shutil.which("npm")
        if npm is None:
            raise ConfigError(f"installing {pkg.name} needs npm (apt-get install npm)")
        return [
            [
                npm,
                "install",
                "--prefix",
                str(staging),
                "--no-audit",
                "--no-fund",
                "--no-update-notifier",
                "--loglevel=error",
                f"{pkg.package}@{pkg.version}",
            ]
        ]
    pip = str(staging / "bin" / "pip")
    return [
        [_base_python(), "-m", "venv", str(staging)],
        [pip, "install", "-q", "--disable-pip-version-check", f"{pkg.package}=={pkg.version}"],
    ]


def _check(pkg: CliPackage, root: Path) -> str:
    """The installed version, checked against the pin (``--version``; a Python agent's from its
    package metadata, as mini has no ``--version``)."""
    exe = pkg.bin_path(root)
    if not exe.exists():
        raise RuntimeError(f"{exe} is missing after the install")
    if pkg.registry == "npm":
        argv = [str(exe), "--version"]
    else:
        query = f"import importlib.metadata as m; print(m.version({pkg.package!r}))"
        argv = [str(root / "bin" / "python"), "-c", query]
    env = {**os.environ, "HOME": str(root), "NO_COLOR": "1"}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    if out.returncode != 0 or pkg.version not in out.stdout:
        raise RuntimeError(
            f"{exe} --version exited {out.returncode}: {(out.stdout + out.stderr)[-500:]}"
        )
    return out.stdout.strip()


def ensure_installed_sync(
    name: str,
    *,
    cache_dir: Path | None = None,
    retries: int | None = None,
    backoff_sec: float | None = None,
) -> Path:
    """Install agent ``name`` into the cache unless it is there; return its executable.

    Blocking (runs ``npm``/``pip``); :func:`ensure_installed` is the async form.

    Raises:
        ConfigError: unknown name, or npm missing.
        AgentInstallError: every attempt failed (the last error's output attached).
    """
    try:
        pkg = CLI_PACKAGES[name]
    except KeyError:
        raise ConfigError(
            f"no pinned CLI agent {name!r}; choose one of {', '.join(sorted(CLI_PACKAGES))}"
        ) from None
    if retries is None or backoff_sec is None:
        cfg = SweConfig.from_env(check_protocols=False)
        retries = cfg.npm.install_retries if retries is None else retries
        backoff_sec = cfg.npm.install_backoff_sec if backoff_sec is None else backoff_sec
    root = cache_dir if cache_dir is not None else agent_cache_dir()
    final = root / pkg.dirname
    if (final / _MARKER).exists():
        return pkg.bin_path(final)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{pkg.dirname}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing it right now
        if (final / _MARKER).exists():
            return pkg.bin_path(final)
        last = ""
        for attempt in range(1, max(retries, 1) + 1):
            # npm packages are relocatable: built aside, renamed into place. A virtualenv
            # records its own path in its scripts, so it is built in place; either way the
            # marker, written last, says the install is whole.
            staging = (
                root / f".{pkg.dirname}.staging-{os.getpid()}" if pkg.registry == "npm" else final
            )
            shutil.rmtree(staging, ignore_errors=True)
            try:
                for cmd in _install_commands(pkg, staging):
                    staging.mkdir(parents=True, exist_ok=True)
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                    if out.returncode != 0:
                        raise RuntimeError(
                            f"{' '.join(cmd[:2])} exited {out.returncode}: "
                            f"{(out.stdout + out.stderr)[-1500:]}"
                        )
                version = _check(pkg, staging)
                (staging / _MARKER).write_text(f"{pkg.package} {pkg.version}\n{version}\n")
                if staging != final:
                    shutil.rmtree(final, ignore_errors=True)
                    os.rename(staging, final)
                return pkg.bin_path(final)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                last = str(exc)
                shutil.rmtree(staging, ignore_errors=True)
                if attempt < retries:
                    # The policy of every non-transport retry (trio_swe._retry).
                    time.sleep(
                        full_jitter(attempt - 1, base_sec=backoff_sec, max_sec=NPM_BACKOFF_MAX_SEC)
                    )
        raise AgentInstallError(
            f"installing {pkg.package}@{pkg.version} failed after {retries} attempts: {last}"
        )


async def ensure_installed(
    name: str,
    *,
    cache_dir: Path | None = None,
    retries: int | None = None,
    backoff_sec: float | None = None,
) -> Path:
    """The async form of :func:`ensure_installed_sync` (the install runs in a thread)."""
    pkg = CLI_PACKAGES.get(name)
    root = cache_dir if cache_dir is not None else agent_cache_dir()
    if pkg is not None and (root / pkg.dirname / _MARKER).exists():
        return pkg.bin_path(root / pkg.dirname)
    return await trio.to_thread.run_sync(
        lambda: ensure_installed_sync(
            name, cache_dir=cache_dir, retries=retries, backoff_sec=backoff_sec
        ),
        abandon_on_cancel=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trio_swe.agents.install [NAME...|all]``: install agents, print their paths."""
    names = list(argv if argv is not None else sys.argv[1:]) or ["all"]
    if names == ["all"]:
        names = sorted(CLI_PACKAGES)
    for name in names:
        try:
            print(name, ensure_installed_sync(name))
        except (ConfigError, AgentInstallError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0
