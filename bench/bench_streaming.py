"""Streaming benchmark: alert latency and throughput of the streaming job on the local runner.

Everything real except the cloud: the in-process Pub/Sub server of the test
suite, bqemulator (BigQuery) in a child process, and the streaming job
(``pipeline.streaming.start_streaming``: ReadFromPubSub -> the graph ->
WriteToBigQuery + WriteToPubSub) on BundleBasedDirectRunner in this process.

1. Latency: one run at a time, a message of points, then ``run_finished``
   (event time = now, ``--run_grace_seconds=0``, status failure so that the
   run raises a ``job_failed`` alert). Latency = from publishing
   ``run_finished`` to the alert arriving at a real subscriber of the alerts
   topic. p50 and p95 of ``--samples`` runs.
2. Throughput: ``--runs`` runs (20 tests) of ``--messages_per_run`` messages
   of ``--points_per_message`` points, published at once, then their
   ``run_finished`` messages; points per second from the first publish until
   the last run's alert is on the alerts topic (every run also writes its job
   and metric rows to BigQuery).

    python bench/bench_streaming.py [--samples 30] [--runs 100] [--messages_per_run 10] [--points_per_message 100]

Writes bench/out/streaming.json.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from google.cloud import pubsub_v1  # noqa: E402

from pipeline.streaming import start_streaming  # noqa: E402
from scripts.publish_demo import publish  # noqa: E402
from tests.servers.bigquery import BigQueryEmulator  # noqa: E402
from tests.servers.pubsub import PubSubServer  # noqa: E402
from trainguard import wire  # noqa: E402
from trainguard.cli import DASHES_NOTE, StrictArgumentParser  # noqa: E402

CONFIG = {
    "//": "Every metric recorded with four aggregations and a bound; every failed run alerts.",
    "metric_collection_config": {"default_aggregation_strategies": ["final", "min", "max", "average"]},
    "regression_test_config": {
        "metric_success_conditions": {"default": {"comparison": "less", "success_threshold": {"fixed_value": 1e9}}},
        "alert_after_second_test_failure": False}}
TAGS = ("loss", "Accuracy/test", "throughput/examples_per_sec")


def points(count: int, start: float) -> List[Dict]:
    return [wire.point_dict(TAGS[i % len(TAGS)], 1.0 + i, start + i * 1e-3, i // len(TAGS)) for i in range(count)]


def finished(at: float) -> Dict:
    return wire.event_dict(wire.RUN_FINISHED, at, {"status": "failure", "num_failures": 1})


class AlertClock:
    """A real subscriber on the alerts topic, noting when each run's alert arrives."""

    def __init__(self, subscription: str):
        self.arrived: Dict[str, float] = {}
        self._cond = threading.Condition()
        self._future = pubsub_v1.SubscriberClient().subscribe(subscription, self._receive)

    def _receive(self, message) -> None:
        now = time.perf_counter()
        message.ack()
        with self._cond:
            self.arrived.setdefault(message.attributes["run"], now)
            self._cond.notify_all()

    def wait_for(self, runs, timeout: float = 120.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: all(r in self.arrived for r in runs), timeout):
                missing = [r for r in runs if r not in self.arrived]
                raise TimeoutError(f"no alert for {len(missing)} runs, e.g. {missing[:3]}")

    def close(self) -> None:
        self._future.cancel()
        self._future.result(timeout=30)


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_latency(publisher, topic: str, alerts: AlertClock, samples: int, prefix: str) -> List[float]:
    latencies = []
    for i in range(samples):
        run = f"{prefix}-{i:03d}"
        now = time.time()
        publish(publisher, topic, [wire.encode_message("bench-latency", run, points(30, now - 1),
                                                       [wire.event_dict(wire.RUN_STARTED, now - 1)])])
        payload = wire.encode_message("bench-latency", run, events=[finished(time.time())])
        sent = time.perf_counter()
        publish(publisher, topic, [payload])
        alerts.wait_for([run])
        latencies.append(alerts.arrived[run] - sent)
        time.sleep(0.2)  # runs one after another, not a backlog
    return latencies


def wait_until_pulled(server, subscription: str) -> None:
    while True:
        stats = server.subscription_stats(subscription)
        if stats.backlog == 0 and stats.outstanding == 0:
            return
        time.sleep(0.02)


def measure_throughput(publisher, server, topic: str, subscription: str, alerts: AlertClock, runs: int,
                       messages_per_run: int, points_per_message: int) -> Dict:
    """Points of every run first (as trainers stream them), then each run's ``run_finished``.

    The ``run_finished`` messages go out once every point has been pulled: the
    local runner's watermark is the wall clock, so a point pulled after its
    run's end (+ grace) would be late. (On Dataflow the watermark follows the
    ``ts`` attribute and the order of publishing does not matter.)
    """
    now = time.time()
    names = [f"throughput-{i:04d}" for i in range(runs)]
    tests = [f"bench-throughput-{i % 20:02d}" for i in range(runs)]
    point_payloads = [
        wire.encode_message(test, run, points(points_per_message, now + m),
                            [wire.event_dict(wire.RUN_STARTED, now - 1)] if m == 0 else [], message_id=f"{run}/{m}")
        for m in range(messages_per_run) for test, run in zip(tests, names)]
    finish_payloads = [wire.encode_message(test, run, events=[finished(now + messages_per_run)])
                       for test, run in zip(tests, names)]
    started = time.perf_counter()
    publish(publisher, topic, point_payloads)
    wait_until_pulled(server, subscription)
    points_pulled = time.perf_counter() - started
    publish(publisher, topic, finish_payloads)
    alerts.wait_for(names, timeout=1800)
    seconds = max(alerts.arrived[r] for r in names) - started
    total_points = runs * messages_per_run * points_per_message
    messages = len(point_payloads) + len(finish_payloads)
    return {"runs": runs, "points": total_points, "messages": messages, "points_per_message": points_per_message,
            "seconds_until_all_points_pulled": round(points_pulled, 2), "seconds": round(seconds, 2),
            "points_per_second": round(total_points / seconds), "messages_per_second": round(messages / seconds, 1)}


def main() -> None:
    parser = StrictArgumentParser(description=__doc__.replace("``", ""), epilog=DASHES_NOTE)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--messages_per_run", type=int, default=10)
    parser.add_argument("--points_per_message", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "streaming.json"))
    args = parser.parse_args()

    configs = tempfile.mkdtemp(prefix="trainguard-bench-configs-")
    with open(os.path.join(configs, "default.json"), "w") as f:
        json.dump(CONFIG, f)
    with BigQueryEmulator() as bigquery, PubSubServer() as server:
        os.environ["PUBSUB_EMULATOR_HOST"] = server.host
        os.environ["no_grpc_proxy"] = "127.0.0.1,localhost"  # noqa: SIM112 - gRPC reads the lower-case name
        publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        topic = publisher.create_topic(name=server.topic_path("metrics")).name
        alerts_topic = publisher.create_topic(name=server.topic_path("alerts")).name
        subscription = subscriber.create_subscription(name=server.subscription_path("pipeline"), topic=topic).name
        alerts_subscription = subscriber.create_subscription(
            name=server.subscription_path("alerts"), topic=alerts_topic).name
        alerts = AlertClock(alerts_subscription)
        result = start_streaming([
            "--streaming", f"--input_subscription={subscription}", f"--alerts_topic={alerts_topic}",
            f"--config_dir={configs}", f"--bigquery_project={bigquery.project}", "--bigquery_dataset=bench",
            f"--bigquery_endpoint={bigquery.endpoint}", "--run_grace_seconds=0"])
        try:
            measure_latency(publisher, topic, alerts, 3, "warm-up")
            latencies = measure_latency(publisher, topic, alerts, args.samples, "latency")
            throughput = measure_throughput(publisher, server, topic, subscription, alerts, args.runs,
                                            args.messages_per_run, args.points_per_message)
        finally:
            result.cancel()
            alerts.close()

    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        "date": time.strftime("%Y-%m-%d"),
        "runner": "BundleBasedDirectRunner (--streaming), in-process Pub/Sub server, bqemulator",
        "latency_seconds": {"samples": len(latencies), "p50": round(statistics.median(latencies), 3),
                            "p95": round(percentile(latencies, 0.95), 3), "max": round(max(latencies), 3),
                            "min": round(min(latencies), 3), "each": [round(x, 3) for x in latencies]},
        "throughput": throughput,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    lat, thr = report["latency_seconds"], throughput
    print(f"alert latency (publish run_finished -> alert received), {lat['samples']} runs: "
          f"p50 {lat['p50']:.2f} s, p95 {lat['p95']:.2f} s, max {lat['max']:.2f} s")
    print(f"throughput: {thr['points']:,} points in {thr['runs']} runs in {thr['seconds']:.1f} s: "
          f"{thr['points_per_second']:,} points/s ({thr['messages_per_second']} messages/s)")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
