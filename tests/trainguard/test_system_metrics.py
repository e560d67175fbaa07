"""System metrics: host/process sampling, and NVML where available."""

from __future__ import annotations

import types

import pytest

import trainguard as tg
from tests.trainguard.support import jsonl_payloads, parse_all, points_of, wait_until
from trainguard.metrics.api import MetricData, MetricHandler, MetricStream
from trainguard.system_metrics import GpuSampler, HostSampler, SystemMetricsSampler


class Recorder(MetricHandler):
    def __init__(self):
        self.data = []

    def emit(self, metric_data: MetricData):
        self.data.append(metric_data)


def test_host_sampler_reports_cpu_and_memory():
    sample = HostSampler().sample()
    assert {"system/cpu_percent", "system/memory_used_bytes", "system/memory_percent",
            "system/process_cpu_percent", "system/process_rss_bytes"} <= set(sample)
    assert sample["system/process_rss_bytes"] > 1_000_000
    assert 0 <= sample["system/memory_percent"] <= 100


def test_without_psutil_the_standard_library_fallback_reports_the_process(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_psutil(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError("psutil hidden by the test")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    sampler = HostSampler()
    sum(range(200_000))
    sample = sampler.sample()
    assert set(sample) == {"system/process_cpu_percent", "system/process_rss_bytes"}
    assert sample["system/process_rss_bytes"] > 1_000_000


def test_gpu_sampling_on_this_machine_works_or_degrades_cleanly():
    gpus = GpuSampler()  # the real pynvml: no NVIDIA driver here, so it must degrade
    if gpus.available:  # a machine with a GPU
        assert "system/gpu0/utilization_percent" in gpus.sample()
    else:
        assert gpus.device_count == 0 and gpus.sample() == {}
    gpus.close()


def fake_nvml(devices, broken=()):
    """A stand-in for the pynvml module (a third-party library) with the calls we use."""

    class NVMLError(Exception):
        pass

    state = {"shutdown": False}

    def utilization(handle):
        if handle in broken:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(gpu=devices[handle][0], memory=0)

    def memory(handle):
        if handle in broken:
            raise NVMLError("GPU is lost")
        used, total = devices[handle][1:]
        return types.SimpleNamespace(used=used, total=total, free=total - used)

    module = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: state.update(shutdown=True),
        nvmlDeviceGetCount=lambda: len(devices), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=utilization, nvmlDeviceGetMemoryInfo=memory, state=state)
    return module


def test_gpu_sampler_reads_every_device_and_skips_a_broken_one():
    nvml = fake_nvml([(97, 30 << 30, 80 << 30), (5, 1 << 30, 80 << 30), (50, 8 << 30, 16 << 30)], broken={1})
    gpus = GpuSampler(nvml)
    assert gpus.available and gpus.device_count == 3
    assert gpus.sample() == {
        "system/gpu0/utilization_percent": 97.0, "system/gpu0/memory_used_bytes": float(30 << 30),
        "system/gpu0/memory_percent": 37.5,
        "system/gpu2/utilization_percent": 50.0, "system/gpu2/memory_used_bytes": float(8 << 30),
        "system/gpu2/memory_percent": 50.0}
    gpus.close()
    assert nvml.state["shutdown"]


def test_gpu_sampler_survives_nvml_init_failure():
    def init():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    nvml = fake_nvml([])
    nvml.nvmlInit = init
    assert GpuSampler(nvml).available is False


def test_sampler_publishes_ordinary_points_through_the_group_stream():
    recorder = Recorder()
    tg.configure(recorder, "system")
    sampler = SystemMetricsSampler(interval=60, samplers=[lambda: {"system/a": 1.0},
                                                          lambda: 1 / 0,  # a failing sampler is skipped
                                                          lambda: {"system/b": 2.0}])
    assert sampler.sample_once() == {"system/a": 1.0, "system/b": 2.0}
    assert [(d.group_name, d.name, d.value) for d in recorder.data] == [("system", "system/a", 1.0),
                                                                        ("system", "system/b", 2.0)]


def test_start_system_metrics_samples_in_the_background_until_stopped(handlers, tmp_path):
    path = str(tmp_path / "m.jsonl")
    handler = handlers.jsonl(path, max_latency_ms=20)
    sampler = tg.start_system_metrics(interval=0.05, stream=MetricStream("system", handler))
    wait_until(lambda: sampler.samples_taken >= 2)
    sampler.stop()
    taken = sampler.samples_taken
    assert handler.flush(timeout=20)
    tags = {p.tag for p in points_of(parse_all(jsonl_payloads(path)))}
    assert {"system/cpu_percent", "system/process_rss_bytes"} <= tags
    assert sampler.samples_taken == taken  # stopped


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        SystemMetricsSampler(interval=0)
