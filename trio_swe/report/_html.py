"""The report page: plotly figures of a :class:`ReportData`, an episode table, a drill-down.

One self-contained HTML string: plotly.js, the page's own script and the data are inlined, so the
file opens offline (no CDN). Every chart is a plotly figure; the drill-down's per-token log-prob
chart is drawn by plotly.js in the page from the embedded trajectory. Needs the ``report`` extra
(``pip install 'trio-swe[report]'``); plotly is imported when a page is rendered.
"""

from __future__ import annotations

import html
import json
import statistics
from collections import Counter, defaultdict
from typing import Any

import msgspec

from .._errors import ConfigError
from ._data import PHASES, EpisodeRow, ReportData

__all__ = ["render_html"]

_OUTCOME_COLORS = {"completed": "#2ca02c", "truncated": "#ff7f0e"}
_ABORT_PALETTE = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# The figures' element ids (the page's script and the tests find them by these).
FIGURES = ("reward-instance", "reward-group", "turns-tokens", "phases", "outcomes-time")


def _plotly() -> Any:
    try:
        import plotly.graph_objects as go
        import plotly.io
        import plotly.offline
        from plotly.subplots import make_subplots
    except ImportError as exc:
        raise ConfigError(f"the report needs plotly: pip install 'trio-swe[report]' ({exc})")
    return go, plotly.io, plotly.offline, make_subplots


def _colors(rows: list[EpisodeRow]) -> dict[str, str]:
    colors = dict(_OUTCOME_COLORS)
    aborts = sorted({r.outcome for r in rows if r.status == "aborted"})
    for i, outcome in enumerate(aborts):
        colors[outcome] = _ABORT_PALETTE[i % len(_ABORT_PALETTE)]
    return colors


def _outcomes(rows: list[EpisodeRow]) -> list[str]:
    """Outcomes present, completed and truncated first, then the abort reasons."""
    present = {r.outcome for r in rows}
    first = [o for o in ("completed", "truncated") if o in present]
    return first + sorted(present - set(first))


def _layout(title: str, **kw: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "template": "plotly_white",
        "height": 380,
        "margin": {"l": 60, "r": 20, "t": 60, "b": 60},
        **kw,
    }


def _reward_by_instance(go: Any, rows: list[EpisodeRow]) -> Any:
    graded: dict[str, list[float]] = defaultdict(list)
    aborted: Counter[str] = Counter()
    for r in rows:
        if r.status == "aborted":
            aborted[r.instance_id] += 1
        else:
            graded[r.instance_id].append(r.reward)
    ids = sorted({r.instance_id for r in rows}, key=lambda i: (-_mean(graded[i]), i))
    means = [_mean(graded[i]) for i in ids]
    fig = go.Figure(
        go.Bar(
            x=ids,
            y=means,
            error_y={"type": "data", "array": [_std(graded[i]) for i in ids], "visible": True},
            customdata=[[len(graded[i]), aborted[i]] for i in ids],
            hovertemplate=(
                "%{x}<br>mean reward %{y:.3f}<br>%{customdata[0]} graded, "
                "%{customdata[1]} aborted<extra></extra>"
            ),
            marker_color="#1f77b4",
        )
    )
    fig.update_layout(
        _layout(
            "Mean reward by instance (graded episodes; bars: std)",
            yaxis={"title": "reward", "rangemode": "tozero"},
            xaxis={"title": "instance", "type": "category"},
        )
    )
    return fig


def _reward_by_group(go: Any, rows: list[EpisodeRow]) -> Any:
    graded = [r for r in rows if r.status != "aborted"]
    by_group: dict[str, list[float]] = defaultdict(list)
    for r in graded:
        by_group[r.group].append(r.reward)
    spread = sum(1 for v in by_group.values() if len(set(v)) > 1)
    fig = go.Figure(
        go.Box(
            x=[r.group for r in graded],
            y=[r.reward for r in graded],
            boxpoints="all",
            jitter=0.5,
            pointpos=0,
            customdata=[r.episode_id for r in graded],
            hovertemplate="%{customdata}<br>reward %{y}<extra></extra>",
            marker={"color": "#1f77b4", "size": 7, "opacity": 0.7},
            line={"color": "#aec7e8"},
            fillcolor="rgba(0,0,0,0)",
            name="episodes",
        )
    )
    fig.update_layout(
        _layout(
            f"Reward by group ({spread} of {len(by_group)} with a reward spread: a GRPO signal)",
            yaxis={"title": "reward"},
            xaxis={"title": "group", "type": "category"},
            showlegend=False,
        )
    )
    return fig


def _turns_tokens(go: Any, make_subplots: Any, rows: list[EpisodeRow]) -> Any:
    colors = _colors(rows)
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("turns per episode", "tokens per episode (samples' tokens)"),
    )
    for outcome in _outcomes(rows):
        part = [r for r in rows if r.outcome == outcome]
        color = colors[outcome]
        fig.add_trace(
            go.Histogram(
                x=[r.n_turns for r in part],
                name=outcome,
                legendgroup=outcome,
                marker_color=color,
                xbins={"size": 1},
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=[r.n_turns for r in part],
                y=[r.tokens for r in part],
                mode="markers",
                name=outcome,
                legendgroup=outcome,
                showlegend=False,
                marker={"color": color, "size": 8, "opacity": 0.75},
                customdata=[r.episode_id for r in part],
                text=[f"{r.trained_tokens} trained" for r in part],
                hovertemplate="%{customdata}<br>%{x} turns, %{y} tokens, %{text}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_layout(_layout("Turns and tokens per episode", barmode="stack"))
    fig.update_xaxes(title_text="turns", row=1, col=1)
    fig.update_yaxes(title_text="episodes", row=1, col=1)
    fig.update_xaxes(title_text="turns", row=1, col=2)
    fig.update_yaxes(title_text="tokens", row=1, col=2)
    return fig


def _phases(go: Any, rows: list[EpisodeRow]) -> Any:
    fig = go.Figure()
    for phase in PHASES:
        ran = [r for r in rows if r.phases[phase] > 0]
        fig.add_trace(
            go.Box(
                y=[r.phases[phase] for r in ran],
                name=phase,
                boxpoints="all" if len(ran) <= 200 else "outliers",
                jitter=0.4,
                pointpos=0,
                customdata=[r.episode_id for r in ran],
                hovertemplate=f"{phase}: %{{y:.3f}} s<br>%{{customdata}}<extra></extra>",
                marker={"size": 4},
            )
        )
    fig.update_layout(
        _layout(
            "Seconds per phase (episodes where the phase ran; log scale)",
            yaxis={"title": "seconds", "type": "log"},
            showlegend=False,
        )
    )
    return fig


def _time_unit(span_sec: float) -> tuple[str, float]:
    """The unit that reads best for a run of ``span_sec`` seconds, and its length in seconds."""
    if span_sec < 300:
        return "seconds", 1.0
    if span_sec < 3 * 3600:
        return "minutes", 60.0
    return "hours", 3600.0


def _outcomes_over_time(go: Any, rows: list[EpisodeRow]) -> Any:
    colors = _colors(rows)
    timed = bool(rows) and all(r.finished_at is not None for r in rows)
    unit, scale = _time_unit(max((r.finished_at or 0.0) for r in rows) if timed else 0.0)
    fig = go.Figure()
    for outcome in _outcomes(rows):
        part = [r for r in rows if r.outcome == outcome]
        xs = [(r.finished_at or 0.0) / scale if timed else r.index for r in part]
        fig.add_trace(
            go.Histogram(
                x=xs,
                name=outcome,
                marker_color=colors[outcome],
                nbinsx=min(60, max(10, len(rows) // 4)),
                hovertemplate=f"{outcome}: %{{y}} episodes<extra></extra>",
            )
        )
    fig.update_layout(
        _layout(
            "Episodes finished over time, by outcome and abort reason",
            barmode="stack",
            xaxis={
                "title": (
                    f"{unit} since the first episode started"
                    if timed
                    else "episodes in the order they finished (the results carry no start times)"
                )
            },
            yaxis={"title": "episodes"},
        )
    )
    return fig


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _std(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def _figure_div(pio: Any, fig: Any, div_id: str) -> str:
    return str(
        pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
    )


def _summary(data: ReportData) -> str:
    rows = data.rows
    graded = [r for r in rows if r.status != "aborted"]
    counts = Counter(r.outcome for r in rows)
    mean = _mean([r.reward for r in graded])
    solved = sum(1 for r in graded if r.resolved)
    parts = [
        f"<b>{len(rows)}</b> episodes on <b>{len({r.instance_id for r in rows})}</b> instances "
        f"in <b>{len({r.group for r in rows})}</b> groups",
        f"mean reward <b>{mean:.3f}</b> over {len(graded)} graded ({solved} resolved)",
        ", ".join(f"{html.escape(k)} {v}" for k, v in sorted(counts.items())),
        f"{sum(r.tokens for r in rows)} tokens, {sum(r.trained_tokens for r in rows)} trained",
    ]
    return " &middot; ".join(parts)


def _table(data: ReportData) -> str:
    head = (
        "<tr><th>#</th><th>episode</th><th>group</th><th>outcome</th><th>reward</th>"
        "<th>turns</th><th>tokens</th><th>total s</th><th>why</th></tr>"
    )
    body = []
    for r in data.rows:
        why = r.error or r.eval_reason or ""
        body.append(
            f'<tr data-episode="{html.escape(r.episode_id)}" '
            f'class="{"drill" if r.drill else "nodrill"}">'
            f"<td>{r.index}</td><td>{html.escape(r.episode_id)}</td>"
            f"<td>{html.escape(r.group)}</td>"
            f'<td><span class="badge" data-outcome="{html.escape(r.outcome)}">'
            f"{html.escape(r.outcome)}</span></td>"
            f"<td>{r.reward:g}</td><td>{r.n_turns}</td><td>{r.tokens}</td>"
            f"<td>{r.phases['total']:.2f}</td><td>{html.escape(why[:160])}</td></tr>"
        )
    return f'<table id="episodes"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>'


def _json_script(element_id: str, value: Any) -> str:
    # "</" would close the script element early; JSON allows "<\/" for it.
    raw = msgspec.json.encode(value).replace(b"</", b"<\\/").decode()
    return f'<script type="application/json" id="{element_id}">{raw}</script>'


def render_html(data: ReportData) -> str:
    """The page: a summary, the five figures, the episode table and the drill-down panel.

    Raises:
        ConfigError: plotly is not installed (names the ``report`` extra).
    """
    go, pio, offline, make_subplots = _plotly()
    rows = data.rows
    figures = {
        "reward-instance": _reward_by_instance(go, rows),
        "reward-group": _reward_by_group(go, rows),
        "turns-tokens": _turns_tokens(go, make_subplots, rows),
        "phases": _phases(go, rows),
        "outcomes-time": _outcomes_over_time(go, rows),
    }
    divs = "\n".join(
        f'<section class="figure">{_figure_div(pio, fig, name)}</section>'
        for name, fig in figures.items()
    )
    rows_json = [
        {
            "episode_id": r.episode_id,
            "instance_id": r.instance_id,
            "group": r.group,
            "group_index": r.group_index,
            "outcome": r.outcome,
            "reward": r.reward,
            "resolved": r.resolved,
            "eval_reason": r.eval_reason,
            "error": r.error,
            "n_turns": r.n_turns,
            "tokens": r.tokens,
            "trained_tokens": r.trained_tokens,
            "phases": r.phases,
        }
        for r in rows
    ]
    omitted = (
        f"<p class='note'>{data.omitted_trajectories} episodes beyond the first "
        f"{len(data.episodes)} have no drill-down (--max-trajectories).</p>"
        if data.omitted_trajectories
        else ""
    )
    tok = (
        f"token ids decoded with {html.escape(data.tokenizer)}"
        if data.tokenizer
        else "token ids shown as ids (pass --tokenizer PATH, or bytes, to decode them)"
    )
    return _PAGE.format(
        title=html.escape(data.title),
        plotlyjs=offline.get_plotlyjs(),
        style=_STYLE,
        summary=_summary(data),
        figures=divs,
        table=_table(data),
        omitted=omitted,
        tokenizer=tok,
        rows=_json_script("report-rows", rows_json),
        episodes=_json_script("report-episodes", data.episodes),
        colors=json.dumps(_colors(rows)),
        script=_SCRIPT,
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 4px; } h2 { font-size: 1.15em; margin: 18px 0 6px; }
.summary, .note { color: #444; } .figure { border-top: 1px solid #eee; }
#figures { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 16px; }
#figures .figure:nth-child(3) { grid-column: span 2; }
#filter { width: 320px; padding: 4px; margin: 4px 0 8px; }
#episodes { border-collapse: collapse; width: 100%; font-size: 0.85em; }
#episodes th, #episodes td { border-bottom: 1px solid #eee; padding: 3px 6px; text-align: left; }
#episodes tbody tr.drill { cursor: pointer; } #episodes tbody tr:hover { background: #f3f7fb; }
#episodes tbody tr.selected { background: #dbe9f6; } #episodes tr.nodrill { color: #888; }
.table-wrap { max-height: 360px; overflow-y: auto; border: 1px solid #ddd; }
.badge { padding: 1px 6px; border-radius: 8px; color: white; font-size: 0.9em; }
#drill { margin-top: 12px; } #drill dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; }
#drill dt { font-weight: 600; } #drill dd { margin: 0; }
.msg { border: 1px solid #ddd; border-left: 5px solid #bbb; margin: 8px 0; padding: 6px 10px; }
.msg.assistant { border-left-color: #1f77b4; } .msg.prompt { border-left-color: #999; }
.msg.observation { border-left-color: #2ca02c; }
.msg .head { font-size: 0.85em; color: #555; margin-bottom: 4px; }
.msg pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; max-height: 420px; overflow-y: auto;
  background: #fafafa; padding: 4px; }
.tool { background: #eef5ff; } .tokens td { padding: 0 6px; font-family: monospace; font-size: 0.8em; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{style}</style>
<script>{plotlyjs}</script>
<script>window.TRIO_SWE_COLORS = {colors};</script>
{rows}
{episodes}
<script>{script}</script>
</head><body>
<h1>{title}</h1>
<p class="summary">{summary}</p>
<div id="figures">{figures}</div>
<h2>Episodes</h2>
<p class="note">Click an episode (or a point of a chart) for its trajectory: each turn's text, tool
calls, the tool output that followed, its loss mask and rollout log-probs; {tokenizer}.</p>
{omitted}
<input id="filter" placeholder="filter: instance, group, outcome, reason" type="search">
<div class="table-wrap">{table}</div>
<section id="drill"><h2 id="drill-title">Trajectory</h2><p class="note">No episode selected.</p></section>
</body></html>
"""

_SCRIPT = r"""
"use strict";
(function () {
  const rows = () => JSON.parse(document.getElementById("report-rows").textContent);
  const episodes = () => JSON.parse(document.getElementById("report-episodes").textContent);
  let ROWS = null, EPISODES = null;
  function data() {
    if (ROWS === null) { ROWS = {}; for (const r of rows()) ROWS[r.episode_id] = r; EPISODES = episodes(); }
  }
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children) e.append(c);
    return e;
  }
  function pre(text, cls) { const p = el("pre", cls ? {class: cls} : {}); p.textContent = text; return p; }
  function stats(lps, mask) {
    const trained = mask.reduce((a, b) => a + b, 0);
    const mean = lps.length ? lps.reduce((a, b) => a + b, 0) / lps.length : 0;
    const min = lps.length ? Math.min(...lps) : 0;
    return `${lps.length} tokens, ${trained} trained (mask 1), mean log-prob ${mean.toFixed(3)}, min ${min.toFixed(3)}`;
  }
  function tokenTable(m) {
    const t = el("table", {class: "tokens"});
    t.append(el("tr", {}, el("th", {}, "#"), el("th", {}, "id"), el("th", {}, "mask"), el("th", {}, "log-prob")));
    m.token_ids.forEach((id, i) => t.append(el("tr", {}, el("td", {}, String(i)), el("td", {}, String(id)),
      el("td", {}, String(m.loss_mask[i])), el("td", {}, String(m.log_probs[i])))));
    return t;
  }
  function message(m) {
    const box = el("div", {class: "msg " + m.role, "data-role": m.role});
    let head = m.role === "assistant" ? `turn ${m.turn}` + (m.kind ? ` (${m.kind})` : "") : m.role;
    head += ` · sample ${m.sample}`;
    if (m.role === "assistant") head += " · " + stats(m.log_probs, m.loss_mask);
    else head += ` · ${m.token_ids.length} tokens (context, mask 0)`;
    box.append(el("div", {class: "head"}, head));
    box.append(pre(m.text !== undefined && m.text !== null ? m.text : "token ids: " + m.token_ids.join(" ")));
    if (m.tool_calls && m.tool_calls.length) {
      for (const c of m.tool_calls) box.append(pre(`tool call ${c.name}: ` + JSON.stringify(c.arguments, null, 2), "tool"));
    }
    if (m.role === "assistant") {
      const d = el("details", {}, el("summary", {}, "tokens: id, mask, log-prob"));
      d.addEventListener("toggle", () => { if (d.open && d.children.length === 1) d.append(tokenTable(m)); });
      box.append(d);
    }
    return box;
  }
  function logprobChart(target, msgs) {
    const xs = [], ys = [], colors = [], text = [];
    let pos = 0;
    for (const m of msgs) {
      if (m.role !== "assistant") { pos += m.token_ids.length; continue; }
      m.log_probs.forEach((lp, i) => {
        xs.push(pos + i); ys.push(lp);
        colors.push(m.loss_mask[i] ? "#1f77b4" : "#d62728");
        text.push(`turn ${m.turn}, token ${m.token_ids[i]}, mask ${m.loss_mask[i]}`);
      });
      pos += m.token_ids.length;
    }
    Plotly.newPlot(target, [{x: xs, y: ys, text: text, mode: "markers", type: "scattergl",
      marker: {size: 3, color: colors}, hovertemplate: "%{text}<br>log-prob %{y}<extra></extra>"}],
      {title: {text: "Rollout log-prob of each sampled token (blue: mask 1, red: mask 0)"},
       template: "plotly_white", height: 280, margin: {l: 60, r: 20, t: 50, b: 40},
       xaxis: {title: {text: "token position (all samples, prompt regions included)"}},
       yaxis: {title: {text: "log-prob"}}},
      {displaylogo: false, responsive: true});
  }
  function showEpisode(id) {
    data();
    const r = ROWS[id];
    const drill = document.getElementById("drill");
    if (!r) return false;
    for (const tr of document.querySelectorAll("#episodes tbody tr"))
      tr.classList.toggle("selected", tr.dataset.episode === id);
    drill.replaceChildren(el("h2", {id: "drill-title"}, "Trajectory of " + id));
    const dl = el("dl", {});
    const add = (k, v) => { if (v !== null && v !== undefined && v !== "") dl.append(el("dt", {}, k), el("dd", {}, String(v))); };
    add("instance", r.instance_id); add("group", r.group + (r.group_index !== null ? ` #${r.group_index}` : ""));
    add("outcome", r.outcome); add("reward", r.reward); add("grading", r.eval_reason);
    add("error", r.error); add("turns", r.n_turns); add("tokens", `${r.tokens} (${r.trained_tokens} trained)`);
    add("seconds", Object.entries(r.phases).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${v.toFixed(2)}`).join(", "));
    drill.append(dl);
    const ep = EPISODES[id];
    if (!ep) { drill.append(el("p", {class: "note"}, "This episode's trajectory is not in the report.")); return true; }
    if (ep.eval_detail) drill.append(el("p", {class: "note"}, "grading: " + ep.eval_detail));
    const msgs = ep.messages;
    if (!msgs.length) drill.append(el("p", {class: "note", id: "no-messages"}, "No turns recorded (no samples)."));
    else {
      const chart = el("div", {id: "episode-logprobs"});
      drill.append(chart);
      logprobChart(chart, msgs);
      const list = el("div", {id: "messages"});
      for (const m of msgs) list.append(message(m));
      drill.append(list);
    }
    if (ep.patch) { drill.append(el("h3", {}, "Patch")); drill.append(pre(ep.patch)); }
    if (ep.log_tail) { drill.append(el("h3", {}, "Test log (tail)")); drill.append(pre(ep.log_tail)); }
    if (ep.agent_output) { drill.append(el("h3", {}, "Agent output (tail)")); drill.append(pre(ep.agent_output)); }
    return true;
  }
  window.trioSweShowEpisode = showEpisode;
  document.addEventListener("DOMContentLoaded", () => {
    const colors = window.TRIO_SWE_COLORS;
    for (const b of document.querySelectorAll(".badge")) b.style.background = colors[b.dataset.outcome] || "#777";
    for (const tr of document.querySelectorAll("#episodes tbody tr")) {
      tr.addEventListener("click", () => { location.hash = "episode=" + encodeURIComponent(tr.dataset.episode); });
    }
    document.getElementById("filter").addEventListener("input", (ev) => {
      const q = ev.target.value.toLowerCase();
      for (const tr of document.querySelectorAll("#episodes tbody tr"))
        tr.style.display = tr.textContent.toLowerCase().includes(q) ? "" : "none";
    });
    for (const plot of document.querySelectorAll(".js-plotly-plot")) {
      plot.on("plotly_click", (ev) => {
        const id = ev.points && ev.points[0] && ev.points[0].customdata;
        data();
        if (typeof id === "string" && ROWS[id]) location.hash = "episode=" + encodeURIComponent(id);
      });
    }
    const fromHash = () => {
      const m = location.hash.match(/^#episode=(.+)$/);
      if (m) showEpisode(decodeURIComponent(m[1]));
    };
    window.addEventListener("hashchange", fromHash);
    fromHash();
  });
})();
"""
