"""Real CLI coding agents (Claude Code, Codex, Qwen Code, opencode, mini-swe-agent) run through
the recording gateway, so their episodes give samples.

Each episode: the pinned CLI is installed on the host once (:mod:`._install`, cached); a
gateway session is opened for the episode (its API key goes to the agent); the agent gets a
fresh ``HOME`` with its configuration (telemetry, updates, plugins and web tools off, the
gateway as its only provider) and runs detached in the sandbox as ``agent`` under the task's
budget. In a sandbox without a network (the default for these agents) a forwarder inside the
sandbox relays ``127.0.0.1:PORT`` to the gateway's unix socket, so the gateway is all the agent
can reach. The turns the gateway recorded are the outcome's turns.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio

from .._errors import AgentInstallError, ConfigError
from ..config import SweConfig
from ..policy import Policy
from ..sandbox import Sandbox
from ._harness import DEFAULT_CLI_PROMPT, run_agent
from ._install import CLI_PACKAGES, agent_cache_dir, ensure_installed
from ._registry import AgentFactory, register_agent
from ._types import Agent, AgentOutcome, AgentTask, BaseAgent

__all__ = ["CLI_AGENTS", "CliAgent", "CliContext", "CliSpec", "cli_agent_host_paths"]

#: The port the forwarder listens on inside a sandbox without a network (its own namespace).
FORWARD_PORT = 18080


class CliContext(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent's configuration is made from.

    Attributes:
        base_url: the gateway as the agent reaches it (``http://127.0.0.1:PORT``).
        api_key: the episode's session key.
        model: the model name the agent asks for.
        home: the agent's fresh ``HOME`` in the sandbox.
        exe: the CLI's executable (a host path visible in the sandbox).
        workdir: the repository.
    """

    base_url: str
    api_key: str
    model: str
    home: str
    exe: str
    workdir: str


class CliSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How to configure and start one CLI agent.

    Attributes:
        name: the agent's name (``SWE_AGENT``).
        api: the API it speaks to the gateway.
        files: files to write into ``HOME`` (relative path -> text) from a context.
        env: its environment from a context.
        argv: its command line (before quoting) from a context and the prompt.
    """

    name: str
    api: str
    files: Callable[[CliContext], dict[str, str]]
    env: Callable[[CliContext], dict[str, str]]
    argv: Callable[[CliContext, str], list[str]]


def _claude_env(c: CliContext) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": c.base_url,
        "ANTHROPIC_API_KEY": c.api_key,
        "ANTHROPIC_MODEL": c.model,
        "ANTHROPIC_SMALL_FAST_MODEL": c.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "IS_SANDBOX": "1",  # --dangerously-skip-permissions refuses root without it
    }


def _claude_files(c: CliContext) -> dict[str, str]:
    ack = json.dumps({"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True})
    return {".claude.json": ack, ".claude/settings.json": ack}


def _codex_files(c: CliContext) -> dict[str, str]:
    features = (
        "plugins",
        "remote_plugin",
        "apps",
        "multi_agent",
        "goals",
        "image_generation",
        "skill_search",
        "tool_suggest",
    )
    toml = (
        # web_search must come before any table
        'web_search = "disabled"\n'
        f"model = {json.dumps(c.model)}\n"
        'model_provider = "trio"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "check_for_update_on_startup = false\n\n"
        "[model_providers.trio]\n"
        'name = "trio-swe gateway"\n'
        f"base_url = {json.dumps(c.base_url + '/v1')}\n"
        'env_key = "TRIO_SWE_API_KEY"\n'
        'wire_api = "responses"\n\n'
        "[analytics]\nenabled = false\n\n"
        "[features]\n" + "".join(f"{f} = false\n" for f in features)
    )
    return {".codex/config.toml": toml}


def _qwen_files(c: CliContext) -> dict[str, str]:
    settings = {
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "security": {"auth": {"selectedType": "openai"}},
    }
    return {".qwen/settings.json": json.dumps(settings)}


def _opencode_env(c: CliContext) -> dict[str, str]:
    config = {
        "provider": {
            "trio": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "trio-swe gateway",
                "options": {"baseURL": c.base_url + "/v1", "apiKey": c.api_key},
                "models": {
                    c.model: {
                        "name": c.model,
                        "tool_call": True,
                        "limit": {"context": 131072, "output": 8192},
                    }
                },
            }
        },
        "model": f"trio/{c.model}",
        "small_model": f"trio/{c.model}",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
    }
    return {
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        # Should opencode still look a package up (see _opencode_files), it asks the
        # gateway, which answers 404 and counts it (the agents' tests assert none).
        "NPM_CONFIG_REGISTRY": c.base_url + "/npm-registry/",
        "npm_config_registry": c.base_url + "/npm-registry/",
    }


#: The plugin SDK opencode installs into each of its config directories at start-up.
_OPENCODE_PLUGIN_SDK = "@opencode-ai/plugin"


def _opencode_files(c: CliContext) -> dict[str, str]:
    # At start-up opencode (1.18.33) installs its plugin SDK into every config directory
    # (``$XDG_CONFIG_HOME/opencode``, ``.opencode``) from the npm registry, unless that
    # directory already has a ``node_modules`` and a lockfile that lists every dependency it
    # would add; no variable turns that off (OPENCODE_DISABLE_DEFAULT_PLUGINS does not). So
    # the fresh config directory is written as already provided: nothing is fetched (the
    # SDK is only imported by local plugins, and there are none).
    sdk = {_OPENCODE_PLUGIN_SDK: "*"}
    lock = {"lockfileVersion": 3, "requires": True, "packages": {"": {"dependencies": sdk}}}
    return {
        ".config/opencode/package.json": json.dumps({"dependencies": sdk}),
        ".config/opencode/package-lock.json": json.dumps(lock),
        ".config/opencode/node_modules/.keep": "",
    }


def _mini_env(c: CliContext) -> dict[str, str]:
    return {
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_SILENT_STARTUP": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "OPENAI_API_KEY": c.api_key,
        "OPENAI_BASE_URL": c.base_url + "/v1",
    }


#: The supported CLI agents.
CLI_AGENTS: dict[str, CliSpec] = {
    s.name: s
    for s in (
        CliSpec(
            name="claude-code",
            api="anthropic",
            files=_claude_files,
            env=_claude_env,
            argv=lambda c, p: [
                c.exe,
                "-p",
                p,
                "--output-format",
                "stream-json",
                "--verbose",
                "--dangerously-skip-permissions",
                "--tools",
                "Bash,Read,Edit,Write",
            ],
        ),
        CliSpec(
            name="codex",
            api="responses",
            files=_codex_files,
            env=lambda c: {"TRIO_SWE_API_KEY": c.api_key, "CODEX_HOME": f"{c.home}/.codex"},
            argv=lambda c, p: [
                c.exe,
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                p,
            ],
        ),
        CliSpec(
            name="qwen-code",
            api="chat",
            files=_qwen_files,
            env=lambda c: {
                "OPENAI_API_KEY": c.api_key,
                "OPENAI_BASE_URL": c.base_url + "/v1",
                "OPENAI_MODEL": c.model,
            },
            argv=lambda c, p: [c.exe, "--auth-type", "openai", "--yolo", "-o", "stream-json", p],
        ),
        CliSpec(
            name="opencode",
            api="chat",
            files=_opencode_files,
            env=_opencode_env,
            argv=lambda c, p: [c.exe, "run", "--pure", "--format", "json", "--auto", p],
        ),
        CliSpec(
            name="mini-swe-agent",
            api="chat",
            files=lambda c: {},
            env=_mini_env,
            argv=lambda c, p: [
                c.exe,
                "-m",
                f"openai/{c.model}",
                "-t",
                p,
                "-y",
                "--exit-immediately",
                "-c",
                "mini.yaml",
                "-c",
                f"model.model_kwargs.api_base={c.base_url}/v1",
                "-c",
                "agent.cost_limit=0",
                "-o",
                f"{c.home}/trajectory.json",
            ],
        ),
    )
}


def _sandbox_python() -> str:
    """An interpreter the sandbox's unprivileged user can run: the system's, else ours."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def cli_agent_host_paths() -> list[str]:
    """The host directories a container sandbox must show (read-only, at the same place) for
    CLI agents to run in it: the agents' install cache and the gateway's socket directory,
    e.g. ``DockerBackend(host_paths=cli_agent_host_paths())``."""
    return [str(agent_cache_dir()), str(default_socket_dir())]


def default_socket_dir() -> Path:
    """Where per-episode gateways put their unix sockets: ``SWE_GATEWAY_SOCKET_DIR``, else a
    directory local sandboxes see (not under ``/tmp``, which is private to each sandbox)."""
    env = os.environ.get("SWE_GATEWAY_SOCKET_DIR", "").strip()
    if env:
        return Path(env)
    for cand in (Path("/run/trio-swe"), Path("/var/tmp") / f"trio-swe-{os.getuid()}"):
        try:
            cand.mkdir(parents=True, exist_ok=True)
            os.chmod(cand, 0o755)
            return cand
        except OSError:
            continue
    raise ConfigError("no directory for gateway sockets; set SWE_GATEWAY_SOCKET_DIR")


class CliAgent(BaseAgent):
    """One of the :data:`CLI_AGENTS`, recorded through the gateway.

    Args:
        name: a key of :data:`CLI_AGENTS`.
        policy: the policy the gateway calls.
        tokenizer: the checkpoint's tokenizer (with its chat template).
        gateway: a running :class:`~trio_swe.gateway.Gateway` to share (it must listen on a
            unix socket for sandboxes without a network); None opens one per episode.
        tool_parser: the tool-call parser (``"auto"`` infers it from the template).
        model_name: the model name the agent is configured with.
        prompt: the instruction template (``{problem_statement_path}``, ``{instance_id}``).
        cache_dir: where the pinned CLIs are installed (see :func:`agent_cache_dir`).
        sandbox_network: False (default) asks the episode for a sandbox without a network.
        python: the interpreter that runs the forwarder in the sandbox.
        extra_env: more environment for the agent.
        own_policy: :meth:`aclose` closes the policy (the registry's agents own theirs).
        wrapper: a command the CLI runs under (e.g. ``strace -f -e trace=connect -o FILE``).
        sampling_params: the trainer's sampling parameters (SGLang's names) under each task's
            own: every policy call of the gateway's session uses them.
    """

    append_only = False  # the gateway forks where a client rewrites its history
    user = "agent"

    def __init__(
        self,
        name: str,
        *,
        policy: Policy,
        tokenizer: Any,
        gateway: Any | None = None,
        tool_parser: str = "auto",
        model_name: str = "trio-swe-policy",
        prompt: str = "Instance: {instance_id}\n\n" + DEFAULT_CLI_PROMPT,
        cache_dir: str | os.PathLike[str] | None = None,
        sandbox_network: bool = False,
        python: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        own_policy: bool = False,
        wrapper: Sequence[str] = (),
        sampling_params: Mapping[str, Any] | None = None,
    ) -> None:
        if name not in CLI_AGENTS:
            raise ConfigError(
                f"no CLI agent {name!r}; choose one of {', '.join(sorted(CLI_AGENTS))}"
            )
        self.name = name
        self.spec = CLI_AGENTS[name]
        self.policy = policy
        self.tokenizer = tokenizer
        self.gateway = gateway
        self.tool_parser = tool_parser
        self.model_name = model_name
        self.prompt = prompt
        self.cache_dir = Path(cache_dir) if cache_dir is not None else agent_cache_dir()
        self.sandbox_network = sandbox_network
        self.python = python or _sandbox_python()
        self.extra_env = dict(extra_env or {})
        self.own_policy = own_policy
        self.wrapper = list(wrapper)
        #: Under each task's own sampling parameters (the run's temperature, seed, ...).
        self.sampling_params = dict(sampling_params or {})
        self.last_session: Any = None  # the last episode's GatewaySession (for tests, tools)
        self.last_gateway: Any = None  # and the gateway that served it

    async def aclose(self) -> None:
        """Close the policy's client when this agent owns it."""
        if self.own_policy:
            close = getattr(self.policy, "aclose", None)
            if close is not None:
                await close()

    @asynccontextmanager
    async def _gateway(self) -> AsyncIterator[Any]:
        if self.gateway is not None:
            yield self.gateway
            return
        from ..gateway import open_gateway

        sock = default_socket_dir() / f"gw-{uuid.uuid4().hex[:16]}.sock"
        async with open_gateway(
            self.policy,
            self.tokenizer,
            host=None,
            unix_socket=sock,
            tool_parser=self.tool_parser,
            model_name=self.model_name,
        ) as gw:
            yield gw

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        """Install (cached), configure and run the CLI on the task; the gateway records it."""
        deadline = trio.current_time() + task.time_budget_sec
        exe = await ensure_installed(self.name, cache_dir=self.cache_dir)
        seen = await sandbox.exec(f"test -x {shlex.quote(str(exe))}", user=self.user, timeout=30)
        if not seen.ok:
            raise AgentInstallError(
                f"{exe} is installed on the host but not visible in the sandbox; keep the agent "
                "cache (SWE_AGENT_CACHE) outside /tmp and /root, or show it with "
                "LocalBackend(host_paths=[...]) / DockerBackend(host_paths=cli_agent_host_paths())"
            )
        exe = await self._runnable(sandbox, exe)
        network = bool(getattr(sandbox, "network", True))
        async with (
            self._gateway() as gw,
            gw.session(
                task.session_id,
                sampling_params={**self.sampling_params, **task.sampling_params},
                max_context_tokens=task.max_context_tokens,
            ) as session,
        ):
            self.last_session = session
            self.last_gateway = gw
            home = f"/tmp/.trio-swe-agent-{uuid.uuid4().hex[:12]}"
            if network and gw.url is not None:
                base_url, forward = gw.url, None
            elif gw.unix_socket is not None:
                base_url = f"http://127.0.0.1:{FORWARD_PORT}"
                forward = gw.unix_socket
            else:
                raise ConfigError(
                    "the sandbox has no network and the gateway no unix socket to forward to"
                )
            ctx = CliContext(
                base_url=base_url,
                api_key=session.api_key,
                model=self.model_name,
                home=home,
                exe=str(exe),
                workdir=task.workdir,
            )
            prompt = task.prompt or self.prompt.format(
                problem_statement_path=task.problem_statement_path, instance_id=task.instance_id
            )
            for rel, text in self.spec.files(ctx).items():
                await sandbox.write_file(f"{home}/{rel}", text, user=self.user)
            env = {
                "HOME": home,
                "XDG_CONFIG_HOME": f"{home}/.config",
                "XDG_CACHE_HOME": f"{home}/.cache",
                "XDG_DATA_HOME": f"{home}/.local/share",
                "NO_COLOR": "1",
                "CI": "1",
                **self.spec.env(ctx),
                **self.extra_env,
            }
            cmd = self._command(ctx, prompt, forward)
            remaining = max(deadline - trio.current_time(), 0.001)
            result = await run_agent(
                sandbox,
                cmd,
                workdir=task.workdir,
                time_budget_sec=remaining,
                env=env,
                user=self.user,
            )
        turns = session.turns()
        stats = session.statistics()
        return AgentOutcome(
            exit_code=result.exit_code,
            finish="time_budget" if result.reason == "time_budget" else "exited",
            turns=turns,
            output=result.output[-20000:],
            command_sec=max(result.duration_sec - stats.policy_sec, 0.0),
            policy_sec=stats.policy_sec,
            n_commands=stats.tool_calls,
        )

    async def _runnable(self, sandbox: Sandbox, exe: Path) -> Path:
        """``exe``, or the package's native executable when ``exe`` is a Node.js script and the
        sandbox's image has no ``node`` (a container image, unlike a local sandbox, which sees
        the host's).

        Raises:
            AgentInstallError: the agent needs Node.js and the image has none.
        """
        pkg = CLI_PACKAGES[self.name]
        if not pkg.needs_node:
            return exe
        probe = await sandbox.exec("command -v node", user=self.user, timeout=30)
        if probe.ok:
            return exe
        native = pkg.native_path(self.cache_dir / pkg.dirname)
        if native is not None and native.exists():
            return native
        raise AgentInstallError(
            f"{self.name} runs on Node.js and the sandbox's image has no node on its PATH; "
            "use an image with Node.js 20, or an agent with a native executable (claude-code, "
            "codex, opencode)"
        )

    def _command(self, ctx: CliContext, prompt: str, forward: str | None) -> str:
        argv = " ".join(shlex.quote(a) for a in [*self.wrapper, *self.spec.argv(ctx, prompt)])
        home = shlex.quote(ctx.home)
        steps = [f"mkdir -p {home}"]
        if forward is not None:
            from ..gateway._forwarder import FORWARDER_SOURCE

            script = f"{ctx.home}/.forwarder.py"
            ready = f"{ctx.home}/.forwarder.ready"
            steps += [
                f"printf %s {shlex.quote(FORWARDER_SOURCE)} > {shlex.quote(script)}",
                f"({shlex.quote(self.python)} {shlex.quote(script)} {FORWARD_PORT} "
                f"{shlex.quote(forward)} {shlex.quote(ready)} >/dev/null 2>&1 &)",
                # Wait (bounded) until it listens; the agent's first request must not race it.
                f"i=0; while [ ! -e {shlex.quote(ready)} ] && [ $i -lt 200 ]; do sleep 0.05; "
                "i=$((i+1)); done",
            ]
        steps.append(f"{argv} < /dev/null")
        return "\n".join(steps)


def _cli_factory(name: str) -> AgentFactory:
    def factory(config: SweConfig) -> Agent:
        from ..models import load_tokenizer
        from ..policy import open_policy, vocabulary_size

        try:  # once here, rather than an internal_error in every episode's gateway
            import hypercorn  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"SWE_AGENT={name} runs through the recording gateway, which needs hypercorn: "
                "pip install 'trio-swe[gateway]'"
            ) from None
        path = config.bash.tokenizer
        if not path:
            raise ConfigError(
                f"SWE_AGENT={name} records its turns through the gateway, which renders them "
                "with the checkpoint's chat template: set SWE_TOKENIZER to the checkpoint folder"
            )
        tokenizer = load_tokenizer(path)
        return CliAgent(
            name,
            policy=open_policy(
                config.policy.api, config.bash.policy_url, vocab_size=vocabulary_size(tokenizer)
            ),
            tokenizer=tokenizer,
            sampling_params=config.policy.sampling_params(),
            tool_parser=config.bash.tool_parser,
            own_policy=True,
        )

    return factory


for _name in ("claude-code", "codex", "qwen-code", "opencode", "mini-swe-agent"):
    register_agent(_name, _cli_factory(_name))
