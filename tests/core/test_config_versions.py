"""A config directory with dated versions, read by a loader that never raises (``core.config_versions``).

Beam-free: the directory is a real local one (``load_local_versions``) or, for the property test, listings and
reads made up by the test, failures included.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.alert_record import alert_problems, parse_alert
from core.config import ConfigError, TestConfig, load_config_dir
from core.config_versions import (
    ALL_TESTS,
    BEGINNING,
    CONFIG_ALERT_RUN,
    DIRECTORY,
    ConfigCheck,
    ListedFile,
    LoadedConfigs,
    config_rejected_alert,
    dated_name,
    load_config_versions,
    load_local_versions,
    next_check,
    parse_file_name,
)
from core.vocabulary import AlertKind
from tests.support import T0

CHANGE_AT = T0 + 3600  # 2025-11-20T01:00:00Z
GOOD = {"regression_test_config": {"alert_for_failed_jobs": False}}
BAD = {"regression_test_config": {"alert_for_failed_jobs": "yes"}}
BAD_KEY = "regression_test_config.alert_for_failed_jobs"


def write(directory, name, content) -> str:
    path = directory / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def fails_jobs(config: TestConfig) -> bool:
    return config.regression_test.alert_for_failed_jobs


# -- file names and versions -----------------------------------------------------------------------------------


def test_a_dated_file_is_the_version_valid_from_its_utc_time():
    assert dated_name("team/cifar", CHANGE_AT) == "team__cifar@20251120T010000Z.json"
    assert parse_file_name("team__cifar@20251120T010000Z.json") == ("team/cifar", CHANGE_AT)
    assert parse_file_name("team__cifar.json") == ("team/cifar", BEGINNING)
    assert parse_file_name("a@b@20251120T010000Z.json") == ("a@b", CHANGE_AT)  # the last @ dates the file


@pytest.mark.parametrize("name", ["@20251120T010000Z.json", ".json", "cifar@2025-11-20.json", "cifar@.json",
                                  "cifar@20251320T010000Z.json", "cifar@20251120T010000.json", "cifar@x.json",
                                  "cifar@２０２５１１２０T010000Z.json"])
def test_a_file_name_that_names_no_test_or_no_utc_time_is_refused_with_the_expected_form(name):
    with pytest.raises(ValueError, match="<test>@<UTC time>.json, the time written as 20261120T100000Z"):
        parse_file_name(name)


def test_each_element_picks_its_tests_version_by_event_time_else_the_defaults(tmp_path):
    write(tmp_path, "cifar.json", {})
    write(tmp_path, dated_name("cifar", CHANGE_AT), GOOD)
    write(tmp_path, dated_name("bert", CHANGE_AT), GOOD)           # bert has no version before the change...
    write(tmp_path, "default.json", {"regression_test_config": {"alert_for_oob_metrics": False}})
    write(tmp_path, dated_name("default", CHANGE_AT + 60), {})       # ...and the default changes a minute later
    (tmp_path / "README.txt").write_text("not a config")
    versions = load_local_versions(str(tmp_path)).strict()
    assert fails_jobs(versions.for_test("cifar", CHANGE_AT - 1)) and not fails_jobs(versions.for_test("cifar", CHANGE_AT))
    assert not fails_jobs(versions.for_test("cifar"))                # no time: the latest
    before = versions.for_test("bert", CHANGE_AT - 1)                # ...so it gets the default's then
    assert before.source.endswith("default.json") and not before.regression_test.alert_for_oob_metrics
    assert versions.for_test("other", CHANGE_AT + 60).regression_test.alert_for_oob_metrics
    assert versions.latest.for_test("other").source.endswith(dated_name("default", CHANGE_AT + 60))
    assert not fails_jobs(load_config_dir(str(tmp_path)).for_test("cifar"))  # the tools read the latest


def test_without_any_file_every_test_gets_the_built_in_default(tmp_path):
    versions = load_local_versions(str(tmp_path)).strict()
    assert versions.for_test("x", T0) == TestConfig() and versions.latest.for_test("x") == TestConfig()


# -- launch: strict, with the errors the CLIs have always printed ----------------------------------------------


def test_at_launch_a_bad_file_is_the_one_line_error_naming_file_and_key(tmp_path):
    path = write(tmp_path, "cifar.json", BAD)
    with pytest.raises(ConfigError, match=f"^{path}: {BAD_KEY}: must be true/false"):
        load_local_versions(str(tmp_path)).strict()
    write(tmp_path, "cifar.json", "{oops")
    with pytest.raises(ConfigError, match="cifar.json: -: cannot read JSON"):
        load_config_dir(str(tmp_path))
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'nope'}: -: config directory does not exist$"):
        load_config_dir(str(tmp_path / "nope"))


# -- a running job's re-reads: rejections, never exceptions -----------------------------------------------------


def test_a_file_that_becomes_invalid_keeps_its_previous_version_and_is_rejected_naming_file_and_key(tmp_path):
    path = write(tmp_path, "cifar.json", GOOD)
    first = load_local_versions(str(tmp_path), now=T0)
    write(tmp_path, "cifar.json", BAD)
    again = load_local_versions(str(tmp_path), first, now=T0 + 300)
    [rejection] = again.rejections
    assert (rejection.file, rejection.key, rejection.test, rejection.kept_previous) == (path, BAD_KEY, "cifar", True)
    assert rejection.reason.startswith("must be true/false") and rejection.checked_at == T0 + 300
    assert not fails_jobs(again.versions.for_test("cifar", T0 + 300))  # the version read before
    write(tmp_path, "cifar.json", {})
    fixed = load_local_versions(str(tmp_path), again, now=T0 + 600)
    assert fixed.rejections == () and fails_jobs(fixed.versions.for_test("cifar"))


def test_a_new_bad_file_is_not_used_and_its_test_keeps_its_other_versions(tmp_path):
    write(tmp_path, "cifar.json", GOOD)
    first = load_local_versions(str(tmp_path))
    write(tmp_path, dated_name("cifar", CHANGE_AT), "[1, 2")
    again = load_local_versions(str(tmp_path), first)
    [rejection] = again.rejections
    assert rejection.key == "-" and rejection.reason.startswith("cannot read JSON") and not rejection.kept_previous
    assert not fails_jobs(again.versions.for_test("cifar", CHANGE_AT + 1))


def test_a_directory_that_disappears_keeps_everything_read_before(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    write(configs, "cifar.json", GOOD)
    first = load_local_versions(str(configs))
    for name in os.listdir(configs):
        os.remove(configs / name)
    configs.rmdir()
    again = load_local_versions(str(configs), first)
    assert [(r.file, r.key, r.reason) for r in again.rejections] == [
        (str(configs), "-", "config directory does not exist")]
    assert again.versions == first.versions


def test_a_deleted_file_is_gone_and_reported_as_a_change(tmp_path):
    path = write(tmp_path, "cifar.json", GOOD)
    first = load_local_versions(str(tmp_path), now=T0)
    os.remove(path)
    again = load_local_versions(str(tmp_path), first, now=T0 + 1)
    assert fails_jobs(again.versions.for_test("cifar"))
    assert again.changes_since(first) == [ConfigCheck(path, checked_at=T0 + 1, test="cifar")]


def test_a_file_whose_listing_did_not_change_is_not_read_again():
    reads = []

    def read(path):
        reads.append(path)
        return json.dumps(GOOD).encode()

    def listing(stamp):
        return lambda: [ListedFile("cifar.json", stamp)]

    first = load_config_versions("gs://b/configs", listing("1:100"), read)
    again = load_config_versions("gs://b/configs", listing("1:100"), read, first, now=T0)
    assert reads == ["gs://b/configs/cifar.json"] and again.versions == first.versions
    assert again.changes_since(first) == []
    load_config_versions("gs://b/configs", listing("1:200"), read, again)
    assert len(reads) == 2


# The loader's inputs, made up: any names (good, dated, garbage), stamps, bytes, and failures of either function.
CONTENTS = st.one_of(
    st.sampled_from([b"{}", json.dumps(GOOD).encode(), json.dumps(BAD).encode(), b"{oops", b"\xff\xfe", b"[" * 5000,
                     b'{"window_config": {"tags": {"x": {}}}}', b'{"regression_test_config": 7}']),
    st.binary(max_size=40),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                     st.sampled_from(["metric_collection_config", "regression_test_config", "window_config", "//",
                                      "tags", "x"]), inner, max_size=3), max_leaves=8).map(
        lambda value: json.dumps(value).encode()))
NAMES = st.one_of(st.sampled_from(["cifar.json", "default.json", "cifar@20251120T010000Z.json", "@.json",
                                   "cifar@bad.json", "a__b.json", "README.md", "x/y.json", ".json"]),
                  st.text(max_size=12).map(lambda name: name + ".json"), st.text(max_size=12))
FAILURES = st.sampled_from([OSError("permission denied"), FileNotFoundError("gone"), ValueError("bad"),
                            RuntimeError("boom"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")])
FILES = st.dictionaries(NAMES, st.tuples(st.none() | st.text(max_size=3), CONTENTS | FAILURES), max_size=6)


@settings(max_examples=150, deadline=None)
@given(FILES, FILES, st.none() | FAILURES)
def test_the_loader_never_raises_and_names_the_file_key_and_reason_of_every_rejection(first, second, broken):
    def loader(files, listing_fails):
        def list_files():
            if listing_fails is not None:
                raise listing_fails
            return [ListedFile(name, stamp) for name, (stamp, _) in files.items()]

        def read_file(path):
            content = files[os.path.basename(path)][1]
            if isinstance(content, Exception):
                raise content
            return content
        return list_files, read_file

    before = load_config_versions("configs", *loader(first, None), now=T0)
    after = load_config_versions("configs", *loader(second, broken), before, now=T0 + 1)
    for loaded in (before, after):
        assert isinstance(loaded, LoadedConfigs) and DIRECTORY in loaded.checks
        for check in loaded.rejections:
            assert check.file.startswith("configs") and check.key and check.reason
            assert str(check.error()) == f"{check.file}: {check.key}: {check.reason}"
        for name, check in loaded.checks.items():
            if name != DIRECTORY and not check.rejected:
                assert name in loaded.files and loaded.files[name].test == check.test
        for test in ("cifar", "a/b", "other"):  # every lookup answers
            assert isinstance(loaded.versions.for_test(test, T0), TestConfig)
    if broken is not None:  # a listing that fails keeps what was read before
        assert after.versions == before.versions and after.checks[DIRECTORY].rejected
    for check in after.changes_since(before):
        assert isinstance(check, ConfigCheck)


# -- the alert, once per rejected version ------------------------------------------------------------------------


def check(at, digest="d1", reason="must be true/false", file="gs://b/configs/cifar.json"):
    return ConfigCheck(file, digest, at, BAD_KEY if reason else None, reason, "cifar", True)


def test_each_rejected_version_alerts_once_while_it_stays_rejected():
    seen, alerts = None, []
    for arriving in [check(1), check(2), check(3, "d2", None), check(2.5), check(4), check(5, "d3"), check(6, "d3")]:
        seen, alert = next_check(seen, arriving)
        alerts.append(alert)
    # d1 once; read again: no; accepted d2; a stale d1 read before it: nothing; d1 anew: again; d3 once
    assert alerts == [True, False, False, False, True, True, False]
    assert seen == check(6, "d3")


def test_the_config_rejected_alert_names_file_key_and_reason_and_what_is_used_instead():
    alert = config_rejected_alert(check(T0))
    assert (alert.kind, alert.test, alert.run, alert.created_at) == (AlertKind.CONFIG_REJECTED, "cifar",
                                                                    CONFIG_ALERT_RUN, T0)
    assert alert.message == (f"gs://b/configs/cifar.json: {BAD_KEY}: must be true/false "
                             "(what was read before stays in use)")
    assert alert.alert_id == config_rejected_alert(check(T0 + 300)).alert_id  # one id per file and version
    assert alert.alert_id != config_rejected_alert(check(T0, "d2")).alert_id
    record = parse_alert(json.dumps(alert.to_row()).encode())
    assert record.details["file"] == "gs://b/configs/cifar.json" and record.details["key"] == BAD_KEY
    assert alert_problems([record]) == ["config cifar.json rejected"]
    listing = ConfigCheck("gs://b/configs", "", T0, "-", "config directory does not exist", None, True)
    assert config_rejected_alert(listing).test == ALL_TESTS
