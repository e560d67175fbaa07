"""Publishes a demo workload to a Pub/Sub topic, as trainers would: wire messages with their attributes.

The workload is ``pipeline.demo``'s four tests (a regression, failures, a run
that never finishes, a record-only test) re-timed to start now: run N of each
test starts ``N * --run_spacing_seconds`` after the first, and each step takes
``--step_seconds`` of event time, so the whole story plays out in minutes of
event time instead of days. Every message carries the attributes of the wire
contract (``schema``, ``test``, ``run`` and ``ts``, its event time), plus
``id`` (the payload's id) for ``--pubsub_id_attribute=id`` on Dataflow.

    python scripts/publish_demo.py --topic=projects/my-project/topics/trainguard-metrics

Honours ``PUBSUB_EMULATOR_HOST`` like every Pub/Sub client. The local runner's
watermark is the wall clock, so event times are placed ``--lead_seconds`` in the
future: runs finalize as the clock passes their end (+ ``--run_grace_seconds``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Dict, Iterable, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.demo import RunPlan, demo_plans, run_messages
from trainguard import wire
from trainguard.cli import DASHES_NOTE, RUNTIME_ERROR, HelpFormatter, StrictArgumentParser, cloud_failure, fail

PROG = "publish_demo.py"


def message_attributes(payload: bytes) -> Dict[str, str]:
    """The Pub/Sub attributes of one wire message (wire contract v1)."""
    message = json.loads(payload)
    ts = wire.event_time_millis(message.get("points", ()), message.get("events", ()))
    return wire.message_attributes(message["test"], message["run"], ts, message["id"])


def publish(publisher, topic: str, payloads: Iterable[bytes], rate: Optional[float] = None,
            attributes=message_attributes, timeout_seconds: float = 60.0) -> List[str]:
    """Publishes wire payloads with their attributes (at most ``rate`` per second); returns the message ids.
    Every message must be taken within ``timeout_seconds`` after the last one was handed over (TimeoutError)."""
    futures = []
    started = time.monotonic()
    for index, payload in enumerate(payloads):
        if rate:
            delay = started + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        futures.append(publisher.publish(topic, payload, **attributes(payload)))
    deadline = time.monotonic() + timeout_seconds
    return [future.result(timeout=max(0.0, deadline - time.monotonic())) for future in futures]


def retimed_plans(start: float, run_spacing_seconds: float, step_seconds: float) -> List[RunPlan]:
    """The demo plans with run N of each test starting at ``start + N * run_spacing_seconds``."""
    plans = []
    for test_plans in demo_plans().values():
        for index, plan in enumerate(test_plans):
            plans.append(dataclasses.replace(plan, start=float(start + index * run_spacing_seconds),
                                             step_seconds=step_seconds))
    return plans


def demo_payloads(start: float, run_spacing_seconds: float, step_seconds: float,
                  points_per_message: int = 100) -> List[bytes]:
    """Every message of the re-timed demo, ordered by event time (as live trainers would send them)."""
    payloads = [m for plan in retimed_plans(start, run_spacing_seconds, step_seconds)
                for m in run_messages(plan, points_per_message)]
    return sorted(payloads, key=lambda p: int(message_attributes(p)[wire.ATTR_TS]))


def main(argv=None) -> int:
    parser = StrictArgumentParser(prog=PROG, description=__doc__.replace("``", ""), formatter_class=HelpFormatter,
                                  epilog=DASHES_NOTE)
    parser.add_argument("--topic", required=True, help="projects/<project>/topics/<topic> to publish to")
    parser.add_argument("--start", type=float, default=None,
                        help="Event time (unix seconds) of the first run's start. Default: now + --lead_seconds")
    parser.add_argument("--lead_seconds", type=float, default=30.0,
                        help="With the default --start: how far in the future the first run starts")
    parser.add_argument("--run_spacing_seconds", type=float, default=60.0,
                        help="Event time between the starts of consecutive runs of a test")
    parser.add_argument("--step_seconds", type=float, default=0.05, help="Event time per training step")
    parser.add_argument("--rate", type=float, default=None, help="Messages per second (default: as fast as possible)")
    parser.add_argument("--timeout_seconds", type=float, default=60.0,
                        help="How long Pub/Sub may take to accept the messages once all are handed over")
    args = parser.parse_args(argv)

    from google.cloud import pubsub_v1

    start = args.start if args.start is not None else time.time() + args.lead_seconds
    payloads = demo_payloads(start, args.run_spacing_seconds, args.step_seconds)
    try:
        ids = publish(pubsub_v1.PublisherClient(), args.topic, payloads, args.rate,
                      timeout_seconds=args.timeout_seconds)
    except TimeoutError:
        return fail(PROG, f"{args.topic} took not every message within {args.timeout_seconds:g} s: is Pub/Sub (or "
                          "PUBSUB_EMULATOR_HOST) reachable?", RUNTIME_ERROR)
    except Exception as e:
        line = cloud_failure(e)
        if line is None:
            raise
        return fail(PROG, line, RUNTIME_ERROR)
    print(f"published {len(ids)} messages to {args.topic}; event times from {start:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
