"""trainguard's core: the domain vocabulary and the maths, with no Beam and no I/O.

Everything above builds on it: ``transforms/`` (the Beam stages, each file named
after the core module whose logic it runs), ``sinks/`` (stores and topics),
``pipeline/`` (options, the graph, the entry points) and the standalone tools
``notifier/`` and ``report/``. The rule of the layers: a core module imports
only the standard library, other core modules and the wire contract
(``trainguard.wire``, stdlib-only and shared with trainers); never Beam, never a
package above it. ``tests/core/test_layers.py`` checks it. One exception:
``encoding`` writes state with msgpack, a dependency of the pipeline only (the
modules that define records import ``registry``, standard library only, so the
notifier and the report do without it).

| module | what it holds |
|---|---|
| ``vocabulary`` | alert kinds, run statuses, BigQuery write methods |
| ``strict_json`` | the strict JSON reader every config file goes through |
| ``config`` | per-test configs: dataclasses and their strict parser |
| ``schema`` | the output tables, for every store |
| ``stats`` | exact sums, means, population stddev, percentiles |
| ``parse`` | raw payloads and per-message summaries |
| ``runs`` | the run model: per-tag aggregates, the run accumulator, run results, lifecycle settings |
| ``run_parts`` | a replay's messages of a run taken before its shuffle, and which copy of a message id counts |
| ``records`` | alerts and rows, as the pipeline writes them |
| ``alert_record`` | an alert as readers (report, notifier) see it |
| ``bounds`` | regression bounds from a condition and a history |
| ``history`` | run-level checks as state machines |
| ``windows`` | live windows of one run's tag |
| ``stalls`` | silences in a run |
| ``window_checks`` | checks of windows against history, as a state machine |
| ``registry`` | the types that live in state or cross a shuffle: stable names, schema versions |
| ``encoding`` | how they are written: versioned, schema'd, deterministic bytes (no pickles) |
"""
