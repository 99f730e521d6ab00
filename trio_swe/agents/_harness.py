"""The harness for CLI coding agents (installed with npm), and the built-in agents' factories.

``install_npm_cli`` installs a CLI from a package tarball on the host (no registry needed when the
package has no dependencies); ``run_agent`` runs its start command detached as the unprivileged
``agent`` user with ``exec_and_wait``, keeping its output. The ``bash`` and ``npm-cli`` factories
are registered here in the agent registry (``_registry.py``: chosen by name, ``SWE_AGENT``;
users add theirs with :func:`register_agent`).
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import Mapping
from pathlib import Path

import trio

from .._errors import AgentInstallError, ConfigError, InvalidArgumentError
from .._retry import Backoff, retry
from ..config import NPM_BACKOFF_MAX_SEC, SweConfig
from ..sandbox import ExecResult, Sandbox
from ..sandbox._detached import exec_and_wait
from ._registry import register_agent
from ._types import Agent, AgentOutcome, AgentTask, BaseAgent

__all__ = [
    "AgentInstallError",
    "NpmCliAgent",
    "install_npm_cli",
    "run_agent",
]

#: Default instruction for CLI agents (slime's wording, adapted).
DEFAULT_CLI_PROMPT = (
    "Read {problem_statement_path} and resolve the issue it describes. Edit source files only "
    "(do not touch tests). Run the relevant tests to check your fix. Do not modify "
    "{problem_statement_path} and do not commit. When finished, print a one-line summary and exit."
)

_LOG_TAIL = 2000


async def install_npm_cli(
    sandbox: Sandbox,
    package: str | os.PathLike[str],
    *,
    check_cmd: str,
    prefix: str = "/usr/local",
    retries: int | None = None,
    backoff_sec: float | None = None,
    time_budget_sec: float = 300.0,
) -> int:
    """Install an npm package from a tarball on the host into ``sandbox``; return attempts used.

    The tarball is uploaded once; then ``npm install -g --prefix <prefix>`` followed by
    ``check_cmd`` runs as root through :func:`~trio_swe.exec_and_wait`, with a fresh tag per
    attempt (a retry never replays an earlier attempt's result), up to ``retries`` attempts with
    full-jitter exponential backoff between them (``uniform(0, backoff_sec * 2**n)``, capped at a
    minute: the same policy as the boot retry, :mod:`trio_swe._retry`).

    Args:
        sandbox: where to install.
        package: host path of the ``.tgz`` made by ``npm pack``.
        check_cmd: a shell command that proves the install worked (e.g. ``mycli --version``).
        prefix: npm's global prefix inside the sandbox (its ``bin`` gets the CLI).
        retries: attempts in all; None: :class:`~trio_swe.config.NpmOptions`'s
            ``install_retries``, from the environment.
        backoff_sec: base of the backoff; None: ``NpmOptions``'s ``install_backoff_sec``.
        time_budget_sec: budget of one attempt.

    Raises:
        AgentInstallError: every attempt failed; carries the last attempt's log tail.
        ConfigError: the environment variables are malformed.
    """
    if retries is None or backoff_sec is None:
        env_config = SweConfig.from_env(check_protocols=False)
        retries = env_config.npm.install_retries if retries is None else retries
        backoff_sec = env_config.npm.install_backoff_sec if backoff_sec is None else backoff_sec
    if retries < 1:
        raise InvalidArgumentError(f"retries must be >= 1, not {retries}")
    host_path = Path(os.fspath(package))
    try:
        data = await trio.Path(host_path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"npm package tarball {str(host_path)!r} cannot be read: {exc}") from exc
    remote = f"/tmp/trio_swe-npm-{uuid.uuid4().hex[:12]}.tgz"
    await sandbox.write_file(remote, data)
    cmd = (
        f"npm install -g --prefix={shlex.quote(prefix)} --no-audit --no-fund --no-update-notifier "
        f"{shlex.quote(remote)} && ({check_cmd})"
    )
    env = {"npm_config_cache": "/tmp/.trio_swe-npm-cache", "PATH": f"{prefix}/bin:" + _SANE_PATH}

    async def attempt(n: int) -> int:
        r = await exec_and_wait(
            sandbox,
            cmd,
            time_budget_sec=time_budget_sec,
            tag=f"npm-install-{n}-{uuid.uuid4().hex[:8]}",
            user="root",
            env=env,
            want_output=True,
        )
        if not r.ok:
            raise AgentInstallError(
                f"npm install of {host_path.name} failed after {n} attempts "
                f"(exit={r.exit_code}, {r.reason}):\n{r.output[-_LOG_TAIL:]}"
            )
        return n

    backoff = Backoff(attempts=retries, base_sec=backoff_sec, max_sec=NPM_BACKOFF_MAX_SEC)
    return await retry(attempt, backoff, retry_on=(AgentInstallError,))


_SANE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


async def run_agent(
    sandbox: Sandbox,
    start_cmd: str,
    *,
    workdir: str,
    time_budget_sec: float,
    env: Mapping[str, str] | None = None,
    user: str = "agent",
) -> ExecResult:
    """Run a CLI agent's ``start_cmd`` detached as ``user`` in ``workdir``; keep its output.

    Returns the :class:`~trio_swe.ExecResult` of :func:`~trio_swe.exec_and_wait`: the exit code
    (``-1`` and reason ``"time_budget"`` on overrun, the agent's process group killed) and the
    agent's merged output.
    """
    return await exec_and_wait(
        sandbox,
        start_cmd,
        time_budget_sec=time_budget_sec,
        tag=f"agent-run-{uuid.uuid4().hex[:12]}",
        user=user,
        env=dict(env or {}),
        workdir=workdir,
        want_output=True,
    )


class NpmCliAgent(BaseAgent):
    """A coding-agent CLI shipped as an npm package: installed, then run once per episode.

    ``start_cmd`` is a shell command template with ``{prompt}`` (shell-quoted), ``{workdir}``
    (shell-quoted) and ``{session_id}`` placeholders. The CLI talks to its model on its own (e.g.
    through an adapter proxy); this harness records no turns, so its episodes give rewards and
    transcripts but no token samples.
    """

    def __init__(
        self,
        name: str,
        *,
        package: str | os.PathLike[str],
        check_cmd: str,
        start_cmd: str,
        env: Mapping[str, str] | None = None,
        prefix: str = "/usr/local",
        prompt: str = DEFAULT_CLI_PROMPT,
        install_retries: int | None = None,
        install_backoff_sec: float | None = None,
        install_budget_sec: float = 300.0,
        user: str = "agent",
    ) -> None:
        self.name = name
        self.package = package
        self.check_cmd = check_cmd
        self.start_cmd = start_cmd
        self.env = dict(env or {})
        self.prefix = prefix
        self.prompt = prompt
        self.install_retries = install_retries
        self.install_backoff_sec = install_backoff_sec
        self.install_budget_sec = install_budget_sec
        self.user = user

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        """Install the CLI, then run it on the task within the remaining budget."""
        deadline = task.deadline()
        await install_npm_cli(
            sandbox,
            self.package,
            check_cmd=self.check_cmd,
            prefix=self.prefix,
            retries=self.install_retries,
            backoff_sec=self.install_backoff_sec,
            time_budget_sec=self.install_budget_sec,
        )
        prompt = task.prompt or self.prompt.format(
            problem_statement_path=task.problem_statement_path
        )
        cmd = self.start_cmd.format(
            prompt=shlex.quote(prompt),
            workdir=shlex.quote(task.workdir),
            session_id=shlex.quote(task.session_id),
        )
        env = {"PATH": f"{self.prefix}/bin:{_SANE_PATH}", **self.env}
        remaining = max(deadline - trio.current_time(), 0.001)
        result = await run_agent(
            sandbox,
            cmd,
            workdir=task.workdir,
            time_budget_sec=remaining,
            env=env,
            user=self.user,
        )
        return AgentOutcome(
            exit_code=result.exit_code,
            finish="time_budget" if result.reason == "time_budget" else "exited",
            output=result.output[-20000:],
            command_sec=result.duration_sec,
            n_commands=1,
        )


def _bash_factory(config: SweConfig) -> Agent:
    from ._bash_agent import BashAgent

    return BashAgent.from_config(config)


def _npm_cli_factory(config: SweConfig) -> Agent:
    npm = config.npm
    missing = [
        var
        for var, value in (("SWE_NPM_PACKAGE", npm.package), ("SWE_NPM_START_CMD", npm.start_cmd))
        if not value
    ]
    if missing:
        raise ConfigError(f"SWE_AGENT=npm-cli needs {' and '.join(missing)} set")
    return NpmCliAgent(
        "npm-cli",
        package=npm.package,
        check_cmd=npm.check_cmd,
        start_cmd=npm.start_cmd,
        prefix=npm.prefix,
        install_retries=npm.install_retries,
        install_backoff_sec=npm.install_backoff_sec,
    )


register_agent("bash", _bash_factory)
register_agent("npm-cli", _npm_cli_factory)
