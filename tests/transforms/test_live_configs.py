"""Configs that change while the streaming job runs (``transforms.config_versions``), on real Beam.

- ``LiveConfigs`` re-reads the directory once its refresh period has passed (an injected clock, no sleeping),
  and a copy unpickled on a worker re-reads at its first lookup; nothing it meets makes it raise;
- a file that becomes invalid while the job runs keeps its previous version in every stage, and ``WatchConfigs``
  raises exactly one ``config_rejected`` alert naming the file and the key;
- ``AlertOnceFn`` alerts once per rejected version of a file, again when the file breaks anew.

A dated version applying by event time, in a replay and on a stream, is in ``test_config_changes.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import threading

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from core.config_versions import CONFIG_REFRESH_SECONDS, ConfigCheck, load_local_versions
from core.runs import RunLifecycle
from core.schema import ALERTS, DEAD_LETTER
from pipeline.graph import GraphSettings
from tests.support import T0
from tests.transforms.support import detect, simple_run, streaming_pipeline
from transforms import config_versions
from transforms.config_versions import AlertOnceFn, LiveConfigs, WatchConfigs, forget_readers, read_config_dir

CONDITION = {"comparison": "greater", "success_threshold": {"fixed_value": 80}}
GOOD = {"regression_test_config": {"metric_success_conditions": {"acc_final": CONDITION},
                                   "alert_after_second_test_failure": False}}
TYPO = {"regression_test_config": {**GOOD["regression_test_config"], "alert_for_failed_job": True}}
TYPO_KEY = "regression_test_config.alert_for_failed_job"
LIFECYCLE = RunLifecycle(grace_seconds=10, timeout_seconds=600)


@dataclasses.dataclass
class FakeClock:
    """Processing time that moves only when the test says so (picklable, as the stages' copies are)."""
    now: float = T0

    def __call__(self) -> float:
        return self.now


WALL_CLOCK = [T0]


def wall_clock() -> float:
    """Processing time shared by every copy (a module function pickles by name)."""
    return WALL_CLOCK[0]


def config_dir(tmp_path, **files) -> str:
    directory = tmp_path / "configs"
    directory.mkdir(exist_ok=True)
    for name, content in files.items():
        (directory / f"{name}.json").write_text(json.dumps(content))
    return str(directory)


def bounded(configs, test="cifar"):
    """Whether ``test``'s config has the fixed bound on acc_final."""
    return configs.for_test(test, T0).regression_test.condition_for("acc_final") is not None


# -- LiveConfigs -------------------------------------------------------------------------------------------------


def test_live_configs_re_read_the_directory_once_the_refresh_period_has_passed(tmp_path):
    directory = config_dir(tmp_path, cifar={})
    clock = FakeClock()
    live = LiveConfigs(read_config_dir(directory, now=clock()), refresh_seconds=300, clock=clock)
    assert not bounded(live)                       # the first lookup re-reads: nothing changed
    config_dir(tmp_path, cifar=GOOD)
    clock.now += 299
    assert not bounded(live)                       # not yet due
    clock.now += 1
    assert bounded(live)                           # due: the edit is live
    copy = pickle.loads(pickle.dumps(live))        # another stage's copy, in the same process
    config_dir(tmp_path, cifar={})
    assert bounded(live) and bounded(copy)         # they share the process's reader: not due yet
    forget_readers()                               # a new worker process has no reader yet
    assert not bounded(copy)                       # its first lookup reads the directory
    assert not bounded(live)                       # the same reader


def test_every_stage_of_a_worker_shares_one_reader_that_lists_the_directory_once_per_refresh(tmp_path, monkeypatch):
    """The job's 14-odd stages each hold a copy of its LiveConfigs; on a worker they list the directory once per
    refresh period between them, and switch to an edit at the same moment."""
    directory = config_dir(tmp_path, cifar={})
    listings = []
    original = config_versions._list_files
    monkeypatch.setattr(config_versions, "_list_files", lambda d: listings.append(d) or original(d))
    WALL_CLOCK[0] = T0
    launched = LiveConfigs(read_config_dir(directory, now=T0), refresh_seconds=300, clock=wall_clock)
    listings.clear()
    stages = [pickle.loads(pickle.dumps(launched)) for _ in range(14)]
    threads = [threading.Thread(target=lambda s=stage: [s.for_test("cifar", T0) for _ in range(50)]) for stage in stages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(listings) == 1
    config_dir(tmp_path, cifar=GOOD)
    WALL_CLOCK[0] += 299
    assert [bounded(stage) for stage in stages] == [False] * 14
    WALL_CLOCK[0] += 1
    assert [bounded(stage) for stage in stages] == [True] * 14 and len(listings) == 2


def test_live_configs_never_raise_whatever_happens_to_the_directory(tmp_path):
    directory = config_dir(tmp_path, cifar=GOOD)
    clock = FakeClock()
    live = LiveConfigs(read_config_dir(directory), refresh_seconds=60, clock=clock)
    for damage in (lambda: config_dir(tmp_path, cifar="{oops"), lambda: os.remove(os.path.join(directory, "cifar.json")),
                   lambda: shutil.rmtree(directory)):
        damage()
        clock.now += 60
        assert live.for_test("cifar", T0) is not None
    assert bounded(live) is False  # the file was deleted before the directory went: that change was read
    assert live.loaded.rejections[0].reason == "config directory does not exist"


def test_a_local_directory_reads_the_same_through_beams_file_systems_as_without_beam(tmp_path):
    directory = config_dir(tmp_path, cifar=GOOD, default={}, **{"cifar@20251120T010000Z": {}})
    assert read_config_dir(directory).strict() == load_local_versions(directory).strict()
    [missing] = read_config_dir(str(tmp_path / "nope")).rejections
    assert (missing.file, missing.reason) == (str(tmp_path / "nope"), "config directory does not exist")


def test_the_refresh_period_is_an_option_of_the_streaming_job():
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.streaming import StreamingJobConfig, UsageError

    base = ["--streaming", "--input_subscription=projects/my-project/subscriptions/s", "--bigquery_dataset=d",
            "--project=my-project"]
    assert StreamingJobConfig.from_options(PipelineOptions(base)).config_refresh_seconds == CONFIG_REFRESH_SECONDS
    assert StreamingJobConfig.from_options(PipelineOptions(base + ["--config_refresh_seconds=60"])
                                           ).config_refresh_seconds == 60
    with pytest.raises(UsageError, match="--config_refresh_seconds=0: must be more than 0"):
        StreamingJobConfig.from_options(PipelineOptions(base + ["--config_refresh_seconds=0"]))


# -- the streaming graph, with a file that turns bad -------------------------------------------------------------


def alert_summary(row):
    return row["kind"], row["test_name"], row["run_id"], row["metric_name"]


def config_alert(row):
    details = json.loads(row["details"])
    return row["kind"], row["test_name"], row["run_id"], details["file"], details["key"], details["kept_previous"]


def test_a_file_that_becomes_invalid_keeps_its_previous_version_and_alerts_once_naming_file_and_key(tmp_path):
    directory = config_dir(tmp_path, cifar=GOOD)
    launched = read_config_dir(directory)  # at launch, checked strictly: fine
    launched.strict()
    config_dir(tmp_path, cifar=TYPO)       # then someone uploads a typo
    live = LiveConfigs(launched, refresh_seconds=0)  # every lookup re-reads: every stage meets the typo, often
    stream = TestStream().advance_watermark_to(Timestamp.of(T0))
    for i, accuracy in enumerate((90.0, 70.0, 95.0)):
        for message in simple_run("cifar", f"r{i}", T0 + 100 * i, accuracy):
            stream = stream.add_elements([message])
    stream = stream.advance_watermark_to(Timestamp.of(T0 + 1000)).advance_watermark_to_infinity()
    with streaming_pipeline() as p:
        messages = p | stream
        outputs = detect(messages, GraphSettings(live, LIFECYCLE, streaming=True))
        config_alerts = messages | "WatchConfigs" >> WatchConfigs(live)
        # the bound of the version read before still judges the runs: r1 is out of bounds
        assert_that(outputs[ALERTS.name] | beam.Map(alert_summary),
                    equal_to([("metric_out_of_bounds", "cifar", "r1", "acc_final")]), label="run alerts")
        assert_that(outputs[DEAD_LETTER.name], equal_to([]), label="nothing dead")
        assert_that(config_alerts | beam.Map(config_alert), equal_to([
            ("config_rejected", "cifar", "config", os.path.join(directory, "cifar.json"), TYPO_KEY, True)]),
            label="one config alert")


# -- once per rejected version -----------------------------------------------------------------------------------


def check(file, at, digest="d1", rejected=True):
    return file, ConfigCheck(file, digest, at, TYPO_KEY if rejected else None, "unknown key" if rejected else None,
                             "cifar", True)


def test_each_rejected_version_of_a_file_alerts_once_and_again_when_the_file_breaks_anew():
    a, b = "gs://b/configs/a.json", "gs://b/configs/b.json"
    arrivals = [check(a, T0), check(b, T0), check(a, T0 + 300), check(b, T0 + 300), check(a, T0 + 600, "d2", False),
                check(a, T0 + 400), check(a, T0 + 900), check(b, T0 + 900, "d3")]
    stream = TestStream()
    for arrival in arrivals:
        stream = stream.add_elements([arrival])
    with streaming_pipeline() as p:
        alerts = (p | stream.advance_watermark_to_infinity()
                  | "AlertOnce" >> beam.ParDo(AlertOnceFn())
                  | beam.Map(lambda row: (json.loads(row["details"])["file"], row["created_at"])))
        # a: first seen; read again (no); accepted; a stale read from before that (no); broken anew (yes).
        # b: first seen; read again (no); another bad version (yes).
        assert_that(alerts, equal_to([(a, "2025-11-20T00:00:00.000000Z"), (b, "2025-11-20T00:00:00.000000Z"),
                                      (a, "2025-11-20T00:15:00.000000Z"), (b, "2025-11-20T00:15:00.000000Z")]))
