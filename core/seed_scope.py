"""What of the stored history the start-up seed needs: which keys, and how many of each key's latest runs.

A store holds every run ever recorded; the checks compare a value with far
less. A metric's history keeps its last ``history_max_points`` counted values
(``core.history.MetricHistory``), and only metrics with a success condition
have one; a window check compares with the last ``history_runs`` successful
runs, and only tags with checks have a window history. The seed's queries
read only that (``sinks.seed``), so its size grows with the number of checked
keys, not with the number of stored rows.

Each key's history is rebuilt by stepping its latest rows in order, starting
empty, so it must read enough of them to end in the state the full history
gives. For a metric that is every row newer than its ``2 * max_points +
rebaseline_after``-th newest value that counted when it was checked (stored
``within_bounds`` not false): the values the history keeps, the ones before a
baseline that moved among them (``previous``, which scales the new level's
warm-up), the streak, and every out-of-bounds value in between, however many.
A triage action whose run is older than that is left out: it no longer changes
the history (an accept or dismiss of a forgotten run). tests/sinks/test_seed_scope.py
checks, over random histories with triage, that this seed's bounds are the
full history's. A window history is rebuilt by checking its runs' windows
again, from the ``2 * history_runs + rebaseline_after`` latest successful runs:
the first of them are checked against a shorter history than the live check
had, so which windows counted may differ there, not in the runs it compares
with.
"""

from __future__ import annotations

import dataclasses
from typing import FrozenSet, Mapping, Optional, Tuple

from core.config import DEFAULT_CONFIG_NAME, ConfigSet, TestConfig

Names = Optional[FrozenSet[str]]
"""Names of one test that need a seed: None for every name, an empty set for none."""


def metric_values_needed(max_points: int, rebaseline_after: int) -> int:
    """The latest counted values that, with every row newer than them, rebuild a metric history of ``max_points``
    values (see the module)."""
    return 2 * max_points + rebaseline_after


def window_runs_needed(history_runs: int, rebaseline_after: int) -> int:
    """The latest successful runs that rebuild a step-aligned window history of ``history_runs`` runs."""
    return 2 * history_runs + rebaseline_after


@dataclasses.dataclass(frozen=True)
class KeyScope:
    """One kind of seeded key: the names each configured test needs, those of every other test (the default
    config's), and how deep into a key's latest rows its history is rebuilt from (the most any test needs):
    counted values of a metric, successful runs of a window key."""
    by_test: Mapping[str, Names]
    default: Names
    depth: int

    @property
    def empty(self) -> bool:
        return self.depth == 0 or (self.default == frozenset() and all(n == frozenset() for n in self.by_test.values()))

    def needs(self, test: str, name: str) -> bool:
        names = self.by_test.get(test, self.default)
        return names is None or name in names


@dataclasses.dataclass(frozen=True)
class SeedScope:
    """What the seed reads: ``metrics`` keyed by (test, metric name), ``windows`` by (test, tag)."""
    metrics: Optional[KeyScope]  # None: every stored row (the backtest reads them all)
    windows: Optional[KeyScope]


def _checked_metrics(config: TestConfig) -> Tuple[Names, int]:
    conditions = config.regression_test.metric_success_conditions
    rebaseline_after = config.regression_test.rebaseline_after
    depth = max((metric_values_needed(c.history_max_points, rebaseline_after) for c in conditions.values()),
                default=0)
    names: Names = None if DEFAULT_CONFIG_NAME in conditions else frozenset(conditions)
    return names, depth


def _checked_tags(config: TestConfig) -> Tuple[Names, int]:
    """Only step-aligned checks compare with earlier runs (a trailing one, with the same run's windows)."""
    checks = {tag: [check for check in tag_config.checks if check.history == "step_aligned"]
              for tag, tag_config in config.windows.tags.items()}
    rebaseline_after = config.regression_test.rebaseline_after
    depth = max((window_runs_needed(check.history_runs, rebaseline_after)
                 for tag_checks in checks.values() for check in tag_checks), default=0)
    return frozenset(tag for tag, tag_checks in checks.items() if tag_checks), depth


def seed_scope(configs: ConfigSet) -> SeedScope:
    """The keys of ``configs``' checks and how deep each is read (the configs valid now: the seed starts the job)."""
    scopes = []
    for checked in (_checked_metrics, _checked_tags):
        default, depth = checked(configs.default)
        by_test = {}
        for test, config in configs.by_test.items():
            by_test[test], test_depth = checked(config)
            depth = max(depth, test_depth)
        scopes.append(KeyScope(by_test, default, depth))
    return SeedScope(*scopes)
