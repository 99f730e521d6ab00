"""``trio-swe``'s argument parser: every command's flags, their help and defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from .. import __version__
from ..config import BACKENDS, SweConfig
from .report import add_report_parser

__all__ = ["build_parser"]

_EXAMPLES = """\
examples:
  trio-swe demo                                   the bundled demo: 8 episodes, no network
  trio-swe run rows.jsonl --policy-url http://127.0.0.1:30000 --concurrency 8
  SWE_BACKEND=e2b E2B_API_KEY=... trio-swe run rows.jsonl --out results.msgpack
  trio-swe run rows.jsonl --protocol swebench --limit 10
  trio-swe results results.msgpack                a summary of a results file
  trio-swe report results.msgpack -o report.html  an HTML page of plots and trajectories
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


def _number(kind: type[float], minimum: float, what: str) -> Callable[[str], float]:
    """An argparse type: a ``kind`` of at least ``minimum`` (``what`` says which)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < minimum or value != value:  # NaN too
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    return parse


#: ``--limit``, ``--concurrency``: whole numbers from 1.
_COUNT = _number(int, 1, "a whole number >= 1")
#: Seconds of a bound: more than zero.
_SECONDS = _number(float, 1e-9, "a number of seconds > 0")


def build_parser() -> argparse.ArgumentParser:
    """The ``trio-swe`` parser: every command's flags, with where each default comes from."""
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
    run.add_argument(
        "instances",
        help="the dataset: a JSONL file (one row per line), a JSON list, a Parquet file, or a "
        "folder saved by Hugging Face datasets (save_to_disk) or of <split>-*.parquet files",
    )
    run.add_argument(
        "--split", default=None, help="the split of a dataset folder that has several (e.g. test)"
    )
    run.add_argument(
        "--instance-ids",
        default=None,
        metavar="IDS",
        help="only these instances: a comma-separated list, or a file of ids (one per line)",
    )
    run.add_argument(
        "--filter",
        default=None,
        metavar="REGEX",
        help="only the instances whose id matches REGEX (re.search, e.g. '^django__')",
    )
    run.add_argument(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="shuffle the rows with this seed (before --slice: a reproducible sample)",
    )
    run.add_argument(
        "--slice",
        default=None,
        metavar="A:B",
        help="rows A to B of the selection, as Python slices them (0:100, :50, -10:)",
    )
    run.add_argument(
        "--backend",
        default=None,
        help="where sandboxes run: local, e2b, docker, or a registered backend "
        f"({_from_env_help('SWE_BACKEND', defaults.backend)}); e2b reads E2B_API_KEY, "
        "E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN and SSL_CERT_FILE; docker reads DOCKER_HOST "
        "and SWE_DOCKER_BASE_IMAGE (the image host-path rows, dir or path@commit, are copied "
        "into)",
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
        help="agents running at once; as many more episodes boot or grade beside them (with "
        "--ray: episodes per worker, each holding its slot throughout); boots are further "
        "limited by SWE_BOOT_CONCURRENCY (default: 4)",
    )
    run.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the episodes on a Ray cluster: its address, or auto (needs trio-swe[ray]); "
        "connecting gives up after $SWE_RAY_CONNECT_TIMEOUT_SEC (default: 60)",
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
    _add_policy_flags(run, defaults)
    run.add_argument(
        "--max-context-tokens",
        type=int,
        default=None,
        help="cap of a sample's tokens, 0 for none "
        f"({_from_env_help('SWE_MAX_CONTEXT_TOKENS', defaults.episode.max_context_tokens)})",
    )
    run.add_argument(
        "--limit", type=_COUNT, default=None, help="run at most this many episodes (>= 1)"
    )
    run.add_argument(
        "--n-per-instance",
        type=_COUNT,
        default=1,
        help="episodes per instance, a GRPO group each, each with its own sandbox and seed "
        "(default: 1)",
    )
    run.add_argument("--no-network", action="store_true", help="agent sandboxes get no network")
    run.add_argument("--no-progress", action="store_true", help="no live display")
    run.add_argument(
        "--progress-every",
        type=_number(float, 0, "a number of seconds >= 0"),
        default=30.0,
        metavar="SEC",
        help="without a live display (output not a terminal, or --no-progress): print the "
        "run's figures on one line every SEC seconds, 0 for never (default: 30)",
    )
    run.add_argument(
        "--trajectories",
        metavar="DIR",
        default=None,
        help="also write one JSON per episode here (<episode id>.traj.json: its turns' text, "
        "tool calls, observations, mask and log-probs, reward, status, timings)",
    )
    run.add_argument(
        "--harness-dir",
        default=None,
        help="also write SWE-bench's harness outputs here (predictions.jsonl, report, logs)",
    )
    run.add_argument(
        "--run-id",
        default=None,
        help="with --harness-dir: run id of its outputs (default: trio_swe)",
    )
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
        description="Grade existing predictions (swebench's predictions.jsonl, a JSON list or a "
        "JSON object keyed by instance id) against the dataset's rows, each in a fresh sandbox, "
        "and write what swebench.harness.run_evaluation writes: predictions.jsonl, a log "
        "folder per instance and the report <model>.<run-id>.json. Exits 0 when something was "
        "graded, 1 when every prediction ended in an error, 2 on bad input.",
    )
    grade.add_argument("predictions", help="predictions: JSONL, a JSON list or a JSON object")
    grade.add_argument("--dataset", required=True, help="the dataset rows (JSONL or JSON list)")
    grade.add_argument("--protocol", default="swebench", help="grading protocol (default swebench)")
    grade.add_argument("--backend", default="local", choices=BACKENDS)
    grade.add_argument("--run-id", default="trio_swe", help="run id of the harness's outputs")
    grade.add_argument("--out-dir", default=".", help="where the harness's outputs go")
    grade.add_argument(
        "--timeout", type=_SECONDS, default=1800.0, help="seconds per test run (default: 1800)"
    )
    grade.add_argument(
        "--concurrency", type=int, default=4, help="gradings running at once (default: 4)"
    )
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
        "--concurrency",
        type=int,
        default=4,
        help="agents running at once; as many more episodes boot or grade beside them (default: 4)",
    )
    demo.add_argument(
        "--agent",
        default="bash",
        help="bash (the built-in agent) or a CLI agent through the recording gateway: "
        "claude-code, codex, qwen-code, opencode, mini-swe-agent (needs --tokenizer)",
    )
    demo.add_argument(
        "--agent-budget",
        type=_SECONDS,
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
        "--progress-every",
        type=_number(float, 0, "a number of seconds >= 0"),
        default=30.0,
        metavar="SEC",
        help="without a live display: the figures on one line every SEC seconds (default: 30)",
    )
    demo.add_argument(
        "--tokenizer",
        default=None,
        metavar="PATH",
        help="a checkpoint folder: speak its chat template and tool calls (needs trio-swe[hf])",
    )
    demo.add_argument(
        "--tool-parser", default=None, help="tool-call format with --tokenizer (default: auto)"
    )
    demo.add_argument(
        "--policy-url",
        default=None,
        metavar="URL",
        help="run the demo against this engine instead of the scripted policy (needs "
        "--tokenizer: the engine's checkpoint); the demo then reports, and exits by, what it "
        "recorded (0 when no episode aborted), not the scripts' rewards",
    )
    _add_policy_flags(demo, defaults)

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
        "--model",
        default=None,
        help="predictions: their model_name_or_path (default: trio-swe)",
    )
    results.add_argument(
        "--samples", action="store_true", help="jsonl: include each result's samples"
    )
    results.add_argument("--all", action="store_true", help="table: list every episode")
    results.add_argument(
        "-o",
        "--output",
        default=None,
        help="jsonl, predictions: write the export here, as Parquet if it ends in .parquet "
        "(needs pyarrow: trio-swe[parquet]) (default: standard output)",
    )
    add_report_parser(sub)
    return parser


def _add_policy_flags(parser: argparse.ArgumentParser, defaults: SweConfig) -> None:
    """The policy server's API and the sampling options, on ``run`` and ``demo`` alike."""
    from ..policy import POLICY_APIS

    policy = defaults.policy
    parser.add_argument(
        "--policy-api",
        choices=POLICY_APIS,
        default=None,
        help="the policy server's API: sglang (/generate), vllm (/inference/v1/generate, "
        "vLLM --enable-scale-out), vllm-completions (/v1/completions with prompt ids) "
        f"({_from_env_help('SWE_POLICY_API', policy.api)})",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature; at T != 1 the recorded log-probs are the tempered "
        "distribution's only where the engine reports processed log-probs (vLLM "
        f"--logprobs-mode processed_logprobs) ({_from_env_help('SWE_TEMPERATURE', policy.temperature)})",
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help=f"nucleus sampling's p ({_from_env_help('SWE_TOP_P', policy.top_p)})",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="cap of one turn's sampled tokens, 0 for the agent's own "
        f"({_from_env_help('SWE_MAX_NEW_TOKENS', policy.max_new_tokens)})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the run's base seed: each episode and turn derives its own "
        "(default: $SWE_SEED, else the engine's own randomness)",
    )
