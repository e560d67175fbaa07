"""``trainguard-ship``: tail a TensorBoard log directory into wire messages.

::

    trainguard-ship --logdir runs/ --test resnet50 --run 2026-11-21.3 \\
        --topic projects/P/topics/T [--finish_on_idle 600]
    trainguard-ship --logdir runs/ --test resnet50 --run 2026-11-21.3 \\
        --output metrics.jsonl -- python train.py --epochs 90

Every event file under the log directory is read as it grows, including new
ones; scalar summaries become points tagged ``<run subdirectory>/<tag>``
(``train/loss``; files directly in the log directory keep bare tags).
Delivered byte offsets are persisted (``--state``, by default
``<logdir>/.trainguard-ship.<test>.<run>.json``) after every delivered chunk,
so a restarted shipper neither re-sends nor skips points; message ids are
derived from file and offset, so a chunk re-sent after a crash carries the
same ids. ``run_started`` is sent once; ``run_finished`` when the wrapped
command exits (with its status; the shipper then exits with the command's
code) or after ``--finish_on_idle`` seconds without new data. A run the shipper
found no point of is never reported a success: its ``run_finished`` says
``failure`` (reason ``no_data``) and the shipper exits with status 1. Without a
wrapped command the log directory must exist (the command may create it).

Distributed jobs: ``--rank``/``--world-size`` go on every message. A
subdirectory named ``rank<N>``, ``rank_<N>`` or ``rank-<N>`` holds rank N's
logs: its files are shipped with rank N (the flag's rank applies outside
such directories) and its name is left out of the tag prefix
(``rank_1/train/loss`` -> ``train/loss``). Each rank found this way gets its
own ``run_started`` (when first seen) and ``run_finished``, so the pipeline
hears every rank it has points from finish.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import distributed, wire
from .cli import DASHES_NOTE, RUNTIME_ERROR, USAGE_ERROR, StrictArgumentParser, cloud_failure, fail, missing_credentials
from .distributed import Rank
from .encoding import EncodedMessage, MessageEncoder
from .handlers import ENV_RUN, ENV_TEST
from .transports import JsonlTransport, Transport

logger = logging.getLogger("trainguard.shipper")
PROG = "trainguard-ship"

STATE_VERSION = 1
RETRY_INITIAL_BACKOFF_S = 0.5  # delivery retries back off from this...
RETRY_MAX_BACKOFF_S = 30.0  # ...up to this, and never give up (the state file keeps the place)
LOG_EVERY_NTH_FAILURE = 10  # a failing delivery logs its first attempt and every tenth
MAX_REMEMBERED_TAGS = 100_000  # --ignore_tags verdicts cached per tag, up to this many tags
EXIT_CANNOT_RUN = 127  # as a shell reports a command it cannot run
EXIT_NO_DATA = 1  # the run ended without a single point: nothing shipped is not a success
NO_DATA_REASON = "no_data"
SIGNAL_NAP_S = 0.1  # the longest a sleeping shipper takes to notice a signal


@dataclasses.dataclass
class ShipperConfig:
    """What to ship and how; see ``trainguard-ship --help``."""
    logdir: str
    test: str
    run: str
    state_path: Optional[str] = None
    ignore_tags: Sequence[str] = ()
    poll_interval_s: float = 2.0
    finish_on_idle_s: Optional[float] = None
    idle_status: str = wire.STATUS_SUCCESS
    max_points_per_message: int = 1000
    max_records_per_read: int = 20_000
    send_timeout_s: float = 30.0
    exit_timeout_s: float = 300.0
    """After the wrapped command exits, give up delivering after this long (progress is saved)."""
    command: Optional[List[str]] = None
    rank: Optional[int] = None
    """The rank of files outside ``rank<N>`` directories (and of the shipper's own run events)."""
    world_size: Optional[int] = None
    """The job's world size, on every message when given (needs ``rank`` or rank directories)."""

    def __post_init__(self):
        wire.check_name(self.test, "test")
        wire.check_name(self.run, "run")
        if self.world_size is not None and self.rank is None:
            distributed.check_rank(0, self.world_size)  # rank directories will give the rank
        else:
            distributed.check_rank(self.rank, self.world_size)
        if self.state_path is None:
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{self.test}.{self.run}")[:200]
            self.state_path = os.path.join(self.logdir, f".trainguard-ship.{safe}.json")
        if self.idle_status not in wire.FINISHED_STATUSES:
            raise ValueError(f"idle status must be one of {wire.FINISHED_STATUSES}")


def _shell_code(returncode: int) -> int:
    """A child's return code as a shell reports it: killed by signal N is 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


@dataclasses.dataclass
class _Chunk:
    """Records read from one event file in one go, and the points in them."""
    start: int
    end: int
    records: int = 0
    points: List[Tuple[str, float, int, float]] = dataclasses.field(default_factory=list)
    corrupt: bool = False  # the file breaks after ``end``: it is not read any further


class _Stopped(Exception):
    """Interrupted while delivering: exit without recording the undelivered chunk."""


def _message_id(*parts: Any) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode("utf-8")).hexdigest()[:32]


class ShipState:
    """Persisted progress: delivered offsets per file, tag kinds per run, run events sent (and to which ranks)."""

    def __init__(self, path: str, test: str, run: str):
        self.path = path
        self.data: Dict[str, Any] = {"version": STATE_VERSION, "test": test, "run": run,
                                     "started": False, "finished": False, "files": {}, "kinds": {},
                                     "last_data_time": None, "ranks_started": []}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                loaded = json.load(f)
            if (loaded.get("test"), loaded.get("run")) != (test, run):
                raise ValueError(f"state file {path} belongs to test={loaded.get('test')!r} "
                                 f"run={loaded.get('run')!r}; pass another --state")
            self.data.update(loaded)

    def save(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Shipper:
    """Tails ``config.logdir`` and delivers its scalars through ``transport``."""

    def __init__(self, config: ShipperConfig, transport: Transport):
        from . import tb_events  # tensorboard is needed from here on

        self._tb = tb_events
        self.config = config
        self.transport = transport
        assert config.state_path is not None  # ShipperConfig names one
        self.state = ShipState(config.state_path, config.test, config.run)
        # The rank of files outside rank directories; world_size alone (every file in a rank
        # directory) leaves them without either.
        self.rank = Rank(config.rank, config.world_size) if config.rank is not None else distributed.UNKNOWN
        self._encoders: Dict[Rank, MessageEncoder] = {}
        self._layouts: Dict[str, Tuple[str, Rank]] = {}
        self._readers: Dict[str, Any] = {}
        self._ignored: Dict[str, bool] = {}
        self._woken = False  # set by the signal handler: a plain flag, as a handler must take no lock
        self.interrupts = 0
        self.points_shipped = 0
        self.child: Optional[subprocess.Popen] = None
        self._give_up_at: Optional[float] = None

    # -- delivery ------------------------------------------------------------

    def _deliver(self, messages: List[EncodedMessage]) -> None:
        remaining = messages
        attempt = 0
        while remaining:
            results = self.transport.send(remaining, self.config.send_timeout_s)
            failed = [(m, r) for m, r in zip(remaining, results) if r is not None]
            if not failed:
                return
            if missing_credentials(failed[0][1]):  # retrying cannot find credentials: stop, in one line
                raise failed[0][1]
            attempt += 1
            backoff = min(RETRY_INITIAL_BACKOFF_S * 2 ** (attempt - 1), RETRY_MAX_BACKOFF_S)
            if attempt == 1 or attempt % LOG_EVERY_NTH_FAILURE == 0:
                error = failed[0][1]
                logger.warning("trainguard-ship: delivery failed (attempt %d), retrying in %.1fs: %s: %s",
                               attempt, backoff, type(error).__name__, str(error)[:300])
            remaining = [m for m, _ in failed]
            if self._should_stop():
                raise _Stopped()
            self._sleep(backoff)
            if self._should_stop():
                raise _Stopped()

    def _should_stop(self) -> bool:
        # With a wrapped command, one interrupt only reaches the command; a second aborts.
        if self.interrupts >= (2 if self.child is not None else 1):
            return True
        if self.child is not None and self.child.poll() is not None:
            # The command is done: do not hold its exit up for long if delivery fails.
            if self._give_up_at is None:
                self._give_up_at = time.monotonic() + self.config.exit_timeout_s
            return time.monotonic() >= self._give_up_at
        return False

    def _sleep(self, seconds: float) -> None:
        """Sleeps up to ``seconds``, in short naps so that a signal ends it at once.

        Not an ``Event``: the handler runs in this thread between two bytecodes, possibly while
        ``Event.wait`` holds the event's lock, and ``Event.set`` in the handler would then wait forever.
        """
        deadline = time.monotonic() + seconds
        while not self._woken and time.monotonic() < deadline:
            time.sleep(min(SIGNAL_NAP_S, max(0.0, deadline - time.monotonic())))
        self._woken = False

    def _encoder(self, rank: Rank) -> MessageEncoder:
        """The encoder of one rank's messages (each writes its rank into its envelope once)."""
        encoder = self._encoders.get(rank)
        if encoder is None:
            encoder = self._encoders[rank] = MessageEncoder(
                self.config.test, self.config.run, self.config.max_points_per_message,
                on_warning=lambda text: logger.warning("trainguard-ship: %s", text),
                rank=rank.rank, world_size=rank.world_size)
        return encoder

    def _id_parts(self, rank: Rank, *parts: Any) -> Tuple[Any, ...]:
        """A message's id parts: ranks' messages must differ (the pipeline processes an id once)."""
        return (self.config.test, self.config.run, *parts) + ((("rank", rank.rank),) if rank.known else ())

    def _send_event(self, event_type: str, timestamp: float, data: Dict[str, Any],
                    rank: Optional[Rank] = None) -> None:
        rank = self.rank if rank is None else rank
        event = wire.event_dict(event_type, timestamp, data)
        ident = _message_id(*self._id_parts(rank, event_type))
        self._deliver(self._encoder(rank).encode([], [event], next_id=lambda: ident))

    # -- layout ----------------------------------------------------------------

    def _layout(self, run_dir: str) -> Tuple[str, Rank]:
        """A log subdirectory's tag prefix and rank (see the module docstring)."""
        layout = self._layouts.get(run_dir)
        if layout is None:
            prefix, rank = distributed.split_rank_directory(run_dir)
            layout = (run_dir, self.rank)
            if rank is not None:
                try:
                    layout = (prefix, distributed.check_rank(rank, self.config.world_size))
                except ValueError as e:
                    logger.warning("trainguard-ship: %s is not read as a rank directory (%s); its files are "
                                   "shipped as an ordinary subdirectory", run_dir, e)
            self._layouts[run_dir] = layout
        return layout

    def _start_rank(self, rank: Rank, path: str) -> None:
        """Sends run_started for a rank directory's rank the first time one of its files is shipped."""
        started = self.state.data["ranks_started"]
        if rank == self.rank or rank.rank in started:
            return
        first = self._tb.first_wall_time(path)
        timestamp = first if first is not None and first >= wire.MIN_TIME else time.time()
        self._send_event(wire.RUN_STARTED, timestamp, self._started_data(rank), rank)
        started.append(rank.rank)
        self.state.save()

    # -- reading -------------------------------------------------------------

    def _is_ignored(self, tag: str) -> bool:
        ignored = self._ignored.get(tag)
        if ignored is None:
            ignored = any(fnmatch.fnmatchcase(tag, pattern) for pattern in self.config.ignore_tags)
            if len(self._ignored) < MAX_REMEMBERED_TAGS:
                self._ignored[tag] = ignored
        return ignored

    def _reader(self, run: str):
        reader = self._readers.get(run)
        if reader is None:
            kinds = self.state.data["kinds"].setdefault(run, {})
            reader = self._readers[run] = self._tb.ScalarReader(kinds)
        return reader

    def _unread_start(self, rel: str, path: str) -> Optional[int]:
        """The offset where unread bytes of a file start; None when there are none (or it is given up)."""
        entry = self.state.data["files"].setdefault(rel, {"offset": 0})
        if entry.get("corrupt"):
            return None
        try:
            size = os.path.getsize(path)
        except OSError:
            return None
        start = entry["offset"]
        if size < start:
            logger.warning("trainguard-ship: %s shrank from %d to %d bytes; reading it from the start",
                           rel, start, size)
            start = entry["offset"] = 0
        return start if size > start else None

    def _read_points(self, run: str, prefix: str, rel: str, path: str, start: int) -> Optional[_Chunk]:
        """The points in the records after ``start``, up to ``max_records_per_read`` records; None if unreadable.

        ``run`` is the file's directory (whose tags' kinds are remembered), ``prefix`` its tags' prefix."""
        reader = self._reader(run)
        chunk = _Chunk(start=start, end=start)
        try:
            for record, chunk.end in self._tb.RecordTail(path).read(start, self.config.max_records_per_read):
                chunk.records += 1
                try:
                    found = reader.points(record)
                except Exception as e:  # noqa: BLE001 - e.g. a record that is not an Event
                    logger.warning("trainguard-ship: %s: unreadable event before offset %d: %s", rel, chunk.end, e)
                    continue
                for tag, value, step, wall_time in found:
                    full = f"{prefix}/{tag}" if prefix else tag
                    if not self._is_ignored(full):
                        chunk.points.append((full, value, step, wall_time))
        except self._tb.CorruptRecord as e:
            logger.error("trainguard-ship: %s; not reading this file any further", e)
            chunk.corrupt = True
        except OSError as e:
            logger.warning("trainguard-ship: cannot read %s: %s", rel, e)
            return None
        return chunk

    def _ship_chunk(self, rel: str, chunk: _Chunk, rank: Rank) -> None:
        """Delivers a chunk's points, then moves the file's offset past it (in the state file)."""
        ids = iter(range(1 << 62))
        messages = self._encoder(rank).encode(
            chunk.points, next_id=lambda: _message_id(*self._id_parts(rank, rel, chunk.start, next(ids))))
        self._deliver(messages)
        entry = self.state.data["files"][rel]
        entry["offset"] = chunk.end
        if chunk.corrupt:
            entry["corrupt"] = True
        if chunk.points:
            latest = max(p[3] for p in chunk.points)
            previous = self.state.data.get("last_data_time") or 0.0
            self.state.data["last_data_time"] = max(previous, latest)
        self.state.save()
        shipped = sum(m.points for m in messages)
        self.points_shipped += shipped
        if shipped:
            logger.info("trainguard-ship: %s: %d points (offset %d -> %d)", rel, shipped, chunk.start, chunk.end)

    def _ship_file(self, run: str, path: str) -> Tuple[int, bool]:
        """Ships new records of one file: (records read, whether more are waiting)."""
        rel = os.path.relpath(path, self.config.logdir).replace(os.sep, "/")
        start = self._unread_start(rel, path)
        if start is None:
            return 0, False
        prefix, rank = self._layout(run)
        chunk = self._read_points(run, prefix, rel, path, start)
        if chunk is None or (chunk.end == start and not chunk.corrupt):
            return 0, False
        self._start_rank(rank, path)
        self._ship_chunk(rel, chunk, rank)
        return chunk.records, chunk.records >= self.config.max_records_per_read

    def poll(self) -> int:
        """Ships everything new; returns the number of records read."""
        total = 0
        more = True
        while more:
            more = False
            for run, path in self._tb.find_event_files(self.config.logdir):
                records, waiting = self._ship_file(run, path)
                total += records
                more = more or waiting
        return total

    # -- lifecycle -------------------------------------------------------------

    def ensure_started(self) -> None:
        """Sends run_started once per run (remembered in the state file)."""
        if self.state.data["started"]:
            return
        times = [time.time()]
        for _, path in self._tb.find_event_files(self.config.logdir):
            first = self._tb.first_wall_time(path)
            if first is not None and first >= wire.MIN_TIME:
                times.append(first)
        self._send_event(wire.RUN_STARTED, min(times), self._started_data(self.rank))
        self.state.data["started"] = True
        self.state.save()

    def _started_data(self, rank: Rank) -> Dict[str, Any]:
        data: Dict[str, Any] = {"source": "tensorboard", "logdir": os.path.abspath(self.config.logdir),
                                "host": socket.gethostname()}
        if rank.known:
            data["rank"] = rank.rank
        if self.config.command:
            data["command"] = " ".join(self.config.command)[:1000]
        return data

    def finish(self, status: str, timestamp: float, **data: Any) -> None:
        """Sends run_finished once per run: for the shipper's rank and for each rank directory's."""
        if self.state.data["finished"]:
            return
        ranks = [self.rank] + [Rank(rank, self.config.world_size)
                               for rank in sorted(self.state.data["ranks_started"])]
        for rank in ranks:
            self._send_event(wire.RUN_FINISHED, timestamp, {"status": status, **data}, rank)
        self.state.data["finished"] = True
        self.state.save()

    def _on_signal(self, signum, frame) -> None:
        self.interrupts += 1
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(OSError):
                self.child.send_signal(signum)
        self._woken = True

    def run(self) -> int:
        """Ships until the command exits, the run goes idle, or a signal; returns the exit code."""
        if self.state.data["finished"]:
            logger.warning("trainguard-ship: %s says this run already finished; nothing to do",
                           self.config.state_path)
            return 0
        previous = {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            if self.config.command and not self._start_command():
                return EXIT_CANNOT_RUN
            self.ensure_started()
            if self.child is None and self.config.finish_on_idle_s is None:
                print(f"trainguard-ship: shipping {self.config.logdir} until interrupted; Ctrl-C stops it "
                      "(progress is saved)", file=sys.stderr, flush=True)
            return self._ship_until_done()
        except _Stopped:
            logger.warning("trainguard-ship: stopped before everything was delivered; run it again with the "
                           "same --state to ship the rest")
            return self._child_code(1)
        except Exception as e:
            line = cloud_failure(e)
            if line is None:
                logger.exception("trainguard-ship: shipping stopped; progress up to the last delivered chunk is saved")
            else:  # no credentials or no endpoint: a traceback would hide the one line that matters
                logger.error("trainguard-ship: error: %s; progress up to the last delivered chunk is saved", line)
            if self.child is not None:
                logger.error("trainguard-ship: waiting for the command to finish without shipping")
            return self._child_code(1)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            try:
                self.transport.close()
            except Exception:
                logger.exception("trainguard-ship: transport did not close cleanly")

    def _start_command(self) -> bool:
        command = self.config.command or []
        env = dict(os.environ, **{ENV_TEST: self.config.test, ENV_RUN: self.config.run})
        try:
            self.child = subprocess.Popen(command, env=env)
        except OSError as e:
            logger.error("trainguard-ship: cannot run %s: %s", command[0], e)
            return False
        return True

    def _ship_until_done(self) -> int:
        """The polling loop: ends with the command's exit, an idle run, or an interrupt."""
        idle_since = time.monotonic()
        while True:
            exit_code = self.child.poll() if self.child is not None else None
            if self.poll():
                idle_since = time.monotonic()
            if exit_code is not None:
                if exit_code == 0 and not self.saw_data():
                    self.finish(wire.STATUS_FAILURE, time.time(), exit_code=exit_code, reason=NO_DATA_REASON)
                    return self._no_data()
                status = wire.STATUS_SUCCESS if exit_code == 0 else wire.STATUS_FAILURE
                self.finish(status, time.time(), exit_code=exit_code)
                return _shell_code(exit_code)
            idle = time.monotonic() - idle_since
            if self.config.finish_on_idle_s is not None and idle >= self.config.finish_on_idle_s:
                if not self.saw_data():
                    self.finish(wire.STATUS_FAILURE, time.time(), reason=NO_DATA_REASON, idle_s=round(idle, 1))
                    return self._no_data()
                last = self.state.data.get("last_data_time") or time.time()
                self.finish(self.config.idle_status, last, reason="idle", idle_s=round(idle, 1))
                return 0
            if self._should_stop():
                logger.info("trainguard-ship: interrupted; progress saved, run it again to resume")
                return 0
            self._sleep(self.config.poll_interval_s)

    def saw_data(self) -> bool:
        """Whether any point of this run was shipped, by this process or an earlier one (the state file)."""
        return bool(self.points_shipped or self.state.data.get("last_data_time"))

    def _no_data(self) -> int:
        logger.error("trainguard-ship: error: no scalar point found under %s; run_finished sent as %s (reason %s), "
                     "not success", self.config.logdir, wire.STATUS_FAILURE, NO_DATA_REASON)
        return EXIT_NO_DATA

    def _child_code(self, default: int) -> int:
        if self.child is None:
            return default
        return _shell_code(self.child.wait())


def build_parser() -> argparse.ArgumentParser:
    parser = StrictArgumentParser(
        prog=PROG,
        description="Ship TensorBoard scalars to Pub/Sub (or a JSONL file) in trainguard's wire format. "
                    "Anything after -- is a training command to run and watch. A run without a single point "
                    "is reported as failed (reason no_data) and the shipper exits with status 1.",
        epilog=DASHES_NOTE)
    parser.add_argument("--logdir", required=True,
                        help="TensorBoard log directory to tail; it must exist unless a command is wrapped")
    parser.add_argument("--test", required=True, help="test (benchmark) name")
    parser.add_argument("--run", required=True, help="run id")
    sink = parser.add_mutually_exclusive_group(required=True)
    sink.add_argument("--topic", help="Pub/Sub topic, projects/P/topics/T (honours PUBSUB_EMULATOR_HOST)")
    sink.add_argument("--output", help="append wire messages to this JSONL file instead")
    parser.add_argument("--state", help="progress file (default: <logdir>/.trainguard-ship.<test>.<run>.json)")
    parser.add_argument("--ignore_tag", action="append", default=[], metavar="GLOB",
                        help="skip tags matching this glob (full tag, e.g. 'train/*' or '*/lr'); repeatable")
    parser.add_argument("--poll_interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between looks for new data")
    parser.add_argument("--finish_on_idle", type=float, metavar="SECONDS",
                        help="send run_finished and exit after this long without new data")
    parser.add_argument("--idle_status", choices=wire.FINISHED_STATUSES, default=wire.STATUS_SUCCESS,
                        help="run_finished status when finishing on idle (default: success)")
    parser.add_argument("--exit_timeout", type=float, default=300.0, metavar="SECONDS",
                        help="after the command exits, stop retrying delivery after this long (default 300); "
                             "progress is saved, so a later run ships the rest")
    parser.add_argument("--rank", type=int, metavar="N",
                        help="this worker's rank in a distributed job, on every message (files in rank<N>, "
                             "rank_<N> or rank-<N> subdirectories get their directory's rank instead)")
    parser.add_argument("--world_size", type=int, metavar="N", help="the job's number of workers (ranks)")
    parser.add_argument("--max_points_per_message", type=int, default=1000, help="points per wire message")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: Optional[List[str]] = None
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:] or None
    parser = build_parser()
    args = parser.parse_args(argv)
    if command and args.finish_on_idle is not None:
        parser.error("--finish_on_idle and a wrapped command exclude each other")
    if not command and not os.path.isdir(args.logdir):
        return fail(PROG, f"no log directory {args.logdir!r} (--logdir): nothing to ship", USAGE_ERROR)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = ShipperConfig(logdir=args.logdir, test=args.test, run=args.run, state_path=args.state,
                               ignore_tags=args.ignore_tag, poll_interval_s=args.poll_interval,
                               finish_on_idle_s=args.finish_on_idle, idle_status=args.idle_status,
                               max_points_per_message=args.max_points_per_message,
                               exit_timeout_s=args.exit_timeout, command=command, rank=args.rank,
                               world_size=args.world_size)
        if args.topic:
            from .pubsub_handler import PubSubTransport

            transport: Transport = PubSubTransport(args.topic)
        else:
            transport = JsonlTransport(args.output)
        shipper = Shipper(config, transport)
    except ImportError as e:
        parser.error(f"{e}: trainguard-ship needs tensorboard (pip install 'trainguard[shipper]')")
    except (ValueError, OSError) as e:
        parser.error(str(e))
    except Exception as e:
        line = cloud_failure(e)
        if line is None:
            raise
        return fail(PROG, line, RUNTIME_ERROR)
    return shipper.run()


if __name__ == "__main__":
    sys.exit(main())
