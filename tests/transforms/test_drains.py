"""A drain, driven through every stateful DoFn of the streaming graph: it raises no alert of its own and loses nothing.

A drain (``gcloud dataflow jobs drain``) stops reading, moves every stage's input watermark to the end of time and
so fires every event-time timer still pending, at once, each at its own time, earliest first, while the wall
clock still reads "now"; then the job ends and its keyed state is dropped. Here each DoFn of
``tests.transforms.support.stateful_dofns`` runs key by key on coded state stand-ins
(``tests/transforms/held_watermarks.py``): a few keys' elements come in as a live job's do (each a moment after
its event time, the watermark trailing the wall clock by ``LAG``), the watermark follows the wall clock to ``NOW``
with their timers pending mid-life, then the drain: ``advance(END_OF_TIME, NOW)``.

"Caused by the drain" means: made only because the drain fired a timer before its time had come by the wall
clock, i.e. an output a live job, its watermark following the wall clock, would not have made from the same
input. What is due anyway is not: an item the watermark would pass within seconds, a run that had sent
``run_finished``, a silence that had already lasted. The rule of each DoFn:

- the event-time-ordered checks (metric, job, window, triage ledger, rank windows; ``transforms.ordered``) read
  no clock: their outputs depend only on their items and their order. A drain passes every item they hold, and
  they step each as any watermark passing it would: the same outputs, in the same order, as a watermark just
  past the last held item, and nothing left pending (their state goes with the job: the next one's seed
  rebuilds it from what they wrote);
- de-duplication (``FirstPerKeyFn``) let the first copy of each id through when it came: the drain only fires
  its forget timers, which emit nothing;
- run assembly (``AssembleRunFn``, ``AssembleRunOrBackfillFn``): a run whose end the drain fired further ahead of
  the wall clock than the clock skew (``RunLifecycle.interrupted``), or a back-fill whose quiet period it cut
  short by more than half (``RunLifecycle.backfill_interrupted``), is not ended as ``missing`` but goes to the
  ``interrupted`` output with its open state, which the next job resumes; a run that had sent ``run_finished``
  ends as itself;
- live windows (``WindowRunFn``): a stall the drain fired further ahead of the wall clock than the clock skew or
  half the stall (``RunLifecycle.stall_fired_by_drain``) has not happened: no ``run_stalled``; the run's close
  emits every window it holds, the open ones partial (a resumed run's windows start afresh in the next job).

Each DoFn is driven alone, on the inputs the graph gives it (what one stage's drain feeds the next: the local
streaming runner's drain in ``tests/pipeline/test_restarts.py`` and ``tests/transforms/test_windows.py``). A
replay's run assembly (``AssembleRunPartsFn``) and ordered checks (``GroupedInOrder``) are not here: they keep no
state, and a bounded replay is never drained (its input ends; its open runs end ``missing``, tested in
``tests/transforms/test_stored_and_interrupted_runs.py``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Tuple

import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import MIN_TIMESTAMP

from core import encoding
from core.alert_details import finish_alert
from core.history import SeededState
from core.parse import summarize
from core.records import Alert, MetricObservation
from core.runs import BACKFILL_LAG_SECONDS, RunAccumulator, RunLifecycle, RunResult, open_run_text
from core.schema import ALERT_UPDATES, ALERTS, DEAD_LETTER
from core.triage import RaisedAlert, TriageItem
from core.vocabulary import AlertKind
from core.window_checks import RunEnded
from core.windows import WindowResult
from tests.support import T0
from tests.transforms.held_watermarks import END_OF_TIME, HeldStage
from tests.transforms.support import configs, finished, raw, started, stateful_dofns
from trainguard import wire
from transforms.history import JobMachine, MetricMachine
from transforms.ordered import bucket_end
from transforms.runs import INTERRUPTED
from transforms.window_checks import WindowCheckMachine

DAY = 86400.0
NOW = T0 + 30 * DAY  # the wall clock when the job is drained
JOB_START = NOW - 2 * 3600.0  # when the drained job started (its seed came then)
LAG = 10.0  # the watermark trails the wall clock by about this much (Dataflow's Pub/Sub watermark)
DELAY = 2.0  # a live message arrives this long after its event time
LIFECYCLE = RunLifecycle(backfill_lag_seconds=BACKFILL_LAG_SECONDS)  # the streaming job's: timeout 6 h, skew 10 min
STALL = 300.0
CONFIGS = configs(cifar={
    "regression_test_config": {"alert_after_second_test_failure": False, "metric_success_conditions": {
        "acc_final": {"comparison": "greater", "success_threshold": {"stddevs_from_mean": 3},
                      "wait_for_n_points_of_history": 3}}},
    "metric_collection_config": {"tag_to_rank_reduction": {"step_time": "max"}},
    "window_config": {"allowed_lateness_seconds": 30, "stall_seconds": STALL, "tags": {
        "loss": {"count": 4, "aggregations": ["mean"], "checks": [{
            "aggregation": "mean", "history": "step_aligned", "min_effect_rel": 0.05,
            "condition": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 3},
                          "wait_for_n_points_of_history": 2}}]},
        "step_time": {"count": 10, "aggregations": ["mean"]}}}})
CONFIG = CONFIGS.for_test("cifar")


class Clock:
    """The wall clock the DoFns read (``clock=``): where the drive has got to."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass(frozen=True)
class Element:
    """One element of a key, at its event time, arriving at ``arrival`` by the wall clock."""
    key: Any
    value: Any
    at: float
    arrival: float


def live(key, value, at: float) -> Element:
    """An element sent live: it arrives a moment after its event time (and no later than the drain)."""
    return Element(key, value, at, min(at + DELAY, NOW))


@dataclasses.dataclass
class Drained:
    stage: HeldStage
    live: List[Any]  # outputs while the watermark followed the wall clock
    held: List[Tuple[Any, str, Any]]  # the timers pending when the drain came
    held_items: int  # the items an ordered stage's keys held then
    drained: List[Any]  # the drain's outputs


def drive(name: str, elements: List[Element], to: float = END_OF_TIME) -> Drained:
    """Runs the DoFn ``name`` on ``elements`` as a live job does until the wall clock reads ``NOW`` (the
    watermark ``LAG`` behind), then moves the watermark ``to`` the end of time, the wall clock still at ``NOW``:
    the drain."""
    arrivals = sorted(elements, key=lambda e: e.arrival)
    clock = Clock(arrivals[0].arrival)
    stage = HeldStage(stateful_dofns(CONFIGS, LIFECYCLE, clock)[name][0])
    outputs: List[Any] = []
    watermark = clock.now - LAG
    for element in arrivals:
        clock.now = element.arrival
        watermark = max(watermark, element.arrival - LAG)
        outputs += stage.advance(watermark, clock.now)
        outputs += stage.process(element.key, element.value, element.at)
    clock.now = NOW
    outputs += stage.advance(NOW - LAG, NOW)
    return Drained(stage, outputs, stage.pending(), held_items(stage), stage.advance(to, NOW))


def held_items(stage: HeldStage) -> int:
    """How many items an ordered stage's keys hold in their pending bags (``transforms.ordered``)."""
    return sum(len(cell.data) for cells, _ in stage.keys.values() for name, cell in cells.items()
               if name.endswith("_pending"))


def main(outputs) -> List[Any]:
    return [o for o in outputs if not isinstance(o, TaggedOutput)]


def plain(outputs) -> List[Tuple[str, Any]]:
    """Outputs as (output name, value): ``TaggedOutput`` has no equality."""
    return [(o.tag, o.value) if isinstance(o, TaggedOutput) else ("main", o) for o in outputs]


def tagged(outputs, tag: str) -> List[Any]:
    return [o.value for o in outputs if isinstance(o, TaggedOutput) and o.tag == tag]


# -- the messages and items the DoFns take ----------------------------------------------------------------------

def summary(message):
    parsed, _ = wire.parse_message(message.payload)
    return summarize(parsed, message.payload, CONFIGS.for_test(parsed.test))


def messages(run: str, times: List[float], status_at: Tuple[float, str] = None, first: int = 0):
    """A run's messages, one a time from the run's ``first``: an ``acc`` and a ``loss`` point at step ``i``
    (and ``run_started`` on the run's first), then ``run_finished`` of ``status_at``."""
    sent = [raw("cifar", run, f"{run}/{i}", points=[("acc", 70.0 + i, i, t), ("loss", 1.0 - i / 100, i, t)],
                events=[started(t)] if i == 0 else []) for i, t in enumerate(times, first)]
    if status_at is not None:
        sent.append(raw("cifar", run, f"{run}/end", events=[finished(status_at[0], status_at[1])]))
    return sent


def event_time(message) -> float:
    return wire.parse_message(message.payload)[0].event_time


def accumulated(run: str, sent) -> RunAccumulator:
    """The run's state after ``sent``, as run assembly keeps it."""
    accumulator = RunAccumulator("cifar", run)
    for message in sent:
        accumulator.add(summary(message))
    return accumulator


def run_result(run: str, start: float, acc: float, status: str = "success") -> RunResult:
    """A finished run (its end 100 s after its start, finalized a grace later)."""
    sent = [raw("cifar", run, f"{run}/p", points=[("acc", acc, 10, start + 50)], events=[started(start)]),
            raw("cifar", run, f"{run}/e", events=[finished(start + 100, status)])]
    return accumulated(run, sent).result(CONFIG, LIFECYCLE)


def seeded(machine, key, items) -> Element:
    """A key's state from the start-up seed (``transforms.ordered.WithSeeds``): the key's ``machine`` after
    earlier jobs' ``items``. It comes when the job starts."""
    state = machine.initial(key)
    for item in sorted(items, key=lambda i: i.order):
        list(machine.step(state, item))
    return Element(key, SeededState(state), float(MIN_TIMESTAMP), JOB_START)


def window(run: str, index: int, end: float, mean: float, partial: bool = False, rank=None, tag="loss",
           n: int = 4) -> WindowResult:
    ranked = () if rank is None else (rank, 3, f"host-{rank}")
    return WindowResult("cifar", run, tag, "count", index, end - 3 * n, end, index * n, index * n + n - 1, n,
                        partial, {"mean": mean}, *ranked)


def raised(run: str, kind: AlertKind, at: float, metric: str = None) -> RaisedAlert:
    alert = Alert(kind=kind, test="cifar", run=run, message="", created_at=at, metric=metric)
    return RaisedAlert("cifar", at, finish_alert(alert, CONFIG).to_row())


def alert_id(item: RaisedAlert) -> str:
    return item.row["alert_id"]


# -- the event-time-ordered checks ------------------------------------------------------------------------------

HISTORY = [run_result(f"h{i}", JOB_START - (10 - i) * DAY, acc) for i, acc in enumerate([80.0, 80.6, 79.4, 80.2])]
EARLIER = run_result("r1", NOW - 3600, 80.1)  # ended while the job ran
JUST_ENDED = run_result("r1b", NOW - 165, 79.9)  # ended at NOW - 5: the watermark has not passed it yet
# in their grace when the drain came (ending at NOW + 40 and NOW + 100): run assembly emits them at the drain
ENDING = run_result("r2", NOW - 120, 50.0)
FAILING = run_result("r3", NOW - 60, 79.0, "failure")


def observations(runs) -> List[Tuple[Tuple[str, str], MetricObservation]]:
    return [((o.test, o.metric), o) for run in runs for o in MetricObservation.all_of(run)]


def metric_elements() -> List[Element]:
    history = observations(HISTORY)
    machine = MetricMachine(CONFIGS)
    return ([seeded(machine, key, [o for k, o in history if k == key]) for key in dict(history)]
            + [live(key, o, o.finalized_at) for key, o in observations([EARLIER, JUST_ENDED, ENDING])])


def job_elements() -> List[Element]:
    other = dataclasses.replace(run_result("o1", NOW - 100, 90.0, "timeout"), test="other")  # another key
    return [seeded(JobMachine(CONFIGS), "cifar", HISTORY)] + [
        live(run.test, run, run.finalized_at) for run in (EARLIER, ENDING, FAILING, other)]


def window_elements() -> List[Element]:
    key = ("cifar", "loss", "count")
    history = [item for i, run in enumerate(["h0", "h1"]) for item in (
        window(run, 0, JOB_START - (5 - i) * DAY, 1.0 + i / 100), window(run, 1, JOB_START - (5 - i) * DAY + 20, 0.9),
        RunEnded("cifar", run, "success", JOB_START - (5 - i) * DAY + 100, "loss", "count"))]
    return [seeded(WindowCheckMachine(CONFIGS), key, history),
            live(key, window("r1", 0, NOW - 400, 1.0), NOW - 400),
            live(key, window("r1", 1, NOW - 300, 0.9), NOW - 300),
            # r1's end, in its grace (run assembly emits it at the drain): r1's windows join the history
            live(key, RunEnded("cifar", "r1", "success", NOW + 40, "loss", "count"), NOW + 40),
            live(key, window("r2", 0, NOW - 200, 1.01), NOW - 200),
            live(key, window("r2", 1, NOW - 5, 3.0), NOW - 5)]  # complete, and far out of bounds: alerts


TRIAGE_EARLIER = raised("r1", AlertKind.METRIC_OUT_OF_BOUNDS, NOW - 3000, "acc_final")
TRIAGE_ENDING = raised("r3", AlertKind.JOB_FAILED, NOW + 100)


def triage_elements() -> List[Element]:
    mute = TriageItem("mute-1", "cifar", "mute", NOW - 8, until=NOW + DAY)
    dismiss = TriageItem("dismiss-1", "cifar", "dismiss", NOW - 6, metric="acc_final", run="r1",
                         alert_id=alert_id(TRIAGE_EARLIER), alert_kind="metric_out_of_bounds")
    return [live("cifar", item, item.order[0]) for item in (TRIAGE_EARLIER, mute, dismiss, TRIAGE_ENDING)]


def rank_elements() -> List[Element]:
    running, ending = ("cifar", "dist", "step_time"), ("cifar", "dist-done", "step_time")
    return ([live(running, window("dist", 0, NOW - 600 + rank, 1.0 + rank / 10, rank=rank, tag="step_time"),
                  NOW - 600 + rank) for rank in range(3)]
            + [live(running, window("dist", 1, NOW - 6 + rank, 1.1, rank=rank, tag="step_time"), NOW - 6 + rank)
               for rank in range(3)]
            # a run whose rank 2 sent no window: its end (at the drain) combines the others'
            + [live(ending, window("dist-done", 0, NOW - 500 + rank, 2.0 + rank, rank=rank, tag="step_time"),
                    NOW - 500 + rank) for rank in range(2)]
            + [live(ending, RunEnded("cifar", "dist-done", "success", NOW + 40, "step_time", "count"), NOW + 40)])


def state_of(row) -> str:
    """The triage state an alert row's details announce."""
    return (json.loads(row["details"]).get("triage") or {}).get("state", "open")


def keyed_state(run: Drained, key, name: str):
    """The machine's state an ordered stage keeps for ``key`` (``<name>_keyed``)."""
    return run.stage.keys[key][0][f"{name}_keyed"].read()


def metric_drained(run: Drained):
    """The runs that ended by the drain are checked; the one out of bounds alerts (its rows before the alert)."""
    assert [(a.kind, a.run) for a in tagged(run.drained, ALERTS.name)] == [("metric_out_of_bounds", "r2")]
    assert [row["run_id"] for row in main(run.drained) if row["metric_name"] == "acc_final"] == ["r1b", "r2"]


def job_drained(run: Drained):
    """Each test's runs that ended by the drain are checked: the failed ones alert."""
    assert [(a.kind, a.test, a.run) for a in main(run.drained)] == [
        ("job_failed", "other", "o1"), ("job_failed", "cifar", "r3")]
    assert keyed_state(run, "cifar", "job").last_status == "failure"


def window_drained(run: Drained):
    """The window the watermark had not passed is checked (and alerts); the run that ended joins the history."""
    assert [(a.kind, a.run, a.instance) for a in main(run.drained)] == [("window_out_of_bounds", "r2", "count/1")]
    settled = run.stage.keys[("cifar", "loss", "count")][0]["window_settled"].read()  # kept apart: the finished runs
    assert [finished.run for finished in settled] == ["h0", "h1", "r1"]


def triage_drained(run: Drained):
    """The mute covers the alert raised after it; the dismiss re-announces the alert it names."""
    assert [(row["alert_id"], state_of(row)) for row in main(run.drained)] == [(alert_id(TRIAGE_ENDING), "muted")]
    assert [(row["alert_id"], state_of(row)) for row in tagged(run.drained, ALERT_UPDATES)] == [
        (alert_id(TRIAGE_EARLIER), "dismissed")]


def ranks_drained(run: Drained):
    """The index every rank had sent is combined; the run that ended combines the ranks that have its last."""
    assert [(w.run, w.index, w.n) for w, _ in main(run.drained)] == [("dist", 1, 12), ("dist-done", 0, 8)]


ORDERED = {
    "ordered metric check": (metric_elements, metric_drained),
    "ordered job check": (job_elements, job_drained),
    "ordered window check": (window_elements, window_drained),
    "ordered triage ledger": (triage_elements, triage_drained),
    "ordered rank windows": (rank_elements, ranks_drained),
}


def just_past(elements: List[Element]) -> float:
    """A watermark just past every element's bucket: where a live job's watermark would pass them all."""
    return float(bucket_end(max(e.at for e in elements), LIFECYCLE.timer_bucket_seconds)) + 1


def check_ordered(name: str):
    """Items the stage held when the drain came (due within the last bucket, or emitted upstream by the drain)
    are all stepped, and give exactly what a live job's watermark passing them gives; no dead letter."""
    elements_of, drained = ORDERED[name]
    elements = elements_of()
    run = drive(name, elements)
    assert run.held_items > 0, "nothing held when the drain came: the drain would be untested"
    assert held_items(run.stage) == 0, "items left unstepped"
    assert tagged(run.live + run.drained, DEAD_LETTER.name) == []
    passed = drive(name, elements, to=just_past(elements))
    assert held_items(passed.stage) == 0 and plain(passed.live) == plain(run.live)
    assert plain(run.drained) == plain(passed.drained)
    drained(run)


# -- de-duplication ---------------------------------------------------------------------------------------------

def check_dedup(name: str):
    """Each id went out once, when its first copy came (a redelivery, nothing); the drain fires the ids' forget
    timers, within their horizon: nothing out, nothing twice."""
    sent = messages("r1", [NOW - 100, NOW - 5])
    copies = [live(summary(m).id, summary(m), event_time(m)) for m in sent]
    redelivered = [dataclasses.replace(copy, arrival=NOW) for copy in copies]
    run = drive(name, copies + redelivered)
    assert {key for key, _ in main(run.live)} == {summary(m).id for m in sent} and len(main(run.live)) == 2
    assert run.held, "no id within its horizon: the drain would be untested"
    assert run.drained == [] and run.stage.pending() == []


# -- run assembly -----------------------------------------------------------------------------------------------

LIVE_RUN = messages("live", [NOW - 600 + 60 * i for i in range(10)])  # still sending (last NOW - 60)
GRACE_RUN = messages("grace", [NOW - 300, NOW - 200], status_at=(NOW - 20, "success"))
RESUMED_BEFORE = messages("resumed", [JOB_START - 300, JOB_START - 200])  # a drained job's open run
RESUMED_AFTER = messages("resumed", [JOB_START + 600, NOW - 3 * 3600, NOW - 30], first=2)
BACKFILL_CUT = messages("backfill", [T0 + 10, T0 + 50])  # month-old logs, still coming when the drain came
BACKFILL_DONE = messages("backfill-done", [T0 + 10, T0 + 50], status_at=(T0 + 100, "success"))


def sent_live(messages_) -> List[Element]:
    return [live(("cifar", summary(m).run), summary(m), event_time(m)) for m in messages_]


def sent_now(messages_, arrival: float) -> List[Element]:
    """Messages of old logs sent ``arrival`` by the wall clock (a back-fill)."""
    return [Element(("cifar", summary(m).run), summary(m), event_time(m), arrival + i)
            for i, m in enumerate(messages_)]


def assembly_elements(backfills: bool) -> List[Element]:
    resumed = Element(("cifar", "resumed"), accumulated("resumed", RESUMED_BEFORE), float(MIN_TIMESTAMP), JOB_START)
    elements = sent_live(LIVE_RUN + GRACE_RUN + RESUMED_AFTER) + [resumed]
    if backfills:
        elements += sent_now(BACKFILL_CUT, NOW - 120) + sent_now(BACKFILL_DONE, NOW - 60)
    return elements


def open_state(result: RunResult) -> str:
    """The open state an interrupted run carries for the next job, as ``core.encoding`` text."""
    return encoding.to_text(encoding.from_text(open_run_text([e._asdict() for e in result.events])))


def check_assembly(name: str):
    """Runs open when the drain came (a live one still sending, one resumed from a drained job's state, a
    back-fill still coming) are interrupted with all they had, none ends missing; a run in its grace, or a
    back-fill with its run_finished, ends as itself."""
    backfills = name == "run assembly with back-fills"
    run = drive(name, assembly_elements(backfills))
    assert run.live == [], "a run ended before the drain: the drain would be untested"
    ended = {(r.run, r.status, r.out_of_order) for r in main(run.drained)}
    interrupted = {r.run: r for r in tagged(run.drained, INTERRUPTED)}
    assert tagged(run.drained, DEAD_LETTER.name) == []
    # what had sent run_finished ends as itself (with its metrics); nothing ends missing
    assert ended == {("grace", "success", False)} | ({("backfill-done", "success", True)} if backfills else set())
    assert all({m.name for m in r.metrics} >= {"acc_final", "loss_final"} for r in main(run.drained))
    # every run still open is interrupted, with everything it had (a resumed run: both jobs' messages)
    whole = {"live": accumulated("live", LIVE_RUN), "resumed": accumulated("resumed", RESUMED_BEFORE + RESUMED_AFTER)}
    if backfills:
        whole["backfill"] = accumulated("backfill", BACKFILL_CUT)
    assert {r: (i.status, i.finalized_at, open_state(i)) for r, i in interrupted.items()} == {
        r: ("interrupted", NOW, encoding.to_text(a)) for r, a in whole.items()}
    assert run.stage.pending() == []


# -- live windows -----------------------------------------------------------------------------------------------

WINDOWED = {"live": messages("live", [NOW - 600 + 20 * i for i in range(30)] + [NOW - 3]),  # one not yet placed
            # the last point a straggler from a clock 35 s ahead: its settle and the run's close (at NOW + 40)
            # fire at the same time, and whichever comes first takes it
            "grace": messages("grace", [NOW - 400 + 30 * i for i in range(11)] + [NOW + 35],
                              status_at=(NOW - 20, "success")),
            # silent for longer than the stall, live, then sending again: stalled before the drain, once
            "resumed": messages("resumed", [NOW - 1200, NOW - 1190] + [NOW - 700 + 50 * i for i in range(14)])}


def window_run_elements(windowed: Dict[str, list]) -> List[Element]:
    return [live(("cifar", run, 0), summary(m), event_time(m)) for run, sent in windowed.items() for m in sent]


def placed_points(outputs) -> Dict[Tuple[str, str], int]:
    """(run, tag) -> how many points its windows hold (each window's latest revision)."""
    latest: Dict[Tuple[str, str, int], Tuple[int, int]] = {}
    for result, revision in main(outputs):
        key = (result.run, result.tag, result.index)
        if revision >= latest.get(key, (-1, 0))[0]:
            latest[key] = (revision, result.n)
    points: Dict[Tuple[str, str], int] = {}
    for (run_, tag, _), (_, n) in latest.items():
        points[(run_, tag)] = points.get((run_, tag), 0) + n
    return points


def check_windows(name: str):
    """No ``run_stalled`` from the drain for runs still sending (the one a real silence stalled was reported
    live, once); every point is in an emitted window, those the drain closed partial; no dead letter."""
    run = drive(name, window_run_elements(WINDOWED))
    assert any(timer == "ts-stall" and key[1] == "live" for key, timer, _ in run.held), run.held
    assert [(a.kind, a.run) for a in tagged(run.live, ALERTS.name)] == [("run_stalled", "resumed")]
    assert tagged(run.drained, ALERTS.name) == []
    assert tagged(run.live + run.drained, DEAD_LETTER.name) == []
    sent = {run_: sum(point[0] == "loss" for m in ms for point in summary(m).window_points)
            for run_, ms in WINDOWED.items()}
    assert {run_: n for (run_, tag), n in placed_points(run.live + run.drained).items() if tag == "loss"} == sent
    assert run.stage.pending() == []


CHECKS: Dict[str, Callable[[str], None]] = {
    **{name: check_ordered for name in ORDERED},
    "first per key (dedup)": check_dedup,
    "run assembly": check_assembly,
    "run assembly with back-fills": check_assembly,
    "live windows": check_windows,
}
NOT_DRAINED: Dict[str, str] = {}  # name -> why a stateful DoFn of the graph is never drained


def test_every_stateful_dofn_of_the_graph_is_drained_here():
    """A stateful DoFn that joins ``stateful_dofns`` must get a drain here (or say why it is never drained)."""
    assert set(CHECKS) | set(NOT_DRAINED) == set(stateful_dofns(CONFIGS, LIFECYCLE))
    assert not set(CHECKS) & set(NOT_DRAINED)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_drain_raises_no_alert_of_its_own_and_loses_nothing(name):
    """The DoFn's keys, their timers pending mid-life, drained: what each kind asserts is its ``check_*``."""
    CHECKS[name](name)


# -- what a drain rightly reports: what was due anyway -----------------------------------------------------------

@pytest.mark.parametrize("silent_for, stalled", [(STALL / 2 - 10, False), (STALL / 2 + 10, True)])
def test_a_drain_reports_a_run_already_silent_for_more_than_half_its_stall(silent_for, stalled):
    """The drain fires the run's stall timer ``STALL - silent_for`` ahead of the wall clock: a run silent for
    more than half its stall when the job drains is reported (its silence would have been found within half a
    stall), one silent for less is not (``RunLifecycle.stall_fired_by_drain``)."""
    last = NOW - silent_for
    run = drive("live windows", window_run_elements({"quiet": messages("quiet", [last - 100, last])}))
    assert tagged(run.live, ALERTS.name) == []
    expected = [(AlertKind.RUN_STALLED, "quiet", last + STALL)] if stalled else []
    assert [(a.kind, a.run, a.created_at) for a in tagged(run.drained, ALERTS.name)] == expected


@pytest.mark.parametrize("name", ["run assembly", "run assembly with back-fills"])
@pytest.mark.parametrize("left, status", [(LIFECYCLE.clock_skew_seconds - 60, "missing"),
                                          (LIFECYCLE.clock_skew_seconds + 60, "interrupted")])
def test_a_drain_ends_as_missing_a_run_whose_timeout_was_within_the_clock_skew(name, left, status):
    """A run silent for all but ``left`` seconds of its timeout: within the clock skew, its end was due (senders'
    clocks may be that far ahead), and it is ``missing``; further ahead, the drain cut it short
    (``RunLifecycle.interrupted``)."""
    last = NOW - LIFECYCLE.timeout_seconds + left
    run = drive(name, sent_live(messages("silent", [last - 60, last])))
    assert [(r.run, r.status) for r in main(run.drained) + tagged(run.drained, INTERRUPTED)] == [("silent", status)]


@pytest.mark.parametrize("quiet_for, status", [(LIFECYCLE.backfill_quiet_seconds / 2 + 60, "missing"),
                                               (LIFECYCLE.backfill_quiet_seconds / 2 - 60, "interrupted")])
def test_a_drain_ends_as_missing_a_backfill_quiet_for_more_than_half_its_quiet_period(quiet_for, status):
    """A back-fill without its ``run_finished`` whose last message came ``quiet_for`` before the drain: quiet for
    more than half its quiet period, its end was due and it is ``missing`` (out of order); quiet for less, the
    drain cut it short (``RunLifecycle.backfill_interrupted``)."""
    run = drive("run assembly with back-fills", sent_now(BACKFILL_CUT, NOW - quiet_for - 1))
    assert [(r.run, r.status, r.out_of_order) for r in main(run.drained) + tagged(run.drained, INTERRUPTED)] == [
        ("backfill", status, True)]
