"""Live windows as Beam transforms: windowed points in; window rows, window alerts and late points out."""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, Optional

import apache_beam as beam
from apache_beam.coders import PickleCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from pipeline.config import ConfigSet
from transforms.aggregation import NO_STEP, MessageSummary, finalization_time
from transforms.ordered import in_event_time_order
from transforms.parse import DEAD_LETTER
from transforms.records import Alert, dead_letter_row, iso_utc
from transforms.window_checks import RunEnded, WindowHistory, WindowResult, check_window, end_run
from transforms.windows import TagWindows, Window, window_aggregates
from trainguard import wire

ALERTS = "alerts"


def window_row(result: WindowResult, revision: int) -> dict:
    row = {"run_id": result.run, "test_name": result.test, "tag": result.tag, "window_kind": result.kind,
           "window_index": result.index, "revision": revision, "partial": result.partial,
           "start_time": iso_utc(result.start_time), "end_time": iso_utc(result.end_time),
           "start_step": result.start_step, "end_step": result.end_step, "n": result.n}
    row.update(result.values)
    return row


@dataclasses.dataclass
class _RunWindows:
    """Everything one run keeps for its windows."""
    tags: Dict[str, TagWindows]
    last_time: Optional[float] = None        # latest point or event
    last_point_time: Optional[float] = None
    finished_time: Optional[float] = None
    watermark_floor: float = float("-inf")   # the watermark is at least this (a timer fired there)
    closed: bool = False
    stalled_since: Optional[float] = None    # last point time of the stall already alerted


class WindowRunFn(beam.DoFn):
    """((test, run), MessageSummary) -> (WindowResult, revision); stall alerts; late points.

    Keyed by run: points wait until the watermark passes them, then fill the
    tag's windows in step order; the run's end (the same rule as the run
    assembler) closes the open ones as partial. A point more than the allowed
    lateness behind the watermark is dead-lettered as ``late``. A DoFn cannot
    read the watermark, so "the watermark" here is the latest time at which one
    of the run's timers fired (the watermark had passed it): a lower bound,
    which errs towards accepting a point (its window is re-emitted with a new
    revision), never towards dropping one.
    """

    STATE = ReadModifyWriteStateSpec("run_windows", PickleCoder())
    SETTLE = TimerSpec("settle_windows", TimeDomain.WATERMARK)
    CLOSE = TimerSpec("close_windows", TimeDomain.WATERMARK)
    STALL = TimerSpec("stall", TimeDomain.WATERMARK)
    EXPIRE = TimerSpec("expire_windows", TimeDomain.WATERMARK)

    def __init__(self, configs: ConfigSet, grace: float, run_timeout: float, retention: float):
        self.configs = configs
        self.grace = grace
        self.run_timeout = run_timeout
        self.retention = retention

    def _windows(self, test: str):
        return self.configs.for_test(test).windows

    def process(self, element, state=beam.DoFn.StateParam(STATE), settle=beam.DoFn.TimerParam(SETTLE),
                close=beam.DoFn.TimerParam(CLOSE), stall=beam.DoFn.TimerParam(STALL)):
        (test, run), summary = element
        config = self._windows(test)
        run_windows = state.read() or _RunWindows({tag: TagWindows(c.spec) for tag, c in config.tags.items()})
        if run_windows.closed:
            return  # the run assembler dead-letters the whole late message
        for tag, value, step, time in summary.window_points:
            if time < run_windows.watermark_floor - config.allowed_lateness_seconds:
                yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter_row(
                    f"late: point more than {config.allowed_lateness_seconds:g} s behind the watermark",
                    json.dumps({"id": summary.id, "test": test, "run": run, "point": {
                        "tag": tag, "value": value, "step": step, "time": time}}, sort_keys=True),
                    f"run:{test}/{run}", time))
                continue
            for window in run_windows.tags[tag].add((time, NO_STEP if step is None else step, value)):
                yield self._result(test, run, tag, window)
            run_windows.last_point_time = max(time, run_windows.last_point_time or time)
        for event in summary.events:
            if event.type == wire.RUN_FINISHED:
                run_windows.finished_time = max(event.time, run_windows.finished_time or event.time)
        run_windows.last_time = max(summary.last_time, run_windows.last_time or summary.last_time)
        self._schedule(run_windows, settle)
        close.set(Timestamp.of(finalization_time(run_windows.finished_time, run_windows.last_time,
                                                 self.grace, self.run_timeout)))
        if config.stall_seconds is not None and run_windows.last_point_time is not None:
            stall.set(Timestamp.of(run_windows.last_point_time + config.stall_seconds))
        state.write(run_windows)

    @staticmethod
    def _schedule(run_windows: _RunWindows, settle) -> None:
        dues = [d for d in (w.next_due() for w in run_windows.tags.values()) if d is not None]
        if dues:
            settle.set(Timestamp.of(max(min(dues), run_windows.watermark_floor)))

    def _result(self, test: str, run: str, tag: str, window: Window):
        aggregations = self._windows(test).tags[tag].spec.aggregations
        result = WindowResult(test, run, tag, window.kind, window.index, window.start_time, window.end_time,
                              window.start_step, window.end_step, len(window.points), window.partial,
                              window_aggregates(window.points, aggregations))
        return result, window.revision

    @on_timer(SETTLE)
    def on_settle(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                  state=beam.DoFn.StateParam(STATE), settle=beam.DoFn.TimerParam(SETTLE)):
        run_windows = state.read()
        if run_windows is None or run_windows.closed:
            return
        watermark = float(fired_at)
        run_windows.watermark_floor = max(run_windows.watermark_floor, watermark)
        lateness = self._windows(key[0]).allowed_lateness_seconds
        for tag, windows in run_windows.tags.items():
            for window in windows.settle(watermark):
                yield self._result(*key, tag, window)
            windows.expire(before=watermark - lateness)
        self._schedule(run_windows, settle)
        state.write(run_windows)

    @on_timer(CLOSE)
    def on_close(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 state=beam.DoFn.StateParam(STATE), expire=beam.DoFn.TimerParam(EXPIRE)):
        run_windows = state.read()
        if run_windows is None or run_windows.closed:
            return
        for tag, windows in run_windows.tags.items():
            for window in windows.close():
                yield self._result(*key, tag, window)
        # Keep only the fact that the run is closed (its windows can no longer change) for a while.
        state.write(_RunWindows({}, closed=True))
        expire.set(fired_at + self.retention)

    @on_timer(EXPIRE)
    def on_expire(self, state=beam.DoFn.StateParam(STATE)):
        state.clear()

    @on_timer(STALL)
    def on_stall(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                 state=beam.DoFn.StateParam(STATE)):
        run_windows = state.read()
        if run_windows is None or run_windows.closed:
            return
        run_windows.watermark_floor = max(run_windows.watermark_floor, float(fired_at))
        state.write(run_windows)
        if run_windows.stalled_since == run_windows.last_point_time:
            return
        run_windows.stalled_since = run_windows.last_point_time
        state.write(run_windows)
        test, run = key
        silence = float(fired_at) - run_windows.last_point_time
        yield beam.pvalue.TaggedOutput(ALERTS, Alert(
            kind="run_stalled", test=test, run=run, created_at=float(fired_at),
            instance=repr(run_windows.last_point_time),
            message=f"run {run} has sent no points for {silence:g} s of event time",
            details={"last_point_time": iso_utc(run_windows.last_point_time), "silence_seconds": silence}))


class _WindowCheckMachine:
    def __init__(self, configs: ConfigSet):
        self.configs = configs

    def initial(self, key, seed):
        return WindowHistory()

    def step(self, history, item):
        if isinstance(item, RunEnded):
            end_run(history, item)
            return []
        return check_window(history, item, self.configs.for_test(item.test).windows.tags[item.tag])


class LiveWindows(beam.PTransform):
    """(de-duplicated MessageSummary, RunResult) -> (metric_windows rows, window alerts, late points).

    Only tests with a ``window_config`` cost anything: other messages carry no
    window points and are dropped before the shuffle.
    """

    def __init__(self, configs: ConfigSet, grace: float, run_timeout: float, retention: float):
        super().__init__()
        self.configs = configs
        self.fn = WindowRunFn(configs, grace, run_timeout, retention)

    def expand(self, inputs):
        summaries, runs = inputs
        configs = self.configs
        windowed = (summaries
                    | "OfWindowedTests" >> beam.Filter(lambda s: bool(configs.for_test(s.test).windows.tags))
                    | "KeyByRun" >> beam.Map(lambda s: ((s.test, s.run), s)).with_output_types(
                        beam.typehints.KV[beam.typehints.Tuple[str, str], MessageSummary])
                    | "Windows" >> beam.ParDo(self.fn).with_outputs(ALERTS, DEAD_LETTER, main="results"))
        results = windowed.results
        rows = results | "Rows" >> beam.MapTuple(window_row)
        first_results = results | "FirstRevisions" >> beam.FlatMapTuple(
            lambda result, revision: [result] if revision == 0 and configs.for_test(result.test).windows.tags[
                result.tag].checks else [])
        run_ends = runs | "RunEnds" >> beam.FlatMap(lambda run: [
            RunEnded(run.test, run.run, run.status, run.finalized_at, tag, config.spec.kind)
            for tag, config in configs.for_test(run.test).windows.tags.items() if config.checks])
        check_alerts = (
            (first_results, run_ends) | "CheckInputs" >> beam.Flatten()
            | "KeyByTagKind" >> beam.Map(lambda i: ((i.test, i.tag, i.kind), i)).with_output_types(
                beam.typehints.KV[beam.typehints.Tuple[str, str, str], beam.typehints.Any])
            | "CheckInOrder" >> beam.ParDo(in_event_time_order(_WindowCheckMachine(configs), "window"), None))
        alerts = (windowed[ALERTS], check_alerts) | "WindowAlerts" >> beam.Flatten()
        return rows, alerts, windowed[DEAD_LETTER]
