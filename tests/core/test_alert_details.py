"""What a value alert says: how its bounds were computed, the change, the previous value, the unit, next steps."""

import dataclasses
import shlex

import pytest

from core.alert_details import finish_alert, threshold_facts
from core.bounds import compute_bounds
from core.config import ConfigError, RankCheck, SuccessCondition, TagWindowConfig, WindowCheck, parse_test_config
from core.history import MetricHistory, check_metric
from core.rank_windows import RankWindows, add_rank_window
from core.records import Alert, MetricObservation
from core.triage import ALERT_ID_PREFIX_CHARS, triage_commands
from core.window_checks import FinishedRun, WindowHistory, check_window
from core.windows import WindowResult, WindowSpec
from pipeline.triage import MIN_ID_PREFIX, build_parser

NOW = 1_800_000_000.0
ACCURACY = [74.6, 74.5, 74.7, 74.6, 74.4, 74.8, 74.6, 74.5, 74.7, 74.6]


def config(metric_units=None, report_url_pattern=None, **conditions):
    collection = {} if metric_units is None else {"metric_units": metric_units}
    regression = {"alert_after_second_test_failure": False, "rebaseline_after": 3,
                  "metric_success_conditions": conditions}
    if report_url_pattern is not None:
        regression["report_url_pattern"] = report_url_pattern
    return parse_test_config({"metric_collection_config": collection, "regression_test_config": regression}, "t.json")


MADS = {"comparison": "greater", "success_threshold": {"mads_from_median": 5}, "wait_for_n_points_of_history": 5}
FIXED_LESS = {"comparison": "less", "success_threshold": {"fixed_value": 600}}
FIXED_GREATER = {"comparison": "greater", "success_threshold": {"fixed_value": 70}}


def observation(run, metric, value, at, test="pt-cifar"):
    return MetricObservation(test, run, metric, value, 1000, "success", at, at)


def alerts_of(test_config, metric, values, test="pt-cifar"):
    history = MetricHistory()
    alerts = []
    for i, value in enumerate(values):
        _, alert = check_metric(history, observation(f"r{i:02d}", metric, value, float(i), test),
                                test_config.regression_test)
        if alert is not None:
            alerts.append(finish_alert(alert, test_config))
    return alerts


def parses(command):
    words = shlex.split(command)
    assert words[0] == "trainguard-triage"
    return build_parser(NOW).parse_args(words[1:])


def test_a_statistical_bound_says_centre_multiplier_scale_and_history_with_the_unit():
    test_config = config({"Accuracy/test": "%"}, **{"Accuracy/test_final": MADS})
    [alert] = alerts_of(test_config, "Accuracy/test_final", ACCURACY + [70.1])
    details = alert.details
    assert details["threshold"] == "mads_from_median" and details["multiplier"] == 5
    assert details["centre"] == 74.6 and details["unit"] == "%"
    assert alert.lower_bound == pytest.approx(details["centre"] - 5 * details["scale"])
    assert details["previous_value"] == 74.6 and details["previous_run"] == "r09"
    assert details["change_pct"] == pytest.approx((70.1 - 74.6) / 74.6 * 100)
    assert details["change_in_scales"] == pytest.approx((70.1 - 74.6) / details["scale"])
    assert alert.message.startswith("Accuracy/test_final = 70.1 % is outside bounds (")
    assert ", +inf) %: median 74.6 % \u2212 5 \u00d7 robust scale " in alert.message
    assert "from 10 earlier runs" in alert.message and "previous 74.6 % (run r09)" in alert.message
    assert "change \u22126.03% (\u2212" in alert.message
    assert "-inf/+inf" not in alert.message


@pytest.mark.parametrize("condition, first, value, bounds_text", [
    (FIXED_LESS, 550.0, 612.5, "(-inf, 600) s"), (FIXED_GREATER, 75.0, 65.0, "(70, +inf) s")])
def test_a_fixed_value_says_so_and_each_unbounded_side_prints_as_its_infinity(condition, first, value, bounds_text):
    [alert] = alerts_of(config(**{"time_to_accuracy": condition}), "time_to_accuracy", [first, value])
    assert f"is outside bounds {bounds_text}: fixed value" in alert.message
    assert "earlier runs" not in alert.message and "-inf/+inf" not in alert.message
    assert alert.details["unit"] == "s" and alert.details["scale"] is None and alert.details["centre"] is None
    assert alert.details["change_in_scales"] is None
    fixed = alert.details["fixed_value"]
    assert alert.details["change_pct"] == pytest.approx((value - fixed) / fixed * 100)
    assert f"fixed value {fixed:g} s" in alert.message and f"previous {first:g} s (run r00)" in alert.message


def test_the_first_checked_value_has_no_previous_value():
    [alert] = alerts_of(config(**{"time_to_accuracy": FIXED_LESS}), "time_to_accuracy", [700.0])
    assert alert.details["previous_value"] is None and "previous" not in alert.message


def test_units_come_from_the_metric_then_the_built_in_durations_then_the_tag():
    collection = config({"loss": "nats", "total_wall_time": "min", "loss_final": "bits"}).metric_collection
    assert collection.unit_for("time_to_accuracy") == "s"
    assert collection.unit_for("total_wall_time") == "min"  # the config may say otherwise
    assert collection.unit_for("loss_final") == "bits"
    assert collection.unit_for("loss_max") == "nats" and collection.unit_for("loss_p90") == "nats"
    assert collection.unit_for("loss_weird") is None and collection.unit_for("other_final") is None


def test_a_moved_baseline_says_how_the_old_bounds_were_computed_and_accept_starts_at_its_first_run():
    alerts = alerts_of(config(**{"acc_final": MADS}), "acc_final", ACCURACY + [70.1, 70.3, 70.2])
    shifted = alerts[-1]
    assert shifted.kind == "baseline_shifted" and "moved from 74.6 to 70.2 in 3 runs in a row from run r10" \
        in shifted.message
    assert "old bounds (" in shifted.message and "median 74.6 \u2212 5 \u00d7 robust scale" in shifted.message
    assert shifted.details["previous_value"] == 70.3
    assert "trainguard-triage accept pt-cifar acc_final --from_run r10" in shifted.details["next_steps"]


def test_next_steps_are_the_triage_commands_and_parse_with_its_parser():
    [alert] = alerts_of(config(**{"acc_final": MADS}), "acc_final", ACCURACY + [70.1])
    dismiss, accept, mute = alert.details["next_steps"]
    assert dismiss == f"trainguard-triage dismiss {alert.alert_id[:ALERT_ID_PREFIX_CHARS]}"
    assert ALERT_ID_PREFIX_CHARS >= MIN_ID_PREFIX
    assert parses(dismiss).alert_id == alert.alert_id[:ALERT_ID_PREFIX_CHARS]
    args = parses(accept)
    assert (args.command, args.test, args.metric, args.from_run) == ("accept", "pt-cifar", "acc_final", "r10")
    args = parses(mute)
    assert (args.command, args.test, args.metric, args.until) == ("mute", "pt-cifar", "acc_final", NOW + 86400)


@pytest.mark.parametrize("test, run, metric", [
    ("-dash-test", "-5", "--metric"), ("name with spaces", "run 'quoted'", "a\"b;rm -rf /"),
    ("pt-cifar", "r1", "-loss_final"), ("$(touch x)", "`id`", "m$HOME")])
def test_next_steps_parse_back_to_the_same_names_whatever_the_names(test, run, metric):
    alert = Alert(kind="metric_out_of_bounds", test=test, run=run, metric=metric, message="", created_at=0.0)
    dismiss, accept, mute = triage_commands(alert)
    assert parses(dismiss).alert_id == alert.alert_id[:ALERT_ID_PREFIX_CHARS]
    args = parses(accept)
    assert (args.test, args.metric, args.from_run) == (test, metric, run)
    args = parses(mute)
    assert (args.test, args.metric) == (test, metric)


JOB = (("--topic", "projects/p/topics/trainguard-metrics"), ("--bigquery_project", "p"),
       ("--bigquery_dataset", "trainguard"))


@pytest.mark.parametrize("test, metric", [("pt-cifar", "acc_final"), ("-dash-test", "--metric")])
def test_the_streaming_jobs_next_steps_point_every_command_at_its_topic_and_dataset(test, metric):
    alert = Alert(kind="metric_out_of_bounds", test=test, run="r1", metric=metric, message="", created_at=0.0)
    commands = finish_alert(alert, config(), JOB).details["next_steps"]
    assert [parses(command).command for command in commands] == ["dismiss", "accept", "mute"]
    for command in commands:
        args = parses(command)
        assert (args.topic, args.bigquery_project, args.bigquery_dataset) == (
            "projects/p/topics/trainguard-metrics", "p", "trainguard"), command
    assert (parses(commands[1]).test, parses(commands[1]).metric) == (test, metric)
    assert finish_alert(alert, config(), JOB).alert_id == alert.alert_id  # where it points is not what it is


def test_a_run_level_alert_without_a_metric_can_be_dismissed_or_muted_but_not_accepted():
    alert = Alert(kind="job_failed", test="t", run="r", message="run r finished with status failure", created_at=0.0)
    finished = finish_alert(alert, config())
    assert [shlex.split(c)[1] for c in finished.details["next_steps"]] == ["dismiss", "mute"]
    assert parses(finished.details["next_steps"][1]).metric is None
    assert finished.message == alert.message and "unit" not in finished.details


def test_the_report_link_quotes_test_and_run_and_finishing_keeps_the_id_and_is_deterministic():
    test_config = config(report_url_pattern="https://reports.example/{test}/{run}.html")
    alert = Alert(kind="run_missing", test="a/b c", run="r?1&x", message="m", created_at=0.0)
    finished = finish_alert(alert, test_config)
    assert finished.details["report_url"] == "https://reports.example/a%2Fb%20c/r%3F1%26x.html"
    assert finished.alert_id == alert.alert_id
    assert finish_alert(alert, test_config) == finished
    assert "report_url" not in finish_alert(alert, config()).details


@pytest.mark.parametrize("pattern, problem", [
    ("https://r.example/{tests}/{run}", "not a placeholder"), ("https://r.example/{test!r}", "not a placeholder"),
    ("https://r.example/{run:>10}", "not a placeholder"), ("javascript:alert({test})", "http"),
    ("https://r.example/{test", "not a valid pattern"), ("https://r.example/ {run}", "http"), (7, "string")])
def test_the_report_url_pattern_is_checked_at_start_up(pattern, problem):
    with pytest.raises(ConfigError, match=f"regression_test_config.report_url_pattern: .*{problem}"):
        config(report_url_pattern=pattern)


@pytest.mark.parametrize("units, problem", [
    ({"loss": 3}, "non-empty string"), ({"loss": "a\nb"}, "short unit"), ({"loss": " s"}, "short unit"),
    ({"loss": "x" * 41}, "short unit"), (["s"], "must be an object")])
def test_metric_units_are_checked_at_start_up(units, problem):
    with pytest.raises(ConfigError, match=f"metric_collection_config.metric_units.*{problem}"):
        config(units)


def window(run, value, index=3, rank=None):
    return WindowResult("pt-cifar", run, "loss", "count", index, 0.0, 10.0 + index, 300, 399, 100, False,
                        {"mean": value}, rank=rank, world_size=None if rank is None else 4,
                        host=None if rank is None else f"host-{rank}")


def test_a_window_alert_says_the_step_the_previous_same_step_value_and_how_its_bounds_were_computed():
    check = WindowCheck("mean", SuccessCondition("less", stddevs_from_mean=3.0))
    state = WindowHistory()
    for i, value in enumerate([1.0, 1.02, 0.98, 1.01, 0.99]):
        state.finished_runs.append(FinishedRun(f"r{i}", [window(f"r{i}", value)]))
    [alert] = check_window(state, window("r5", 1.4), TagWindowConfig(WindowSpec(100, None, None, ("mean",)), (check,)))
    finished = finish_alert(alert, config({"loss": "nats"}))
    details = finished.details
    assert (details["step"], details["previous_value"], details["previous_run"]) == (399, 0.99, "r4")
    assert details["unit"] == "nats" and details["multiplier"] == 3.0
    assert alert.upper_bound == pytest.approx(details["centre"] + 3 * details["scale"])
    assert finished.message.startswith("loss_mean = 1.4 nats in count window 3 (steps 300-399) is outside bounds "
                                       "(-inf, ")
    assert "mean 1 nats + 3 \u00d7 stddev" in finished.message
    assert "from the same-step windows of 5 earlier runs" in finished.message
    assert [shlex.split(c)[1] for c in details["next_steps"]] == ["dismiss", "accept", "mute"]


def test_a_straggler_says_the_other_ranks_centre_and_scale_and_has_no_accept():
    rank_check = RankCheck("mean", SuccessCondition("less", mads_from_median=5.0))
    tag = TagWindowConfig(WindowSpec(100, None, None, ("mean",)), (), rank_check)
    state, alerts = RankWindows(), []
    for rank, value in enumerate([0.50, 0.52, 0.49, 0.95]):
        alerts += add_rank_window(state, window("r5", value, rank=rank), tag, "mean")[1]
    [alert] = [finish_alert(a, config({"loss": "s"})) for a in alerts]
    assert alert.details["centre"] == 0.5 and alert.details["step"] == 399 and alert.details["unit"] == "s"
    assert "rank 3 on host-3 is a straggler: loss_mean = 0.95 s in count window 3" in alert.message
    assert "median 0.5 s + 5 \u00d7 robust scale" in alert.message and "of the other 3 ranks" in alert.message
    assert [shlex.split(c)[1] for c in alert.details["next_steps"]] == ["dismiss", "mute"]


def test_a_false_alert_rate_bound_is_multiplier_times_its_robust_scale():
    condition = SuccessCondition("less", false_alert_rate=0.001)
    history = [1.0 + 0.01 * ((i * 7) % 11) for i in range(30)]
    bounds = compute_bounds(condition, history)
    facts = threshold_facts(condition, bounds, history)
    assert facts["multiplier"] * facts["scale"] == pytest.approx(bounds.upper - bounds.centre)


def test_a_re_baselined_history_borrows_its_scale_from_the_previous_level_and_says_so():
    condition = SuccessCondition("less", mads_from_median=4.0, wait_for_n_points_of_history=5)
    previous = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0]
    bounds = compute_bounds(condition, [2.0, 2.1], previous)
    facts = threshold_facts(condition, bounds, [2.0, 2.1], previous)
    assert facts["scale_from"] == "previous_level" and facts["multiplier"] == 4.0
    assert bounds.upper == pytest.approx(bounds.centre + 4.0 * facts["scale"])
    alert = Alert(kind="metric_out_of_bounds", test="t", run="r", metric="m", value=3.0, upper_bound=bounds.upper,
                  message="", created_at=0.0,
                  details={"threshold": "mads_from_median", "mads_from_median": 4.0, "history_size": 2, **facts})
    assert "the scale from before the baseline moved" in finish_alert(alert, config()).message


def test_a_young_level_pools_its_scale_with_the_level_before_and_says_so():
    condition = SuccessCondition("less", false_alert_rate=0.002)
    previous = [1.0 + 0.01 * ((i * 7) % 11) for i in range(30)]
    history = [2.0, 2.05, 1.98, 2.02]
    bounds = compute_bounds(condition, history, previous)
    facts = threshold_facts(condition, bounds, history, previous)
    assert facts["scale_from"] == "pooled_levels"
    assert facts["multiplier"] * facts["scale"] == pytest.approx(bounds.upper - bounds.centre)
    alert = Alert(kind="metric_out_of_bounds", test="t", run="r", metric="m", value=3.0, upper_bound=bounds.upper,
                  message="", created_at=0.0,
                  details={"threshold": "false_alert_rate", "false_alert_rate": 0.002, "history_size": 4, **facts})
    assert "the scale pooled with the level before the baseline moved" in finish_alert(alert, config()).message


def test_finishing_again_gives_the_same_alert():
    test_config = config({"acc": "%"}, "https://r.example/{test}/{run}", **{"acc_final": MADS})
    [alert] = alerts_of(test_config, "acc_final", ACCURACY + [70.1])
    assert finish_alert(dataclasses.replace(alert), test_config) == alert


def test_the_commands_of_after_an_alert_in_the_readme_parse():
    import pathlib
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## After an alert", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip().split("  #")[0] for line in section.splitlines()
                if line.strip().startswith("trainguard-triage ")]
    assert len(commands) == 3
    for command in commands:
        parses(command)
