"""What the commands print: the live tally's line and the summary tables (rich)."""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..episode import EpisodeResult, PhaseTimings
from ..grading import InstanceMetadata

__all__ = [
    "SUMMARY_ROWS",
    "Tally",
    "abort_table",
    "aggregate_table",
    "print_summary",
    "summary_table",
]

#: Per-episode rows shown in the summary; larger runs get the aggregate table only.
SUMMARY_ROWS = 40


class Tally:
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


def aggregate_table(results: Sequence[EpisodeResult]) -> Table:
    """One row per status (aborted ones per reason): episodes, resolved, means, samples."""
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


def summary_table(
    results: Sequence[EpisodeResult], expected: Mapping[str, float] | None = None
) -> Table:
    """One row per episode; with ``expected`` (the demo), the reward each script plays for."""
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


#: Distinct messages shown per abort reason (the most frequent first), and their length.
ABORT_MESSAGES = 3
MESSAGE_CHARS = 200


def abort_table(results: Sequence[EpisodeResult]) -> Table | None:
    """Why episodes aborted: each reason with its most frequent messages (``error``), so the
    summary says what a results file's JSONL would; None when nothing aborted."""
    by_reason: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        if r.status == "aborted":
            message = " ".join((r.error or "(no message)").split())
            by_reason[r.abort_reason or "unknown"][message] += 1
    if not by_reason:
        return None
    table = Table(title="why episodes aborted")
    table.add_column("reason")
    table.add_column("episodes", justify="right")
    table.add_column("message", overflow="fold")
    for reason in sorted(by_reason, key=lambda k: (-sum(by_reason[k].values()), k)):
        messages = by_reason[reason]
        shown = messages.most_common(ABORT_MESSAGES)
        for i, (message, n) in enumerate(shown):
            text = (
                message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 3] + "..."
            )
            table.add_row(
                reason if i == 0 else "",
                str(sum(messages.values())) if i == 0 else "",
                f"({n}) {escape(text)}" if len(messages) > 1 else escape(text),
            )
        if len(messages) > ABORT_MESSAGES:
            rest = len(messages) - ABORT_MESSAGES
            table.add_row("", "", f"... and {rest} other message(s)")
    return table


def print_summary(
    console: Console, results: Sequence[EpisodeResult], *, every: bool = False
) -> None:
    """The episodes (up to :data:`SUMMARY_ROWS`, or ``every`` one), the summary by status and
    why episodes aborted."""
    if len(results) <= SUMMARY_ROWS or every:
        console.print(summary_table(results))
    console.print(aggregate_table(results))
    aborts = abort_table(results)
    if aborts is not None:
        console.print(aborts)
