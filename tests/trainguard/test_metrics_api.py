"""torchelastic compatibility of trainguard.metrics, and what it adds."""

from __future__ import annotations

import abc
import textwrap
import warnings

import pytest

import trainguard
import trainguard.metrics as metrics
from tests.trainguard.support import run_python
from trainguard.metrics import api
from trainguard.metrics.api import MetricData, MetricHandler, MetricStream, prof


class RecordingHandler(MetricHandler):
    """A custom handler written against torchelastic's interface."""

    def __init__(self) -> None:
        self.metric_data = {}
        self.all = []

    def emit(self, metric_data: MetricData):
        self.metric_data[metric_data.name] = metric_data
        self.all.append(metric_data)


# The example below is torchelastic's documented usage; only the import differs.
TORCHELASTIC_EXAMPLE = '''
import time
import trainguard.metrics as metrics    # was: import torch.distributed.elastic.metrics as metrics

class StdoutMetricHandler(metrics.MetricHandler):
    def emit(self, metric_data):
        ts = metric_data.timestamp
        group = metric_data.group_name
        name = metric_data.name
        value = metric_data.value
        print(f"custom [{group}]: {name}={value} ts_is_float={isinstance(ts, float)}")

metrics.configure(metrics.NullMetricHandler())
metrics.configure(metrics.ConsoleMetricHandler(), "my_module")
metrics.configure(StdoutMetricHandler(), group="my_app")

def calculate():
    return 42

def my_method():
    start = time.time()
    calculate()
    end = time.time()
    metrics.put_metric("calculate_latency", int(end - start), "my_module")

@metrics.prof
def foo():
    pass

class Bar():
    @metrics.prof(group="my_app")
    def baz(self):
        pass

my_method()
foo()
Bar().baz()
metrics.getStream("my_app").add_value("custom_metric", 7)
metrics.publish_metric("my_app", "old_api", 1)
metrics.initialize_metrics(metrics.MetricsConfig({"a": "b"}))
print("elapsed", metrics.get_elapsed_time_ms(time.time()))
'''


def test_torchelastic_example_runs_unchanged_but_for_the_import():
    result = run_python(TORCHELASTIC_EXAMPLE)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.endswith("[my_module]: calculate_latency=0") for line in lines), lines
    assert "custom [my_app]: Bar.baz.success=1 ts_is_float=True" in lines
    assert any(line.startswith("custom [my_app]: Bar.baz.duration.ms=") for line in lines)
    assert "custom [my_app]: custom_metric=7 ts_is_float=True" in lines
    assert "custom [my_app]: old_api=1 ts_is_float=True" in lines
    assert "elapsed 0" in lines
    # foo() went to group "torchelastic", which resolves to the configured NullMetricHandler.
    assert not any("foo" in line for line in lines)
    assert "UnconfiguredGroupWarning" not in result.stderr


def foo_1():
    pass


class Parent(abc.ABC):
    @abc.abstractmethod
    def func(self):
        raise NotImplementedError

    def base_func(self):
        self.func()


class Child(Parent):
    @prof
    def func(self):
        pass


class TestTorchelasticApiTest:
    """torchelastic's own api_test, with ``configure`` instead of patching getStream."""

    def foo_2(self):
        pass

    @prof
    def bar(self):
        pass

    @prof
    def throw(self):
        raise RuntimeError

    @prof(group="torchelastic")
    def bar2(self):
        pass

    def test_get_metric_name(self):
        """torchelastic's name for a profiled function: ``module.function``, or ``Class.method``."""
        handler = RecordingHandler()
        metrics.configure(handler)
        foo_1.__module__ = "api_test"
        prof(foo_1)()
        prof(self.foo_2)()
        assert {"api_test.foo_1.success", "TestTorchelasticApiTest.foo_2.success"} <= set(handler.metric_data)

    def test_profile(self):
        handler = RecordingHandler()
        metrics.configure(handler, "torchelastic")
        self.bar()
        assert handler.metric_data["TestTorchelasticApiTest.bar.success"].value == 1
        assert "TestTorchelasticApiTest.bar.failure" not in handler.metric_data
        assert "TestTorchelasticApiTest.bar.duration.ms" in handler.metric_data
        with pytest.raises(RuntimeError):
            self.throw()
        assert handler.metric_data["TestTorchelasticApiTest.throw.failure"].value == 1
        assert "TestTorchelasticApiTest.throw.success" not in handler.metric_data
        assert isinstance(handler.metric_data["TestTorchelasticApiTest.throw.duration.ms"].value, int)
        self.bar2()
        assert handler.metric_data["TestTorchelasticApiTest.bar2.success"].group_name == "torchelastic"

    def test_inheritance(self):
        handler = RecordingHandler()
        metrics.configure(handler)
        Child().base_func()
        assert handler.metric_data["Child.func.success"].value == 1
        assert "Child.func.duration.ms" in handler.metric_data


def test_metric_data_is_torchelastics_four_field_tuple_with_optional_step():
    data = MetricData(1.5, "g", "loss", 0.25)
    timestamp, group, name, value = data
    assert (timestamp, group, name, value) == (1.5, "g", "loss", 0.25)
    assert data == (1.5, "g", "loss", 0.25) and len(data) == 4
    assert data.step is None
    assert MetricData(1.5, "g", "loss", 0.25, step=3).step == 3
    assert data._replace(value=1).value == 1


def test_put_metric_defaults_to_group_torchelastic_and_get_stream_binds_group_handler():
    default, special = RecordingHandler(), RecordingHandler()
    metrics.configure(default)
    metrics.configure(special, group="special")
    metrics.put_metric("a", 1)
    metrics.put_metric("b", 2, "special")
    metrics.put_metric("c", 3, metric_group="special")
    metrics.put_metric("d", 4, group="special", step=9)
    assert [(d.group_name, d.name, d.value) for d in default.all] == [("torchelastic", "a", 1)]
    assert [(d.group_name, d.name, d.value, d.step) for d in special.all] == [
        ("special", "b", 2, None), ("special", "c", 3, None), ("special", "d", 4, 9)]
    stream = metrics.getStream("special")
    assert isinstance(stream, MetricStream)
    assert stream.group_name == "special" and stream.handler is special
    assert metrics.getStream("other").handler is default


def test_configure_rebinds_streams_obtained_afterwards():
    first, second = RecordingHandler(), RecordingHandler()
    metrics.configure(first)
    metrics.put_metric("x", 1)
    metrics.configure(second)
    metrics.put_metric("x", 2)
    assert [d.value for d in first.all] == [1] and [d.value for d in second.all] == [2]


def test_unconfigured_group_warns_once_instead_of_dropping_silently():
    with pytest.warns(metrics.UnconfiguredGroupWarning, match="'lonely'"):
        metrics.put_metric("x", 1, "lonely")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics.put_metric("x", 2, "lonely")  # same group: no second warning
        metrics.getStream("lonely").add_value("y", 3)
    with pytest.warns(metrics.UnconfiguredGroupWarning, match="'other'"):
        metrics.getStream("other")


def test_no_warning_when_a_group_or_the_default_handler_is_configured():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics.configure(RecordingHandler(), "mine")
        metrics.put_metric("x", 1, "mine")
        metrics.configure(metrics.NullMetricHandler())  # an explicit choice to drop
        metrics.put_metric("x", 1, "anything")


def test_step_timer_and_events_through_a_custom_handler():
    class EventHandler(RecordingHandler):
        def __init__(self):
            super().__init__()
            self.events = []

        def emit_event(self, event_type, data, timestamp):
            self.events.append((event_type, data, timestamp))

    handler = EventHandler()
    metrics.configure(handler)
    stream = metrics.getStream("train")
    stream.add_value("loss", 0.5, step=10)
    stream.add_value("loss", 0.4, 11)
    with stream.timer("step.ms", step=11):
        pass
    metrics.log_event("checkpoint_saved", {"path": "/tmp/x"})
    assert [(d.name, d.value, d.step) for d in handler.all[:2]] == [("loss", 0.5, 10), ("loss", 0.4, 11)]
    timed = handler.all[2]
    assert timed.name == "step.ms" and timed.step == 11 and timed.value >= 0.0
    assert handler.events[0][:2] == ("checkpoint_saved", {"path": "/tmp/x"})


def test_console_handler_prints_torchelastic_format(capsys):
    handler = metrics.ConsoleMetricHandler()
    handler.emit(MetricData(1574213883.4182858, "my_app", "my_metric", 5))
    handler.emit(MetricData(1.0, "g", "loss", 0.5, step=3))
    assert capsys.readouterr().out.splitlines() == [
        "[1574213883.4182858][my_app]: my_metric=5", "[1.0][g]: loss=0.5 (step 3)"]


def test_handlers_written_for_torchelastic_get_events_as_no_ops():
    handler = RecordingHandler()
    metrics.configure(handler)
    metrics.log_event("anything", {"a": 1})
    assert handler.flush(1.0) is True
    handler.close()


def test_top_level_package_exports_the_api():
    for name in ["configure", "getStream", "put_metric", "prof", "MetricHandler", "MetricData",
                 "ConsoleMetricHandler", "NullMetricHandler", "MetricStream", "log_event",
                 "Stat", "Run", "PubSubMetricHandler", "JsonlMetricHandler", "start_system_metrics"]:
        assert hasattr(trainguard, name), name
    assert trainguard.configure is api.configure


def test_import_trainguard_stays_light():
    code = textwrap.dedent("""
        import sys
        import trainguard, trainguard.metrics
        trainguard.put_metric("x", 1)
        heavy = [m for m in ("google.cloud.pubsub_v1", "grpc", "tensorboard", "psutil", "pynvml", "numpy",
                             "apache_beam") if m in sys.modules]
        print("heavy:", heavy)
    """)
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout
