"""trainguard, trainer side: publish training metrics and events (wire contract v1).

``import trainguard`` is cheap: the metrics API is loaded at once (standard
library only); handlers, ``Stat``, ``Run``, the shipper and system metrics are
imported on first use, so Pub/Sub, TensorBoard and psutil are only imported
by programs that use them.

::

    import trainguard as tg

    tg.configure(tg.PubSubMetricHandler("projects/p/topics/metrics"))
    with tg.Run("resnet50-nightly", "2026-11-21.3"):
        stream = tg.getStream("train")
        for step in range(1000):
            stream.add_value("loss", loss, step=step)
"""

import importlib
from typing import Any

from .metrics.api import (
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricsConfig,
    MetricStream,
    NullMetricHandler,
    UnconfiguredGroupWarning,
    configure,
    get_elapsed_time_ms,
    get_handler,
    getStream,
    log_event,
    prof,
    profile,
    publish_metric,
    put_metric,
)

_LAZY = {
    "PublisherConfig": "handlers",
    "HandlerStats": "handlers",
    "WireHandler": "handlers",
    "JsonlMetricHandler": "handlers",
    "PubSubMetricHandler": "pubsub_handler",
    "Stat": "stat",
    "Window": "stat",
    "Run": "run",
    "start_system_metrics": "system_metrics",
    "SystemMetricsSampler": "system_metrics",
}

__all__ = [
    "ConsoleMetricHandler", "MetricData", "MetricHandler", "MetricsConfig", "MetricStream",
    "NullMetricHandler", "UnconfiguredGroupWarning", "configure", "get_elapsed_time_ms", "get_handler",
    "getStream", "log_event", "prof", "profile", "publish_metric", "put_metric", *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
