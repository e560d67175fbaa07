"""Dashboard benchmark: every page's latency on a store of 100,000 runs x 20 metrics, then 20 clients for 30 s.

Builds (once, cached in the work directory) a DuckDB store with the pipeline's schema (``DuckDBStore``) filled by
SQL: ``--tests`` tests of ``--runs`` runs each, ``--metrics`` checked metrics per run (one value in 30 out of its
bounds), an alert per out-of-bounds value, windows for each test's latest 10 runs, dead letters, each table in
the order the pipeline writes it: by time, every test's runs interleaved (so a test's rows lie in every block of a
table, as in a real store: a store written test by test would let DuckDB skip most blocks). Serves it with
``python -m dashboard`` and measures, over HTTP:

1. each page alone, ``--requests`` times in a row: p50 and p95 per page, and the CPU time the dashboard's
   processes used per request;
2. ``--clients`` concurrent clients for ``--seconds``, each looping over the pages: requests per second,
   p50/p95/p99 per page, and CPU time per request.

The dashboard keeps a page's data while the store is unchanged (``dashboard.store.PageCache``), so the same ten
URLs asked again are mostly served from it. With ``--vary`` each request of an alert, a run, a test or a test's
alerts names another one (of the newest 2,000 alerts, their runs, and every test), so that those pages are read
from the store as a first visit is.

Writes ``results-N-workers.json`` in the work directory and prints a table.

    python bench/bench_dashboard.py [--tests 100] [--runs 1000] [--metrics 20] [--clients 20] [--seconds 30] [--workers 1]
                                    [--vary]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sinks.duckdb_store import DuckDBStore
from trainguard.cli import DASHES_NOTE, StrictArgumentParser

T0 = 1735689600.0  # 2025-01-01
HOUR = 3600.0


def build_store(path: str, tests: int, runs: int, metrics: int) -> None:
    """The synthetic store (see the module's docstring), written by SQL into the pipeline's schema."""
    import duckdb

    store = DuckDBStore(path)
    store.ensure_schema()
    store.close()
    c = duckdb.connect(path)
    c.execute("SET TimeZone = 'UTC'")
    c.execute(f"""CREATE TEMP TABLE r AS SELECT t, j, 'test-' || lpad(t::VARCHAR, 3, '0') AS test,
                  'test-' || lpad(t::VARCHAR, 3, '0') || '-run-' || lpad(j::VARCHAR, 6, '0') AS run,
                  {T0} + j * {HOUR} + t AS ended
                  FROM range({tests}) a(t), range({runs}) b(j)""")
    c.execute("""INSERT INTO job_history SELECT run, test, CASE WHEN j % 97 = 0 THEN 'failure' ELSE 'success' END, 0,
                 to_timestamp(ended - 900), to_timestamp(ended), 900.0, to_timestamp(ended + 60),
                 '[{"type":"run_started","time":' || (ended - 900) || ',"data":{}},{"type":"run_finished","time":'
                 || ended || ',"data":{"status":"success"}}]', FALSE FROM r ORDER BY ended""")
    c.execute(f"""INSERT INTO metric_history SELECT run, test, 'metric_' || lpad(m::VARCHAR, 2, '0'),
                  CASE WHEN (j + m) % 30 = 0 THEN 150.0 ELSE 100.0 + ((j * 7 + m) % 10) END, 90.0, 110.0,
                  (j + m) % 30 != 0, to_timestamp(ended), 1000, FALSE, NULL
                  FROM r, range({metrics}) c(m) ORDER BY ended, m""")
    c.execute("""INSERT INTO alerts SELECT md5(test || run || metric_name), 'metric_out_of_bounds', test_name, run_id,
                 metric_name, metric_value, metric_lower_bound, metric_upper_bound,
                 metric_name || ' = ' || metric_value || ' is outside bounds (90, 110)', timestamp,
                 '{"threshold":"fixed","history_size":20,"previous_value":101.0}'
                 FROM metric_history JOIN r ON r.run = run_id AND r.test = test_name WHERE NOT within_bounds
                 ORDER BY timestamp, metric_name""")
    c.execute(f"""INSERT INTO metric_windows SELECT run, test, tag, 'count', w, 0, FALSE,
                  to_timestamp(ended - 900 + w * 40), to_timestamp(ended - 900 + w * 40 + 39), w * 100, w * 100 + 99,
                  100, 1.0 + w, 1.0 + w, 0.5, 2.0, 100.0 * (1 + w), 0.1, 1.0 + w, 1.5 + w, 1.9 + w, NULL, NULL
                  FROM r, (VALUES ('loss'), ('accuracy')) g(tag), range(20) h(w) WHERE j >= {runs - 10}
                  ORDER BY ended + w * 40, tag""")
    c.execute("""INSERT INTO dead_letter SELECT to_timestamp(1735689600 + i * 60), 'invalid message: reason ' || (i % 7),
                 '{"broken": ' || i, 'files', md5(i::VARCHAR) FROM range(1000) d(i)""")
    c.execute("CHECKPOINT")
    c.close()


def pages(path: str) -> Dict[str, str]:
    """A URL per page, on the newest rows of the middle test."""
    import urllib.parse

    import duckdb

    with duckdb.connect(path, read_only=True) as c:
        test = c.execute("SELECT test_name FROM job_history ORDER BY test_name LIMIT 1 OFFSET "
                         "(SELECT COUNT(DISTINCT test_name) / 2 FROM job_history)").fetchone()[0]
        alert, run = c.execute("SELECT alert_id, run_id FROM alerts WHERE test_name = ? "
                               "ORDER BY created_at DESC LIMIT 1", [test]).fetchone()
        letter = c.execute("SELECT dead_letter_id FROM dead_letter LIMIT 1").fetchone()[0]
    return {
        "alerts": "/alerts", "alerts page 5": "/alerts?page=5", "alerts of a test": "/alerts?test=" + test,
        "open alerts": "/alerts?state=open", "alert": f"/alerts/{alert}", "test": "/test?name=" + test,
        "run": "/run?" + urllib.parse.urlencode({"test": test, "run": run}), "tests": "/tests",
        "dead letters": "/dead-letters", "dead letter": f"/dead-letters/{letter}",
    }


def varied(path: str, urls: Dict[str, str]) -> Dict[str, Callable[[int], str]]:
    """For ``--vary``: the i-th request of each page that names an alert, a run or a test (the newest 2,000 alerts
    and their runs, every test); the other pages' one URL."""
    import urllib.parse

    import duckdb

    with duckdb.connect(path, read_only=True) as c:
        alerts = c.execute("SELECT alert_id, test_name, run_id FROM alerts ORDER BY created_at DESC "
                           "LIMIT 2000").fetchall()
        tests = [r[0] for r in c.execute("SELECT DISTINCT test_name FROM job_history ORDER BY 1").fetchall()]
    pick = {
        "alert": lambda i: f"/alerts/{alerts[i % len(alerts)][0]}",
        "run": lambda i: "/run?" + urllib.parse.urlencode({"test": alerts[i % len(alerts)][1],
                                                          "run": alerts[i % len(alerts)][2]}),
        "test": lambda i: "/test?name=" + tests[i % len(tests)],
        "alerts of a test": lambda i: "/alerts?test=" + tests[(i * 7) % len(tests)],
    }
    return {name: pick.get(name, lambda i, url=url: url) for name, url in urls.items()}


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process and every process below it (uvicorn's workers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)  # ppid, utime+stime
    tree, total = {pid}, 0.0
    for _ in range(4):  # uvicorn's processes are at most a few levels deep
        tree |= {p for p, (ppid, _) in stats.items() if ppid in tree}
    for p in tree:
        total += stats.get(p, (0, 0.0))[1]
    return total


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def alone(base: str, urls: Dict[str, Callable[[int], str]], requests: int, pid: int) -> Dict[str, Dict[str, float]]:
    import httpx

    out = {}
    with httpx.Client(base_url=base, timeout=60) as client:
        for name, url in urls.items():
            client.get(url(-1)).raise_for_status()  # warm
            times = []
            cpu = cpu_seconds(pid)
            for i in range(requests):
                started = time.perf_counter()
                client.get(url(i)).raise_for_status()
                times.append((time.perf_counter() - started) * 1000)
            out[name] = {"p50_ms": statistics.median(times), "p95_ms": percentile(times, 95),
                         "cpu_ms": (cpu_seconds(pid) - cpu) * 1000 / requests}
    return out


def load(base: str, urls: Dict[str, Callable[[int], str]], clients: int, seconds: float, pid: int,
         think: float = 0.0) -> dict:
    import httpx

    times: Dict[str, List[float]] = {name: [] for name in urls}
    errors: List[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client_loop(offset: int) -> None:
        names = list(urls)
        with httpx.Client(base_url=base, timeout=60) as client:
            i = offset
            while time.monotonic() < stop:
                name = names[i % len(names)]
                started = time.perf_counter()
                response = client.get(urls[name]((i // len(names)) * clients + offset))  # a client's own alerts, runs, tests
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    if response.status_code == 200:
                        times[name].append(elapsed)
                    else:
                        errors.append(f"{name}: {response.status_code}")
                i += 1
                if think:
                    time.sleep(think)

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(clients)]
    started, cpu = time.monotonic(), cpu_seconds(pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.monotonic() - started, cpu_seconds(pid) - cpu
    every = [t for ts in times.values() for t in ts]
    return {"clients": clients, "think_s": think, "seconds": wall, "requests": len(every), "errors": len(errors),
            "requests_per_s": len(every) / wall, "cpu_ms_per_request": cpu * 1000 / max(1, len(every) + len(errors)),
            "p50_ms": percentile(every, 50), "p95_ms": percentile(every, 95), "p99_ms": percentile(every, 99),
            "pages": {name: {"p50_ms": percentile(ts, 50), "p95_ms": percentile(ts, 95)}
                      for name, ts in times.items() if ts}}


def main(argv=None) -> int:
    p = StrictArgumentParser(description=__doc__.split("\n\n")[0], epilog=DASHES_NOTE)
    p.add_argument("--tests", type=int, default=100)
    p.add_argument("--runs", type=int, default=1000, help="runs per test")
    p.add_argument("--metrics", type=int, default=20, help="metrics per run")
    p.add_argument("--requests", type=int, default=40, help="requests of each page alone")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--workers", type=int, default=1, help="the dashboard's --workers")
    p.add_argument("--think", type=float, default=0.0, help="seconds each client waits after each answer (0: a "
                                                           "tight loop, the most load 20 clients can make; 1: "
                                                           "people clicking through pages)")
    p.add_argument("--vary", action="store_true", help="each request of an alert, run, test or a test's alerts "
                                                       "names another one (most are not kept from an earlier one)")
    p.add_argument("--out_dir", default="bench/out/dashboard")
    args = p.parse_args(argv)
    from tests.dashboard.support import served_process

    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, f"store-{args.tests}x{args.runs}x{args.metrics}-by-time.duckdb")
    if not os.path.isfile(path):
        started = time.perf_counter()
        build_store(path, args.tests, args.runs, args.metrics)
        print(f"built {path} in {time.perf_counter() - started:.1f} s", flush=True)
    urls = varied(path, pages(path)) if args.vary else {name: (lambda i, u=url: u) for name, url in pages(path).items()}
    with served_process(f"--local_store={os.path.abspath(path)}", f"--workers={args.workers}") as (base, process):
        results = {"store": {"tests": args.tests, "runs": args.tests * args.runs,
                             "metric_rows": args.tests * args.runs * args.metrics}, "workers": args.workers,
                   "vary": args.vary, "alone": alone(base, urls, args.requests, process.pid),
                   "load": load(base, urls, args.clients, args.seconds, process.pid, args.think)}
    think = f"-think-{args.think:g}" if args.think else ""
    name = f"results-{args.workers}-workers{'-varied' if args.vary else ''}{think}.json"
    with open(os.path.join(args.out_dir, name), "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'page':<18} {'alone p50':>10} {'alone p95':>10} {'alone CPU':>10} {'load p50':>10} {'load p95':>10}")
    for name, alone_ms in results["alone"].items():
        loaded = results["load"]["pages"].get(name, {})
        print(f"{name:<18} {alone_ms['p50_ms']:>8.1f}ms {alone_ms['p95_ms']:>8.1f}ms {alone_ms['cpu_ms']:>8.1f}ms "
              f"{loaded.get('p50_ms', 0):>8.1f}ms {loaded.get('p95_ms', 0):>8.1f}ms")
    load_result = results["load"]
    print(f"load: {load_result['clients']} clients (waiting {args.think:g} s after each answer), "
          f"{load_result['requests']} requests in "
          f"{load_result['seconds']:.1f} s ({load_result['requests_per_s']:.1f}/s), errors {load_result['errors']}, "
          f"p50 {load_result['p50_ms']:.1f} ms, p95 {load_result['p95_ms']:.1f} ms, p99 {load_result['p99_ms']:.1f} ms, "
          f"CPU {load_result['cpu_ms_per_request']:.1f} ms a request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
