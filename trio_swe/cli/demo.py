"""``trio-swe demo``: the bundled demo end to end, without network.

Builds the demo repositories, starts the scripted policy server on loopback and runs the demo
episodes on the local backend with an agent from the registry (:func:`create_agent`): the
built-in ``bash`` agent, or a CLI agent through the recording gateway (its shell tool plays the
scripts). The two differ in their agent's options and the policy server's dialect only.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path

import msgspec
import trio
from rich.console import Console

from .._close import aclose_quietly
from .._errors import ConfigError
from ..agents import CLI_AGENTS, BashAgent, create_agent, ensure_installed
from ..config import BashAgentOptions, BootPolicy, EpisodeBudgets, PolicyOptions, SweConfig
from ..demo import build_demo_set, cli_scripts, open_scripted_policy_server
from ..episode import EpisodeResult
from ..grading import InstanceMetadata, get_metadata
from ..models import ChatModel, load_tokenizer
from ..policy import ByteTokenizer, RawTextTokenizer, Tokenizer
from ..results import ResultsWriter
from ..sandbox import open_backend
from ._progress import run_with_progress
from ._render import abort_table, summary_table

__all__ = ["cmd_demo"]


async def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    if args.tool_parser is not None and not args.tokenizer:
        raise ConfigError("--tool-parser reads a checkpoint's tool calls: give --tokenizer too")
    if args.policy_api is not None and args.policy_url is None:
        raise ConfigError("--policy-api names a real engine's API: give --policy-url too")
    if args.policy_url is not None and not args.tokenizer:
        raise ConfigError(
            "--policy-url runs the demo against a real engine, whose tokens are its "
            "checkpoint's: give --tokenizer PATH (the checkpoint the engine serves)"
        )
    if args.agent != "bash":
        return await _cmd_demo_cli(args, console)
    started = time.monotonic()
    with _demo_workdir(args, console) as workdir:
        demo = await trio.to_thread.run_sync(build_demo_set, workdir / "repos")
        config = _demo_config(
            args,
            agent_budget_sec=5.0 if args.policy_url is None else 120.0,
            max_context_tokens=args.max_context_tokens,
            bash=BashAgentOptions(
                max_turns=10,
                command_timeout_sec=30.0,
                tokenizer=args.tokenizer or "",
                tool_parser=args.tool_parser or "auto",
            ),
        )
        mds = [get_metadata(row, "scaleswe") for row in demo.rows]
        tokenizer: Tokenizer | ChatModel = ByteTokenizer()
        dialect = "byte tokens, ```bash blocks"
        if args.tokenizer:
            # The checkpoint's tokenizer and template: the policy plays the scripts as that
            # model's tool calls, the agent parses them with the checkpoint's parser.
            tokenizer = await trio.to_thread.run_sync(
                partial(
                    ChatModel.from_checkpoint,
                    args.tokenizer,
                    tools=BashAgent.TOOLS,
                    tool_parser=args.tool_parser or "auto",
                )
            )
            dialect = f"{args.tokenizer}: its chat template, {tokenizer.parser.name} tool calls"
        if args.policy_url is not None:
            console.print(
                f"demo: {len(mds)} instances built in {workdir / 'repos'}; the engine at "
                f"{args.policy_url} ({config.policy.api}); bash agent ({dialect}); local backend "
                f"without network; concurrency {args.concurrency}"
            )
            results = await _run_demo(console, args, mds, _with_policy(config, args.policy_url))
            return _engine_verdict(console, args, results, started)
        console.print(
            f"demo: {len(mds)} instances built in {workdir / 'repos'}; scripted policy on "
            f"loopback; bash agent ({dialect}); local backend without network; "
            f"concurrency {args.concurrency}"
        )
        async with open_scripted_policy_server(demo.scripts, tokenizer=tokenizer) as server:
            results = await _run_demo(console, args, mds, _with_policy(config, server.url))
        return _demo_verdict(console, args, results, demo.expected_rewards, started)


async def _cmd_demo_cli(args: argparse.Namespace, console: Console) -> int:
    """The demo with a real CLI agent: its shell tool plays the scripts, through the gateway."""
    if args.agent not in CLI_AGENTS:
        console.print(
            f"[red]--agent {args.agent!r}: choose bash or one of {', '.join(sorted(CLI_AGENTS))}"
        )
        return 2
    if not args.tokenizer:
        console.print(
            f"[red]--agent {args.agent} records its turns through the gateway, which renders them "
            "with a checkpoint's chat template: pass --tokenizer PATH"
        )
        return 2
    started = time.monotonic()
    console.print(f"demo: installing {args.agent} (pinned, cached) if needed ...")
    exe = await ensure_installed(args.agent)
    tokenizer = await trio.to_thread.run_sync(load_tokenizer, args.tokenizer)
    model = await trio.to_thread.run_sync(partial(ChatModel, tokenizer, name=args.tokenizer))
    with _demo_workdir(args, console) as workdir:
        demo = await trio.to_thread.run_sync(build_demo_set, workdir / "repos")
        config = _demo_config(
            args,
            agent_budget_sec=90.0 if args.policy_url is None else 240.0,
            max_context_tokens=max(args.max_context_tokens, 65536),
            bash=BashAgentOptions(tokenizer=args.tokenizer, tool_parser=args.tool_parser or "auto"),
        )
        mds = [get_metadata(row, "scaleswe") for row in demo.rows]
        if args.policy_url is not None:
            console.print(
                f"demo: {len(mds)} instances; {args.agent} ({exe}) through the recording "
                f"gateway; the engine at {args.policy_url} ({config.policy.api}); local "
                f"backend, sandboxes reach only the gateway; concurrency {args.concurrency}"
            )
            results = await _run_demo(console, args, mds, _with_policy(config, args.policy_url))
            return _engine_verdict(console, args, results, started)
        console.print(
            f"demo: {len(mds)} instances; {args.agent} ({exe}) through the recording gateway; "
            f"scripted policy on {args.tokenizer}; local backend, sandboxes reach only the "
            f"gateway; concurrency {args.concurrency}"
        )
        async with open_scripted_policy_server(
            cli_scripts(args.agent, model=model),
            tokenizer=RawTextTokenizer(tokenizer),
            turn_marker=model.generation_prompt or None,
            key_pattern=r"Instance: ([\w.\-]+)",
        ) as server:
            results = await _run_demo(console, args, mds, _with_policy(config, server.url))
        return _demo_verdict(console, args, results, demo.expected_rewards, started, gateway=True)


# The two demos (the built-in agent; a CLI agent through the gateway) differ in their agent and
# its policy server only: the workdir, the config and the run are these.


@contextlib.contextmanager
def _demo_workdir(args: argparse.Namespace, console: Console) -> Iterator[Path]:
    """A fresh folder for the demo's repositories, removed afterwards unless ``--keep``."""
    workdir = Path(tempfile.mkdtemp(prefix="trio_swe-demo-"))
    try:
        yield workdir
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            console.print(f"kept {workdir}")


def _demo_config(
    args: argparse.Namespace,
    *,
    agent_budget_sec: float,
    max_context_tokens: int,
    bash: BashAgentOptions,
) -> SweConfig:
    """The demo's agent and budgets (``--agent-budget`` overrides the agent's), checked."""
    environ = SweConfig.from_env(check_protocols=False)
    config = SweConfig(
        agent=args.agent,
        episode=EpisodeBudgets(
            agent_time_budget_sec=(
                agent_budget_sec if args.agent_budget is None else args.agent_budget
            ),
            eval_timeout_sec=60.0,
            setup_timeout_sec=60.0,
            guard_headroom_sec=60.0,
            max_context_tokens=max_context_tokens,
            # How samples are built is the environment's (SWE_ILL_FORMED_POLICY, ...): an
            # untrained engine's turns are all ill-formed, masked by default.
            ill_formed_policy=environ.episode.ill_formed_policy,
            realign_max_tokens=environ.episode.realign_max_tokens,
        ),
        boot=BootPolicy(concurrency=max(args.concurrency, 1)),
        bash=bash,
        policy=_policy_options(args, environ.policy),
    )
    config.validate_protocols()
    return config


#: A turn's cap against a real engine unless --max-new-tokens says otherwise: the bash
#: agent's own (4096) would let an untrained model talk for minutes per turn on a CPU.
ENGINE_MAX_NEW_TOKENS = 256


def _policy_options(args: argparse.Namespace, environ: PolicyOptions) -> PolicyOptions:
    """The policy's API and sampling options from the flags (the environment's under them,
    against an engine; the scripted server speaks SGLang's API whatever the environment)."""
    base = PolicyOptions() if args.policy_url is None else environ
    values = {
        "api": args.policy_api,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
    }
    if args.policy_url is not None and args.max_new_tokens is None and not base.max_new_tokens:
        values["max_new_tokens"] = ENGINE_MAX_NEW_TOKENS
    try:
        return msgspec.structs.replace(base, **{k: v for k, v in values.items() if v is not None})
    except ConfigError as exc:
        raise ConfigError(f"demo's policy flags: {exc}") from None


def _with_policy(config: SweConfig, url: str) -> SweConfig:
    """``config`` with its agent calling the scripted policy server at ``url``."""
    return msgspec.structs.replace(
        config, bash=msgspec.structs.replace(config.bash, policy_url=url)
    )


async def _run_demo(
    console: Console, args: argparse.Namespace, mds: list[InstanceMetadata], config: SweConfig
) -> list[EpisodeResult]:
    """The demo's episodes with the registry's agent, on the local backend without network
    (results to ``--out``)."""
    # The factory may load a checkpoint's tokenizer (a second or so): not on the event loop.
    agent = await trio.to_thread.run_sync(create_agent, config)
    writer = ResultsWriter(args.out) if args.out else None
    try:
        async with open_backend("local") as backend:
            return await run_with_progress(
                console,
                mds,
                agent,
                backend=backend,
                config=config,
                concurrency=args.concurrency,
                writer=writer,
                network=False,
                show_progress=not args.no_progress,
            )
    finally:
        if writer is not None:
            writer.close()
        await aclose_quietly([agent], timeout_sec=10.0)


def _engine_verdict(
    console: Console, args: argparse.Namespace, results: Sequence[EpisodeResult], started: float
) -> int:
    """Against a real engine the scripts mean nothing: report what was recorded; 0 when no
    episode aborted (an untrained model earns 0, which is a result, not a failure)."""
    console.print(summary_table(results))
    aborts = abort_table(results)
    if aborts is not None:
        console.print(aborts)
    samples = [s for r in results for s in r.samples]
    tokens = sum(len(s.tokens) for s in samples)
    trained = sum(sum(s.loss_mask) for s in samples)
    aborted = sum(1 for r in results if r.status == "aborted")
    rewards = [r.reward for r in results if r.status != "aborted"]
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    console.print(
        f"{len(results) - aborted}/{len(results)} episodes ran to the end (reward mean "
        f"{mean:.2f}); {sum(r.n_turns for r in results)} turns, {len(samples)} samples, "
        f"{tokens} tokens ({trained} trained); {time.monotonic() - started:.1f}s"
    )
    if args.out:
        console.print(f"results: {args.out}")
    return 0 if aborted == 0 else 1


def _demo_verdict(
    console: Console,
    args: argparse.Namespace,
    results: Sequence[EpisodeResult],
    expected: Mapping[str, float],
    started: float,
    *,
    gateway: bool = False,
) -> int:
    """Print the demo's table and one-line verdict; 0 when every episode earned its reward."""
    console.print(summary_table(results, expected))
    aborts = abort_table(results)
    if aborts is not None:
        console.print(aborts)
    matched = sum(
        1 for r in results if r.status != "aborted" and r.reward == expected[r.instance_id]
    )
    samples = sum(len(r.samples) for r in results)
    tokens = sum(len(s.tokens) for r in results for s in r.samples)
    recorded = (
        f"{sum(r.n_turns for r in results)} turns recorded by the gateway, " if gateway else ""
    )
    console.print(
        f"{matched}/{len(results)} episodes earned the reward their script plays for; "
        f"{recorded}{samples} samples, {tokens} tokens; {time.monotonic() - started:.1f}s"
    )
    if args.out:
        console.print(f"results: {args.out}")
    return 0 if matched == len(results) else 1
