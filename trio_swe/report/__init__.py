"""``trio-swe report``: a results file as one self-contained HTML page with plotly figures (reward
by instance and by group, turns and tokens per episode, seconds per phase, outcomes and abort
reasons over time) and a drill-down into each episode's trajectory.

:func:`report_data` reads the results (sans-IO); :func:`render_html` renders the page (needs the
``report`` extra: plotly). :func:`write_report` does both and writes the file.
"""

from ._data import PHASES, EpisodeRow, ReportData, report_data
from ._html import render_html
from ._write import write_report

__all__ = ["PHASES", "EpisodeRow", "ReportData", "render_html", "report_data", "write_report"]
