"""``trainguard-triage`` end to end: actions from the command line reach the pipeline and change what it says."""

import glob
import json
import pathlib
import shutil

import pytest
from google.cloud import pubsub_v1

from core.records import Alert
from pipeline import triage as cli
from pipeline.main import main as pipeline_main
from sinks.duckdb_store import DuckDBStore
from tests.support import REPO_ROOT, readme_block, run_shell_line
from trainguard import wire

CIFAR = "pt-cifar-tpu-v3-8"
WALL_TIME_RUN = "tf-bert-squad-v100-007"


@pytest.fixture(scope="module")
def demo_outputs(tmp_path_factory):
    """The directory a demo replay wrote its store and alerts file into (once for the module)."""
    where = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(where)
        assert replay() == 0
    return where


@pytest.fixture
def demo(demo_outputs, tmp_path, monkeypatch):
    """A copy of the demo replay's store and alerts file; the working directory is the test's own."""
    shutil.copytree(demo_outputs, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def replay(*extra):
    return pipeline_main([f"--input_files={REPO_ROOT}/data/demo/*.jsonl", f"--config_dir={REPO_ROOT}/configs",
                          "--report_dir=", *extra])


def triage(*argv):
    return cli.main(list(argv))


def listed(capsys, *argv):
    capsys.readouterr()
    assert triage("list", "--json", *argv) == 0
    return {(row["run"], row["metric"] or row["kind"]): row for row in json.loads(capsys.readouterr().out)}


def alert_id(store, run, metric):
    [(found,)] = DuckDBStore(str(store)).query(
        "SELECT alert_id FROM alerts WHERE run_id = ? AND metric_name = ?", (run, metric))
    return found


def test_actions_are_written_to_the_triage_file_applied_by_the_next_replay_and_listed(demo, capsys):
    wall_time = alert_id(demo / "trainguard.duckdb", WALL_TIME_RUN, "total_wall_time")
    assert triage("dismiss", wall_time[:10], "--note", "slow disk, not the model") == 0
    assert triage("accept", CIFAR, "Accuracy/test_final", "--from-run", f"{CIFAR}-010", "--note", "new aug") == 0
    assert triage("mute", "jax-resnet50-failures-only", "--until", "+2d") == 0
    actions = [wire.parse_message(line)[0] for line in (demo / "trainguard.triage.jsonl").read_bytes().splitlines()]
    assert [a.triage.action for a in actions] == ["dismiss", "accept", "mute"]
    assert actions[0].triage.alert_id == wall_time and actions[0].test == "tf-bert-squad-v100"

    before = listed(capsys)
    assert before[(WALL_TIME_RUN, "total_wall_time")]["state"] == "dismissed"
    assert before[(WALL_TIME_RUN, "total_wall_time")]["pending"] is True  # not applied by a replay yet

    assert replay() == 0
    rows = DuckDBStore(str(demo / "trainguard.duckdb")).query("SELECT action, note FROM triage ORDER BY created_at")
    assert rows == [("dismiss", "slow disk, not the model"), ("accept", "new aug"), ("mute", None)]
    after = listed(capsys)
    assert after[(WALL_TIME_RUN, "total_wall_time")]["pending"] is False
    assert {key[0] for key, row in after.items() if row["state"] == "accepted"} == {f"{CIFAR}-010", f"{CIFAR}-011"}
    assert after[(f"{CIFAR}-010", "Accuracy/test_max")]["state"] == "open"  # another metric of the same runs
    assert set(listed(capsys, "--state", "dismissed")) == {(WALL_TIME_RUN, "total_wall_time")}

    # the alerts file announces the new states (what the e-mail notifier reads)
    announced = [json.loads(line) for line in (demo / "alerts.jsonl").read_text().splitlines()]
    states = sorted((a["run_id"], json.loads(a["details"])["triage"]["state"])
                    for a in announced if "triage" in json.loads(a["details"]))
    assert states == [(f"{CIFAR}-010", "accepted"), (f"{CIFAR}-011", "accepted"), (WALL_TIME_RUN, "dismissed")]

    assert replay() == 0  # running it again adds nothing
    assert len((demo / "alerts.jsonl").read_text().splitlines()) == len(announced)


def test_one_replay_with_an_action_equals_two_replays_split_at_the_action(tmp_path, monkeypatch):
    """The seed carries an applied action across invocations: later runs are judged the same either way."""
    monkeypatch.chdir(tmp_path)
    cut = 1764504000.0  # 2025-11-30T12:00Z: after cifar run 010 ended, before 011 started
    dismiss = wire.encode_triage(CIFAR, wire.Triage(
        "dismiss", cut, metric="Accuracy/test_final", run=f"{CIFAR}-010", alert_kind="metric_out_of_bounds",
        alert_id=Alert(kind="metric_out_of_bounds", test=CIFAR, run=f"{CIFAR}-010", message="", created_at=0,
                       metric="Accuracy/test_final").alert_id), "dismiss-1")
    before, after = [dismiss], []
    for path in sorted(glob.glob(f"{REPO_ROOT}/data/demo/*.jsonl")):
        for line in pathlib.Path(path).read_bytes().splitlines():
            try:
                late = wire.parse_message(line)[0].event_time > cut
            except ValueError:  # the demo's bad lines: dead letters either way
                late = False
            (after if late else before).append(line)
    (tmp_path / "before.jsonl").write_bytes(b"".join(line + b"\n" for line in before))
    (tmp_path / "after.jsonl").write_bytes(b"".join(line + b"\n" for line in after))

    def run(store, pattern, triage_file=""):
        assert pipeline_main([f"--input_files={tmp_path / pattern}", f"--config_dir={REPO_ROOT}/configs",
                              "--report_dir=", f"--local_store={tmp_path / store}", f"--triage_file={triage_file}",
                              f"--alerts_file={tmp_path / store}.jsonl"]) == 0
        return DuckDBStore(str(tmp_path / store))

    one = run("one.duckdb", "*.jsonl")
    run("two.duckdb", "before.jsonl")
    two = run("two.duckdb", "after.jsonl")
    for table in ("alerts", "metric_history", "triage", "job_history", "metric_windows"):
        assert one.query(f"SELECT * FROM {table} ORDER BY ALL") == two.query(f"SELECT * FROM {table} ORDER BY ALL")
    undismissed = [line for line in before + after if line != dismiss]
    (tmp_path / "plain.jsonl").write_bytes(b"".join(line + b"\n" for line in undismissed))
    plain = run("plain.duckdb", "plain.jsonl")
    bounds = "SELECT metric_lower_bound FROM metric_history WHERE run_id = ? AND metric_name = 'Accuracy/test_final'"
    assert one.query(bounds, (f"{CIFAR}-011",)) < plain.query(bounds, (f"{CIFAR}-011",))  # 010 widened the band


def test_actions_published_with_topic_reach_pubsub_as_wire_messages(demo, pubsub_server):
    topic = pubsub_server.topic_path("metrics")
    pubsub_v1.PublisherClient().create_topic(name=topic)
    subscriber = pubsub_v1.SubscriberClient()
    subscription = pubsub_server.subscription_path("pipeline")
    subscriber.create_subscription(name=subscription, topic=topic)
    assert triage("accept", CIFAR, "loss_final", "--from_run", "r9", "--topic", topic,
                  "--at", "2026-01-02T03:04:05Z") == 1  # the names cannot be checked: no dataset named
    assert triage("accept", CIFAR, "loss_final", "--from_run", "r9", "--topic", topic, "--unchecked",
                  "--at", "2026-01-02T03:04:05Z") == 0
    [received] = subscriber.pull(subscription=subscription, max_messages=5, timeout=10).received_messages
    message, rejections = wire.parse_message(received.message.data)
    assert rejections == [] and message.triage.action == "accept" and message.triage.run == "r9"
    attributes = dict(received.message.attributes)
    assert attributes["ts"] == str(int(message.triage.time * 1000)) == "1767323045000"
    assert attributes["id"] == message.id and attributes["test"] == CIFAR


def test_mistakes_are_one_line_and_a_non_zero_exit(demo, capsys):
    assert triage("dismiss", "0123456789abcdef") == 1
    assert "no alert '0123456789abcdef' in the store" in capsys.readouterr().err
    assert triage("dismiss", "abc") == 1
    assert "give at least 8 characters" in capsys.readouterr().err
    assert triage("list", "--local_store", "missing.duckdb") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no store at 'missing.duckdb'" in err
    assert triage("mute", CIFAR, "--until", "2020-01-01") == 1
    assert "is not after --at" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        triage("list", "--bogus_flag=1")
    assert usage.value.code == 2 and "--bogus_flag" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        triage("mute", CIFAR, "--until", "next week")
    assert usage.value.code == 2 and "is not a time" in capsys.readouterr().err


def test_help_shows_every_command_and_the_defaults(capsys):
    with pytest.raises(SystemExit) as done:
        triage("--help")
    out = capsys.readouterr().out
    assert done.value.code == 0 and all(word in out for word in ("accept", "dismiss", "mute", "list"))
    with pytest.raises(SystemExit):
        triage("mute", "--help")
    out = capsys.readouterr().out
    assert "trainguard.triage.jsonl beside trainguard.duckdb" in " ".join(out.split()) and "--until" in out


def test_the_readme_triage_commands_run_as_shown(demo):
    for command in readme_block("## Triage"):
        assert command.startswith("trainguard-triage ")
        done = run_shell_line(command, str(demo))
        assert done.returncode == 0, (command, done.stderr)
    assert len((demo / "trainguard.triage.jsonl").read_text().splitlines()) == 3


def test_the_readme_after_an_alert_commands_run_as_shown(demo):
    commands = readme_block("## After an alert")
    assert [c.split()[1] for c in commands] == ["dismiss", "accept", "mute"]
    for command in commands:
        done = run_shell_line(command, str(demo))
        assert done.returncode == 0, (command, done.stderr)


def test_a_triage_file_belongs_to_its_store_and_a_stray_one_is_named_not_applied(demo, capsys):
    """Actions for one store reach no other: the replay applies its store's own triage file and names it in its
    summary; a replay into another store, or an old triage.jsonl lying in the directory, applies nothing."""
    assert triage("mute", "jax-resnet50-failures-only", "--until", "+2d") == 0
    assert (demo / "trainguard.triage.jsonl").exists()
    (demo / "triage.jsonl").write_bytes((demo / "trainguard.triage.jsonl").read_bytes())
    capsys.readouterr()
    assert replay("--local_store=other.duckdb", "--alerts_file=other.jsonl") == 0
    out, err = capsys.readouterr()
    assert "triage applied" not in out and "triage.jsonl here is not applied" in err and "other.triage.jsonl" in err
    assert DuckDBStore(str(demo / "other.duckdb")).query("SELECT count(*) FROM triage") == [(0,)]
    assert replay() == 0
    assert "triage applied: trainguard.triage.jsonl" in capsys.readouterr().out
    assert DuckDBStore(str(demo / "trainguard.duckdb")).query("SELECT action FROM triage") == [("mute",)]


def test_an_action_on_a_bigquery_dataset_needs_the_topic(demo, capsys):
    assert triage("mute", "t", "--until", "+2d", "--bigquery_dataset=trainguard") == 1
    assert "give --topic" in capsys.readouterr().err and not (demo / "trainguard.triage.jsonl").exists()


@pytest.mark.parametrize("argv, message", [
    (["accept", "pt-cifar-tpu", "Accuracy/test_final", "--from_run", f"{CIFAR}-010"],
     f"no test 'pt-cifar-tpu' in trainguard.duckdb; did you mean '{CIFAR}'?"),
    (["accept", CIFAR, "Accuracy/test_fnal", "--from_run", f"{CIFAR}-010"],
     f"no metric of {CIFAR} 'Accuracy/test_fnal' in trainguard.duckdb; did you mean 'Accuracy/test_final'?"),
    (["accept", CIFAR, "Accuracy/test_final", "--from_run", f"{CIFAR}-10"],
     f"no run of {CIFAR} '{CIFAR}-10' in trainguard.duckdb; did you mean '{CIFAR}-010'? (a run still going: "
     "--allow_future)"),
    (["mute", "jax-resnet50", "--until", "+2d"], "no test 'jax-resnet50' in trainguard.duckdb; did you mean "
                                                  "'jax-resnet50-failures-only'?"),
])
def test_a_name_the_store_has_never_seen_is_refused_with_the_nearest(demo, capsys, argv, message):
    """A misspelled test, metric or run is exit 2 naming the nearest one the store has, and nothing is written."""
    assert triage(*argv) == 2
    assert f"error: {message}" in capsys.readouterr().err
    assert not (demo / "trainguard.triage.jsonl").exists()


def test_a_run_still_going_is_accepted_with_allow_future(demo):
    """The message says so (``future``), so that the pipeline waits for the run instead of refusing it."""
    assert triage("accept", CIFAR, "Accuracy/test_final", "--from_run", f"{CIFAR}-099", "--allow_future") == 0
    [message] = [wire.parse_message(line)[0] for line in (demo / "trainguard.triage.jsonl").read_bytes().splitlines()]
    assert message.triage.run == f"{CIFAR}-099" and message.triage.future is True


def test_where_triage_goes_comes_from_the_flags_then_the_environment(monkeypatch):
    monkeypatch.setenv("TRAINGUARD_TOPIC", "projects/p/topics/metrics")
    monkeypatch.setenv("TRAINGUARD_BIGQUERY_PROJECT", "p")
    monkeypatch.setenv("TRAINGUARD_BIGQUERY_DATASET", "trainguard")
    monkeypatch.setenv("TRAINGUARD_LOCAL_STORE", "elsewhere.duckdb")
    args = cli.build_parser(0.0).parse_args(["mute", "t", "--until", "+1d"])
    assert (args.topic, args.bigquery_project, args.bigquery_dataset, args.local_store) == (
        "projects/p/topics/metrics", "p", "trainguard", "elsewhere.duckdb")
    args = cli.build_parser(0.0).parse_args(["mute", "t", "--until", "+1d", "--topic=projects/q/topics/other",
                                             "--bigquery_dataset=staging"])
    assert (args.topic, args.bigquery_dataset) == ("projects/q/topics/other", "staging")  # a flag wins
    monkeypatch.setenv("TRAINGUARD_TOPIC", "")  # empty: not set
    assert cli.build_parser(0.0).parse_args(["mute", "t", "--until", "+1d"]).topic is None
