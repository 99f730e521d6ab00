"""``trio-swe run --ray ADDRESS``: the same run, its episodes on a Ray cluster's workers."""

from __future__ import annotations

import argparse
import os
from functools import partial

import trio
from rich.console import Console

from .._errors import ConfigError
from ..config import SweConfig
from ..episode import EpisodeResult
from ..grading import InstanceMetadata
from ..results import ResultsWriter
from ._progress import run_with_progress
from ._render import print_summary

__all__ = ["run_on_ray"]


#: How long ``ray.init`` may look for the cluster (``SWE_RAY_CONNECT_TIMEOUT_SEC``): its own
#: search of an address nobody answers at has no end the CLI can see (a log line every 5 s).
RAY_CONNECT_TIMEOUT_SEC = 60.0


def _connect_timeout() -> float:
    raw = os.environ.get("SWE_RAY_CONNECT_TIMEOUT_SEC", "").strip()
    try:
        value = float(raw) if raw else RAY_CONNECT_TIMEOUT_SEC
    except ValueError:
        raise ConfigError(f"SWE_RAY_CONNECT_TIMEOUT_SEC={raw!r}: not a number") from None
    if not value > 0:
        raise ConfigError(f"SWE_RAY_CONNECT_TIMEOUT_SEC={raw!r}: must be > 0")
    return value


async def connect_ray(address: str, console: Console) -> None:
    """``ray.init`` in a thread, bounded and cancellable (Ctrl-C, SIGTERM); one-line errors."""
    import ray

    bound = _connect_timeout()
    init = partial(ray.init, address=address, namespace="trio_swe", log_to_driver=False)
    console.print(f"connecting to the Ray cluster at {address} ...")
    try:
        with trio.fail_after(bound):
            # Abandoned on cancellation: the process is on its way out then.
            await trio.to_thread.run_sync(init, abandon_on_cancel=True)
    except trio.TooSlowError:
        raise ConfigError(
            f"--ray {address}: no Ray cluster answered within {bound:g} s "
            "(SWE_RAY_CONNECT_TIMEOUT_SEC)"
        ) from None
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--ray {address}: {first}") from None


async def run_on_ray(
    args: argparse.Namespace,
    console: Console,
    config: SweConfig,
    mds: list[InstanceMetadata],
    writer: ResultsWriter,
    skipped: int,
    unreadable: int,
) -> list[EpisodeResult]:
    """Run ``mds`` on the cluster at ``args.ray``, print the summary; the results."""
    if getattr(args, "harness_dir", None):
        raise ConfigError("--harness-dir is not supported with --ray (grading runs on the workers)")
    if getattr(args, "python_env", None) or getattr(args, "checkouts", None):
        raise ConfigError("--python-env and --checkouts are not supported with --ray")
    try:
        import ray

        from ..ray import WorkerPool
    except ImportError as exc:
        raise ConfigError(f"--ray needs Ray: pip install 'trio-swe[ray]' ({exc})") from None
    if not ray.is_initialized():
        await connect_ray(args.ray, console)
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
        results = await run_with_progress(
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
    print_summary(console, results)
    if stats.deaths:
        console.print(
            f"{stats.deaths} worker(s) died; {stats.reruns} episode(s) ran again elsewhere"
        )
    console.print(f"results: {args.out} ({writer.written} new, {skipped} from before)")
    return results
