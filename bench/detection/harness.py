"""The benchmark's run: each suite scored for every detector, then pooled per noise family and written out.

:func:`evaluate_suite` is one (seed, noise family): generate, replay through
trainguard at every operating point, run every reference detector, score them
all with :func:`~bench.detection.scoring.score`. It returns plain data, so that
suites can run in worker processes (:func:`evaluate_all`, ``jobs``).
:func:`report` pools the suites of a family (counts add up) into the rows of
the table, the matched comparison, and trainguard's bound distances.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

from bench.detection import anchors as anchor_detectors
from bench.detection import oracle, trainguard_path
from bench.detection.scoring import MATCHED_FALSE_ALERTS, Counts, Row, matched, pool, rows_as_dicts, score
from bench.detection.suite import FaultKind, SuiteSpec, generate

TRAINGUARD = "trainguard"
TRAINGUARD_MEASURED = "trainguard, noise measured on last month"  # "noise" set where --suggest_noise says
TRAINGUARDS = (TRAINGUARD, TRAINGUARD_MEASURED)
LAST_MONTH = 1000  # the seed offset of the suite the noise is measured on: the same fleet, other runs
LIVE_KINDS = (FaultKind.DIVERGENCE, FaultKind.SLOWDOWN_115, FaultKind.SLOWDOWN_160)  # mid-run faults


@dataclasses.dataclass(frozen=True)
class SuiteResult:
    """Everything one suite gave, as plain data."""
    spec: SuiteSpec
    rows: Tuple[Tuple[str, str, bool], ...]  #: (detector, operating point, is trainguard's default), in table order
    counts: Dict[Tuple[str, str], Counts]
    distances: Dict[float, Dict[str, List[float]]]  #: budget -> metric -> each stored bound's distance in σ
    live: Dict[float, Dict[str, Tuple[int, int]]]  #: budget -> fault kind -> (alerted live, faults)
    seconds: Dict[str, float]  #: wall: generate, trainguard (the replay alone), anchors; cpu: all of it
    ceiling: Tuple[Tuple[str, Counts], ...] = ()  #: the oracle at each of ``oracle.CEILING_BUDGETS``


def loudest_first(budgets: Sequence[float]) -> List[Tuple[int, float]]:
    """(operating point, budget) pairs, the largest budget first: the table's order."""
    return sorted(enumerate(budgets), key=lambda item: -item[1])


def budget_label(budget: float) -> str:
    return f"false_alerts_per_100_runs {budget:g}"


def evaluate_suite(spec: SuiteSpec, workdir: str, budgets: Sequence[float] = trainguard_path.BUDGETS,
                   with_change_points: bool = True,
                   history_by: Sequence[str] = trainguard_path.HISTORY_BY) -> SuiteResult:
    started, cpu = time.monotonic(), time.process_time()
    suite = generate(spec)
    seconds = {"generate": time.monotonic() - started}
    rows: List[Tuple[str, str, bool]] = []
    counts: Dict[Tuple[str, str], Counts] = {}
    distances: Dict[float, Dict[str, List[float]]] = {}
    live: Dict[float, Dict[str, Tuple[int, int]]] = {}
    here = os.path.join(workdir, f"{spec.noise}-seed{spec.seed}")
    result = trainguard_path.run_trainguard(suite, here, budgets, history_by)
    seconds["trainguard"] = result.seconds
    for point, budget in loudest_first(budgets):
        key = (TRAINGUARD, budget_label(budget))
        rows.append((*key, budget == trainguard_path.DEFAULT_BUDGET))
        counts[key] = score(suite, result.alerts[point])
        distances[budget] = trainguard_path.bound_distances(suite, result.bounds[point])
        alerted = {(a.test, a.run) for a in result.live[point]}
        live[budget] = {kind.value: (sum(1 for p in suite.plans for run, f in p.faults.items()
                                       if f.kind is kind and (p.index, run) in alerted),
                                   sum(1 for p in suite.plans for f in p.faults.values() if f.kind is kind))
                      for kind in LIVE_KINDS}
    started = time.monotonic()
    noise = trainguard_path.measure_noise(generate(dataclasses.replace(spec, seed=spec.seed + LAST_MONTH)),
                                          here + "-last-month", history_by)
    measured = trainguard_path.run_trainguard(suite, here + "-measured-noise", budgets, history_by, noise)
    for point, budget in loudest_first(budgets):
        key = (TRAINGUARD_MEASURED, budget_label(budget))
        rows.append((*key, False))
        counts[key] = score(suite, measured.alerts[point])
    seconds["trainguard, measured noise"] = time.monotonic() - started
    started = time.monotonic()
    for anchor in anchor_detectors.anchors(with_change_points=with_change_points):
        key = (anchor.detector, anchor.point)
        rows.append((*key, False))
        counts[key] = score(suite, anchor_detectors.detect_suite(suite, anchor.detect))
    seconds["anchors"] = time.monotonic() - started
    quantiles = oracle.cached_noise_quantiles(spec.noise, workdir)
    for point, alerts in oracle.oracle_points(suite, quantiles):
        rows.append((oracle.ORACLE, point, False))
        counts[(oracle.ORACLE, point)] = score(suite, alerts)
    ceiling = tuple((point, score(suite, alerts))
                    for point, alerts in oracle.oracle_points(suite, quantiles, oracle.CEILING_BUDGETS))
    seconds["cpu"] = time.process_time() - cpu  # this process's, all of the suite's work: load on the cores aside
    return SuiteResult(spec, tuple(rows), counts, distances, live, seconds, ceiling)


def _evaluate(args: Tuple[SuiteSpec, str, Tuple[float, ...], bool, Tuple[str, ...]]) -> SuiteResult:
    return evaluate_suite(*args)


def evaluate_all(specs: Sequence[SuiteSpec], workdir: str, budgets: Sequence[float] = trainguard_path.BUDGETS,
                 with_change_points: bool = True, jobs: int = 1,
                 history_by: Sequence[str] = trainguard_path.HISTORY_BY) -> List[SuiteResult]:
    """Every suite, ``jobs`` at a time in fresh processes (each replay is one process's work)."""
    work = [(spec, workdir, tuple(budgets), with_change_points, tuple(history_by)) for spec in specs]
    if jobs <= 1 or len(work) == 1:
        return [_evaluate(w) for w in work]
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool_:
        return list(pool_.map(_evaluate, work))


@dataclasses.dataclass(frozen=True)
class FamilyReport:
    """One noise family, pooled over its seeds."""
    noise: str
    seeds: Tuple[int, ...]
    rows: Tuple[Row, ...]
    per_seed: Dict[int, Tuple[Row, ...]]
    ceiling: Dict[int, Tuple[Row, ...]]  #: per seed, the oracle at each of ``oracle.CEILING_BUDGETS``
    distances: Dict[float, Dict[str, Dict[str, Optional[float]]]]
    live: Dict[float, Dict[str, Tuple[int, int]]]

    @property
    def matched(self) -> List[Row]:
        return matched(self.rows)


def report(results: Sequence[SuiteResult]) -> List[FamilyReport]:
    families = []
    for noise in dict.fromkeys(r.spec.noise for r in results):
        mine = [r for r in results if r.spec.noise == noise]
        order = mine[0].rows
        rows = tuple(Row(d, p, pool(r.counts[(d, p)] for r in mine), default) for d, p, default in order)
        per_seed = {r.spec.seed: tuple(Row(d, p, r.counts[(d, p)], default) for d, p, default in order)
                    for r in mine}
        ceiling = {r.spec.seed: tuple(Row(oracle.ORACLE, p, c) for p, c in r.ceiling) for r in mine}
        budgets = list(mine[0].distances)
        distances = {budget: trainguard_path.summarize_distances(
            {metric: [d for r in mine for d in r.distances[budget][metric]] for metric in mine[0].distances[budget]})
            for budget in budgets}
        live = {budget: {kind: (sum(r.live[budget][kind][0] for r in mine), sum(r.live[budget][kind][1] for r in mine))
                       for kind in mine[0].live[budget]} for budget in budgets}
        families.append(FamilyReport(noise, tuple(r.spec.seed for r in mine), rows, per_seed, ceiling, distances,
                                     live))
    return families


def distances_table(family: FamilyReport) -> str:
    lines = ["| trainguard's stored bounds, distance from the true centre in σ of the noise | bounds | median | p90 "
             "| max | beyond 12σ |", "|---|---|---|---|---|---|"]
    for budget, per_metric in family.distances.items():
        for metric, s in per_metric.items():
            cells = [str(s["n"])] + ["–" if s[k] is None else f"{s[k]:.1f}" for k in ("median", "p90", "max")]
            share = "–" if s["beyond_12"] is None else f"{100 * s['beyond_12']:.0f}%"
            lines.append(f"| {budget_label(budget)}: {metric} | " + " | ".join(cells + [share]) + " |")
    return "\n".join(lines)


def per_seed_table(family: FamilyReport) -> str:
    """Per seed, at most ``MATCHED_FALSE_ALERTS`` false alerts per 100 healthy runs: trainguard's best point
    (each variant that ran) against the best reference detector's, and the margin in recall points (the issue asks
    for 10 on every seed); then the oracle's best point there (a finer sweep of its budget than the table's) and its
    margin: what a detector of run-level values could have at most."""
    variants = [d for d in TRAINGUARDS if any(r.detector == d for rows in family.per_seed.values() for r in rows)]
    lines = ["| seed | " + " | ".join(f"{d} at ≤ 1 false alert / 100 (point: recall, false alerts)"
                                     for d in variants)
             + " | best reference at ≤ 1 | " + " | ".join(f"margin, {d} (points)" for d in variants)
             + " | oracle at ≤ 1, the ceiling | margin, oracle (points) |",
             "|---|" + "---|" * (2 * len(variants) + 3)]
    for seed, rows in family.per_seed.items():
        within = _within(rows)
        theirs = max((r for r in within if r.detector not in (*TRAINGUARDS, oracle.ORACLE)),
                     key=lambda r: r.counts.recall or 0.0, default=None)
        ours = [next((r for r in within if r.detector == d), None) for d in variants]
        ceiling = next(iter(_within(family.ceiling.get(seed, ()))), None)
        lines.append(f"| {seed} | " + " | ".join(_cell(r) for r in ours) + f" | {_cell(theirs)} | "
                     + " | ".join(_margin(r, theirs) for r in ours) + f" | {_cell(ceiling)} | "
                     + f"{_margin(ceiling, theirs)} |")
    return "\n".join(lines)


def _within(rows: Sequence[Row]) -> List[Row]:
    """Each detector's best point with at most ``MATCHED_FALSE_ALERTS`` false alerts per 100 healthy runs."""
    return [r for r in matched(rows) if (r.counts.false_alerts_per_100 or 0.0) <= MATCHED_FALSE_ALERTS]


def _cell(row: Optional[Row]) -> str:
    if row is None:
        return "–"
    return (f"{row.detector if row.detector not in (*TRAINGUARDS, oracle.ORACLE) else ''} {row.point}: "
            f"{row.counts.recall or 0:.2f}, {row.counts.false_alerts_per_100 or 0:.2f}").strip()


def _margin(row: Optional[Row], theirs: Optional[Row]) -> str:
    """trainguard's recall above the best reference's, in points."""
    if row is None or theirs is None:
        return "–"
    return f"{100 * ((row.counts.recall or 0) - (theirs.counts.recall or 0)):+.0f}"


def live_line(family: FamilyReport) -> str:
    parts = []
    for budget, kinds in family.live.items():
        parts.append(f"{budget_label(budget)}: " + ", ".join(f"{kind} {alerted}/{faults}"
                                                        for kind, (alerted, faults) in kinds.items()))
    return "trainguard, mid-run faults alerted live (a window alert before the run ended): " + "; ".join(parts)


def as_json(families: Sequence[FamilyReport]) -> Dict[str, object]:
    return {f.noise: {
        "seeds": list(f.seeds), "rows": rows_as_dicts(f.rows), "matched": rows_as_dicts(f.matched),
        "per_seed": {seed: [{"detector": r.detector, "point": r.point, "recall": r.counts.recall,
                             "false_alerts_per_100_healthy_runs": r.counts.false_alerts_per_100}
                            for r in rows] for seed, rows in f.per_seed.items()},
        "oracle_at_most_1_per_seed": {seed: [{"point": r.point, "recall": r.counts.recall,
                                              "false_alerts_per_100_healthy_runs": r.counts.false_alerts_per_100}
                                             for r in _within(rows)] for seed, rows in f.ceiling.items()},
        "bound_distances_in_sigma": {budget_label(budget): d for budget, d in f.distances.items()},
        "live": {budget_label(budget): {k: {"alerted_live": a, "faults": n} for k, (a, n) in kinds.items()}
                 for budget, kinds in f.live.items()},
    } for f in families}
