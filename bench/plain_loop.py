"""The replay benchmark's reference: a plain single-process Python loop doing a replay's work on the same files.

What ``python -m pipeline`` does with the benchmark's input under the default config, written as one loop a
careful engineer would write without a framework (kept plain on purpose: no Beam, no project code):

- parse each line with orjson (the stdlib json where orjson is missing);
- validate it as the wire contract says: the envelope's names, each v1 point (a printable tag, a finite number, a
  plausible time, a step from 0 up) and each v1.1 column (the same rules on its values, the running sums of its
  ``steps`` and ``ms``, float32 rounding with ``f32``); a bad point is counted and left out;
- skip a message whose id its run has seen (a redelivery);
- aggregate each (test, run, tag): count, final (latest time, then step), min, max and the exact mean
  (``math.fsum``); keep each run's ``run_started``/``run_finished`` events;
- check each test's runs in the order they ended: a failed run after a failed run is an alert (the default
  config's ``alert_after_second_test_failure``), and each final value against the mean ± 4 standard deviations
  of the test's earlier runs (the seed system's rule);
- write a job row per run and a metric row per (run, tag) into a DuckDB file in one transaction.

    python bench/plain_loop.py 'input-*.jsonl' out.duckdb    # prints: points runs metric_rows alerts bad_points
"""

from __future__ import annotations

import glob
import math
import statistics
import sys
from array import array
from itertools import accumulate

try:
    from orjson import loads
except ImportError:  # pragma: no cover - the pipeline's install has orjson
    from json import loads

SCHEMAS = ("trainguard/v1", "trainguard/v1.1")
MIN_TIME, MAX_TIME, MAX_STEP = 946684800.0, 7258118400.0, (1 << 63) - 1
NUMBERS, INT = {float, int}, {int}


def good_name(value) -> bool:
    return type(value) is str and 0 < len(value) <= 256 and value.isprintable()


def good_point(tag, value, time, step) -> bool:
    return (good_name(tag) and type(value) in (float, int) and math.isfinite(value)
            and type(time) in (float, int) and MIN_TIME <= time < MAX_TIME
            and (step is None or (type(step) is int and 0 <= step <= MAX_STEP)))


def column_points(column):
    """(tag, values, steps, times) of a v1.1 column's points, bad points left out; None for a bad column."""
    tag, values, ms, steps = column.get("tag"), column.get("values"), column.get("ms"), column.get("steps")
    if not good_name(tag) or type(values) is not list or type(ms) is not list or len(ms) != len(values) \
            or (steps is not None and (type(steps) is not list or len(steps) != len(values))):
        return None
    if column.get("f32"):
        values = array("f", [v if type(v) in (float, int) else math.nan for v in values]).tolist()
    ms_ints = set(map(type, ms)) == INT
    times = [t / 1000 for t in accumulate(ms)] if ms_ints else [math.nan] * len(ms)
    steps = list(accumulate(steps)) if steps is not None else [None] * len(values)
    if set(map(type, values)) <= NUMBERS and ms_ints and math.isfinite(sum(values)) \
            and min(times) >= MIN_TIME and max(times) < MAX_TIME \
            and (column.get("steps") is None or (set(map(type, steps)) == INT and min(steps) >= 0
                                                 and max(steps) <= MAX_STEP)):
        return tag, values, steps, times  # every point good, checked a column at a time
    keep = [i for i in range(len(values)) if good_point(tag, values[i], times[i], steps[i])]
    if len(keep) < len(values):
        values, times, steps = [values[i] for i in keep], [times[i] for i in keep], [steps[i] for i in keep]
    return tag, values, steps, times


def main(pattern: str, store: str) -> None:
    aggregates = {}  # (test, run) -> tag -> [count, (time, step, value), min, max, values]
    events = {}  # (test, run) -> {"run_started": time, "run_finished": (time, status)}
    seen = set()
    points = bad_points = 0
    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    message = loads(line)
                except ValueError:
                    continue
                if type(message) is not dict or message.get("schema") not in SCHEMAS \
                        or not all(good_name(message.get(k)) for k in ("id", "test", "run")):
                    continue
                key = (message["test"], message["run"])
                if (key, message["id"]) in seen:
                    continue
                seen.add((key, message["id"]))
                by_tag = aggregates.setdefault(key, {})
                for p in message.get("points") or ():
                    tag, value, step, time = p.get("tag"), p.get("value"), p.get("step"), p.get("time")
                    if not good_point(tag, value, time, step):
                        bad_points += 1
                        continue
                    points += 1
                    latest = (time, -1 if step is None else step, value)
                    a = by_tag.get(tag)
                    if a is None:
                        by_tag[tag] = [1, latest, value, value, [value]]
                    else:
                        a[0] += 1
                        if latest > a[1]:
                            a[1] = latest
                        if value < a[2]:
                            a[2] = value
                        if value > a[3]:
                            a[3] = value
                        a[4].append(value)
                for column in message.get("columns") or ():
                    column = column_points(column)
                    if column is None:
                        bad_points += 1
                        continue
                    tag, values, steps, times = column
                    points += len(values)
                    latest = max(zip(times, [-1 if s is None else s for s in steps], values))
                    a = by_tag.get(tag)
                    if a is None:
                        by_tag[tag] = [len(values), latest, min(values), max(values), values]
                    else:
                        a[0] += len(values)
                        a[1] = max(a[1], latest)
                        a[2] = min(a[2], min(values))
                        a[3] = max(a[3], max(values))
                        a[4] += values
                for event in message.get("events") or ():
                    if event.get("type") == "run_started":
                        events.setdefault(key, {})["run_started"] = event["time"]
                    elif event.get("type") == "run_finished":
                        events.setdefault(key, {})["run_finished"] = (event["time"], event["data"].get("status"))

    job_rows, metric_rows, alerts = [], [], 0
    ended = sorted((finished[0], key) for key, run in events.items() if (finished := run.get("run_finished")))
    last_failed, earlier_finals = {}, {}
    for end, (test, run) in ended:
        started = events[(test, run)].get("run_started")
        status = events[(test, run)]["run_finished"][1]
        alerts += status != "success" and last_failed.get(test, False)
        last_failed[test] = status != "success"
        job_rows.append((run, test, status, started, end, None if started is None else end - started))
        if started is not None:
            metric_rows.append((run, test, "total_wall_time", end - started, None, None, None, None, None))
        for tag, (count, (_, step, final), low, high, values) in aggregates.get((test, run), {}).items():
            history = earlier_finals.setdefault((test, tag), [])
            if len(history) >= 2:
                centre, spread = statistics.fmean(history), statistics.stdev(history)
                alerts += not centre - 4 * spread <= final <= centre + 4 * spread
            history.append(final)
            metric_rows.append((run, test, tag + "_final", final, low, high, math.fsum(values) / count, count,
                                None if step < 0 else step))

    import duckdb  # a store like the pipeline's, written as the pipeline's store writes: a column table at a time
    import pyarrow as pa

    connection = duckdb.connect(store)
    connection.execute("BEGIN")
    for name, columns, rows in (
            ("job_history", ("run_id", "test_name", "job_status", "start_time", "end_time", "job_duration_sec"),
             job_rows),
            ("metric_history", ("run_id", "test_name", "metric_name", "metric_value", "min", "max", "average",
                                "count", "step"), metric_rows)):
        staged = pa.table({column: [row[i] for row in rows] for i, column in enumerate(columns)})
        connection.register("staged", staged)
        connection.execute(f"CREATE TABLE IF NOT EXISTS {name} AS SELECT * FROM staged LIMIT 0")
        connection.execute(f"INSERT INTO {name} SELECT * FROM staged")
        connection.unregister("staged")
    connection.execute("COMMIT")
    connection.close()
    print(points, len(job_rows), len(metric_rows), alerts, bad_points)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
