"""The streaming job's run assembly, which also takes back-fills (old logs sent now)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from transforms.run_assembly import AssembleRunFn, RunCells


class AssembleRunOrBackfillFn(AssembleRunFn):
    """``AssembleRunFn`` of the streaming job, which also takes back-fills.

    A run whose first message is older than the wall clock by
    ``lifecycle.backfill_lag_seconds`` is a back-fill (``RunLifecycle.backfilled``):
    its event-time end is behind the watermark, so a timer at that end would
    end it after its first bundle. It ends instead ``lifecycle.backfill_quiet_seconds``
    after its latest message arrived (by its own ``run_finished``, or as
    ``missing`` if the logs never had one), with ``out_of_order`` set, and its
    tombstone expires ``lifecycle.retention_seconds`` after that.

    Both are event-time timers set at the wall clock plus the wait, not
    processing-time timers: Dataflow holds a stage's output watermark at every
    pending user timer's hold, which for a processing-time timer is the
    timestamp of the element that set it, a month back for a back-fill. That
    would hold every check downstream, all tests' alerts, until the tombstone
    expired. An event-time timer's hold is its own time, ahead of the
    watermark, which follows the wall clock: it holds nothing back, and fires
    once the watermark passes the wall-clock time it was set for. A drain
    fires it at once; a back-fill it cuts short without its ``run_finished``
    is interrupted like a live run (``RunLifecycle.backfill_interrupted``), and
    the next job resumes it as a back-fill. A subclass: a replay reads history,
    all of it behind the wall clock, and has no back-fills.
    """

    FINALIZE_BACKFILL = TimerSpec("finalize_backfill", TimeDomain.WATERMARK)
    EXPIRE_BACKFILL = TimerSpec("expire_backfill", TimeDomain.WATERMARK)

    def default_label(self) -> str:
        return "AssembleRunFn"  # the step's name since before back-fills: what a running job's --update maps

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                accumulator_state=beam.DoFn.StateParam(AssembleRunFn.ACCUMULATOR),
                finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                resumed=beam.DoFn.StateParam(AssembleRunFn.RESUMED),
                backfill=beam.DoFn.StateParam(AssembleRunFn.BACKFILL),
                finalize_timer=beam.DoFn.TimerParam(AssembleRunFn.FINALIZE),
                finalize_backfill_timer=beam.DoFn.TimerParam(FINALIZE_BACKFILL)):
        cells = RunCells(accumulator_state, finalized, resumed=resumed, backfill=backfill,
                         finalize_timer=finalize_timer, finalize_backfill_timer=finalize_backfill_timer)
        yield from self._add(element, timestamp, cells)

    @on_timer(FINALIZE_BACKFILL)
    def finalize_backfill(self, key=beam.DoFn.KeyParam, fired_at=beam.DoFn.TimestampParam,
                          accumulator_state=beam.DoFn.StateParam(AssembleRunFn.ACCUMULATOR),
                          finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                          backfill=beam.DoFn.StateParam(AssembleRunFn.BACKFILL),
                          expire_timer=beam.DoFn.TimerParam(EXPIRE_BACKFILL)):
        cells = RunCells(accumulator_state, finalized, backfill=backfill, expire_timer=expire_timer)
        accumulator = cells.accumulator.read()
        if accumulator is None or not cells.backfill.read():  # state gone, or a timer of an earlier life of the key
            return
        cells.expire_timer.set(Timestamp.of(self.clock() + self.lifecycle.retention_seconds))
        at = accumulator.finalize_at(self.lifecycle)
        yield from self._finalize(key, accumulator, cells, at, out_of_order=True, timer_at=float(fired_at))

    @on_timer(EXPIRE_BACKFILL)
    def expire_backfill(self, finalized=beam.DoFn.StateParam(AssembleRunFn.FINALIZED),
                        resumed=beam.DoFn.StateParam(AssembleRunFn.RESUMED),
                        backfill=beam.DoFn.StateParam(AssembleRunFn.BACKFILL)):
        finalized.clear()
        resumed.clear()
        backfill.clear()
