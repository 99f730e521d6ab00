"""``trio-swe run INSTANCES.jsonl``: one episode per row, results appended and resumable.

Each result (with its samples) is written the moment it finishes; a rerun with the same
``--out`` skips the instances already finished and retries the aborted ones. ``--ray ADDRESS``
runs the episodes on a Ray cluster's workers (:mod:`._ray`); ``--harness-dir DIR`` also writes
SWE-bench's harness outputs (see ``docs/grading.md``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from .._close import aclose_quietly
from .._errors import BackendUnavailableError, ConfigError, MetadataError
from ..agents import check_agent, create_agent
from ..config import SweConfig, replace_option
from ..datasets import Row, Selection, parse_slice, read_instance_ids, read_rows, select_rows
from ..episode import EpisodeResult
from ..grading import (
    HarnessOutputs,
    InstanceMetadata,
    evaluability_check,
    get_metadata,
    local_backend_shims,
    local_checkouts,
)
from ..results import ResultsWriter, harness_record, read_results
from ..rollout import plan_groups
from ..sandbox import Backend, open_backend
from ..sandbox.docker import DockerBackend
from ..trajectories import TrajectoryWriter, load_turn_text
from ._progress import run_with_progress
from ._ray import run_on_ray
from ._render import print_summary

__all__ = ["cmd_run", "config_from_args", "exit_code", "local_options"]


def dataset_rows(args: argparse.Namespace) -> list[Row]:
    """The rows ``run`` was asked for: read (``--split``), then selected (``--instance-ids``,
    ``--filter``, ``--shuffle``, ``--slice``).

    Raises:
        ConfigError: the dataset is empty, or the selection leaves nothing.
    """
    rows = read_rows(args.instances, split=args.split)
    if not rows:
        raise ConfigError(f"instances file {args.instances!r} has no rows")
    start, stop = parse_slice(args.slice) if args.slice else (None, None)
    selection = Selection(
        instance_ids=read_instance_ids(args.instance_ids) if args.instance_ids else (),
        pattern=args.filter,
        shuffle_seed=args.shuffle,
        start=start,
        stop=stop,
    )
    if selection == Selection():
        return rows
    chosen = select_rows(rows, selection)
    if not chosen:
        raise ConfigError(
            f"the selection leaves none of the {len(rows)} rows of {args.instances!r}"
        )
    return chosen


#: ``trio-swe run``'s flags that set an option: flag -> (argparse dest, option paths).
RUN_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "--backend": ("backend", ("backend",)),
    "--agent": ("agent", ("agent",)),
    "--protocol": ("protocol", ("train_protocol", "eval_protocol")),
    "--policy-url": ("policy_url", ("bash.policy_url",)),
    "--agent-budget": ("agent_budget", ("episode.agent_time_budget_sec",)),
    "--eval-timeout": ("eval_timeout", ("episode.eval_timeout_sec",)),
    "--max-context-tokens": ("max_context_tokens", ("episode.max_context_tokens",)),
    "--policy-api": ("policy_api", ("policy.api",)),
    "--temperature": ("temperature", ("policy.temperature",)),
    "--top-p": ("top_p", ("policy.top_p",)),
    "--max-new-tokens": ("max_new_tokens", ("policy.max_new_tokens",)),
    "--seed": ("seed", ("policy.seed",)),
}


#: Flags whose value must be positive, and what they are (the option's own check would name
#: the option's field, not the flag).
POSITIVE_FLAGS: dict[str, tuple[float, str]] = {
    "--agent-budget": (1e-9, "a number of seconds > 0"),
    "--eval-timeout": (1e-9, "a number of seconds > 0"),
    "--max-context-tokens": (0, "a whole number >= 0 (0 for no cap)"),
}


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> SweConfig:
    """The environment's configuration, with the flags given applied on top (each checked)."""
    config = SweConfig.from_env(environ, check_protocols=False)  # SWE_BACKEND is checked first
    for flag, (dest, paths) in RUN_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        low, what = POSITIVE_FLAGS.get(flag, (None, ""))
        if low is not None and not value >= low:
            raise ConfigError(f"{flag} {value!r}: must be {what}")
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


def check_run_flags(args: argparse.Namespace, config: SweConfig) -> None:
    """Refuse flags that would do nothing in this combination (a silent no-op misleads)."""
    if args.ray is None:
        given = [
            flag
            for flag, value in (
                ("--ray-workers", args.ray_workers),
                ("--max-alive", args.max_alive),
                ("--max-booting", args.max_booting),
            )
            if value
        ]
        if given:
            raise ConfigError(f"{', '.join(given)}: only used with --ray ADDRESS")
    if args.run_id is not None and not args.harness_dir:
        raise ConfigError("--run-id names the outputs of --harness-dir: give that too")
    if args.checkouts and config.train_protocol != "swebench":
        # local_checkouts maps SWE-bench rows (repo, base_commit); other rows keep their image.
        raise ConfigError(
            f"--checkouts maps SWE-bench rows (repo@base_commit) to clones: it needs "
            f"--protocol swebench (protocol is {config.train_protocol!r})"
        )


def check_docker_images(mds: Sequence[InstanceMetadata], config: SweConfig) -> None:
    """Host-path images (a folder, ``path@commit``) on Docker need SWE_DOCKER_BASE_IMAGE."""
    if config.backend != "docker" or os.environ.get("SWE_DOCKER_BASE_IMAGE"):
        return
    hosted = [md for md in mds if md.image.startswith(("/", "./", "../"))]
    if hosted:
        raise ConfigError(
            f"{len(hosted)} row(s) boot a host path (e.g. {hosted[0].image!r}), which the docker "
            "backend copies into a container of SWE_DOCKER_BASE_IMAGE: set it to an image with "
            "the tools the rows need (e.g. python:3.12)"
        )


async def check_backend(backend: Backend) -> None:
    """Reach the backend once before any episode, so an unreachable daemon is one error here
    rather than a ``boot_failed`` in every episode."""
    if isinstance(backend, DockerBackend):
        try:
            await backend.engine()
        except BackendUnavailableError as exc:
            raise ConfigError(
                f"--backend docker: the Docker daemon cannot be reached ({exc}); start it, or "
                "point DOCKER_HOST at it"
            ) from None


async def cmd_run(args: argparse.Namespace, console: Console) -> int:
    config = config_from_args(args)
    check_run_flags(args, config)
    protocol = config.train_protocol
    rows = dataset_rows(args)  # before the results file is touched
    # Resume: episodes already finished (not aborted) are skipped: each is a member of a group
    # (the instance's n per instance; a dataset that repeats an instance has a group per
    # occurrence: rollout.plan_groups). So are the instances the protocol found it can never
    # grade (``unevaluable``) and still cannot.
    previous, _ = read_results(args.out)
    finished = {(r.group, r.group_index) for r in previous if r.status != "aborted"}
    unevaluable = {r.instance_id for r in previous if r.abort_reason == "unevaluable"}
    skipped = sum(1 for r in previous if r.status != "aborted")
    mds: list[InstanceMetadata] = []
    unreadable = 0
    never: collections.Counter[str] = collections.Counter()
    for row in rows:
        try:
            md = get_metadata(row.data, protocol)
        except MetadataError as exc:
            unreadable += 1
            console.print(f"[yellow]skipping {row.where}: {escape(str(exc))}")
            continue
        if md.instance_id in unevaluable:
            reason = evaluability_check(md)
            if reason is not None:
                never[reason] += 1
                continue
        mds.append(md)
    if unreadable == len(rows):
        raise ConfigError(
            f"every row of {args.instances!r} ({len(rows)}) was skipped as unreadable for "
            f"protocol {protocol!r}: see the lines above"
        )
    for reason, n in sorted(never.items()):
        console.print(f"[yellow]{n} row(s) cannot be graded ({reason}): not run again")
    # Before anything boots: can this install grade these rows (e.g. the swebench version)?
    config.check_rows([row.data for row in rows])
    check_docker_images(mds, config)
    members = list(plan_groups(mds, args.n_per_instance, done=finished))
    if args.limit is not None:
        members = members[: args.limit]
    mds = list({id(m.md): m.md for m in members}.values())
    check_docker_images(mds, config)
    if not members:
        console.print(
            f"nothing to run: {skipped} episode(s) already finished in {args.out}"
            + (f", {sum(never.values())} row(s) that cannot be graded" if never else "")
        )
        return 0
    if args.ray is None:
        console.print(
            f"{len(members)} episodes to run ({skipped} already finished in {args.out}, "
            f"{unreadable} unreadable rows), protocol {protocol}, agent {config.agent}, "
            f"concurrency {args.concurrency}, backend {config.backend}"
        )
    if args.ray is not None and getattr(args, "trajectories", None):
        raise ConfigError("--trajectories is not supported with --ray (yet)")
    trajectories = _trajectory_writer(args, config)
    with ResultsWriter(args.out) as writer:
        # An aborted episode that runs again replaces its aborted frames (no duplicates).
        rerun = {(m.group_id, m.group_index) for m in members}
        writer.keep_only(lambda r: r.status != "aborted" or (r.group, r.group_index) not in rerun)
        if args.ray is not None:
            results = await run_on_ray(args, console, config, members, writer, skipped, unreadable)
            return exit_code(console, results)
        agent = create_agent(config)
        outputs = (
            HarnessOutputs(args.harness_dir, args.run_id or "trio_swe", f"trio_swe__{config.agent}")
            if args.harness_dir
            else None
        )
        try:
            async with open_backend(config.backend, local_options(args, config)) as backend:
                await check_backend(backend)
                results = await run_with_progress(
                    console,
                    members,
                    agent,
                    backend=backend,
                    config=config,
                    concurrency=args.concurrency,
                    writer=writer,
                    network=not args.no_network,
                    show_progress=not args.no_progress,
                    every=args.progress_every,
                    # The harness's files and the trajectories are written from each result
                    # as it arrives.
                    on_result=_each_result(
                        functools.partial(harness_record, outputs) if outputs else None,
                        trajectories,
                    ),
                    keep_eval_artifacts=outputs is not None,
                )
        finally:
            await aclose_quietly([agent], timeout_sec=10.0)
    print_summary(console, results)
    console.print(f"results: {args.out} ({writer.written} new, {skipped} from before)")
    if outputs is not None:
        outputs.write_report(md.instance_id for md in mds)
        console.print(f"harness outputs: {escape(str(outputs.report_path()))}")
    return exit_code(console, results)


def _trajectory_writer(args: argparse.Namespace, config: SweConfig) -> TrajectoryWriter | None:
    """``--trajectories DIR``: one JSON per episode, decoded with the run's tokenizer (the
    checkpoint of ``SWE_TOKENIZER``, else the byte tokenizer of the text dialect)."""
    if not getattr(args, "trajectories", None):
        return None
    text = load_turn_text(config.bash.tokenizer or "bytes", tool_parser=config.bash.tool_parser)
    return TrajectoryWriter(args.trajectories, text)


def _each_result(
    *hooks: Callable[[EpisodeResult], object] | None,
) -> Callable[[EpisodeResult], None] | None:
    """One ``on_result`` calling each hook given, in order (None when there are none)."""
    given = [h for h in hooks if h is not None]
    if not given:
        return None

    def each(result: EpisodeResult) -> None:
        for hook in given:
            hook(result)

    return each


def local_options(args: argparse.Namespace, config: SweConfig) -> dict[str, Any] | None:
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
    options: dict[str, Any] = {}
    if args.python_env or config.train_protocol == "swebench":
        options.update(local_backend_shims(args.python_env))
    if args.checkouts:
        options["images"] = local_checkouts(args.checkouts)
    return options or None


def exit_code(console: Console, results: Sequence[EpisodeResult]) -> int:
    """0, or 1 when every episode of the run was aborted (nothing was graded)."""
    if results and all(r.status == "aborted" for r in results):
        console.print(
            f"[red]every episode of this run was aborted ({len(results)}): "
            "see the abort reasons above"
        )
        return 1
    return 0
