"""Metrics API compatible with ``torch.distributed.elastic.metrics``.

Replace ``import torch.distributed.elastic.metrics as metrics`` with
``import trainguard.metrics as metrics`` (and ``...metrics.api`` with
``trainguard.metrics.api``); everything else stays. See ``api`` for what is
added on top (``step=``, ``timer``, ``log_event``, warnings for unconfigured
groups).
"""

from typing import Optional

from .api import (
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

__all__ = [
    "ConsoleMetricHandler", "MetricData", "MetricHandler", "MetricsConfig", "MetricStream", "NullMetricHandler",
    "UnconfiguredGroupWarning", "configure", "get_elapsed_time_ms", "get_handler", "getStream", "log_event",
    "prof", "profile", "publish_metric", "put_metric", "initialize_metrics",
]


def initialize_metrics(cfg: Optional[MetricsConfig] = None):
    """torchelastic compatibility: a no-op."""
