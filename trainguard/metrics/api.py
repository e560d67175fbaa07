"""The metrics API: a drop-in for ``torch.distributed.elastic.metrics.api``.

Names, signatures and semantics follow torchelastic, so code written for it
works after changing only the import. Additions, all optional:

* ``step=`` on ``MetricStream.add_value`` and ``put_metric`` (carried to
  handlers as ``MetricData.step``);
* ``MetricStream.timer(name)``, a context manager recording milliseconds;
* ``log_event(type, data)`` for lifecycle events;
* ``MetricHandler.emit_event``, ``flush`` and ``close`` (no-ops by default);
* a group that resolves to no configured handler warns once
  (``UnconfiguredGroupWarning``) instead of dropping silently.

Handlers may offer a fast path: if ``handler.stream_adder(group)`` exists and
returns a callable, ``MetricStream.add_value`` *is* that callable, so a value
goes to the handler without building a ``MetricData``.
"""

from __future__ import annotations

import abc
import threading
import time
import warnings
from collections import namedtuple
from functools import wraps
from typing import Any, Dict, Optional, Set

__all__ = [
    "MetricsConfig", "MetricHandler", "ConsoleMetricHandler", "NullMetricHandler",
    "MetricStream", "MetricData", "UnconfiguredGroupWarning", "configure", "getStream",
    "prof", "profile", "put_metric", "publish_metric", "get_elapsed_time_ms", "log_event",
    "get_handler",
]

DEFAULT_GROUP = "torchelastic"

_MetricDataFields = namedtuple("MetricData", ["timestamp", "group_name", "name", "value"])  # type: ignore[name-match]


class MetricData(_MetricDataFields):
    """One metric value: ``(timestamp, group_name, name, value)``.

    A 4-field named tuple exactly as in torchelastic (it unpacks and compares
    as such); the optional training step rides along as the attribute
    ``step`` (``None`` when not given).
    """

    step: Optional[int] = None

    def __new__(cls, timestamp: float, group_name: str, name: str, value: Any,
                step: Optional[int] = None) -> MetricData:
        self = super().__new__(cls, timestamp, group_name, name, value)
        if step is not None:
            self.step = step
        return self


class MetricsConfig:
    """torchelastic's (unused) metrics configuration holder."""
    __slots__ = ["params"]

    def __init__(self, params: Optional[Dict[str, str]] = None):
        self.params = params if params is not None else {}


class UnconfiguredGroupWarning(RuntimeWarning):
    """A metric group resolved to no configured handler: its values are dropped."""


class MetricHandler(abc.ABC):
    """Receives metric values (``emit``) and, optionally, events."""

    @abc.abstractmethod
    def emit(self, metric_data: MetricData):
        pass

    def emit_event(self, event_type: str, data: Dict[str, Any], timestamp: float) -> None:  # noqa: B027 (optional)
        """Receives a lifecycle event. Handlers that know no events ignore it."""

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Delivers what is buffered; True if everything was delivered in time."""
        return True

    def close(self, timeout: Optional[float] = None) -> None:  # noqa: B027 (optional)
        """Flushes and releases resources; later values are dropped."""


class ConsoleMetricHandler(MetricHandler):
    """Prints ``[timestamp][group]: name=value`` lines, as torchelastic does."""

    def emit(self, metric_data: MetricData):
        step = "" if metric_data.step is None else f" (step {metric_data.step})"
        print(f"[{metric_data.timestamp}][{metric_data.group_name}]: "
              f"{metric_data.name}={metric_data.value}{step}")

    def emit_event(self, event_type: str, data: Dict[str, Any], timestamp: float) -> None:
        print(f"[{timestamp}][event]: {event_type} {data}")


class NullMetricHandler(MetricHandler):
    """Drops everything (the default when nothing is configured)."""

    def emit(self, metric_data: MetricData):
        pass


class _Timer:
    """Context manager recording the duration of its block in milliseconds."""
    __slots__ = ("_stream", "_name", "_step", "_start")

    def __init__(self, stream: MetricStream, name: str, step: Optional[int]):
        self._stream, self._name, self._step = stream, name, step

    def __enter__(self) -> _Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        elapsed_ms = (time.perf_counter() - self._start) * 1000.0
        self._stream.add_value(self._name, elapsed_ms, self._step)


class MetricStream:
    """A group's view of its handler: ``add_value(name, value, step=None)``."""

    def __init__(self, group_name: str, handler: MetricHandler):
        self.group_name = group_name
        self.handler = handler
        make_adder = getattr(handler, "stream_adder", None)
        adder = make_adder(group_name) if make_adder is not None else None
        if adder is not None:
            # The handler's fast path shadows the method below.
            self.add_value = adder  # type: ignore[method-assign]

    def add_value(self, metric_name: str, metric_value: Any, step: Optional[int] = None):
        self.handler.emit(MetricData(time.time(), self.group_name, metric_name, metric_value, step))

    def timer(self, metric_name: str, step: Optional[int] = None) -> _Timer:
        """``with stream.timer("fwd.ms"):`` adds the block's duration in milliseconds."""
        return _Timer(self, metric_name, step)


_metrics_map: Dict[str, MetricHandler] = {}
_default_metrics_handler: MetricHandler = NullMetricHandler()
_default_configured = False
_streams: Dict[str, MetricStream] = {}
_warned_groups: Set[Optional[str]] = set()
_warn_lock = threading.Lock()


def configure(handler: MetricHandler, group: Optional[str] = None):
    """Sets the handler of ``group``, or the default handler when group is None."""
    global _default_metrics_handler, _default_configured
    if group is None:
        _default_metrics_handler = handler
        _default_configured = True
    else:
        _metrics_map[group] = handler
    _streams.clear()


def _warn_unconfigured(group: Optional[str]) -> None:
    with _warn_lock:
        if group in _warned_groups:
            return
        _warned_groups.add(group)
    what = f"metric group {group!r}" if group is not None else "events"
    warnings.warn(f"trainguard: no metrics handler configured for {what}; its values are dropped "
                  f"(call trainguard.configure(handler) or configure(handler, group))",
                  UnconfiguredGroupWarning, stacklevel=4)


def get_handler(group: Optional[str] = None) -> MetricHandler:
    """The handler ``group`` resolves to (the default handler for None)."""
    handler = _metrics_map.get(group) if group is not None else None
    if handler is None:
        handler = _default_metrics_handler
        if not _default_configured:
            _warn_unconfigured(group)
    return handler


def getStream(group: str) -> MetricStream:  # noqa: N802 (torchelastic's name, kept for drop-in use)
    """A stream bound to the group's handler, or to the default handler."""
    stream = _streams.get(group)
    if stream is None:
        stream = _streams[group] = MetricStream(group, get_handler(group))
    return stream


def _get_metric_name(fn) -> str:
    qualname = fn.__qualname__
    split = qualname.split(".")
    if len(split) == 1:
        module = fn.__module__
        if module:
            return module.split(".")[-1] + "." + split[0]
        return split[0]
    return qualname


def prof(fn=None, group: str = DEFAULT_GROUP):
    """Decorator publishing ``<name>.success``/``.failure`` (1) and ``.duration.ms``.

    The name is the qualified name (``Class.method``), or ``module.function``
    for plain functions. Usage: ``@prof`` or ``@prof(group="agent")``.
    """

    def wrap(f):
        @wraps(f)
        def wrapper(*args, **kwargs):
            key = _get_metric_name(f)
            try:
                start = time.time()
                result = f(*args, **kwargs)
                put_metric(f"{key}.success", 1, group)
            except Exception:
                put_metric(f"{key}.failure", 1, group)
                raise
            finally:
                put_metric(f"{key}.duration.ms", get_elapsed_time_ms(start), group)
            return result

        return wrapper

    if fn:
        return wrap(fn)
    return wrap


def profile(group=None):
    """Deprecated torchelastic decorator (metric names without the class); use ``prof``."""
    warnings.warn("Deprecated, use @prof instead", DeprecationWarning, stacklevel=2)

    def wrap(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            try:
                start_time = time.time()
                result = func(*args, **kwargs)
                publish_metric(group, f"{func.__name__}.success", 1)
            except Exception:
                publish_metric(group, f"{func.__name__}.failure", 1)
                raise
            finally:
                publish_metric(group, f"{func.__name__}.duration.ms", get_elapsed_time_ms(start_time))
            return result

        return wrapper

    return wrap


def put_metric(metric_name: str, metric_value: Any, metric_group: str = DEFAULT_GROUP,
               step: Optional[int] = None, *, group: Optional[str] = None):
    """Publishes one value: ``put_metric("loss", 0.1, "my_app", step=10)``.

    ``group=`` is accepted as an alias of torchelastic's ``metric_group``.
    """
    stream = getStream(group if group is not None else metric_group)
    if step is None:
        stream.add_value(metric_name, metric_value)
    else:
        stream.add_value(metric_name, metric_value, step)


def publish_metric(metric_group: str, metric_name: str, metric_value: Any):
    """Deprecated torchelastic spelling of ``put_metric``."""
    warnings.warn("Deprecated, use put_metric(metric_group)(metric_name, metric_value) instead",
                  DeprecationWarning, stacklevel=2)
    getStream(metric_group).add_value(metric_name, metric_value)


def get_elapsed_time_ms(start_time_in_seconds: float) -> int:
    """Milliseconds elapsed since ``start_time_in_seconds`` (a ``time.time()``)."""
    return int((time.time() - start_time_in_seconds) * 1000)


def log_event(event_type: str, data: Optional[Dict[str, Any]] = None,
              group: Optional[str] = None, timestamp: Optional[float] = None) -> None:
    """Publishes a lifecycle event through the group's (or the default) handler."""
    handler = get_handler(group)
    handler.emit_event(event_type, dict(data or {}), time.time() if timestamp is None else timestamp)


def reset_for_tests() -> None:
    """Forgets all configuration (for tests)."""
    global _default_metrics_handler, _default_configured
    _metrics_map.clear()
    _streams.clear()
    _warned_groups.clear()
    _default_metrics_handler = NullMetricHandler()
    _default_configured = False
