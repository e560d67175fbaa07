"""Live windows as Beam transforms: windowed points in; window rows, window alerts and late points out.

The logic is Beam-free in ``core.windows`` (the windows of one tag) and
``core.stalls`` (silences); the checks of the windows are ``transforms.window_checks``.
"""

from __future__ import annotations

import dataclasses
import json
from time import time as wall_clock
from typing import Any, Callable, Dict, List, Tuple

import apache_beam as beam
from apache_beam import PCollection
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from core.aggregation import NO_STEP
from core.config import Configs, WindowConfig, ranks_matter
from core.history import history_segment
from core.parse import MessageSummary
from core.records import Alert, dead_letter_row, failure_reason, iso_utc, window_row
from core.runs import RunLifecycle, RunResult, effective_rank
from core.schema import ALERTS, DEAD_LETTER
from core.stalls import StallWatch
from core.triage import TriageItem
from core.vocabulary import AlertKind
from core.windows import TagWindows, Window, WindowPoint, WindowResult, window_aggregates
from trainguard import wire
from transforms.coders import RecordCoder, outputs_any
from transforms.ordered import bucket_end
from transforms.parse import DeduplicateMessages
from transforms.rank_windows import CombineRankWindows
from transforms.window_checks import CheckWindows
from transforms.window_state import (
    ClosedWindows,
    PointColumns,
    RunIntake,
    RunWindows,
    closed_entries,
    read_run_and_intake,
    write_run,
)


@outputs_any
class WindowRunFn(beam.DoFn):
    """((test, run, rank), MessageSummary) -> (WindowResult, revision); stall alerts; late points.

    Keyed by run: points wait until the watermark passes them, then fill the
    tag's windows in step order; the run's end (the same rule as the run
    assembler) closes the open ones as partial. A point more than the allowed
    lateness behind the watermark is dead-lettered as ``late``. A DoFn cannot
    read the watermark, so "the watermark" here is the latest time at which one
    of the run's timers fired (the watermark had passed it): a lower bound,
    which errs towards accepting a point (its window is re-emitted with a new
    revision), never towards dropping one.

    In streaming mode the settle timer is set at the earliest due time (a
    buffered message, a time window's end, a stall span) rounded up to its bucket
    of ``lifecycle.timer_bucket_seconds`` (``transforms.ordered.bucket_end``):
    a firing settles everything due up to its time at once, so the watermark
    passing many points costs a firing per bucket, not one per point time. A
    message (its points, its stall span) is due at its LATEST point, not its
    earliest: a message of 1,000 points spans ~50 s, 5-6 buckets, and each
    firing reads and rewrites the run's value and the bag, so settling it as
    the watermark passes each bucket cost ~5.7 firings per message (bench:
    ``bench/bench_state_bytes.py``); due at its end, one. Its windows come out
    up to one message span later; what they hold is the same (points are placed
    in step order once the watermark passed them, whenever that is noticed).

    A back-filled run (``RunLifecycle.backfilled``: its first message far behind
    the wall clock) gets no live windows and no stall check in the streaming job:
    they follow a live run as the watermark passes it, and the watermark has
    passed a back-fill already, so every bundle of it would close its windows
    as partial and look like a stall. Its points still count in its run's
    aggregates; a replay of its logs gives its windows.

    Configs may change while a run is open (``--update``): a tag that gains
    windows starts windowing from its next point; a tag that loses them is
    closed at the next timer, its open windows flushed as partial. A window
    spec that changes applies from the next run. A point, a window or a tag
    that raises goes to ``dead_letter`` with the exception as the reason, and
    the run goes on without it.
    """

    STATE = ReadModifyWriteStateSpec("run_windows", RecordCoder())
    # Batches of points not yet placed: ``PointColumns`` (before them, lists of (tag, point): still read).
    POINTS = BagStateSpec("window_points", RecordCoder())
    # Emitted windows kept for late points, out of ``run_windows`` (``_stash``): ``ClosedWindows`` (before
    # them, lists of (seq, tag, Window without its points, its points as ``PointColumns``): still read).
    CLOSED_0 = BagStateSpec("closed_windows_0", RecordCoder())
    CLOSED_1 = BagStateSpec("closed_windows_1", RecordCoder())
    # What messages in order changed of ``run_windows`` since it was last written (``RunIntake``).
    INTAKE = ReadModifyWriteStateSpec("run_intake", RecordCoder())
    SETTLE = TimerSpec("settle_windows", TimeDomain.WATERMARK)
    CLOSE = TimerSpec("close_windows", TimeDomain.WATERMARK)
    STALL = TimerSpec("stall", TimeDomain.WATERMARK)
    EXPIRE = TimerSpec("expire_windows", TimeDomain.WATERMARK)

    def __init__(self, configs: Configs, lifecycle: RunLifecycle, streaming: bool,
                 clock: Callable[[], float] = wall_clock):
        self.configs = configs
        self.lifecycle = lifecycle
        self.clock = clock
        # A bounded replay has all its input before any timer fires: settling as the
        # watermark advances would only re-read state, so the run's close does it all.
        self.incremental = streaming
        # State as small as its columns go where its bytes are billed and read at every firing (a streaming
        # job); a bounded replay reads it once, at the run's end: there, quick to write and read.
        self.compact = streaming

    def _windows(self, test: str, at: float) -> WindowConfig:
        return self.configs.for_test(test, at).windows

    def process(self, element, timestamp=beam.DoFn.TimestampParam, state=beam.DoFn.StateParam(STATE),
                pending=beam.DoFn.StateParam(POINTS), settle=beam.DoFn.TimerParam(SETTLE),
                close=beam.DoFn.TimerParam(CLOSE), stall=beam.DoFn.TimerParam(STALL),
                closed_0=beam.DoFn.StateParam(CLOSED_0), closed_1=beam.DoFn.StateParam(CLOSED_1),
                intake=beam.DoFn.StateParam(INTAKE)):
        (test, run, rank), summary = element
        run_windows, before = read_run_and_intake(state, intake)
        if run_windows is None and self.incremental and self.lifecycle.backfilled(float(timestamp), self.clock()):
            return ()  # a back-filled run has no live windows (see the class docstring)
        config = self._windows(test, summary.last_time)
        new = run_windows is None
        run_windows = run_windows or RunWindows(
            {}, None if config.stall_seconds is None or rank else StallWatch(config.stall_seconds), rank=rank)
        if run_windows.closed:  # the run assembler dead-letters the whole late message
            return ()
        bags = (closed_0, closed_1)
        tags, stored_seq = list(run_windows.tags), run_windows.stored_seq
        started = (run_windows.started, run_windows.started_time)
        self._note_started(test, summary, run_windows)
        outputs = list(self._absorb(test, run, summary, config, run_windows, pending, settle, close, stall, bags))
        self._stash(run_windows, bags)
        if (new or list(run_windows.tags) != tags or run_windows.stored_seq != stored_seq
                or (run_windows.started, run_windows.started_time) != started):
            write_run(state, run_windows, self.compact, intake, before)
        else:  # only the fields an intake holds changed (a message in order: the usual one)
            span = (summary.first_time, summary.last_time) if run_windows.stalls is not None else None
            intake.write(RunIntake.after(run_windows, before, span))
        return outputs

    def _absorb(self, test, run, summary, config, run_windows, pending, settle, close, stall, bags):
        """Takes one message's points into the run's windows (or the late output) and sets the timers."""
        waiting = []
        loaded = False
        for tag, value, step, time in summary.window_points:
            if time < run_windows.watermark_floor - config.allowed_lateness_seconds:
                yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                    f"late: point more than {config.allowed_lateness_seconds:g} s behind the watermark",
                    json.dumps({"id": summary.id, "test": test, "run": run, "point": {
                        "tag": tag, "value": value, "step": step, "time": time}}, sort_keys=True),
                    f"run:{test}/{run}", time))
                continue
            point = WindowPoint(time, NO_STEP if step is None else step, value)
            windows = run_windows.tags.get(tag)
            if windows is None:
                if tag not in config.tags:
                    continue  # its windows were removed from the config since the message was summarized
                windows = run_windows.tags[tag] = TagWindows(config.tags[tag].spec)
            try:
                needed = windows.needs_emitted(point)
                if needed and not loaded:
                    self._load(run_windows, bags)
                    loaded = True
                updated = windows.update_emitted(point) if needed else None
            except Exception as error:  # noqa: BLE001 - one point's failure is that point's
                yield self._dead_point(test, run, tag, point, failure_reason("window a point", error))
                continue
            if updated is None:
                waiting.append((tag, point))
            else:
                yield from self._results(test, run, tag, [updated], windows.spec.aggregations, run_windows)
        if waiting:
            pending.add(PointColumns.of(waiting, self.compact))
        if run_windows.stalls is not None:
            run_windows.stalls.add(summary.first_time, summary.last_time)
        for event in summary.events:
            if event.type == wire.RUN_FINISHED:
                run_windows.finished_time = max(event.time, run_windows.finished_time or event.time)
            if event.type == wire.RUN_STARTED and isinstance(event.data.get("host"), str):
                run_windows.host = event.data["host"]
        if summary.world_size is not None:
            run_windows.world_size = max(run_windows.world_size or 0, summary.world_size)
        run_windows.last_time = max(summary.last_time, run_windows.last_time or summary.last_time)
        close.set(Timestamp.of(self._finalized_at(run_windows)))
        if self.incremental:  # the message is due at its latest point (see the class docstring)
            latest = [max(point.time for _, point in waiting)] if waiting else []
            message_due = latest or ([summary.last_time] if run_windows.stalls is not None else [])
            due = min(message_due + [run_windows.scheduled or float("inf")])
            if due < float("inf") and due != run_windows.scheduled:
                self._set_settle(run_windows, settle, max(due, run_windows.watermark_floor))
            if run_windows.stalls is not None:
                # not truncated below a microsecond (``bucket_end``): a firing before it would see no stall yet
                stall.set(bucket_end(run_windows.last_time + config.stall_seconds, 0))

    def _note_started(self, test: str, summary: MessageSummary, run_windows: RunWindows) -> None:
        """Keeps the data of the run's earliest run_started (in event time; the first of a tie, in the message)
        of the keys that pick the history its windows are checked against (``history_by``), for the windows
        emitted from then on."""
        for event in summary.events:
            if event.type != wire.RUN_STARTED or (run_windows.started_time is not None
                                                  and event.time >= run_windows.started_time):
                continue
            keys = self.configs.for_test(test, summary.last_time).window_history_keys()
            if keys:
                run_windows.started = {key: event.data[key] for key in keys if key in event.data}
                run_windows.started_time = event.time

    def _take_pending(self, run_windows: RunWindows, pending, upto: float) -> List[float]:
        """Moves the buffered points at or before ``upto`` into their tag's windows.

        Returns when each batch left buffered is due: its latest point (a batch is one message's points,
        or what a firing left of them), so that a message settles in one firing."""
        batches = [batch if isinstance(batch, list) else batch.items() for batch in pending.read()]
        pending.clear()
        dues = []
        for batch in batches:
            later = [item for item in batch if item[1].time > upto]
            if later:
                pending.add(PointColumns.of(later, self.compact))
                dues.append(max(point.time for _, point in later))
            for tag, point in batch:
                if point.time <= upto and tag in run_windows.tags:
                    run_windows.tags[tag].pending.append(point)
        return dues

    @staticmethod
    def _load(run_windows: RunWindows, bags) -> None:
        """Puts every kept emitted window back into its tag's ``emitted``, from the bags of closed windows.

        Read only for a point behind a tag's open window (``TagWindows.needs_emitted``): a late point."""
        for bag, used in zip(bags, run_windows.closed_used):
            if not used:
                continue
            for batch in bag.read():
                for seq, tag, window in closed_entries(batch):
                    ref = run_windows.stored.get(tag, {}).get(window.index)
                    windows = run_windows.tags.get(tag)
                    if ref is not None and ref[0] == seq and windows is not None and window.index in windows.kept:
                        windows.emitted.setdefault(window.index, window)

    @staticmethod
    def _stash(run_windows: RunWindows, bags) -> None:
        """Moves the emitted windows out of ``run_windows`` into a bag of closed windows, those new or revised.

        31 KB of the run's 36 KB value were emitted windows kept only for late points (bench, 20 tags,
        60 s lateness), read and rewritten with it at every firing; in a bag, a window is written once when
        emitted (or revised) and read only when a point behind the open window comes (``_load``). Each
        stored window has a seq (``stored``), the latest version of a window is the one whose seq is there.
        Two bags take turns, so that old windows go without being read: new windows go to ``closed_bag``;
        once no kept window is in the other bag, that one is cleared (blind) and takes the new windows.
        Each bag then holds about the allowed lateness' worth of windows, a batch as one ``ClosedWindows``.
        A value written before the bags (its windows in ``emitted``, none ``stored``) moves them at its next
        write."""
        for tag in [t for t in run_windows.stored if t not in run_windows.tags]:
            del run_windows.stored[tag]
        for tag, refs in run_windows.stored.items():
            kept = run_windows.tags[tag].kept
            run_windows.stored[tag] = {i: ref for i, ref in refs.items() if i in kept}
        batch = []
        for tag in sorted(run_windows.tags):
            windows = run_windows.tags[tag]
            refs = run_windows.stored.setdefault(tag, {})
            for index, window in sorted(windows.emitted.items()):
                ref = refs.get(index)
                if index in windows.kept and (ref is None or ref[1] != window.revision):
                    run_windows.stored_seq += 1
                    batch.append((run_windows.stored_seq, tag, window))
                    refs[index] = [run_windows.stored_seq, window.revision, -1]
            windows.emitted = {}
        if not batch:
            return
        current, other = run_windows.closed_bag, 1 - run_windows.closed_bag
        live = {ref[2] for refs in run_windows.stored.values() for ref in refs.values()}
        if run_windows.closed_used[current] and other not in live:
            if run_windows.closed_used[other]:
                bags[other].clear()
            run_windows.closed_used[other] = False
            current = run_windows.closed_bag = other
        for _, tag, window in batch:
            run_windows.stored[tag][window.index][2] = current
        bags[current].add(ClosedWindows.of(batch))
        run_windows.closed_used[current] = True

    @staticmethod
    def _dead_point(test: str, run: str, tag: str, point: WindowPoint, reason: str):
        return beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
            reason, json.dumps({"test": test, "run": run, "point": {
                "tag": tag, "value": point.value, "step": None if point.step == NO_STEP else point.step,
                "time": point.time}}, sort_keys=True),
            f"run:{test}/{run}", point.time))

    def _advance(self, key, run_windows: RunWindows, closing: bool, watermark: float, at: float):
        """Settles (or, at the run's end, closes) every tag's windows and yields their results.

        A tag whose windows were removed from the config is closed now. A tag
        that raises is dropped from the run, its points dead-lettered."""
        test, run = key[:2]
        config = self._windows(test, at)
        for tag in sorted(run_windows.tags):
            windows = run_windows.tags[tag]
            try:
                if closing or tag not in config.tags:
                    closed = windows.close()
                    del run_windows.tags[tag]
                else:
                    closed = windows.settle(watermark)
                    windows.expire(before=watermark - config.allowed_lateness_seconds)
            except Exception as error:  # noqa: BLE001 - one tag's failure stops that tag, not the run
                del run_windows.tags[tag]
                reason = failure_reason(f"windows of {tag}", error)
                stranded = windows.pending + windows.open + [p for ps in windows.open_by_index.values() for p in ps]
                for point in stranded:
                    yield self._dead_point(test, run, tag, point, reason)
                continue
            yield from self._results(test, run, tag, closed, windows.spec.aggregations, run_windows)

    def _finalized_at(self, run_windows: RunWindows) -> float:
        assert run_windows.last_time is not None  # a run's windows start with its first point or event
        return self.lifecycle.finalization_time(run_windows.finished_time, run_windows.last_time)

    def _stall_alerts(self, key, run_windows: RunWindows, gap_starts):
        test, run = key[:2]
        stalls = run_windows.stalls
        assert stalls is not None  # the gaps come from it
        for gap_start in gap_starts:
            detected = gap_start + stalls.stall_seconds
            if detected >= self._finalized_at(run_windows):
                continue  # the run had ended by then: silence after the end is no stall
            if self.incremental and self.lifecycle.stall_fired_by_drain(detected, self.clock(), stalls.stall_seconds):
                continue  # a drain fired every timer at once: this silence has not happened
            yield beam.pvalue.TaggedOutput(ALERTS.name, Alert(
                kind=AlertKind.RUN_STALLED, test=test, run=run, created_at=detected, instance=repr(gap_start),
                message=f"run {run} sent nothing for {stalls.stall_seconds:g} s of event time "
                        f"after {iso_utc(gap_start)}",
                details={"silent_since": iso_utc(gap_start), "stall_seconds": stalls.stall_seconds}))

    def _schedule(self, run_windows: RunWindows, settle, buffered_dues: List[float]) -> None:
        dues = [d for d in (w.next_due() for w in run_windows.tags.values()) if d is not None]
        dues += buffered_dues
        if run_windows.stalls is not None and run_windows.stalls.pending:
            dues.append(min(last for _, last in run_windows.stalls.pending))  # a message's span: due at its end
        if dues:
            self._set_settle(run_windows, settle, max(min(dues), run_windows.watermark_floor))
        else:
            run_windows.scheduled = None

    def _set_settle(self, run_windows: RunWindows, settle, due: float) -> None:
        """Sets the settle timer at the end of ``due``'s bucket (``scheduled`` keeps when it fires)."""
        fires = bucket_end(due, self.lifecycle.timer_bucket_seconds)
        run_windows.scheduled = float(fires)
        settle.set(fires)

    def _results(self, test: str, run: str, tag: str, windows: List[Window], aggregations: Tuple[str, ...],
                 run_windows: RunWindows):
        """(WindowResult, revision) of each window; a window whose aggregates raise is dead-lettered.

        A tag whose windows need every rank gives each rank's windows, with the rank, for
        ``transforms.rank_windows`` to combine; other tags' windows (rank 0's) are the run's own."""
        config = self.configs.for_test(test, windows[0].end_time) if windows else None
        per_rank = config is not None and ranks_matter(config, tag)
        history_by = config.window_history_by(tag) if config is not None else ()
        segment = history_segment(run_windows.started or {}, history_by)
        rank, world_size, host = (run_windows.rank, run_windows.world_size, run_windows.host) if per_rank else (
            None, None, None)
        for window in windows:
            try:
                yield WindowResult(test, run, tag, window.kind, window.index, window.start_time, window.end_time,
                                   window.start_step, window.end_step, len(window.points), window.partial,
                                   window_aggregates(window.points, aggregations), rank=rank, world_size=world_size,
                                   host=host, segment=segment), window.revision
            except Exception as error:  # noqa: BLE001 - one window's failure is that window's
                yield beam.pvalue.TaggedOutput(DEAD_LETTER.name, dead_letter_row(
                    failure_reason(f"aggregate a window of {tag}", error),
                    json.dumps({"test": test, "run": run, "tag": tag, "window": window.index,
                                "points": [list(p) for p in window.points]}, sort_keys=True),
                    f"run:{test}/{run}", window.end_time))

    @on_timer(SETTLE)
    def on_settle(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                  state=beam.DoFn.StateParam(STATE), pending=beam.DoFn.StateParam(POINTS),
                  settle=beam.DoFn.TimerParam(SETTLE), closed_0=beam.DoFn.StateParam(CLOSED_0),
                  closed_1=beam.DoFn.StateParam(CLOSED_1), intake=beam.DoFn.StateParam(INTAKE)):
        run_windows, merged = read_run_and_intake(state, intake)
        if run_windows is None or run_windows.closed:
            return
        watermark = float(fired_at)
        run_windows.watermark_floor = max(run_windows.watermark_floor, watermark)
        buffered_dues = self._take_pending(run_windows, pending, watermark)
        yield from self._advance(key, run_windows, False, watermark, watermark)
        if run_windows.stalls is not None:
            yield from self._stall_alerts(key, run_windows, run_windows.stalls.settle(watermark))
        self._schedule(run_windows, settle, buffered_dues)
        self._stash(run_windows, (closed_0, closed_1))
        write_run(state, run_windows, self.compact, intake, merged)

    @on_timer(CLOSE)
    def on_close(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 state=beam.DoFn.StateParam(STATE), pending=beam.DoFn.StateParam(POINTS),
                 expire=beam.DoFn.TimerParam(EXPIRE), closed_0=beam.DoFn.StateParam(CLOSED_0),
                 closed_1=beam.DoFn.StateParam(CLOSED_1), intake=beam.DoFn.StateParam(INTAKE)):
        run_windows, merged = read_run_and_intake(state, intake)
        if run_windows is None or run_windows.closed:
            return
        self._take_pending(run_windows, pending, float("inf"))
        yield from self._advance(key, run_windows, True, float("inf"), float(fired_at))
        if run_windows.stalls is not None:  # timer families may fire in any order: finish the stall check here
            stalls = run_windows.stalls
            gaps = stalls.settle(float("inf")) + stalls.ongoing(float("inf"), run_windows.last_time)
            yield from self._stall_alerts(key, run_windows, gaps)
        # Keep only the fact that the run is closed (its windows can no longer change) for a while.
        closed_0.clear()
        closed_1.clear()
        write_run(state, RunWindows({}, closed=True), self.compact, intake, merged)
        expire.set(fired_at + self.lifecycle.retention_seconds)

    @on_timer(EXPIRE)
    def on_expire(self, state=beam.DoFn.StateParam(STATE), intake=beam.DoFn.StateParam(INTAKE)):
        state.clear()
        intake.clear()

    @on_timer(STALL)
    def on_stall(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 state=beam.DoFn.StateParam(STATE), intake=beam.DoFn.StateParam(INTAKE)):
        run_windows, merged = read_run_and_intake(state, intake)
        if run_windows is None or run_windows.closed:
            return
        now = float(fired_at)
        run_windows.watermark_floor = max(run_windows.watermark_floor, now)
        gaps = run_windows.stalls.ongoing(now, run_windows.last_time)
        write_run(state, run_windows, self.compact, intake, merged)
        yield from self._stall_alerts(key, run_windows, gaps)


def without_payload(summary: MessageSummary) -> MessageSummary:
    """The summary as ``WindowRunFn`` takes it: without its raw payload (or replay-file span).

    The payload rides along so that a message too late for its run can be dead-lettered whole (``AssembleRuns``,
    de-duplication); live windows never read it (a late point is dead-lettered as the point's JSON), and it was
    16 KB of the 56 KB each 1,000-point message of the bench's windowed test put through the shuffle into them."""
    return dataclasses.replace(summary, payload=b"", payload_span=None)


class LiveWindows(beam.PTransform[Tuple[PCollection[MessageSummary], PCollection[RunResult], PCollection[RunResult],
                                        PCollection[TriageItem]],
                                  Tuple[PCollection[Dict[str, Any]], PCollection[Alert], PCollection[Dict[str, Any]]]]):
    """(MessageSummary, RunResult, interrupted RunResult, TriageItem) -> (metric_windows rows, window alerts,
    late points).

    A run a drain interrupts (``AssembleRuns``' ``interrupted`` output) ends its distributed run's rank windows
    as a run that ended does: the windows a slower rank had not reached are combined from the ranks that did,
    not lost with the drained state. It does not join the window checks' history (it did not end). A bounded
    replay interrupts no run: its ``interrupted`` is not read.

    ``seed`` (the one-element PCollection of the start-up ``HistorySeed``) carries
    the step-aligned history of earlier invocations, each key's to that key.

    Only tests with a ``window_config`` cost anything: other messages carry no
    window points and are dropped before the shuffle. ``deduplicate``: the
    summaries may hold a message twice (a bounded replay de-duplicates while
    assembling runs, ``AssembleRunPartsFn``), so those of windowed tests are
    de-duplicated here first, by the same rule (per run, the copy whose bytes
    sort first); a streaming job de-duplicates every message before this. The
    summaries lose their raw payload before the shuffle into the windows
    (``without_payload``), after any de-duplication (which compares them).
    """

    def __init__(self, configs: Configs, lifecycle: RunLifecycle, seed, streaming: bool = False,
                 deduplicate: bool = False):
        super().__init__()
        self.configs = configs
        self.fn = WindowRunFn(configs, lifecycle, streaming)
        self.seed = seed
        self.streaming = streaming
        self.deduplicate = deduplicate

    def expand(self, inputs):
        summaries, runs, interrupted, actions = inputs
        configs = self.configs

        def windowed_rank(summary: MessageSummary) -> bool:
            """Rank 0 (or no rank) of a test with windows; other ranks only where a tag needs every rank."""
            config = configs.for_test(summary.test, summary.last_time)
            if not config.windows.tags:
                return False
            return not summary.rank or any(ranks_matter(config, tag) for tag in config.windows.tags)

        windowed = summaries | "OfWindowedTests" >> beam.Filter(windowed_rank)
        if self.deduplicate:  # the copy its run counts; the run assembly dead-letters the others
            windowed, _ = windowed | "Deduplicate" >> DeduplicateMessages(self.fn.lifecycle.dedup_horizon_seconds,
                                                                          forget=False, per_run=True)
        windowed = (windowed
                    | "KeyByRun" >> beam.Map(lambda s: ((s.test, s.run, effective_rank(s.rank)), without_payload(s)))
                    .with_output_types(
                        beam.typehints.KV[beam.typehints.Tuple[str, str, int], MessageSummary])
                    | "Windows" >> beam.ParDo(self.fn).with_outputs(ALERTS.name, DEAD_LETTER.name, main="results"))
        by_rank = windowed.results | "RankOrRun" >> beam.Partition(
            lambda result, _: int(result[0].rank is not None), 2)
        bucket = self.fn.lifecycle.timer_bucket_seconds
        run_ends = (runs, interrupted) | "EndedOrInterrupted" >> beam.Flatten() if self.streaming else runs
        combined, straggler_alerts, failed_combines = (by_rank[1], run_ends) | "CombineRanks" >> CombineRankWindows(
            configs, self.seed, self.streaming, bucket, self.fn.lifecycle.retention_seconds)
        results = (by_rank[0], combined) | "RunWindows" >> beam.Flatten()
        rows = results | "Rows" >> beam.MapTuple(window_row)
        check_alerts, failed_checks = (results, runs, actions) | "Checks" >> CheckWindows(
            configs, self.seed, self.streaming, bucket)
        alerts = (windowed[ALERTS.name], check_alerts, straggler_alerts) | "WindowAlerts" >> beam.Flatten()
        dead_letters = ((windowed[DEAD_LETTER.name], failed_checks, failed_combines)
                        | "WindowDeadLetters" >> beam.Flatten())
        return rows, alerts, dead_letters
