"""The ``trio-swe`` command: ``run`` a dataset of instances, or the bundled ``demo``.

``trio-swe run INSTANCES.jsonl --backend local --agent bash --protocol scaleswe --concurrency 8
--out results.msgpack`` runs one episode per row with a live progress display, writes each result
(with its samples) the moment it finishes, and on a rerun with the same ``--out`` skips the
instances already finished (aborted ones are retried).

``trio-swe results FILE`` shows a results file (a summary table) or exports it as JSON Lines or
as SWE-bench's ``predictions.jsonl``.

``trio-swe grade PREDICTIONS --dataset ROWS`` grades existing predictions as SWE-bench's harness
does and writes its outputs (``--run-id``, ``--out-dir``); ``run --harness-dir DIR`` writes the
same outputs for a run (see ``docs/grading.md``).

``trio-swe demo`` builds the demo repositories, starts the scripted policy server on loopback and
runs the demo episodes with the bash agent on the local backend, without network.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from ._close import aclose_quietly
from ._errors import ConfigError, MetadataError, TrioSweError
from ._groups import leaves
from ._json import loads
from .agents import Agent, check_agent, create_agent
from .config import (
    BACKENDS,
    BashAgentOptions,
    BootPolicy,
    EpisodeBudgets,
    SweConfig,
    replace_option,
)
from .episode import EpisodeResult, PhaseTimings
from .grading import HarnessOutputs, InstanceMetadata, get_metadata
from .results import (
    ResultsWriter,
    harness_record,
    predictions_jsonl,
    read_results,
    results_jsonl,
)
from .rollout import run_rollouts
from .sandbox import Backend, open_backend

__all__ = ["main"]


# --- progress --------------------------------------------------------------------------------


class _Tally:
    """Counts for the live display and the summary."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.running = 0
        self.done = 0
        self.aborted = 0
        self.rewards: list[float] = []
        self.timings: list[PhaseTimings] = []
        self.statuses: collections.Counter[str] = collections.Counter()

    def started(self, md: InstanceMetadata) -> None:
        self.running += 1

    def finished(self, result: EpisodeResult) -> None:
        self.running -= 1
        self.done += 1
        self.statuses[result.status] += 1
        self.timings.append(result.timings)
        if result.status == "aborted":
            self.aborted += 1
        else:
            self.rewards.append(result.reward)

    def mean_phase(self, name: str) -> float:
        if not self.timings:
            return 0.0
        return sum(float(getattr(t, name)) for t in self.timings) / len(self.timings)

    def line(self) -> str:
        reward = sum(self.rewards) / len(self.rewards) if self.rewards else 0.0
        phases = " ".join(
            f"{p} {self.mean_phase(p):.1f}s" for p in ("boot", "setup", "agent", "eval", "total")
        )
        return (
            f"running {self.running}  done {self.done}/{self.total}  aborted {self.aborted}  "
            f"resolved {sum(1 for r in self.rewards if r > 0)}  mean reward {reward:.2f}  "
            f"| mean {phases}"
        )


#: Per-episode rows shown in the summary; larger runs get the aggregate table only.
SUMMARY_ROWS = 40


def _aggregate_table(results: Sequence[EpisodeResult]) -> Table:
    table = Table(title="summary")
    for col in ("status", "episodes", "resolved", "mean reward", "mean time", "samples"):
        table.add_column(col, justify="left" if col == "status" else "right")
    groups: dict[str, list[EpisodeResult]] = collections.defaultdict(list)
    for r in results:
        key = r.status if r.status != "aborted" else f"aborted: {r.abort_reason}"
        groups[key].append(r)
    for key in sorted(groups):
        rs = groups[key]
        table.add_row(
            key,
            str(len(rs)),
            str(sum(1 for r in rs if r.reward > 0)),
            f"{sum(r.reward for r in rs) / len(rs):.3f}",
            f"{sum(r.timings.total for r in rs) / len(rs):.1f}s",
            str(sum(len(r.samples) for r in rs)),
        )
    return table


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
    console.print(_summary_table(results, expected))
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


def _summary_table(
    results: Sequence[EpisodeResult], expected: Mapping[str, float] | None = None
) -> Table:
    table = Table(title="episodes", show_lines=False)
    for col in ("instance", "status", "reward", "exit", "finish", "turns", "samples", "time"):
        table.add_column(col, justify="right" if col in ("reward", "exit", "turns") else "left")
    if expected is not None:
        table.add_column("script", justify="right")
    for r in sorted(results, key=lambda r: r.instance_id):
        status = r.status if r.status != "aborted" else f"aborted: {r.abort_reason}"
        row = [
            r.instance_id,
            status,
            f"{r.reward:.0f}",
            "" if r.agent_exit_code is None else str(r.agent_exit_code),
            r.agent_finish or "",
            str(r.n_turns),
            str(len(r.samples)),
            f"{r.timings.total:.1f}s",
        ]
        if expected is not None:
            want = expected.get(r.instance_id)
            ok = want is not None and r.status != "aborted" and r.reward == want
            row.append(f"{want:.0f} {'ok' if ok else 'MISMATCH'}" if want is not None else "")
        table.add_row(*row)
    return table


async def _run_with_progress(
    console: Console,
    mds: list[InstanceMetadata],
    agent: Agent | None,
    *,
    backend: Backend | None,
    config: SweConfig,
    concurrency: int,
    writer: ResultsWriter | None,
    network: bool,
    show_progress: bool,
    on_result: Callable[[EpisodeResult], None] | None = None,
    pool: Any = None,
    keep_eval_artifacts: bool = False,
) -> list[EpisodeResult]:
    """Run ``mds`` with a live display: here (``agent`` on ``backend``), or on a Ray ``pool``."""
    tally = _Tally(len(mds))
    progress = Progress(
        TextColumn("[bold]episodes"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    bar = progress.add_task("episodes", total=len(mds))
    results: list[EpisodeResult] = []

    def render() -> Group:
        return Group(progress, tally.line())

    live = Live(render(), console=console, refresh_per_second=8, auto_refresh=show_progress)
    if pool is not None:
        # Workers send each result as the frame a results file stores: append it as it is.
        stream_cm: Any = pool.rollouts(
            mds,
            network=network,
            on_start=tally.started,
            on_frame=(lambda frame, _: writer.write_frame(frame)) if writer else None,
        )
    else:
        assert agent is not None
        assert backend is not None
        stream_cm = run_rollouts(
            mds,
            agent,
            backend=backend,
            config=config,
            concurrency=concurrency,
            network=network,
            on_start=tally.started,
            keep_eval_artifacts=keep_eval_artifacts,
        )
    with live if show_progress else contextlib.nullcontext(live):
        async with stream_cm as stream:
            async for result in stream:
                if writer is not None and pool is None:
                    writer.write(result)
                results.append(result)
                tally.finished(result)
                progress.update(bar, advance=1)
                live.update(render())
                if not show_progress:
                    console.print(
                        f"done {result.instance_id} {result.status} reward {result.reward:g}"
                    )
                if on_result is not None:
                    on_result(result)
    if not show_progress:
        console.print(tally.line())
    return results


# --- trio-swe run ----------------------------------------------------------------------------


def _read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Every row of a JSONL file (line number, object); a typed, one-line error otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except FileNotFoundError:
        raise ConfigError(f"instances file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"instances file {str(path)!r} cannot be read: {exc}") from None
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{lineno}: not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{lineno}: a row must be a JSON object")
        rows.append((lineno, row))
    return rows


#: ``trio-swe run``'s flags that set an option: flag -> (argparse dest, option paths).
_RUN_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "--backend": ("backend", ("backend",)),
    "--agent": ("agent", ("agent",)),
    "--protocol": ("protocol", ("train_protocol", "eval_protocol")),
    "--policy-url": ("policy_url", ("bash.policy_url",)),
    "--agent-budget": ("agent_budget", ("episode.agent_time_budget_sec",)),
    "--eval-timeout": ("eval_timeout", ("episode.eval_timeout_sec",)),
    "--max-context-tokens": ("max_context_tokens", ("episode.max_context_tokens",)),
}


def _config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> SweConfig:
    """The environment's configuration, with the flags given applied on top (each checked)."""
    config = SweConfig.from_env(environ, check_protocols=False)  # SWE_BACKEND is checked first
    for flag, (dest, paths) in _RUN_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        for path in paths:
            try:
                config = replace_option(config, path, value)
            except ConfigError as exc:
                raise ConfigError(f"{flag} {value!r}: {exc}") from None
    try:
        check_agent(config.agent)
    except ConfigError as exc:
        raise ConfigError(f"--agent {args.agent!r}: {exc}" if args.agent else str(exc)) from None
    try:
        config.validate_protocols()
    except ConfigError as exc:
        raise ConfigError(
            f"--protocol {args.protocol!r}: {exc}" if args.protocol else str(exc)
        ) from None
    return config


async def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    config = _config_from_args(args)
    protocol = config.train_protocol
    rows = _read_rows(Path(args.instances))  # before the results file is touched
    # Resume: instances already finished (not aborted) are skipped, as many times as they
    # finished (a dataset may repeat an instance for several samples).
    previous, _ = read_results(args.out)
    finished = collections.Counter(r.instance_id for r in previous if r.status != "aborted")
    skipped = sum(finished.values())
    mds: list[InstanceMetadata] = []
    unreadable = 0
    for lineno, row in rows:
        try:
            md = get_metadata(row, protocol)
        except MetadataError as exc:
            unreadable += 1
            console.print(f"[yellow]skipping line {lineno}: {exc}")
            continue
        if finished[md.instance_id] > 0:
            finished[md.instance_id] -= 1
            continue
        mds.append(md)
    # Before anything boots: can this install grade these rows (e.g. the swebench version)?
    config.check_rows([row for _, row in rows])
    if args.limit is not None:
        mds = mds[: args.limit]
    if args.ray is None:
        console.print(
            f"{len(mds)} episodes to run ({skipped} already finished in {args.out}, "
            f"{unreadable} unreadable rows), protocol {protocol}, agent {config.agent}, "
            f"concurrency {args.concurrency}, backend {config.backend}"
        )
    with ResultsWriter(args.out) as writer:
        # An aborted instance that runs again replaces its aborted frames (no duplicates).
        rerun = {md.instance_id for md in mds}
        writer.keep_only(lambda r: r.status != "aborted" or r.instance_id not in rerun)
        if args.ray is not None:
            return await _run_on_ray(args, console, config, mds, writer, skipped, unreadable)
        agent = create_agent(config)
        outputs = (
            HarnessOutputs(args.harness_dir, args.run_id, f"trio_swe__{config.agent}")
            if args.harness_dir
            else None
        )
        try:
            async with open_backend(config.backend, _local_options(args, config)) as backend:
                results = await _run_with_progress(
                    console,
                    mds,
                    agent,
                    backend=backend,
                    config=config,
                    concurrency=args.concurrency,
                    writer=writer,
                    network=not args.no_network,
                    show_progress=not args.no_progress,
                    # The harness's files are written from each result as it arrives.
                    on_result=functools.partial(harness_record, outputs) if outputs else None,
                    keep_eval_artifacts=outputs is not None,
                )
        finally:
            await aclose_quietly([agent], timeout_sec=10.0)
    if len(results) <= SUMMARY_ROWS:
        console.print(_summary_table(results))
    console.print(_aggregate_table(results))
    console.print(f"results: {args.out} ({writer.written} new, {skipped} from before)")
    if outputs is not None:
        outputs.write_report(md.instance_id for md in mds)
        console.print(f"harness outputs: {escape(str(outputs.report_path()))}")
    return _exit_code(console, results)


def _local_options(args: argparse.Namespace, config: SweConfig) -> dict[str, Any] | None:
    """The local backend's options of ``run``: the SWE-bench shims and checkouts.

    SWE-bench's eval scripts activate ``/opt/miniconda3``'s ``testbed`` environment, so under
    the swebench protocol the shims are on by default (this Python's environment, as
    ``trio-swe grade``); ``--python-env`` names another one, for any protocol.
    """
    if config.backend != "local":
        if args.python_env or args.checkouts:
            raise ConfigError(
                f"--python-env and --checkouts are local backend options (backend is "
                f"{config.backend!r})"
            )
        return None
    from .grading import local_backend_shims, local_checkouts

    options: dict[str, Any] = {}
    if args.python_env or config.train_protocol == "swebench":
        options.update(local_backend_shims(args.python_env))
    if args.checkouts:
        options["images"] = local_checkouts(args.checkouts)
    return options or None


def _exit_code(console: Console, results: Sequence[EpisodeResult]) -> int:
    """0, or 1 when every episode of the run was aborted (nothing was graded)."""
    if results and all(r.status == "aborted" for r in results):
        console.print(
            f"[red]every episode of this run was aborted ({len(results)}): "
            "see the abort reasons above"
        )
        return 1
    return 0


# --- trio-swe results ------------------------------------------------------------------------


def _cmd_results(args: argparse.Namespace, console: Console) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"results file {str(path)!r} does not exist")
    results, intact = read_results(path)
    if intact < path.stat().st_size:
        console.print(
            f"[yellow]{path}: the last {path.stat().st_size - intact} bytes are a frame cut "
            "short (an interrupted writer); reading the intact part"
        )
    if args.format == "table":
        if len(results) <= SUMMARY_ROWS or args.all:
            console.print(_summary_table(results))
        console.print(_aggregate_table(results))
        return 0
    if args.format == "jsonl":
        lines = results_jsonl(results, samples=args.samples)
    else:
        lines = predictions_jsonl(results, model=args.model)
    data = b"".join(lines)
    if args.output in (None, "-"):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        Path(args.output).write_bytes(data)
        console.print(f"wrote {len(lines)} lines to {args.output}")
    return 0


async def _cmd_grade(args: argparse.Namespace, console: Console) -> int:
    from .grading import local_backend_shims, local_checkouts, require_protocol
    from .grading._grade_cmd import (
        grade_predictions,
        model_of,
        pair,
        read_dataset,
        read_predictions,
    )

    require_protocol(args.protocol)
    given = read_predictions(Path(args.predictions))
    rows = read_dataset(Path(args.dataset))
    # Checked here too, before the outputs' directory is made.
    predictions, _ = pair(given, rows, f"dataset {args.dataset}")
    model = model_of(predictions)
    outputs = HarnessOutputs(args.out_dir, args.run_id, model)
    options: dict[str, Any] = {}
    if args.backend == "local":
        images = local_checkouts(args.checkouts) if args.checkouts else None
        options = {**local_backend_shims(args.python_env), "images": images}
    console.print(f"grading {len(predictions)} predictions against {len(rows)} rows ({model})")
    if len(given) > len(predictions):
        console.print(
            f"  {len(given) - len(predictions)} earlier prediction(s) for an instance that has a "
            "later one: the last one is graded, as swebench's harness does"
        )

    def done(iid: str, what: str) -> None:
        console.print(f"  {escape(iid)}: {escape(what)}")

    async with open_backend(args.backend, options) as backend:
        report = await grade_predictions(
            predictions,
            rows,
            backend,
            outputs,
            protocol=args.protocol,
            timeout_sec=args.timeout,
            concurrency=args.concurrency,
            on_done=done,
        )
    # As the harness prints its summary.
    console.print(f"Total instances: {report['total_instances']}")
    for label, key in (
        ("submitted", "submitted_instances"),
        ("completed", "completed_instances"),
        ("incomplete", "incomplete_ids"),
        ("resolved", "resolved_instances"),
        ("unresolved", "unresolved_instances"),
        ("with empty patches", "empty_patch_instances"),
        ("with errors", "error_instances"),
    ):
        value = report[key]
        console.print(f"Instances {label}: {len(value) if isinstance(value, list) else value}")
    console.print(f"report: {escape(str(outputs.report_path()))}")
    return 0


async def _run_on_ray(
    args: argparse.Namespace,
    console: Console,
    config: SweConfig,
    mds: list[InstanceMetadata],
    writer: ResultsWriter,
    skipped: int,
    unreadable: int,
) -> int:
    """``trio-swe run --ray ADDRESS``: the same run, its episodes on a Ray cluster's workers."""
    if getattr(args, "harness_dir", None):
        raise ConfigError("--harness-dir is not supported with --ray (grading runs on the workers)")
    if getattr(args, "python_env", None) or getattr(args, "checkouts", None):
        raise ConfigError("--python-env and --checkouts are not supported with --ray")
    try:
        import ray

        from .ray import WorkerPool
    except ImportError as exc:
        raise ConfigError(f"--ray needs Ray: pip install 'trio-swe[ray]' ({exc})") from None
    if not ray.is_initialized():
        ray.init(address=args.ray, namespace="trio_swe", log_to_driver=False)
    # The workers build their backend from their own environment: give them this one's E2B
    # settings, so a key set where trio-swe runs is enough (Ray's runtime_env env_vars).
    shipped = {k: v for k, v in os.environ.items() if k.startswith("E2B_") or k == "SSL_CERT_FILE"}
    async with WorkerPool(
        workers=args.ray_workers,
        concurrency=args.concurrency,
        config=config,
        max_booting=args.max_booting,
        max_alive=args.max_alive,
        runtime_env={"env_vars": shipped} if shipped else None,
    ) as pool:
        nodes = len({w.info.node_id for w in pool.live_workers()})
        console.print(
            f"{len(mds)} episodes to run ({skipped} already finished in {args.out}, "
            f"{unreadable} unreadable rows), protocol {config.train_protocol}, agent "
            f"{config.agent}, backend {config.backend}, on Ray: {len(pool.live_workers())} "
            f"workers on {nodes} nodes x concurrency {args.concurrency}"
        )
        results = await _run_with_progress(
            console,
            mds,
            None,
            backend=None,
            config=config,
            concurrency=args.concurrency,
            writer=writer,
            network=not args.no_network,
            show_progress=not args.no_progress,
            pool=pool,
        )
        stats = pool.statistics()
    if len(results) <= SUMMARY_ROWS:
        console.print(_summary_table(results))
    console.print(_aggregate_table(results))
    if stats.deaths:
        console.print(
            f"{stats.deaths} worker(s) died; {stats.reruns} episode(s) ran again elsewhere"
        )
    console.print(f"results: {args.out} ({writer.written} new, {skipped} from before)")
    return _exit_code(console, results)


# --- trio-swe demo ---------------------------------------------------------------------------


async def _cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from .agents._bash_agent import BashAgent
    from .demo import build_demo_set, open_scripted_policy_server
    from .models import ChatModel
    from .policy import ByteTokenizer, SGLangPolicy, Tokenizer

    if args.agent != "bash":
        return await _cmd_demo_cli(args, console)
    started = time.monotonic()
    with _demo_workdir(args, console) as workdir:
        demo = await trio.to_thread.run_sync(build_demo_set, workdir / "repos")
        config = _demo_config(
            args,
            agent_budget_sec=5.0,
            max_context_tokens=args.max_context_tokens,
            bash=BashAgentOptions(max_turns=10, command_timeout_sec=30.0),
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
                    tool_parser=args.tool_parser,
                )
            )
            dialect = f"{args.tokenizer}: its chat template, {tokenizer.parser.name} tool calls"
        console.print(
            f"demo: {len(mds)} instances built in {workdir / 'repos'}; scripted policy on "
            f"loopback; bash agent ({dialect}); local backend without network; "
            f"concurrency {args.concurrency}"
        )
        async with (
            open_scripted_policy_server(demo.scripts, tokenizer=tokenizer) as server,
            SGLangPolicy(server.url) as policy,
        ):
            agent = BashAgent(
                policy,
                tokenizer,
                max_turns=config.bash.max_turns,
                command_timeout_sec=config.bash.command_timeout_sec,
            )
            results = await _run_demo(console, args, mds, agent, config)
        return _demo_verdict(console, args, results, demo.expected_rewards, started)


async def _cmd_demo_cli(args: argparse.Namespace, console: Console) -> int:
    """The demo with a real CLI agent: its shell tool plays the scripts, through the gateway."""
    from .agents._cli import CLI_AGENTS, CliAgent
    from .agents._install import ensure_installed
    from .demo import build_demo_set, open_scripted_policy_server
    from .demo._cli_scripts import cli_scripts
    from .models import ChatModel, load_tokenizer
    from .policy import RawTextTokenizer, SGLangPolicy

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
            args, agent_budget_sec=90.0, max_context_tokens=max(args.max_context_tokens, 65536)
        )
        mds = [get_metadata(row, "scaleswe") for row in demo.rows]
        console.print(
            f"demo: {len(mds)} instances; {args.agent} ({exe}) through the recording gateway; "
            f"scripted policy on {args.tokenizer}; local backend, sandboxes reach only the "
            f"gateway; concurrency {args.concurrency}"
        )
        async with (
            open_scripted_policy_server(
                cli_scripts(args.agent, model=model),
                tokenizer=RawTextTokenizer(tokenizer),
                turn_marker=model.generation_prompt or None,
                key_pattern=r"Instance: ([\w.\-]+)",
            ) as server,
            SGLangPolicy(server.url) as policy,
        ):
            agent = CliAgent(
                args.agent, policy=policy, tokenizer=tokenizer, tool_parser=args.tool_parser
            )
            results = await _run_demo(console, args, mds, agent, config)
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
    bash: BashAgentOptions | None = None,
) -> SweConfig:
    """The demo's budgets (``--agent-budget`` overrides the agent's), checked."""
    config = SweConfig(
        episode=EpisodeBudgets(
            agent_time_budget_sec=args.agent_budget or agent_budget_sec,
            eval_timeout_sec=60.0,
            setup_timeout_sec=60.0,
            guard_headroom_sec=60.0,
            max_context_tokens=max_context_tokens,
        ),
        boot=BootPolicy(concurrency=max(args.concurrency, 1)),
        bash=bash if bash is not None else BashAgentOptions(),
    )
    config.validate_protocols()
    return config


async def _run_demo(
    console: Console,
    args: argparse.Namespace,
    mds: list[InstanceMetadata],
    agent: Agent,
    config: SweConfig,
) -> list[EpisodeResult]:
    """The demo's episodes on the local backend without network (results to ``--out``)."""
    from .sandbox.local import LocalBackend

    writer = ResultsWriter(args.out) if args.out else None
    try:
        return await _run_with_progress(
            console,
            mds,
            agent,
            backend=LocalBackend(),
            config=config,
            concurrency=args.concurrency,
            writer=writer,
            network=False,
            show_progress=not args.no_progress,
        )
    finally:
        if writer is not None:
            writer.close()


# --- entry point -----------------------------------------------------------------------------

_EXAMPLES = """\
examples:
  trio-swe demo                                   the bundled demo: 8 episodes, no network
  trio-swe run rows.jsonl --policy-url http://127.0.0.1:30000 --concurrency 8
  SWE_BACKEND=e2b E2B_API_KEY=... trio-swe run rows.jsonl --out results.msgpack
  trio-swe run rows.jsonl --protocol swebench --limit 10
  trio-swe results results.msgpack                a summary of a results file
  trio-swe results results.msgpack --format predictions --model my-model -o predictions.jsonl

Options not given as flags come from the environment (SWE_*, see `SweConfig`); a rerun with the
same --out skips the instances already finished and retries the aborted ones.
"""


def _from_env_help(var: str, builtin: object) -> str:
    """Where a flag's default comes from: the variable (and its value here), else the built-in."""
    raw = os.environ.get(var, "").strip()
    if raw:
        return f"default: ${var}={raw!r} here; {builtin} when unset"
    return f"default: {builtin}, or ${var} when set"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trio-swe",
        description="Run coding-agent episodes for RL on SWE tasks.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = SweConfig()

    run = sub.add_parser(
        "run",
        help="run one episode per row of a JSONL dataset",
        description="Run one episode per row of a JSONL dataset and append each result to a "
        "results file (resumable: a rerun skips what finished and retries what aborted). "
        "Exits 0 when the run finished, 1 when every episode of it was aborted, 2 on bad "
        "input, 130 on Ctrl-C and 143 on SIGTERM (both clean up first).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("instances", help="JSONL file, one dataset row per line")
    run.add_argument(
        "--backend",
        default=None,
        help="where sandboxes run: local, e2b, or a registered backend "
        f"({_from_env_help('SWE_BACKEND', defaults.backend)}); e2b reads E2B_API_KEY, "
        "E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN and SSL_CERT_FILE",
    )
    run.add_argument(
        "--agent",
        default=None,
        help=f"agent name in the registry ({_from_env_help('SWE_AGENT', defaults.agent)})",
    )
    run.add_argument(
        "--protocol",
        default=None,
        help="grading protocol: scaleswe, swebench, or a registered one "
        f"({_from_env_help('SWE_TRAIN_PROTOCOL', defaults.train_protocol)})",
    )
    run.add_argument(
        "--policy-url",
        default=None,
        help="SGLang server the bash agent calls "
        f"({_from_env_help('SWE_POLICY_URL', defaults.bash.policy_url)})",
    )
    run.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="episodes running at once (per worker with --ray); boots are further limited by "
        "SWE_BOOT_CONCURRENCY (default: 4)",
    )
    run.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the episodes on a Ray cluster: its address, or auto (needs trio-swe[ray])",
    )
    run.add_argument(
        "--ray-workers",
        type=int,
        default=None,
        metavar="N",
        help="with --ray: N workers spread over the cluster (default: one per node)",
    )
    run.add_argument(
        "--max-alive",
        type=int,
        default=0,
        metavar="N",
        help="with --ray: sandboxes alive at once across the cluster (default: no cap)",
    )
    run.add_argument(
        "--max-booting",
        type=int,
        default=0,
        metavar="N",
        help="with --ray: sandboxes booting at once across the cluster (default: no cap)",
    )
    run.add_argument(
        "--out",
        default="results.msgpack",
        help="results file, appended and resumable (default: results.msgpack)",
    )
    run.add_argument(
        "--agent-budget",
        type=float,
        default=None,
        help="seconds per agent run "
        f"({_from_env_help('SWE_AGENT_TIME_BUDGET_SEC', defaults.episode.agent_time_budget_sec)})",
    )
    run.add_argument(
        "--eval-timeout",
        type=float,
        default=None,
        help="seconds per graded test run "
        f"({_from_env_help('SWE_EVAL_TIMEOUT_SEC', defaults.episode.eval_timeout_sec)})",
    )
    run.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help="cap of a sample's tokens, 0 for none "
        f"({_from_env_help('SWE_MAX_CONTEXT_TOKENS', defaults.episode.max_context_tokens)})",
    )
    run.add_argument("--limit", type=int, default=None, help="run at most this many episodes")
    run.add_argument("--no-network", action="store_true", help="agent sandboxes get no network")
    run.add_argument("--no-progress", action="store_true", help="no live display")
    run.add_argument(
        "--harness-dir",
        default=None,
        help="also write SWE-bench's harness outputs here (predictions.jsonl, report, logs)",
    )
    run.add_argument("--run-id", default="trio_swe", help="run id of the harness outputs")
    run.add_argument(
        "--python-env",
        default=None,
        help="local backend: bin directory of the repositories' test environment, shown at "
        "SWE-bench's /opt/miniconda3/envs/testbed (default under --protocol swebench: this "
        "Python's)",
    )
    run.add_argument(
        "--checkouts",
        default=None,
        help="local backend: directory of clones named <owner>__<name>; rows boot "
        "<dir>/<owner>__<name>@<base_commit>",
    )

    grade = sub.add_parser(
        "grade",
        help="grade existing predictions as SWE-bench's harness does (its outputs included)",
    )
    grade.add_argument("predictions", help="predictions: JSONL, a JSON list or a JSON object")
    grade.add_argument("--dataset", required=True, help="the dataset rows (JSONL or JSON list)")
    grade.add_argument("--protocol", default="swebench", help="grading protocol (default swebench)")
    grade.add_argument("--backend", default="local", choices=BACKENDS)
    grade.add_argument("--run-id", default="trio_swe", help="run id of the harness's outputs")
    grade.add_argument("--out-dir", default=".", help="where the harness's outputs go")
    grade.add_argument("--timeout", type=float, default=1800.0, help="seconds per test run")
    grade.add_argument("--concurrency", type=int, default=4)
    grade.add_argument(
        "--python-env",
        default=None,
        help="local backend: bin directory of the test environment (default: this Python's)",
    )
    grade.add_argument(
        "--checkouts",
        default=None,
        help="local backend: directory of clones named <owner>__<name>; rows boot "
        "<dir>/<owner>__<name>@<base_commit>",
    )

    demo = sub.add_parser(
        "demo",
        help="run the bundled demo end to end (no network needed)",
        description="Build the demo repositories, start the scripted policy server on loopback "
        "and run the demo episodes with the bash agent on the local backend. Exits 0 when "
        "every episode earned the reward its script plays for.",
    )
    demo.add_argument(
        "--concurrency", type=int, default=4, help="episodes running at once (default: 4)"
    )
    demo.add_argument(
        "--agent",
        default="bash",
        help="bash (the built-in agent) or a CLI agent through the recording gateway: "
        "claude-code, codex, qwen-code, opencode, mini-swe-agent (needs --tokenizer)",
    )
    demo.add_argument(
        "--agent-budget",
        type=float,
        default=None,
        help="seconds per agent run (default: 5 for bash, 90 for a CLI agent)",
    )
    demo.add_argument(
        "--max-context-tokens",
        type=int,
        default=16384,
        help="cap of a sample's tokens (default: 16384)",
    )
    demo.add_argument("--out", default=None, help="also write the results here")
    demo.add_argument("--keep", action="store_true", help="keep the demo repositories")
    demo.add_argument("--no-progress", action="store_true", help="no live display")
    demo.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="a checkpoint folder: speak its chat template and tool calls (needs trio-swe[hf])",
    )
    demo.add_argument(
        "--tool-parser", default="auto", help="tool-call format with --tokenizer (default: auto)"
    )

    results = sub.add_parser(
        "results",
        help="show or export a results file",
        description="Show a results file written by `trio-swe run` (a summary table), or export "
        "it as JSON Lines (one EpisodeResult per line) or as SWE-bench's predictions.jsonl "
        "(instance_id, model_name_or_path, model_patch; the last finished episode of each "
        "instance, aborted ones left out).",
    )
    results.add_argument("file", help="a results file (results.msgpack)")
    results.add_argument(
        "--format",
        choices=("table", "jsonl", "predictions"),
        default="table",
        help="what to print (default: table)",
    )
    results.add_argument(
        "--model", default="trio-swe", help="model_name_or_path of predictions (default: trio-swe)"
    )
    results.add_argument(
        "--samples", action="store_true", help="jsonl: include each result's samples"
    )
    results.add_argument("--all", action="store_true", help="table: list every episode")
    results.add_argument(
        "-o", "--output", default=None, help="write the export here (default: standard output)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trio-swe`` console script."""
    args = _parser().parse_args(argv)
    # A pipe or a file gets a wide, plain console (no cursor tricks, no wrapped ids).
    console = Console() if sys.stdout.isatty() else Console(width=140, no_color=True)
    if args.command == "results":
        try:
            return _cmd_results(args, console)
        except TrioSweError as exc:
            console.print(f"[red]error: {escape(str(exc))}")
            return 2
    if getattr(args, "concurrency", 1) < 1:
        console.print("[red]--concurrency must be >= 1")
        return 2
    command = {"run": _cmd_run, "grade": _cmd_grade}.get(args.command, _cmd_demo)
    try:
        code = trio.run(_interruptible, command, args, console)
    except BaseException as exc:
        if _only(exc, KeyboardInterrupt) is not None:  # a Ctrl-C before the receiver was open
            code = 128 + signal.SIGINT
        else:
            error = _only(exc, TrioSweError)
            if error is not None:
                console.print(f"[red]error: {escape(str(error))}")  # `[swebench]` is not markup
                return 2
            raise
    if code in _SIGNALLED:
        console.print(
            "[yellow]interrupted: every finished episode is in the results file; "
            "rerun the same command to resume"
        )
    return code


#: Exit codes of a run stopped by a signal, as a shell reports them (128 + the signal).
_SIGNALLED = {128 + signal.SIGINT, 128 + signal.SIGTERM}


async def _interruptible(
    command: Callable[[argparse.Namespace, Console], Any],
    args: argparse.Namespace,
    console: Console,
) -> int:
    """Run ``command`` with Ctrl-C and SIGTERM turned into a cancellation of it (exit 130, 143).

    Left to itself, trio raises KeyboardInterrupt wherever the code happens to be, possibly
    halfway through a lock or a TLS stream's state; the cleanup that follows then meets that
    broken state (a sandbox kill that never goes out, a shielded close waiting out its bound).
    A cancellation instead runs every cleanup as any other does. A second signal exits at once.
    """
    received: list[int] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    if received:
                        console.print("[red]interrupted again: exiting without cleanup")
                        sys.stdout.flush()
                        os._exit(128 + signum)
                    received.append(signum)
                    console.print("[yellow]interrupted: cleaning up (Ctrl-C again to skip)")
                    nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            code: int = await command(args, console)
            nursery.cancel_scope.cancel()
    return 128 + received[0] if received else code


def _only(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` if it is a ``kind``, or the first ``kind`` of a group made only of them."""
    members = leaves(exc)
    return members[0] if all(isinstance(m, kind) for m in members) else None


if __name__ == "__main__":
    sys.exit(main())
