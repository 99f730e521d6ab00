"""The report's data (sans-IO) and page, from results built here."""

from __future__ import annotations

import msgspec
import pytest

from trio_swe import EpisodeResult, PhaseTimings, Sample
from trio_swe.report import render_html, report_data


def _result(i: int, **kw: object) -> EpisodeResult:
    fields: dict[str, object] = {
        "instance_id": f"inst-{i % 2}",
        "episode_id": f"inst-{i % 2}#{i}",
        "protocol": "scaleswe",
        "status": "completed",
        "reward": float(i % 2),
        "timings": PhaseTimings(boot=0.5, agent=2.0, total=3.0),
        "started_at": 1000.0 + 10 * i,
        "samples": [
            Sample.from_lists(tokens=[1, 2, 3, 4], loss_mask=[1, 0], rollout_log_probs=[-1, 0])
        ],
        **kw,
    }
    return EpisodeResult(**fields)  # type: ignore[arg-type]


def test_rows_say_outcome_group_tokens_and_time() -> None:
    results = [
        _result(0),
        _result(1),
        _result(2, status="aborted", abort_reason="boot_failed", error="SandboxBootError: x"),
        _result(3, started_at=None),
    ]
    data = report_data(results, max_trajectories=2)
    assert [r.outcome for r in data.rows] == [
        "completed",
        "completed",
        "aborted: boot_failed",
        "completed",
    ]
    # Without group ids in the results, an instance's episodes are its group.
    assert [r.group for r in data.rows] == ["inst-0", "inst-1", "inst-0", "inst-1"]
    assert [r.tokens for r in data.rows] == [4, 4, 4, 4]
    assert [r.trained_tokens for r in data.rows] == [1, 1, 1, 1]
    # Seconds from the first start to each end; None where the start is unknown.
    assert [r.finished_at for r in data.rows] == [3.0, 13.0, 23.0, None]
    assert data.rows[0].phases["overhead"] == pytest.approx(3.0)
    # The first two carry their trajectories; the rest are counted as left out.
    assert list(data.episodes) == ["inst-0#0", "inst-1#1"]
    assert [r.drill for r in data.rows] == [True, True, False, False]
    assert data.omitted_trajectories == 2
    assert [m["role"] for m in data.episodes["inst-0#0"]["messages"]] == [
        "prompt",
        "assistant",
        "observation",
    ]


def test_the_page_is_self_contained_and_escapes_what_it_embeds() -> None:
    pytest.importorskip("plotly")
    evil = "</script><script>alert(1)</script>"
    page = render_html(report_data([_result(0, error=evil, agent_output=evil)]))
    assert "<script src=" not in page  # plotly.js inlined, no CDN
    assert page.count("</script><script>alert(1)") == 0
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page  # the table's text, escaped
    start = page.index('id="report-episodes">') + len('id="report-episodes">')
    embedded = page[start : page.index("</script>", start)]
    assert msgspec.json.decode(embedded)["inst-0#0"]["agent_output"] == evil


def test_groups_are_the_results_group_ids() -> None:
    results = [_result(i, group_id="g-a" if i < 3 else "g-b", group_index=i % 3) for i in range(4)]
    data = report_data(results)
    assert [(r.group, r.group_index) for r in data.rows] == [
        ("g-a", 0),
        ("g-a", 1),
        ("g-a", 2),
        ("g-b", 0),
    ]
