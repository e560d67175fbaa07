"""Runner choice. Never let Beam pick one: its default may try to download Prism, which fails offline."""

from __future__ import annotations

import collections
import contextlib
import copy
import ctypes
import functools
import sys
import threading
import types
import weakref
from typing import Any, FrozenSet, List, Optional, Tuple

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct import transform_evaluator
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner, worker_handlers
from apache_beam.transforms import core as beam_core
from apache_beam.transforms import userstate
from apache_beam.transforms.core import _DoFnParam
from apache_beam.transforms.window import GlobalWindow


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
    spare_local_runners()
    pad_heap_growth()
    return FnApiRunner()


def spare_local_runners() -> None:
    """Spares the local runners Beam's work that gives the same answer again and again, as the functions below
    say: state specs worked out once per DoFn, option views parsed once per class and flags, arguments read from
    a function's code, the global window's end worked out once, and on BundleBasedDirectRunner a DoFn pickled once
    instead of at every bundle. Each changes Beam's module state for the whole process, which is why only local
    runners install them. Idempotent."""
    remember_dofn_specs()
    remember_option_views()
    read_arguments_from_code()
    reuse_the_global_window()
    pickle_dofns_once()


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


def reuse_the_global_window() -> None:
    """Makes ``GlobalWindow()`` give Beam's one global window without working out its end again.

    ``GlobalWindow`` is a singleton, but its ``__init__`` runs at every call: it reads the window's end from the
    runner API's constants and sets a new ``Timestamp`` of it on the shared object (2.5 µs). Beam calls it for
    every element a DoFn yields as a ``TimestampedValue`` (each parsed message, each row and alert of the checks),
    a few per run. The object and its end are the same every time, so after Beam's own ``__init__`` has run once
    it does nothing. Idempotent."""
    if getattr(GlobalWindow.__init__, "reused", False):
        return
    GlobalWindow()  # the shared object, its end set by Beam's own __init__

    def whole_already(self) -> None:
        pass

    whole_already.reused = True  # type: ignore[attr-defined]
    GlobalWindow.__init__ = whole_already  # type: ignore[method-assign]


def remember_dofn_specs() -> None:
    """Makes Beam work out each DoFn's state and timer specs once per DoFn object instead of about nine times.

    ``userstate.get_dofn_specs`` takes the signature of every method of the DoFn; Beam calls it at construction,
    validation, translation and in each stage's worker, 540 times for the replay's 63 ParDos: 0.2 s of its 2 s
    start-up. Its answer depends on the object's methods only, which do not change once it is made, so it is
    kept per object (weakly, so that DoFns still go when their pipeline goes). Idempotent.

    The streaming runner (BundleBasedDirectRunner) asks about a fresh copy of the DoFn at every bundle (it
    unpickles one each time): over half the CPU of a local streaming job went there. So the answer is also kept
    per class, for the objects whose answer depends on their class alone (``specs_follow_the_class``).
    """
    if hasattr(userstate.get_dofn_specs, "remembered"):
        return
    compute = userstate.get_dofn_specs
    specs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    of_class: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # class -> key -> specs

    @functools.wraps(compute)
    def get_dofn_specs(dofn):
        try:
            state_specs, timer_specs = specs[dofn]
        except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced or hashed
            key = specs_follow_the_class(dofn)
            found = None if key is None else of_class.get(type(dofn), {}).get(key)
            if found is None:
                found = compute(dofn)
                if key is not None:
                    of_class.setdefault(type(dofn), {})[key] = found
            state_specs, timer_specs = found
            with contextlib.suppress(TypeError):
                specs[dofn] = found
        return set(state_specs), set(timer_specs)  # Beam's callers get sets of their own, as before

    get_dofn_specs.remembered = specs  # type: ignore[attr-defined]
    userstate.get_dofn_specs = get_dofn_specs


OPTION_VIEWS_KEPT = 256  # (options class, flags) parses kept, the least recently used dropped


def remember_option_views() -> None:
    """Makes ``PipelineOptions.view_as`` parse a pipeline's flags once per options class instead of at every call.

    Beam asks for a view of the options at each transform it applies (for type checks) and at several steps of
    a run, about 450 times for the replay's graph, and each view builds an argparse parser of its class and
    parses the flags again: a tenth of the demo replay's 4 s. The parse depends on the class and the flags
    alone, so it is kept per (class, flags); each view gets a deep copy of its own, so that a view that changes a
    list option (an experiment added) changes no other pipeline's. Options made without flags (they parse
    ``sys.argv``) and classes with an ``__init__`` of their own are left to Beam. Idempotent.
    """
    original = PipelineOptions.view_as
    if hasattr(original, "remembered"):
        return
    parsed: collections.OrderedDict = collections.OrderedDict()
    lock = threading.Lock()

    @functools.wraps(original)
    def view_as(self, cls):
        flags = self._flags
        try:
            key = (cls, tuple(flags)) if flags is not None and not _own_init(cls) else None
            hash(key)
        except TypeError:  # a flag that is no string
            key = None
        with lock:
            namespace = None if key is None else parsed.get(key)
            if namespace is not None:
                parsed.move_to_end(key)
        if namespace is None:
            view = original(self, cls)
            if key is not None:
                try:
                    kept = copy.deepcopy(view._visible_options)
                except Exception:  # noqa: BLE001 - a value that cannot be copied: this class's views stay Beam's
                    return view
                with lock:
                    parsed[key] = kept
                    while len(parsed) > OPTION_VIEWS_KEPT:
                        parsed.popitem(last=False)
            return view
        view = cls.__new__(cls)  # what PipelineOptions.__init__ leaves, its parse taken from the kept one
        view._flags = flags
        view._visible_options = copy.deepcopy(namespace)
        for name in view._visible_option_list():
            if name not in self._all_options:
                self._all_options[name] = getattr(view._visible_options, name)
        view._all_options = self._all_options
        return view

    view_as.remembered = parsed  # type: ignore[attr-defined]
    PipelineOptions.view_as = view_as  # type: ignore[method-assign]


@functools.cache  # asked at every view: one answer per class
def _own_init(cls) -> bool:
    """Whether an options class below ``PipelineOptions`` has an ``__init__`` of its own (its views are Beam's)."""
    mro = cls.mro()
    return PipelineOptions not in mro or any("__init__" in c.__dict__ for c in mro[:mro.index(PipelineOptions)])


def read_arguments_from_code() -> None:
    """Makes Beam read a plain function's or method's argument names and defaults from its code object and
    ``__defaults__`` instead of building an ``inspect.Signature`` of it (``core.get_function_args_defaults``).

    Beam reads the arguments of each method of a DoFn whenever it makes a runner of it: at every bundle on
    BundleBasedDirectRunner, whose every bundle unpickles a new copy of the DoFn's class for the DoFns made in a
    function (``transforms.ordered``), so nothing per class or object can be kept: an eighth of a local streaming
    job's CPU went to ``inspect.signature``. For a function with no wrapper, no ``__signature__`` and no partial,
    the signature holds exactly the code's positional names and the function's defaults (a bound method's first
    name dropped); anything else is left to Beam. Idempotent.
    """
    original = beam_core.get_function_args_defaults
    if hasattr(original, "from_code"):
        return

    @functools.wraps(original)
    def get_function_args_defaults(f):
        found = arguments_from_code(f)
        return original(f) if found is None else found

    get_function_args_defaults.from_code = True  # type: ignore[attr-defined]
    beam_core.get_function_args_defaults = get_function_args_defaults


def arguments_from_code(f) -> Optional[Tuple[List[str], List[Any]]]:
    """What ``inspect.signature`` gives Beam's ``get_function_args_defaults`` for ``f``, read from its code: the
    positional argument names and their defaults; None where the signature is not the code's alone."""
    bound = isinstance(f, types.MethodType)
    function = f.__func__ if bound else f
    if type(function) is not types.FunctionType or (function.__dict__ and any(  # where functools puts them
            name in function.__dict__ for name in ("__wrapped__", "__signature__", "__partialmethod__"))):
        return None
    code = function.__code__
    names = list(code.co_varnames[:code.co_argcount])
    defaults = list(function.__defaults__ or ())
    if bound:
        if not names or len(defaults) == len(names):  # nothing to bind to, or a default for what is bound
            return None
        names = names[1:]
    return names, defaults


def pickle_dofns_once() -> None:
    """Makes BundleBasedDirectRunner pickle each ParDo's DoFn once instead of at every bundle.

    Its ParDo evaluator gives each bundle a fresh copy of the DoFn, ``pickler.roundtrip(transform.dofn)``, and so
    pickled the DoFn again at every bundle: a sixth of a local streaming job's CPU (py-spy on a streaming test of
    the whole graph). The graph's DoFn is never run itself, only its copies, so its pickled bytes cannot change
    while a pipeline runs: they are kept per DoFn object (weakly, so that DoFns still go when their pipeline goes),
    and each bundle still unpickles a copy of its own, as before. Idempotent.
    """
    if not isinstance(transform_evaluator.pickler, _PickledOnce):
        transform_evaluator.pickler = _PickledOnce(transform_evaluator.pickler)  # type: ignore[assignment]


class _PickledOnce:
    """Beam's ``pickler`` module as the ParDo evaluator uses it, with ``roundtrip`` unpickling bytes kept per
    object; anything else is the module's."""

    def __init__(self, pickler: types.ModuleType):
        self._pickler = pickler
        self._kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # the runner's executor threads start bundles at once

    def roundtrip(self, obj):
        try:
            with self._lock:
                pickled = self._kept.get(obj)
        except TypeError:  # an object that cannot be weakly referenced or hashed: pickled at each call, as before
            return self._pickler.roundtrip(obj)
        if pickled is None:
            pickled = self._pickler.dumps(obj, enable_trace=False, use_zlib=True)
            with self._lock:
                self._kept[obj] = pickled
        return self._pickler.loads(pickled, enable_trace=False, use_zlib=True)

    def __getattr__(self, name):
        return getattr(self._pickler, name)


def specs_follow_the_class(dofn) -> Optional[FrozenSet[str]]:
    """None, or a key under which ``get_dofn_specs(dofn)`` is the same for every object of its class.

    It reads the defaults of the object's attributes that are bound methods (``dir``), or the defaults an
    ``_inspect_<method>`` hook returns. So: no ``__getattr__`` on the class; no attribute of the object's own that
    is a bound method (a plain function that hides a method of the class, as ``beam.Map``'s DoFn keeps its
    function, hides it from ``get_dofn_specs``: the key is the names so hidden); and no DoFn parameter (state,
    timer, timestamp...) among what its hooks return.
    """
    try:
        own = vars(dofn)
    except TypeError:  # no __dict__
        return None
    found = _class_names(type(dofn))
    if found is None:
        return None
    names, hooks = found
    if any(isinstance(value, types.MethodType) for value in own.values()):
        return None
    for hook in {*hooks, *(name for name in own if name.startswith("_inspect_"))}:
        try:
            _, defaults = getattr(dofn, hook)()
        except Exception:  # noqa: BLE001 - Beam's own look-up then raises, or answers, as it would have
            return None
        if any(isinstance(default, _DoFnParam) for default in defaults):
            return None
    return names.intersection(own)


_CLASS_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weakly: a class pickled by value is new


def _class_names(cls) -> Optional[Tuple[FrozenSet[str], Tuple[str, ...]]]:
    """The attribute names of a class and those of its ``_inspect_`` hooks; None if ``__getattr__`` is among them
    (then any attribute may be computed per object)."""
    try:
        return _CLASS_NAMES[cls]
    except KeyError:
        names = frozenset(dir(cls))
        found = None if "__getattr__" in names else (
            names, tuple(sorted(name for name in names if name.startswith("_inspect_"))))
        _CLASS_NAMES[cls] = found
        return found


BUNDLE_BASED_BATCH_WARNING = (
    "trainguard: warning: a bounded replay on BundleBasedDirectRunner may give other rows than on FnApiRunner: "
    "that runner's timers do not hold back the watermark of the stages after them (README: Runners); leave "
    "--runner out to run it on FnApiRunner")


def runner_for(options: PipelineOptions):
    """The runner named in the options; else BundleBasedDirectRunner if streaming, FnApiRunner if not. A bounded
    replay named onto BundleBasedDirectRunner runs, with a warning on stderr (``BUNDLE_BASED_BATCH_WARNING``)."""
    standard = options.view_as(StandardOptions)
    if standard.runner is not None:
        named = standard.runner if isinstance(standard.runner, str) else type(standard.runner).__name__
        if named.split(".")[-1] == "BundleBasedDirectRunner" and not standard.streaming:
            print(BUNDLE_BASED_BATCH_WARNING, file=sys.stderr)
        return standard.runner
    if standard.streaming:
        spare_local_runners()
        return BundleBasedDirectRunner()
    return local_batch_runner()
