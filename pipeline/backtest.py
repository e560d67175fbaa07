"""``trainguard-backtest`` (``python -m pipeline.backtest``): what would fire under other configs.

    trainguard-backtest --config_dir=NEW [--local_store=trainguard.duckdb] [--json]
    trainguard-backtest --config_dir=NEW --bigquery_project=P --bigquery_dataset=D [--json]
    trainguard-backtest --config_dir=configs --suggest_noise [--local_store=trainguard.duckdb] [--json]

Re-evaluates the stored history (job_history, metric_history, metric_windows,
triage) under the configs in --config_dir with the pipeline's own checks, from
empty state and without raw points, and prints per test and alert kind what
fired (the alerts table) against what would fire, and which alerts differ.
This is how to tune k, p, N and the warm-up on your own data: copy configs/,
change a threshold, and backtest the copy. What cannot be re-evaluated from
stored rows is listed in ``core/backtest.py``; run_stalled and config_rejected
alerts are carried over as they fired. With --suggest_noise it prints instead
which false_alert_rate checks the stored history says have normal noise, for
which "noise": "normal" brings the cutoff about twice as near (core/noise_evidence.py).

Starts without Apache Beam: the stores are read through ``sinks.stores``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from core.backtest import NOT_RE_EVALUATED, BacktestResult, KindDiff, backtest
from core.config import ConfigError
from core.config_versions import load_local_versions
from core.noise_evidence import MIN_HISTORY, ODDS, NoiseSuggestion, measure_noise, odds, suggest_noise
from core.records import iso_utc
from core.triage import AlertFacts
from sinks.stored_history import read_stored_history
from sinks.stores import add_store_options, open_store
from trainguard.cli import DASHES_NOTE, HelpFormatter, StrictArgumentParser, cloud_failure

PROG = "trainguard-backtest"
USAGE_ERROR, RUNTIME_ERROR = 2, 1  # argparse's exit status for a bad command line, and anything else
MAX_ERRORS_SHOWN = 100  # a broken condition fails every value it checks: say how many, show a few


class UsageError(Exception):
    """A store or config dir that cannot be used as named: one line for the user, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    description = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
    parser = StrictArgumentParser(prog=PROG, description=description.replace("``", ""),
                                  formatter_class=HelpFormatter, epilog=DASHES_NOTE)
    parser.add_argument("--config_dir", required=True, default=argparse.SUPPRESS,
                        help="directory of per-test JSON configs (and default.json) to re-evaluate under")
    store = parser.add_argument_group("the store (a DuckDB file, or a BigQuery dataset with --bigquery_dataset)")
    add_store_options(store)
    parser.add_argument("--suggest_noise", action="store_true",
                        help='measure the tails of each false_alert_rate check\'s noise and say where "noise": '
                             '"normal" is supported, instead of comparing alerts')
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser


def run(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Runs the backtest the command line asks for; returns what ``--json`` prints.

    Raises ``SystemExit`` (2) for a bad command line, ``UsageError`` for a store
    or config dir that cannot be used as named, and anything the store raises.
    """
    return run_with(build_parser().parse_args(argv))


def run_with(args: argparse.Namespace) -> Dict[str, Any]:
    started = time.perf_counter()
    try:
        configs = load_local_versions(args.config_dir).strict()  # dated versions apply by event time, as in the job
    except ConfigError as e:
        raise UsageError(str(e)) from None
    try:
        store = open_store(args)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    try:
        history = read_stored_history(store.query, store.dialect)
    finally:
        store.close()
    read = time.perf_counter()
    if args.suggest_noise:
        at = max((run.finalized_at for run in history.runs), default=0.0)
        suggestions = suggest_noise(measure_noise(history, configs), configs, at)
        return noise_report(suggestions, args.config_dir, store.name, time.perf_counter() - started)
    result = backtest(history, configs)
    done = time.perf_counter()
    return report(result, args.config_dir, store.name,
                  {"read": read - started, "backtest": done - read, "total": done - started})


def _alert(facts: AlertFacts) -> Dict[str, Any]:
    return {"alert_id": facts.alert_id, "run": facts.run, "metric": facts.metric,
            "created_at": iso_utc(facts.created_at)}


def _diff(d: KindDiff) -> Dict[str, Any]:
    return {"test": d.test, "kind": d.kind, "re_evaluated": d.re_evaluated, "fired": len(d.fired),
            "would_fire": len(d.would_fire), "only_fired": [_alert(a) for a in d.only_fired],
            "only_would_fire": [_alert(a) for a in d.only_would_fire]}


def report(result: BacktestResult, config_dir: str, store: str, seconds: Dict[str, float]) -> Dict[str, Any]:
    """The backtest as one JSON-ready object (what ``--json`` prints)."""
    return {"config_dir": config_dir, "store": store, "runs": result.runs, "values": result.values,
            "windows": result.windows, "windows_not_checked": result.skipped_windows,
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
            "not_re_evaluated": sorted(kind.value for kind in NOT_RE_EVALUATED),
            "changed": bool(result.changed), "error_count": len(result.errors),
            "errors": list(result.errors[:MAX_ERRORS_SHOWN]),
            "diffs": [_diff(d) for d in result.diffs]}


def noise_report(suggestions: List[NoiseSuggestion], config_dir: str, store: str, seconds: float) -> Dict[str, Any]:
    """What ``--suggest_noise --json`` prints: per metric name the fleet's evidence, per check the suggestion."""
    metrics: Dict[str, Dict[str, Any]] = {}
    for s in suggestions:
        metrics.setdefault(s.metric, {"metric": s.metric, "tests": 0, "values": s.fleet.values,
                                      "ln_odds_normal": round(s.fleet.log_ratio, 2)})["tests"] += 1
    return {"config_dir": config_dir, "store": store, "seconds": round(seconds, 3), "odds_needed": ODDS,
            "metrics": list(metrics.values()),
            "checks": [{"test": s.test, "metric": s.metric, "values": s.own.values,
                        "ln_odds_normal": round(s.own.log_ratio, 2), "noise": s.current, "suggested": s.suggested}
                       for s in suggestions]}


def render_noise(summary: Dict[str, Any]) -> str:
    """The ``--suggest_noise`` report as two tables: the metrics' evidence, and the checks to change."""
    lines = [f"{PROG}: the noise of the false_alert_rate checks of {summary['config_dir']}, measured on "
             f"{summary['store']} in {summary['seconds']:.2f} s",
             f"  odds for normal noise against heavy tails (Student t, 3 degrees of freedom), from the values that "
             f"joined a history; {summary['odds_needed']:g} or more over a metric's tests suggests normal", ""]
    if not summary["metrics"]:
        lines.append(f"  no false_alert_rate check has a value judged by {MIN_HISTORY} or more earlier ones yet")
        return "\n".join(lines)
    table = [("metric", "tests", "values", "odds normal")] + [
        (m["metric"], str(m["tests"]), str(m["values"]), _odds(m["ln_odds_normal"])) for m in summary["metrics"]]
    lines += _columns(table, right=(False, True, True, True))
    changes = [c for c in summary["checks"] if c["noise"] != c["suggested"]]
    lines.append("")
    if not changes:
        lines.append("  every check's noise is as the history suggests: nothing to change")
        return "\n".join(lines)
    lines.append('  checks to change (set "noise" on the metric\'s condition; backtest the copy first):')
    lines += _columns([("test", "metric", "values", "own odds", "noise now", "suggested")] + [
        (c["test"], c["metric"], str(c["values"]), _odds(c["ln_odds_normal"]), c["noise"], c["suggested"])
        for c in changes], right=(False, False, True, True, False, False))
    return "\n".join(lines)


def _odds(log_ratio: float) -> str:
    value = odds(log_ratio)
    return f"{value:.3g}" if 1e-3 <= value <= 1e3 else f"{value:.0e}"


def _columns(rows: List[Tuple[str, ...]], right: Tuple[bool, ...]) -> List[str]:
    """Rows (the first the header) as columns two spaces apart, each as wide as its widest cell, left-aligned
    but where ``right`` says (the numbers)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(right))]
    return ["  " + "  ".join(cell.rjust(w) if at_right else cell.ljust(w)
                             for cell, w, at_right in zip(row, widths, right)).rstrip() for row in rows]


def render(summary: Dict[str, Any]) -> str:
    """The backtest as a table and the alerts that differ."""
    s = summary["seconds"]
    lines = [f"{PROG}: {summary['config_dir']} against {summary['store']}",
             f"  re-evaluated {summary['runs']} runs, {summary['values']} metric values and {summary['windows']} "
             f"windows in {s['backtest']:.2f} s (store read in {s['read']:.2f} s, {s['total']:.2f} s in all)"]
    if summary["windows_not_checked"]:
        lines.append(f"  {summary['windows_not_checked']} stored windows have no check of their tag and kind "
                     "under these configs")
    diffs = summary["diffs"]
    header = ("test", "kind", "fired", "would fire", "only fired", "only would fire")
    table = [(d["test"], d["kind"] + ("" if d["re_evaluated"] else " *"), str(d["fired"]), str(d["would_fire"]),
              str(len(d["only_fired"])), str(len(d["only_would_fire"]))) for d in diffs]
    lines.append("")
    lines += _columns([header, *table], right=(False, False, True, True, True, True))
    if not diffs:
        lines.append("  (no alerts fired, none would fire)")
    if any(not d["re_evaluated"] for d in diffs):
        lines.append(f"  * not re-evaluated ({', '.join(summary['not_re_evaluated'])} needs the raw message times): "
                     "carried over as fired")
    changes = [(sign, d, a) for d in diffs for sign, key in (("-", "only_fired"), ("+", "only_would_fire"))
               for a in d[key]]
    lines.append("")
    if changes:
        lines.append("  alerts that differ (- fired, would not fire now; + would fire, did not):")
        for sign, d, a in changes:
            lines.append(f"  {sign} {d['test']}  {d['kind']}  {a['run']}  {a['metric'] or '-'}  {a['alert_id']}")
    else:
        lines.append("  no change: every re-evaluated alert would fire as it did, and no other")
    if summary["error_count"]:
        lines.append(f"  {summary['error_count']} item(s) failed their check and were skipped, as the pipeline "
                     "dead-letters them; the first:")
        lines += [f"    {error}" for error in summary["errors"][:10]]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run_with(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except Exception as e:  # noqa: BLE001 - a store or network failure: one line, not a traceback
        print(f"{PROG}: error: {cloud_failure(e) or f'{type(e).__name__}: {e}'}", file=sys.stderr)
        return RUNTIME_ERROR
    text = render_noise(summary) if args.suggest_noise else render(summary)
    print(json.dumps(summary, indent=1) if args.json else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
