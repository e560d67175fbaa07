import json
import os

import pytest

from core.config import (
    COMPARISONS,
    SHIFT_SHARE,
    Comparison,
    ConfigError,
    SuccessCondition,
    TestConfig,
    filename_for_test,
    load_config_dir,
    parse_test_config,
    shift_rate,
)
from tests.support import REPO_ROOT

REPO_CONFIGS = os.path.join(REPO_ROOT, "configs")


def test_every_shipped_config_loads():
    configs = load_config_dir(REPO_CONFIGS)
    assert set(configs.by_test) == {"pt-cifar-tpu-v3-8", "tf-bert-squad-v100", "jax-resnet50-failures-only",
                                    "pt-llama-record-only"}
    bert = configs.for_test("tf-bert-squad-v100")
    assert bert.regression_test.alert_after_second_test_failure is False  # written as the string "False"
    assert bert.metric_collection.tags_to_ignore == {"loss"}
    assert configs.for_test("some-unknown-test").source.endswith("default.json")


def test_defaults_without_any_file():
    config = parse_test_config({}, "x.json")
    assert config.metric_collection.default_aggregation_strategies == ("final",)
    assert config.metric_collection.write_to_bigquery is True
    regression = config.regression_test
    assert regression.alert_for_oob_metrics and regression.alert_for_failed_jobs
    assert regression.alert_after_second_test_failure
    assert regression.condition_for("anything") is None


def test_conditions_per_metric_fall_back_to_default():
    config = parse_test_config({"regression_test_config": {"metric_success_conditions": {
        "default": {"comparison": "less", "success_threshold": {"stddevs_from_mean": 2}},
        "acc_final": {"comparison": "greater", "success_threshold": {"fixed_value": 70},
                      "wait_for_n_points_of_history": 3, "history_max_points": 10}}}}, "x.json")
    regression = config.regression_test
    assert regression.condition_for("acc_final") == SuccessCondition("greater", fixed_value=70.0,
                                                                     wait_for_n_points_of_history=3,
                                                                     history_max_points=10)
    assert regression.condition_for("loss_final") == SuccessCondition("less", stddevs_from_mean=2.0)


@pytest.mark.parametrize("comparison, greater, inclusive, is_equal, sign", [
    ("greater", True, False, False, ">"),
    ("greater_or_equal", True, True, False, "\u2265"),
    ("less", False, False, False, "<"),
    ("less_or_equal", False, True, False, "\u2264"),
    ("equal", False, True, True, "="),
])
def test_a_comparison_says_which_side_is_better_and_whether_its_bounds_are_within(comparison, greater, inclusive,
                                                                                 is_equal, sign):
    member = Comparison(comparison)
    assert (member.greater, member.inclusive, member.is_equal, member.sign) == (greater, inclusive, is_equal, sign)
    # What the call sites asked of the text before it was an enum.
    assert (member.greater, member.inclusive, member.is_equal) == (
        comparison.startswith("greater"), "equal" in comparison, comparison == "equal")


def test_a_comparison_is_its_config_text():
    assert COMPARISONS == ("greater", "less", "equal", "greater_or_equal", "less_or_equal")
    for member in Comparison:
        text = member.value
        assert member == text and hash(member) == hash(text) and {text: 1}[member] == 1
        assert (str(member), f"{member}", json.dumps(member), json.dumps({member: [member]})) == (
            text, text, json.dumps(text), json.dumps({text: [text]}))


def test_conditions_hold_comparisons_parsed_at_load_and_refuse_other_text():
    config = parse_test_config({"regression_test_config": {"metric_success_conditions": {
        "default": {"comparison": "less_or_equal", "success_threshold": {"stddevs_from_mean": 2}}}}}, "x.json")
    assert config.regression_test.condition_for("m").comparison is Comparison.LESS_OR_EQUAL
    assert SuccessCondition("greater", fixed_value=1.0).comparison is Comparison.GREATER  # the text is taken too
    assert SuccessCondition("greater", fixed_value=1.0) == SuccessCondition(Comparison.GREATER, fixed_value=1.0)
    with pytest.raises(ValueError):
        SuccessCondition("bigger", fixed_value=1.0)


@pytest.mark.parametrize("spelling", ["metric_to_aggregation_strategies", "metric_to_aggregation_strategy"])
def test_per_tag_strategies_replace_the_defaults_in_both_spellings(spelling):
    config = parse_test_config({"metric_collection_config": {
        "default_aggregation_strategies": ["final", "max"], spelling: {"loss": ["min", "average"]}}}, "x.json")
    assert config.metric_collection.strategies_for("loss") == ("min", "average")
    assert config.metric_collection.strategies_for("acc") == ("final", "max")


@pytest.mark.parametrize("text, expected", [(True, True), ("True", True), ("TRUE", True), ("false", False),
                                            (False, False)])
def test_booleans_accept_json_and_strings(text, expected):
    config = parse_test_config({"regression_test_config": {"alert_for_failed_jobs": text}}, "x.json")
    assert config.regression_test.alert_for_failed_jobs is expected


@pytest.mark.parametrize("raw, key", [
    ({"metric_collection_config": {"write_to_bigquery": "yes"}}, "metric_collection_config.write_to_bigquery"),
    ({"metric_collection_config": {"write_to_bigquery": 1}}, "metric_collection_config.write_to_bigquery"),
    ({"metric_colection_config": {}}, "metric_colection_config"),
    ({"regression_test_config": {"alert_on_everything": True}}, "regression_test_config.alert_on_everything"),
    ({"metric_collection_config": {"default_aggregation_strategies": ["median"]}},
     "metric_collection_config.default_aggregation_strategies"),
    ({"metric_collection_config": {"default_aggregation_strategies": []}},
     "metric_collection_config.default_aggregation_strategies"),
    ({"metric_collection_config": {"time_to_accuracy": {"accuracy_tag": "acc"}}},
     "metric_collection_config.time_to_accuracy.accuracy_threshold"),
    ({"metric_collection_config": {"tags_to_ignore": ["acc"], "time_to_accuracy": {
        "accuracy_tag": "acc", "accuracy_threshold": 1}}}, "metric_collection_config.time_to_accuracy.accuracy_tag"),
    ({"metric_collection_config": {"metric_to_aggregation_strategy": {}, "metric_to_aggregation_strategies": {}}},
     "metric_collection_config.metric_to_aggregation_strategy"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "equal", "success_threshold": {"stddevs_from_mean": 1}}}}},
     "regression_test_config.metric_success_conditions.m.success_threshold"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "bigger", "success_threshold": {"fixed_value": 1}}}}},
     "regression_test_config.metric_success_conditions.m.comparison"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "less", "success_threshold": {"fixed_value": 1, "stddevs_from_mean": 1}}}}},
     "regression_test_config.metric_success_conditions.m.success_threshold"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "less", "success_threshold": {"fixed_value": "1"}}}}},
     "regression_test_config.metric_success_conditions.m.success_threshold.fixed_value"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "less", "success_threshold": {"fixed_value": 1}, "wait_for_n_points_of_history": -1}}}},
     "regression_test_config.metric_success_conditions.m.wait_for_n_points_of_history"),
    ({"regression_test_config": {"false_alerts_per_100_runs": 0}}, "regression_test_config.false_alerts_per_100_runs"),
    ({"regression_test_config": {"false_alerts_per_100_runs": 25}},
     "regression_test_config.false_alerts_per_100_runs"),
    ({"window_config": {"tags": {"loss": {"count": 5, "aggregations": ["mean"], "rank_check": {
        "aggregation": "mean", "condition": {"comparison": "less"}}}}}},
     "window_config.tags.loss.rank_check.condition.success_threshold"),
    ({"regression_test_config": {"required_metrics": "acc_final"}}, "regression_test_config.required_metrics"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "less", "success_threshold": {"false_alert_rate": 0.5}}}}},
     "regression_test_config.metric_success_conditions.m.success_threshold.false_alert_rate"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "less", "success_threshold": {"false_alert_rate": 0}}}}},
     "regression_test_config.metric_success_conditions.m.success_threshold.false_alert_rate"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "equal", "success_threshold": {"mads_from_median": 3}}}}},
     "regression_test_config.metric_success_conditions.m.success_threshold"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "less", "success_threshold": {"mads_from_median": -1}}}}},
     "regression_test_config.metric_success_conditions.m.success_threshold.mads_from_median"),
    ({"regression_test_config": {"metric_success_conditions": {"m": {
        "comparison": "less", "success_threshold": {"fixed_value": 1}, "min_effect_rel": -0.1}}}},
     "regression_test_config.metric_success_conditions.m.min_effect_rel"),
    ({"regression_test_config": {"rebaseline_after": -1}}, "regression_test_config.rebaseline_after"),
    ({"regression_test_config": {"rebaseline_after": 2.5}}, "regression_test_config.rebaseline_after"),
    ({"window_config": {"tags": {"loss": {"count": 5, "checks": [{"aggregation": "mean", "min_effect_abs": 1,
        "condition": {"comparison": "less", "success_threshold": {"fixed_value": 1}, "min_effect_abs": 2}}]}}}},
     "window_config.tags.loss.checks[0].condition.min_effect_abs"),
    ([1, 2], "<top level>"),
])
def test_bad_configs_fail_naming_file_and_key(raw, key):
    with pytest.raises(ConfigError) as failure:
        parse_test_config(raw, "configs/my-test.json")
    assert failure.value.source == "configs/my-test.json"
    assert failure.value.key == key
    assert str(failure.value).startswith(f"configs/my-test.json: {key}: ")


def test_robust_thresholds_minimum_effects_and_rebaselining_parse():
    config = parse_test_config({"regression_test_config": {"rebaseline_after": 0, "metric_success_conditions": {
        "loss_final": {"comparison": "less", "success_threshold": {"false_alert_rate": 0.0005},
                       "min_effect_rel": 0.02},
        "acc_final": {"comparison": "greater", "success_threshold": {"mads_from_median": 4},
                      "min_effect_abs": 0.5}}}}, "x.json")
    regression = config.regression_test
    assert regression.rebaseline_after == 0
    assert regression.condition_for("loss_final") == SuccessCondition("less", false_alert_rate=0.0005,
                                                                      min_effect_rel=0.02)
    assert regression.condition_for("acc_final").threshold == ("mads_from_median", 4)
    assert regression.condition_for("acc_final").min_effect_abs == 0.5
    assert parse_test_config({}, "x.json").regression_test.rebaseline_after == 3


def test_a_window_checks_minimum_effect_may_sit_beside_its_condition_or_in_it():
    def check(**where):
        inner = {"comparison": "less", "success_threshold": {"fixed_value": 1}, **where.get("condition", {})}
        raw = {"aggregation": "mean", "condition": inner, **where.get("check", {})}
        return parse_test_config({"window_config": {"tags": {"loss": {"count": 5, "checks": [raw]}}}},
                                 "x.json").windows.tags["loss"].checks[0].condition
    assert check(check={"min_effect_abs": 2}) == check(condition={"min_effect_abs": 2})
    assert check(check={"min_effect_rel": 0.1}).min_effect_rel == 0.1


def test_comment_keys_are_allowed_anywhere():
    config = parse_test_config({"//": "top", "metric_collection_config": {"//": "x", "metric_to_aggregation_strategies": {
        "//": "y", "loss": ["min"]}}, "regression_test_config": {"metric_success_conditions": {
            "//": "z", "m": {"//": "w", "comparison": "less", "success_threshold": {"//": "v", "fixed_value": 1}}}}},
        "x.json")
    assert config.metric_collection.strategies_for("loss") == ("min",)
    assert config.regression_test.condition_for("m").fixed_value == 1.0


def test_directory_maps_file_names_to_test_names(tmp_path):
    (tmp_path / filename_for_test("team/cifar")).write_text(json.dumps(
        {"regression_test_config": {"alert_for_failed_jobs": False}}))
    (tmp_path / "default.json").write_text(json.dumps({"regression_test_config": {"alert_for_oob_metrics": False}}))
    (tmp_path / "README.txt").write_text("ignored")
    configs = load_config_dir(str(tmp_path))
    assert filename_for_test("team/cifar") == "team__cifar.json"
    assert configs.for_test("team/cifar").regression_test.alert_for_failed_jobs is False
    assert configs.for_test("other").regression_test.alert_for_oob_metrics is False


def test_unreadable_file_names_the_file(tmp_path):
    (tmp_path / "broken.json").write_text("{oops")
    with pytest.raises(ConfigError, match="broken.json: -: cannot read JSON"):
        load_config_dir(str(tmp_path))


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_dir(str(tmp_path / "nope"))


def test_built_in_default_when_no_default_json(tmp_path):
    assert load_config_dir(str(tmp_path)).for_test("x") == TestConfig()


def readme_json_after(heading):
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(heading):]
    block = section[section.index("```json\n") + len("```json\n"):]
    return block[:block.index("```")]


def test_the_readme_straggler_check_is_a_valid_window_config():
    config = parse_test_config(json.loads("{" + readme_json_after("## Distributed jobs") + "}"), "readme")
    check = config.windows.tags["step_time"].rank_check
    assert check.aggregation == "mean" and check.condition.mads_from_median == 5
    assert (check.debounce_windows, check.debounce_out_of_bounds) == (3, 2) and check.condition.min_effect_rel == 0.1


def test_rank_reductions_are_read_strictly():
    config = parse_test_config({"metric_collection_config": {
        "default_rank_reduction": "mean", "tag_to_rank_reduction": {"loss": "max"}}}, "t.json")
    assert config.metric_collection.rank_reduction_for("loss") == "max"
    assert config.metric_collection.rank_reduction_for("acc") == "mean"
    with pytest.raises(ConfigError, match="tag_to_rank_reduction.loss: 'median' is not one of"):
        parse_test_config({"metric_collection_config": {"tag_to_rank_reduction": {"loss": "median"}}}, "t.json")


@pytest.mark.parametrize("rank_check, reason", [
    ({"aggregation": "p50", "condition": {"comparison": "less", "success_threshold": {"mads_from_median": 5}}},
     "'p50' is not a numeric aggregation"),
    ({"aggregation": "mean"}, "rank_check.condition: is required"),
    ({"aggregation": "mean", "condition": {"comparison": "less", "success_threshold": {"fixed_value": 5}}},
     "compares ranks with each other"),
])
def test_bad_rank_checks_name_the_key(rank_check, reason):
    raw = {"window_config": {"tags": {"step_time": {"count": 10, "aggregations": ["mean"], "rank_check": rank_check}}}}
    with pytest.raises(ConfigError, match=reason):
        parse_test_config(raw, "t.json")


def test_checks_without_a_threshold_share_the_tests_false_alert_budget():
    condition = {"comparison": "less"}
    raw = {"regression_test_config": {"metric_success_conditions": {
        "loss_final": condition, "acc_final": {"comparison": "greater"},
        "epochs_final": {"comparison": "less", "success_threshold": {"fixed_value": 90}},
        "step_time_average": {"comparison": "less", "success_threshold": {"false_alert_rate": 0.0001}}}},
        "window_config": {"tags": {"loss": {"count": 10, "aggregations": ["mean"], "checks": [
            {"aggregation": "mean", "condition": condition},
            {"aggregation": "mean", "condition": condition, "debounce": {"windows": 3, "out_of_bounds": 2}}]}}}}
    config = parse_test_config(raw, "t.json")
    conditions = config.regression_test.metric_success_conditions
    # the default budget, 1 per 100 runs, over the three checks that give no threshold and the shift checks of
    # the two run-level ones, a quarter share each (they run at a quarter of their cutoff's rate)
    shares = 3 + 2 * SHIFT_SHARE
    assert conditions["loss_final"].false_alert_rate == pytest.approx(0.01 / shares)
    assert shift_rate(conditions["loss_final"]) == pytest.approx(0.01 / shares * SHIFT_SHARE)
    assert conditions["acc_final"].false_alert_rate == pytest.approx(0.01 / shares)
    assert config.windows.tags["loss"].checks[0].condition.false_alert_rate == pytest.approx(0.01 / shares)
    # a debounced window check (2 of its last 3 windows) takes the rate without a share
    assert config.windows.tags["loss"].checks[1].condition.false_alert_rate == pytest.approx(0.01 / shares)
    assert conditions["step_time_average"].false_alert_rate == 0.0001  # an expert's own rate stays
    assert conditions["epochs_final"].false_alert_rate is None
    raw["regression_test_config"]["false_alerts_per_100_runs"] = 3
    tripled = parse_test_config(raw, "t.json").regression_test.metric_success_conditions
    assert tripled["loss_final"].false_alert_rate == pytest.approx(0.03 / shares)
    assert tripled["loss_final"].threshold == ("false_alert_rate", pytest.approx(0.03 / shares))


def test_history_by_is_the_tests_unless_a_metric_condition_says_otherwise():
    raw = {"regression_test_config": {"history_by": ["accelerator", "zone"], "metric_success_conditions": {
        "step_time_average": {"comparison": "less"},
        "loss_final": {"comparison": "less", "history_by": []},
        "mfu_average": {"comparison": "greater", "history_by": ["accelerator"]}}}}
    regression = parse_test_config(raw, "t.json").regression_test
    assert regression.history_by_for("step_time_average") == ("accelerator", "zone")
    assert regression.history_by_for("loss_final") == ()
    assert regression.history_by_for("mfu_average") == ("accelerator",)
    assert regression.history_by_for("unchecked") == ("accelerator", "zone")
    assert parse_test_config({}, "t.json").regression_test.history_by_for("loss_final") == ()


@pytest.mark.parametrize("raw, key", [
    ({"regression_test_config": {"history_by": "accelerator"}}, "regression_test_config.history_by"),
    ({"regression_test_config": {"history_by": ["accelerator", "accelerator"]}}, "regression_test_config.history_by"),
    ({"regression_test_config": {"history_by": [" zone"]}}, "regression_test_config.history_by"),
    ({"regression_test_config": {"history_by": ["status"]}}, "regression_test_config.history_by"),
    ({"regression_test_config": {"metric_success_conditions": {"loss": {"comparison": "less", "history_by": [1]}}}},
     "regression_test_config.metric_success_conditions.loss.history_by"),
    ({"window_config": {"tags": {"loss": {"count": 10, "aggregations": ["mean"], "checks": [
        {"aggregation": "mean", "condition": {"comparison": "less", "history_by": ["accelerator"]}}]}}}},
     "history_by"),
])
def test_a_bad_history_by_names_its_key(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_test_config(raw, "t.json")


def test_a_condition_may_declare_its_noise_normal_for_a_false_alert_rate_or_the_budget():
    raw = {"regression_test_config": {"metric_success_conditions": {
        "acc_final": {"comparison": "greater", "noise": "normal"},
        "loss_final": {"comparison": "less", "success_threshold": {"false_alert_rate": 0.001}, "noise": "normal"},
        "step_time_average": {"comparison": "less"}}}}
    conditions = parse_test_config(raw, "t.json").regression_test.metric_success_conditions
    assert conditions["acc_final"].noise == conditions["loss_final"].noise == "normal"
    assert conditions["step_time_average"].noise == "heavy_tailed"


@pytest.mark.parametrize("condition, reason", [
    ({"comparison": "less", "noise": "gaussian"}, "'gaussian' is not one of"),
    ({"comparison": "less", "noise": "normal", "success_threshold": {"mads_from_median": 4}},
     "only a false_alert_rate"),
])
def test_a_bad_noise_names_its_key(condition, reason):
    raw = {"regression_test_config": {"metric_success_conditions": {"loss_final": condition}}}
    with pytest.raises(ConfigError, match=r"metric_success_conditions\.loss_final\.noise.*" + reason):
        parse_test_config(raw, "t.json")


def test_dashboard_url_is_an_http_address_and_links_each_alert_page():
    raw = {"regression_test_config": {"dashboard_url": "https://trainguard.example/"}}
    regression = parse_test_config(raw, "t.json").regression_test
    assert regression.dashboard_alert_url("ab/c d") == "https://trainguard.example/alerts/ab%2Fc%20d"
    assert parse_test_config({}, "t.json").regression_test.dashboard_alert_url("a") is None
    for bad in ("trainguard.example", "ftp://x", "https://x/{test}", "https://x/?q=1", "https://x/#a", "https://x y"):
        raw["regression_test_config"]["dashboard_url"] = bad
        with pytest.raises(ConfigError, match="dashboard_url"):
            parse_test_config(raw, "t.json")
