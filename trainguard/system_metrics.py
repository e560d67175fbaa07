"""Opt-in sampling of host, process and GPU metrics as ordinary metric points.

``start_system_metrics(interval=10.0)`` starts a daemon thread that every
``interval`` seconds adds, through the stream of ``group`` (default
``"system"``):

* ``system/cpu_percent`` (host), ``system/memory_used_bytes``,
  ``system/memory_percent`` (host memory) - with psutil;
* ``system/process_cpu_percent``, ``system/process_rss_bytes`` - psutil, or
  the standard library on Linux without it;
* ``system/gpu<i>/utilization_percent``, ``system/gpu<i>/memory_used_bytes``,
  ``system/gpu<i>/memory_percent`` - where NVML is available
  (``nvidia-ml-py``). Without a driver or a GPU this part is skipped after
  one informational log line; a device that errors is skipped, the others
  still report.

Install ``trainguard[system]`` for psutil and nvidia-ml-py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from . import lifecycle
from .metrics import api

logger = logging.getLogger("trainguard")

Sample = Dict[str, float]


class GpuSampler:
    """Reads utilization and memory of every GPU through an NVML module (pynvml)."""

    def __init__(self, nvml: Any = None):
        self.available = False
        self._nvml: Any = None
        self._handles: List[Any] = []
        try:
            if nvml is None:
                import pynvml as nvml  # type: ignore[no-redef]  # nvidia-ml-py
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = nvml
            self.available = count > 0
        except Exception as e:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, ...
            logger.info("trainguard: no GPU metrics (%s: %s)", type(e).__name__, e)

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def sample(self) -> Sample:
        out: Sample = {}
        for index, handle in enumerate(self._handles):
            try:
                utilization = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:  # noqa: BLE001 - a device fell off the bus, lost permissions, ...
                continue
            prefix = f"system/gpu{index}/"
            out[prefix + "utilization_percent"] = float(utilization.gpu)
            out[prefix + "memory_used_bytes"] = float(memory.used)
            if memory.total:
                out[prefix + "memory_percent"] = 100.0 * memory.used / memory.total
        return out

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # NVML's errors are its own classes; none matters at close
                self._nvml.nvmlShutdown()
            self._nvml = None


class HostSampler:
    """CPU and memory of the host and of this process (psutil, or /proc)."""

    def __init__(self):
        try:
            import psutil
        except ImportError:
            psutil = None
            logger.info("trainguard: psutil not installed; host CPU and memory are not sampled "
                        "(pip install 'trainguard[system]')")
        self._psutil = psutil
        self._process = psutil.Process() if psutil else None
        self._last_cpu = (time.monotonic(), _process_cpu_seconds())
        if psutil:
            psutil.cpu_percent(None)  # the first call only primes the counters
            self._process.cpu_percent(None)

    def sample(self) -> Sample:
        out: Sample = {}
        if self._psutil is not None:
            memory = self._psutil.virtual_memory()
            out["system/cpu_percent"] = float(self._psutil.cpu_percent(None))
            out["system/memory_used_bytes"] = float(memory.total - memory.available)
            out["system/memory_percent"] = float(memory.percent)
            out["system/process_cpu_percent"] = float(self._process.cpu_percent(None))
            out["system/process_rss_bytes"] = float(self._process.memory_info().rss)
            return out
        now, cpu = time.monotonic(), _process_cpu_seconds()
        last_now, last_cpu = self._last_cpu
        self._last_cpu = (now, cpu)
        if now > last_now:
            out["system/process_cpu_percent"] = 100.0 * (cpu - last_cpu) / (now - last_now)
        rss = _proc_rss_bytes()
        if rss is not None:
            out["system/process_rss_bytes"] = float(rss)
        return out


def _process_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _proc_rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class SystemMetricsSampler:
    """A daemon thread publishing samples every ``interval`` seconds; ``stop()`` ends it."""

    def __init__(self, interval: float = 10.0, group: str = "system",
                 stream: Optional[api.MetricStream] = None, gpu: bool = True,
                 samplers: Optional[List[Callable[[], Sample]]] = None):
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self.group = group
        self._stream = stream
        self._closers: List[Callable[[], None]] = []
        if samplers is None:
            samplers = [HostSampler().sample]
            if gpu:
                gpus = GpuSampler()
                if gpus.available:
                    samplers.append(gpus.sample)
                    self._closers.append(gpus.close)
        self.samplers = samplers
        self.samples_taken = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainguard-system-metrics", daemon=True)
        lifecycle.on_exit(self.stop, lifecycle.PRIORITY_SAMPLERS)

    def start(self) -> SystemMetricsSampler:
        self._thread.start()
        return self

    def sample_once(self) -> Sample:
        """Takes one sample and publishes it; returns what was published."""
        sample: Sample = {}
        for sampler in self.samplers:
            try:
                sample.update(sampler())
            except Exception as e:  # noqa: BLE001 - a sampler must not stop the others
                logger.debug("trainguard: system sampler failed: %s", e)
        stream = self._stream or api.getStream(self.group)
        for name, value in sample.items():
            stream.add_value(name, value)
        self.samples_taken += 1
        return sample

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        for close in self._closers:
            close()
        self._closers = []


def start_system_metrics(interval: float = 10.0, group: str = "system",
                         stream: Optional[api.MetricStream] = None, gpu: bool = True) -> SystemMetricsSampler:
    """Starts sampling CPU, memory and GPU every ``interval`` seconds (see module doc)."""
    return SystemMetricsSampler(interval, group, stream, gpu).start()
