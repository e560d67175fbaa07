"""The trainguard report: metric history, step-aligned run curves and a status grid as PNGs + index.html.

``python -m report --local_store=trainguard.duckdb --out=trainguard-report/`` (see ``cli.py`` and
docs/report.md); from Python, :func:`write_report`.
"""

from report.cli import main, run, write_report

__all__ = ["main", "run", "write_report"]
