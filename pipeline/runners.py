"""Runner choice. Never let Beam pick one: its default may try to download Prism, which fails offline."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import weakref

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner, worker_handlers
from apache_beam.transforms import userstate


def local_batch_runner() -> FnApiRunner:
    """FnApiRunner with the in-process worker's user-state cache turned off.

    The embedded worker hard-codes a 100 MB state cache, and every write to it
    sizes the value with ``objsize``, which walks the globals of every loaded
    module (thousands with apache-beam[gcp]): about 1 ms per state write, which
    made replays 8x slower. State lives in the same process anyway, so the
    cache buys nothing here. (Beam 2.77's SDK harness on Dataflow has no state
    cache either unless ``--max_cache_memory_usage_mb`` is set, default 0: each
    state read there is a request to the backend, which ``bench/bench_state_bytes.py``
    counts. Setting it trades those reads for the same ``objsize`` walk per write.)
    """
    worker_handlers.STATE_CACHE_SIZE_MB = 0
    remember_dofn_specs()
    pad_heap_growth()
    return FnApiRunner()


M_TRIM_THRESHOLD, M_TOP_PAD = -1, -2  # glibc's mallopt parameters
HEAP_TRIM_THRESHOLD_BYTES = 256 << 20  # free bytes at the heap's top before it is given back
HEAP_TOP_PAD_BYTES = 64 << 20          # bytes the heap grows by beyond a request


def pad_heap_growth() -> bool:
    """Asks glibc's malloc to keep up to 256 MiB freed at the top of its heap and to grow it 64 MiB beyond what
    is asked for; False where ``mallopt`` is missing or refuses them (macOS, musl: nothing changes).

    A replay's stages free and allocate large buffers (its shuffles, the state it encodes) one after another: by
    default glibc gives the top of its heap back to the kernel at such frees and asks for it again at the next
    allocation; at 10M points that churn was about 1 s of system time (sys 1.9-2.0 s -> 0.8-1.1 s). Peak memory is
    unchanged (pages count once touched); what was freed stays with the process until it ends.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD_BYTES) and mallopt(M_TOP_PAD, HEAP_TOP_PAD_BYTES))


def remember_dofn_specs() -> None:
    """Makes Beam work out each DoFn's state and timer specs once per DoFn object instead of about nine times.

    ``userstate.get_dofn_specs`` takes the signature of every method of the DoFn; Beam calls it at construction,
    validation, translation and in each stage's worker, 540 times for the replay's 63 ParDos: 0.2 s of its 2 s
    start-up. Its answer depends on the object's methods only, which do not change once it is made, so it is
    kept per object (weakly, so that DoFns still go when their pipeline goes). Idempotent.
    """
    if hasattr(userstate.get_dofn_specs, "remembered"):
        return
    compute = userstate.get_dofn_specs
    specs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @functools.wraps(compute)
    def get_dofn_specs(dofn):
        try:
            state_specs, timer_specs = specs[dofn]
        except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced or hashed
            state_specs, timer_specs = found = compute(dofn)
            with contextlib.suppress(TypeError):
                specs[dofn] = found
        return set(state_specs), set(timer_specs)  # Beam's callers get sets of their own, as before

    get_dofn_specs.remembered = specs  # type: ignore[attr-defined]
    userstate.get_dofn_specs = get_dofn_specs


BUNDLE_BASED_BATCH_WARNING = (
    "trainguard: warning: a bounded replay on BundleBasedDirectRunner may give other rows than on FnApiRunner: "
    "that runner's timers do not hold back the watermark of the stages after them (README: Runners); leave "
    "--runner out, or use --runner=DirectRunner, which runs a replay on FnApiRunner")


def runner_for(options: PipelineOptions):
    """The runner named in the options; else BundleBasedDirectRunner if streaming, FnApiRunner if not. A bounded
    replay named onto BundleBasedDirectRunner runs, with a warning on stderr (``BUNDLE_BASED_BATCH_WARNING``)."""
    standard = options.view_as(StandardOptions)
    if standard.runner is not None:
        named = standard.runner if isinstance(standard.runner, str) else type(standard.runner).__name__
        if named.split(".")[-1] == "BundleBasedDirectRunner" and not standard.streaming:
            print(BUNDLE_BASED_BATCH_WARNING, file=sys.stderr)
        return standard.runner
    return BundleBasedDirectRunner() if standard.streaming else local_batch_runner()
