"""The report of real runs, opened in headless Chromium: the plots render, the page asks the
network for nothing, no console error, and an episode's drill-down shows its turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from trio_swe.results import read_results

from ..test_episode_support import processes_mentioning
from ._chromium import CHROMIUM, open_chromium
from .runs import TRIO_SWE, env, make_results

pytest.importorskip("plotly")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/bootstrap)"),
    pytest.mark.slow,
]

FIGURES = ("reward-instance", "reward-group", "turns-tokens", "phases", "outcomes-time")


def _until(condition: str, timeout_ms: int = 20000) -> str:
    """A page expression: a promise of ``condition``'s value once it is truthy."""
    return f"""new Promise((resolve, reject) => {{
      const t0 = Date.now();
      (function poll() {{
        let v; try {{ v = ({condition}); }} catch (e) {{ v = null; }}
        if (v) resolve(v);
        else if (Date.now() - t0 > {timeout_ms}) reject(new Error("timed out: " + {json.dumps(condition)}));
        else setTimeout(poll, 25);
      }})();
    }})"""


async def test_report_renders_in_chromium(tmp_path: Path) -> None:
    results_path = await make_results(tmp_path)
    results, _ = read_results(results_path)
    report = tmp_path / "report.html"
    done = await trio.run_process(
        [TRIO_SWE, "report", str(results_path), "-o", str(report), "--tokenizer", "bytes"],
        env=env(tmp_path),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    page = report.read_text()
    assert "<script src=" not in page  # everything inlined

    graded = [r for r in results if r.status != "aborted"]
    opened = next(r for r in graded if r.instance_id == "demo__calc-1")
    aborted = next(r for r in results if r.abort_reason == "policy_error")

    async with open_chromium(tmp_path / "profile", "--window-size=1400,2000") as browser:
        session = await browser.open_page()
        await browser.send("Page.navigate", {"url": report.as_uri()}, session=session)
        await browser.wait_event("Page.loadEventFired", session=session)

        # Every figure rendered: plotly.js marks its div and draws its SVG into it.
        selector = " && ".join(
            f"!!document.querySelector('#{f}.js-plotly-plot .main-svg')" for f in FIGURES
        )
        assert await browser.evaluate(_until(selector), session=session) is True
        assert await browser.evaluate(
            "document.querySelectorAll('.js-plotly-plot').length", session=session
        ) == len(FIGURES)
        # The reward-by-group strip holds one point per graded episode, in its group (the
        # run's group ids: each row of the dataset is a group of its own).
        points = await browser.evaluate(
            "document.querySelectorAll('#reward-group .point').length", session=session
        )
        assert points == len(graded) == 16
        groups = await browser.evaluate(
            "new Set(document.getElementById('reward-group').data[0].x).size", session=session
        )
        assert groups == len({r.group for r in graded}) == 16
        # Outcomes over time name each abort reason.
        names = await browser.evaluate(
            "document.getElementById('outcomes-time').data.map(t => t.name)", session=session
        )
        assert set(names) == {
            "completed",
            "truncated",
            "aborted: policy_error",
            "aborted: unevaluable",
        }
        rows = await browser.evaluate(
            "document.querySelectorAll('#episodes tbody tr').length", session=session
        )
        assert rows == len(results) == 20

        # Drill into one episode from the table: its turns, tool calls and log-prob chart.
        await browser.evaluate(
            f"document.querySelector('#episodes tr[data-episode={json.dumps(opened.episode_id)}]')"
            ".click()",
            session=session,
        )
        n_assistant = await browser.evaluate(
            _until("document.querySelectorAll('#messages .msg.assistant').length"),
            session=session,
        )
        assert n_assistant == opened.n_turns == 4
        drill = await browser.evaluate(
            "document.getElementById('drill').innerText", session=session
        )
        assert f"Trajectory of {opened.episode_id}" in drill
        assert "tool call bash" in drill
        assert "```bash" in drill  # the decoded output, as sampled
        assert "exit code 0" in drill  # a tool's output (an observation)
        assert "trained (mask 1), mean log-prob" in drill
        assert await browser.evaluate(
            _until("!!document.querySelector('#episode-logprobs.js-plotly-plot .main-svg')"),
            session=session,
        )
        # The token table (ids, mask, log-prob) opens on demand.
        cells = await browser.evaluate(
            "(() => { const d = document.querySelector('#messages .msg.assistant details');"
            " d.open = true; return new Promise(r => setTimeout(() =>"
            " r(d.querySelectorAll('tr').length), 50)); })()",
            session=session,
        )
        assert cells > 1

        # A point of a figure opens its episode too (plotly's click event, as a click emits it).
        other = next(r for r in graded if r.instance_id == "demo__words-1")
        await browser.evaluate(
            "document.getElementById('reward-group').emit('plotly_click', "
            f"{{points: [{{customdata: {json.dumps(other.episode_id)}}}]}})",
            session=session,
        )
        title = await browser.evaluate(
            _until(
                "document.getElementById('drill-title').textContent.includes("
                f"{json.dumps(other.episode_id)}) && "
                "document.getElementById('drill-title').textContent"
            ),
            session=session,
        )
        assert title == f"Trajectory of {other.episode_id}"

        # An aborted episode's drill-down says why.
        await browser.evaluate(
            f"location.hash = 'episode=' + encodeURIComponent({json.dumps(aborted.episode_id)})",
            session=session,
        )
        text = await browser.evaluate(
            _until(
                "document.getElementById('no-messages') && "
                "document.getElementById('drill').innerText"
            ),
            session=session,
        )
        assert "ConnectError: all attempts to connect to 127.0.0.1:9 failed" in text

        assert browser.console_errors() == []
        assert all(url.startswith(("file:", "data:", "blob:")) for url in browser.requested_urls())
    # The browser is gone: its group was killed; under load its processes take a moment to
    # exit, so poll /proc (another process's end: nothing to wait on), bounded.
    with trio.fail_after(30):
        while processes_mentioning(str(tmp_path / "profile")):  # noqa: ASYNC110
            await trio.sleep(0.05)
