"""Benchmark of the trainer-side publisher: hot-path cost and wire efficiency.

Runs against the in-process Pub/Sub server of the test suite (real
google-cloud-pubsub client, real gRPC on loopback)::

    .venv/bin/python bench/bench_publisher.py            # ~6 minutes
    .venv/bin/python bench/bench_publisher.py --quick    # smoke run

Reports (and writes to bench/out/publisher.json):

1. ``add_value`` cost without a network, for reference: the real torchelastic
   (``torch.distributed.elastic.metrics`` with its ``NullMetricHandler``) when
   torch is importable (the row is skipped, and the output says so,
   otherwise); trainguard.metrics' torchelastic-compatible path (a
   ``MetricData`` per value, our re-implementation of torchelastic's API) into
   a NullMetricHandler and into a handler that appends to a list; and our
   fast path into a handler whose background thread is not draining.
   torchelastic's ``add_value(name, value)`` takes no step, so it is called
   without one; trainguard's fast path is measured both with and without.
2. ``add_value`` through ``PubSubMetricHandler`` while it publishes, under a
   steady load shaped like a training loop: each step releases the GIL (as
   CUDA/NCCL calls and numpy do) and then logs a few metrics. The same load
   goes through an empty function, the real torchelastic into its
   NullMetricHandler (when torch is importable; its held stream and its
   ``put_metric``) and trainguard's compatible path into a NullMetricHandler,
   for comparison; trainguard publishes through a held stream and through
   ``put_metric``, and through a held stream whose background thread is
   woken for each full message (``PublisherConfig(messages_per_wake=1)``)
   instead of every 4, the default. At 100,000 points/s the rows run
   ``--rounds`` times in turn and each gives its median round. Every call is
   timed (``perf_counter_ns``, its own overhead subtracted): mean (the
   amortized cost), p50/p99/p99.9/max, and the process CPU spent per point
   including the background thread's encoding and publishing. The lateness
   of each step's start (p99, max) shows how long the training thread waits
   for the GIL after its pause, i.e. what the background thread costs it
   outside ``add_value``.
3. The first batch of a new handler, in a fresh interpreter that imports
   only trainguard (as a training job does): 20,000 points/s for 0.3 s right
   after creating a ``PubSubMetricHandler``, so that its first message goes
   out while the training thread logs. The longest ``add_value`` and the
   latest step start (waiting for the GIL included), median and worst of
   the repeats: this is where building the Pub/Sub client used to stall
   training for 12-18 ms.
4. A tight loop with no pause (saturation): calls/s the training thread can
   make, and points/s the background thread sustains before the buffer drops.
5. Encoding alone, v1 point objects against v1.1 columns (``PublisherConfig.schema``): CPU per point
   (``time.process_time``) and bytes per point of the payload at 1,000 points per message, for a
   training loop's batch (5 tags every step, float32 losses, steps counting up, times 0.2 ms apart);
   v1.1 also from the flat list the handler's intake hands over (``MessageEncoder.encode_flat``),
   with orjson/msgspec where importable and without them.
6. Wire efficiency against the naive one-message-per-point design (one
   ``wire.encode_message`` per point, published with the client's default
   batching): bytes of PublishRequest per point and Publish RPCs per 1,000
   points, counted by a gRPC client interceptor.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import grpc  # noqa: E402
from google.cloud import pubsub_v1  # noqa: E402
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport  # noqa: E402

import trainguard as tg  # noqa: E402
from trainguard import wire  # noqa: E402
from trainguard.cli import DASHES_NOTE, StrictArgumentParser  # noqa: E402
from trainguard.metrics.api import MetricData, MetricHandler, MetricStream, NullMetricHandler  # noqa: E402

TAGS = ["loss", "lr", "grad_norm", "throughput", "step_time_ms"]


def load_torchelastic():
    """``torch.distributed.elastic.metrics`` and torch's version, or (None, why not)."""
    try:
        import torch
        from torch.distributed.elastic import metrics
    except Exception as e:  # noqa: BLE001 - any failure to import means: no torchelastic row
        return None, f"{type(e).__name__}: {e}"
    return metrics, torch.__version__


def torchelastic_null_stream(metrics):
    """A real torchelastic stream whose group is configured with torchelastic's NullMetricHandler."""
    metrics.configure(metrics.NullMetricHandler(), "g")
    return metrics.getStream("g")


def torchelastic_null_put_metric(metrics):
    """``add_value`` through torchelastic's ``put_metric`` into its NullMetricHandler."""
    metrics.configure(metrics.NullMetricHandler(), "g")
    return put_metric_adder(metrics.put_metric, "g", False)


def put_metric_adder(put_metric, group: str, with_step: bool):
    """``add_value(name, value[, step])`` through ``put_metric(name, value, group[, step])``: the module-level
    call, which looks the group's stream up at each value (torchelastic's takes no step)."""
    if with_step:
        def add_value(metric_name, metric_value, step=None):
            put_metric(metric_name, metric_value, group, step)
    else:
        def add_value(metric_name, metric_value, step=None):
            put_metric(metric_name, metric_value, group)
    return add_value


def install() -> Dict[str, Any]:
    """What this process runs on: where trainguard is imported from, and the optional writers it finds (the
    trainer install, ``pip install ./trainer``, brings orjson and numpy; the pipeline's brings Beam too)."""
    import importlib.util

    from trainguard import encoding

    found = {name: importlib.util.find_spec(name) is not None
             for name in ("numpy", "orjson", "msgspec", "apache_beam", "torch")}
    return {"trainguard": os.path.dirname(tg.__file__), "python": sys.executable, "importable": found,
            "compiled_number_writer": getattr(encoding.compiled_dumps, "__module__", None),
            "float32_writer": encoding.float32_dumps is not None}


SERVER_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.servers.pubsub import PubSubServer
with PubSubServer() as server:
    print(server.host, flush=True)
    sys.stdin.read()
"""


class ServerProcess:
    """The in-process Pub/Sub server of the tests, run in its own process so that
    the trainer process's CPU time is the trainer's alone."""

    def __enter__(self) -> ServerProcess:
        self.process = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, ROOT], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.host = self.process.stdout.readline().strip()
        return self

    def topic_path(self, topic: str) -> str:
        return f"projects/bench/topics/{topic}"

    def __exit__(self, *exc_info) -> None:
        self.process.stdin.close()
        self.process.wait(30)


class ListHandler(MetricHandler):
    def __init__(self) -> None:
        self.items: List[MetricData] = []

    def emit(self, metric_data: MetricData) -> None:
        self.items.append(metric_data)


class CountingInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Counts Publish RPCs and the bytes of their requests."""

    def __init__(self) -> None:
        self.requests = 0
        self.request_bytes = 0
        self.lock = threading.Lock()

    def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.method.endswith("/Publish"):
            # a plain protobuf request (trainguard's transport) or a proto-plus one (the client's own publish)
            serialize = getattr(request, "SerializeToString", None)
            size = len(serialize() if serialize is not None else type(request).serialize(request))
            with self.lock:
                self.requests += 1
                self.request_bytes += size
        return continuation(client_call_details, request)


def counting_client(host: str, interceptor: CountingInterceptor, batch_settings=None):
    channel = grpc.intercept_channel(grpc.insecure_channel(host), interceptor)
    transport = PublisherGrpcTransport(channel=channel)
    if batch_settings is None:
        return pubsub_v1.PublisherClient(transport=transport)
    return pubsub_v1.PublisherClient(batch_settings=batch_settings, transport=transport)


def timer_overhead_ns(samples: int = 200_000) -> float:
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(samples):
        start = clock()
        deltas.append(clock() - start)
    return statistics.median(deltas)


def tight_loop_ns(add_value, calls: int, with_step: bool = True) -> float:
    """Mean ns per call of a plain loop of add_value calls (loop overhead subtracted)."""
    names = TAGS
    start = time.perf_counter_ns()
    if with_step:
        for i in range(calls):
            add_value(names[i % 5], 0.5, i)
    else:
        for i in range(calls):
            add_value(names[i % 5], 0.5)
    elapsed = time.perf_counter_ns() - start
    start = time.perf_counter_ns()
    for i in range(calls):
        names[i % 5]
    empty = time.perf_counter_ns() - start
    return (elapsed - empty) / calls


def percentiles(values: List[float]) -> Dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)

    def at(q: float) -> float:
        return ordered[min(n - 1, int(q * n))]

    return {"mean": sum(ordered) / n, "p50": at(0.50), "p99": at(0.99), "p99.9": at(0.999), "max": ordered[-1]}


def steady_load(add_value, rate: int, seconds: float, per_step: int, overhead: float,
                with_step: bool = True) -> Dict[str, Any]:
    """Training-loop-shaped load: each step sleeps (GIL released, as while the
    GPU works), then logs ``per_step`` values, every call timed (without a
    step for torchelastic, whose ``add_value`` takes none)."""
    clock = time.perf_counter_ns
    step_period = per_step / rate
    steps = int(seconds / step_period)
    durations: List[int] = []
    record = durations.append
    names = TAGS
    gc.collect()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    lateness: List[float] = []
    next_step = time.perf_counter()
    for step in range(steps):
        lateness.append(time.perf_counter() - next_step)  # includes waiting for the GIL after the pause
        if with_step:
            for k in range(per_step):
                start = clock()
                add_value(names[k % 5], 0.001 * k, step)
                record(clock() - start)
        else:
            for k in range(per_step):
                start = clock()
                add_value(names[k % 5], 0.001 * k)
                record(clock() - start)
        next_step += step_period
        pause = next_step - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    calls = len(durations)
    result: Dict[str, Any] = {"calls": calls, "achieved_rate_per_s": round(calls / wall),
                              "process_cpu_us_per_call": round(cpu * 1e6 / calls, 3)}
    result.update({f"{k}_us": round(max(v - overhead, 0) / 1000, 3)
                   for k, v in percentiles([float(d) for d in durations]).items()})
    late = percentiles([max(x, 0.0) * 1e6 for x in lateness])
    result.update(step_late_p99_us=round(late["p99"], 1), step_late_max_us=round(late["max"], 1))
    return result


def steady_load_comparison(server: ServerProcess, topic: str, rate: int, per_step: int, seconds: float,
                           overhead: float, torchelastic, rounds: int = 1) -> Dict[str, Any]:
    """The same load through an empty function, the real torchelastic into its NullMetricHandler (held stream
    and ``put_metric``, if torch is importable), trainguard's compatible path into a NullMetricHandler, and
    PubSubMetricHandler publishing (held stream and ``put_metric``), ``rounds`` times in turn: each row is its
    median round by process CPU (the CPU of one round moves by 20% and more on this shared machine, the same
    for every row of that round), with every round's figure beside it."""

    def noop(metric_name, metric_value, step=None):
        pass

    def publishing(name: str, through_put_metric: bool, config: Optional[tg.PublisherConfig] = None):
        handler = tg.PubSubMetricHandler(topic, "bench", name, config)  # its thread creates the client now
        handler.flush(timeout=30)
        if not through_put_metric:
            return handler, MetricStream("train", handler).add_value
        tg.configure(handler, "bench-steady")
        return handler, put_metric_adder(tg.put_metric, "bench-steady", True)

    rows: Dict[str, Any] = {"empty_function": lambda r: (None, noop, True)}
    if torchelastic is not None:
        rows["torchelastic_null_handler"] = lambda r: (None, torchelastic_null_stream(torchelastic).add_value, False)
        rows["torchelastic_put_metric_null_handler"] = lambda r: (None, torchelastic_null_put_metric(torchelastic),
                                                                  False)
    rows["trainguard_compat_path_null_handler"] = lambda r: (None, MetricStream("g", NullMetricHandler()).add_value,
                                                             True)
    rows["trainguard_pubsub_handler"] = lambda r: (*publishing(f"steady-{rate}-{r}", False), True)
    rows["trainguard_pubsub_handler_one_message_a_wake"] = lambda r: (
        *publishing(f"steady-one-{rate}-{r}", False, tg.PublisherConfig(messages_per_wake=1)), True)
    rows["trainguard_put_metric_pubsub_handler"] = lambda r: (*publishing(f"steady-put-{rate}-{r}", True), True)

    measured: Dict[str, List[Dict[str, Any]]] = {name: [] for name in rows}
    for r in range(rounds):
        for name, make in rows.items():
            handler, add_value, with_step = make(r)
            result = steady_load(add_value, rate, seconds, per_step, overhead, with_step=with_step)
            if handler is not None:
                cpu0 = time.process_time()
                result["all_delivered"] = handler.flush(timeout=60)
                result["flush_cpu_ms"] = round((time.process_time() - cpu0) * 1000, 1)
                stats = handler.stats()
                handler.close()
                result.update(points_delivered=stats.points_delivered, points_dropped=stats.points_dropped,
                              messages=stats.messages_delivered)
            measured[name].append(result)
    out: Dict[str, Any] = {"rate_per_s": rate, "per_step": per_step, "rounds": rounds}
    for name, results in measured.items():
        ordered = sorted(results, key=lambda result: result["process_cpu_us_per_call"])
        row = dict(ordered[(len(ordered) - 1) // 2])
        row["process_cpu_us_per_call_rounds"] = [result["process_cpu_us_per_call"] for result in results]
        out[name] = row
    empty = out["empty_function"]["process_cpu_us_per_call"]
    for name in rows:
        if name != "empty_function":
            out[name]["added_process_cpu_us_per_point"] = round(out[name]["process_cpu_us_per_call"] - empty, 3)
    return out


FIRST_BATCH_SCRIPT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import trainguard as tg   # and nothing else: a fresh training process, Pub/Sub modules not imported yet
handler = tg.PubSubMetricHandler(sys.argv[2], "bench", "first-batch")
time.sleep(0.05)  # the rest of the job's setup
add_value = tg.MetricStream("train", handler).add_value
clock = time.perf_counter_ns
worst_call = worst_late = 0
next_step = time.perf_counter()
for step in range(300):  # 20 values per 1 ms step: the first messages (4 a wake) go out after 200 steps
    worst_late = max(worst_late, time.perf_counter() - next_step)
    for k in range(20):
        start = clock()
        add_value("loss", 0.001 * k, step)
        worst_call = max(worst_call, clock() - start)
    next_step += 0.001
    pause = next_step - time.perf_counter()
    if pause > 0:
        time.sleep(pause)
delivered = handler.flush(timeout=30)
print(json.dumps({"max_add_value_us": worst_call / 1000, "step_late_max_us": worst_late * 1e6,
                  "all_delivered": delivered}))
"""


def first_batch(server: ServerProcess, topic: str, repeats: int) -> Dict[str, Any]:
    """The training thread's worst moments around a new handler's first batch, each repeat in a
    fresh interpreter (so that, as in a training job, nothing of the Pub/Sub client is loaded yet)."""
    runs = []
    for _ in range(repeats):
        output = subprocess.run([sys.executable, "-c", FIRST_BATCH_SCRIPT, ROOT, topic], check=True,
                                capture_output=True, text=True, env=dict(os.environ, PUBSUB_EMULATOR_HOST=server.host),
                                timeout=120).stdout
        runs.append(json.loads(output))
    out: Dict[str, Any] = {"repeats": repeats, "all_delivered": all(run["all_delivered"] for run in runs)}
    for key in ("max_add_value_us", "step_late_max_us"):
        values = [run[key] for run in runs]
        out[key] = {"median": round(statistics.median(values), 1), "max": round(max(values), 1)}
    return out


def saturation(server: ServerProcess, topic: str, calls: int) -> Dict[str, Any]:
    handler = tg.PubSubMetricHandler(topic, "bench", "saturation", tg.PublisherConfig(max_buffered_points=100_000))
    add_value = MetricStream("train", handler).add_value
    start = time.perf_counter()
    per_call = tight_loop_ns(add_value, calls)
    produced = time.perf_counter() - start
    handler.flush(timeout=120)
    drained = time.perf_counter() - start
    stats = handler.stats()
    handler.close()
    return {"calls": calls, "ns_per_call_in_tight_loop": round(per_call, 1),
            "calls_per_s": round(calls / produced), "points_delivered": stats.points_delivered,
            "points_dropped_buffer_full": stats.points_dropped_buffer_full,
            "background_points_per_s": round(stats.points_delivered / drained)}


def training_batch(start: int, n: int = 1000) -> List[Any]:
    """Points as a training loop logs them: float32 values (``loss.item()``), 5 tags a step, 0.2 ms apart."""
    from array import array

    points = []
    for i in range(start, start + n):
        step, k = divmod(i, 5)
        value = 2.5 / (1 + 0.001 * step) + 0.01 * ((i * 7919) % 101) + k
        points.append((TAGS[k], array("f", (value,))[0], step, 1763700000.0 + 0.0002 * i))
    return points


def encoding(batches: int) -> Dict[str, Any]:
    """CPU and bytes per point of the background encoder, per wire schema."""
    from trainguard import encoding as encoder_module
    from trainguard.encoding import MessageEncoder

    data = [training_batch(j * 1000) for j in range(batches)]
    out: Dict[str, Any] = {}
    for schema in wire.SCHEMAS:
        encoder = MessageEncoder("bench", "encoding", schema=schema)
        encoder.encode(data[0])
        cpu0 = time.process_time()
        size = sum(len(m.payload) for batch in data for m in encoder.encode(batch))
        cpu = time.process_time() - cpu0
        out[schema] = {"cpu_us_per_point": round(cpu * 1e6 / (1000 * batches), 3),
                       "bytes_per_point": round(size / (1000 * batches), 1)}
    # What the handler's background thread does: the points as its intake holds them, flat (four entries a point),
    # values and times known to be floats (``Intake.all_floats``); and the same without orjson or msgspec (a
    # trainer install without them: %-formatting writes the number lists)
    flat = [[entry for point in batch for entry in point] for batch in data]
    for name, compiled in (("", encoder_module.compiled_dumps), (", without orjson/msgspec", None)):
        saved, encoder_module.compiled_dumps = encoder_module.compiled_dumps, compiled
        try:
            encoder = MessageEncoder("bench", "encoding", schema=wire.SCHEMA_V1_1)
            encoder.encode_flat(flat[0], floats=True)
            cpu0 = time.process_time()
            size = sum(len(m.payload) for batch in flat for m in encoder.encode_flat(batch, floats=True))
            cpu = time.process_time() - cpu0
        finally:
            encoder_module.compiled_dumps = saved
        out[f"{wire.SCHEMA_V1_1} flat (the handler's path){name}"] = {
            "cpu_us_per_point": round(cpu * 1e6 / (1000 * batches), 3),
            "bytes_per_point": round(size / (1000 * batches), 1)}
    return out


def wire_efficiency(server: ServerProcess, topic: str, rate: int, points: int) -> Dict[str, Any]:
    period = 1.0 / rate
    ours_counter = CountingInterceptor()
    handler = tg.PubSubMetricHandler(topic, "bench", f"wire-{rate}", client_factory=lambda: counting_client(
        server.host, ours_counter, pubsub_v1.types.BatchSettings(max_bytes=4 << 20, max_latency=0.005,
                                                                 max_messages=100)))
    add_value = MetricStream("train", handler).add_value
    naive_counter = CountingInterceptor()
    naive = counting_client(server.host, naive_counter)
    futures = []
    next_at = time.perf_counter()
    for i in range(points):
        tag = TAGS[i % 5]
        add_value(tag, 0.001 * i, i)
        now = time.time()
        message_id = wire.new_message_id()
        payload = wire.encode_message("bench", f"naive-{rate}", [wire.point_dict(tag, 0.001 * i, now, i)],
                                      message_id=message_id)
        attributes = wire.message_attributes("bench", f"naive-{rate}", int(now * 1000), message_id)
        futures.append(naive.publish(topic, payload, **attributes))
        next_at += period
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    handler.flush(timeout=60)
    for future in futures:
        future.result(timeout=60)
    handler.close()
    naive.stop()
    stats = handler.stats()
    assert stats.points_delivered == points, stats
    return {
        "rate_per_s": rate, "points": points,
        "batched": {"publish_requests_per_1000_points": round(ours_counter.requests * 1000 / points, 2),
                    "request_bytes_per_point": round(ours_counter.request_bytes / points, 1),
                    "messages": stats.messages_delivered},
        "naive_one_message_per_point": {
            "publish_requests_per_1000_points": round(naive_counter.requests * 1000 / points, 2),
            "request_bytes_per_point": round(naive_counter.request_bytes / points, 1),
            "messages": points},
    }


def main() -> None:
    parser = StrictArgumentParser(description=__doc__.split("\n")[0], epilog=DASHES_NOTE)
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the 100,000 points/s comparison, its rows in turn (default: 5; --quick: 1)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    scale = 0.1 if args.quick else 1.0
    results: Dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "platform": platform.platform()},
                               "date": time.strftime("%Y-%m-%d"), "install": install()}
    overhead = timer_overhead_ns()
    results["timer_overhead_ns"] = overhead

    torchelastic, torch_version = load_torchelastic()
    if torchelastic is None:
        print(f"torchelastic rows skipped: torch is not importable ({torch_version})", file=sys.stderr)
        results["torchelastic"] = {"skipped": f"torch is not importable ({torch_version})"}
    else:
        results["torchelastic"] = {"torch": torch_version}

    calls = int(1_000_000 * scale)
    reference: Dict[str, float] = {}
    if torchelastic is not None:
        reference["torchelastic_null_handler_no_step_ns"] = tight_loop_ns(
            torchelastic_null_stream(torchelastic).add_value, calls, with_step=False)
    reference["trainguard_compat_path_null_handler_ns"] = tight_loop_ns(
        MetricStream("g", NullMetricHandler()).add_value, calls)
    reference["trainguard_compat_path_list_handler_ns"] = tight_loop_ns(MetricStream("g", ListHandler()).add_value,
                                                                        calls)
    # A handler that does not know its run yet keeps everything buffered: the hot path alone.
    os.environ.pop("TRAINGUARD_TEST", None)
    os.environ.pop("TRAINGUARD_RUN", None)
    idle = tg.JsonlMetricHandler(os.devnull, config=tg.PublisherConfig(max_buffered_points=calls + 1))
    reference["trainguard_fast_path_no_draining_ns"] = tight_loop_ns(MetricStream("g", idle).add_value, calls)
    idle.intake.drop_all(count=False)
    reference["trainguard_fast_path_no_draining_no_step_ns"] = tight_loop_ns(MetricStream("g", idle).add_value,
                                                                             calls, with_step=False)
    idle.intake.drop_all(count=False)
    idle.close(timeout=0)
    results["reference_no_network"] = {k: round(v, 1) for k, v in reference.items()}
    results["encoding"] = encoding(20 if args.quick else 200)
    gc.collect()

    with ServerProcess() as server:
        os.environ["PUBSUB_EMULATOR_HOST"] = server.host
        topic = server.topic_path("bench")
        pubsub_v1.PublisherClient().create_topic(name=topic)

        results["steady_load"] = [
            steady_load_comparison(server, topic, rate, per_step, seconds * scale, overhead, torchelastic,
                                   rounds if rate == 100_000 else 1)
            for rate, per_step, seconds in ((1_000, 10, 15.0), (20_000, 20, 10.0), (100_000, 50, 10.0))]
        results["first_batch"] = first_batch(server, topic, 3 if args.quick else 10)
        results["saturation"] = saturation(server, topic, int(2_000_000 * scale))
        results["wire"] = [wire_efficiency(server, topic, rate, int(n * scale))
                           for rate, n in ((10_000, 20_000), (200, 2_000))]

    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "publisher.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
