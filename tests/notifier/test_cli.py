"""``python -m notifier`` on the local alerts file: dry runs, sending, resuming, dead letters, the key."""

from __future__ import annotations

import glob
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from google.cloud import pubsub_v1

from notifier.cli import run, start_health_server
from notifier.state import NotifierState
from sinks.pubsub import alert_message
from tests.notifier.support import API_KEY, alert, payload, run_alerts, wait_until
from tests.servers.sendgrid import sendgrid_server  # noqa: F401 - fixture
from tests.support import REPO_ROOT

REPO = REPO_ROOT
HTML_PARTS = ("<!DOCTYPE html>", "</html>")


@pytest.fixture
def files(tmp_path):
    """Paths of a test's config, alerts file, state, dead-letter file and dry-run directory."""
    names = ("email.json", "alerts.jsonl", "state.sqlite", "dead.jsonl", "out")
    paths = {name: str(tmp_path / name) for name in names}
    with open(paths["email.json"], "w") as f:
        json.dump({"sender": "alerts@example.com", "recipients": ["oncall@example.com"], "group_wait_seconds": 0,
                   "retry": {"initial_seconds": 0.01, "max_seconds": 0.05}}, f)
    return paths


def append(path, *alerts_or_lines):
    with open(path, "ab") as f:
        f.writelines((item if isinstance(item, bytes) else payload(item)) + b"\n" for item in alerts_or_lines)


def read(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def notify(files, *extra, env=None):
    return run(["--config", files["email.json"], "--alerts-file", files["alerts.jsonl"],
                "--dead-letter-file", files["dead.jsonl"], "--once", *extra],
               environ={"SENDGRID_API_KEY": API_KEY} if env is None else env)


def test_dry_run_renders_each_digest_to_files_and_is_repeatable(files, capsys):
    append(files["alerts.jsonl"], *run_alerts("t", "r1", ["a", "b"]), alert(test="t", run="r2"))
    assert notify(files, "--dry-run", files["out"]) == 0
    assert "3 received, 0 duplicates skipped, 2 e-mails sent" in capsys.readouterr().out
    names = sorted(os.listdir(files["out"]))
    assert names == ["0001-t-r1.html", "0001-t-r1.txt", "0002-t-r2.html", "0002-t-r2.txt", "state.sqlite"]
    html = read(os.path.join(files["out"], "0001-t-r1.html"))
    assert html.startswith(HTML_PARTS[0]) and html.rstrip().endswith(HTML_PARTS[1])
    text = read(os.path.join(files["out"], "0001-t-r1.txt"))
    assert text.startswith("From: alerts@example.com\nTo: oncall@example.com\nSubject: [trainguard] t run r1: ")
    assert not os.path.exists(files["state.sqlite"])  # a dry run keeps its own state

    assert notify(files, "--dry-run", files["out"]) == 0  # nothing new: nothing rendered again
    assert len(os.listdir(files["out"])) == 5


def test_sends_through_sendgrid_and_resumes_after_the_last_mailed_line(files, sendgrid_server, capsys,  # noqa: F811
                                                                       caplog):
    append(files["alerts.jsonl"], *run_alerts("t", "r1", ["a", "b"]))
    sendgrid_server.script(500, 429)  # retried within the run
    with caplog.at_level(logging.DEBUG):
        assert notify(files, "--sendgrid-host", sendgrid_server.url, "--state", files["state.sqlite"]) == 0
        append(files["alerts.jsonl"], alert(test="t", run="r2"), *run_alerts("t", "r1", ["a"]))  # r1/a: a duplicate
        assert notify(files, "--sendgrid-host", sendgrid_server.url, "--state", files["state.sqlite"]) == 0
    assert [r.status for r in sendgrid_server.requests] == [500, 429, 202, 202]
    assert [b["subject"] for b in sendgrid_server.accepted_bodies()] == [
        "[trainguard] t run r1: a and b out of bounds", "[trainguard] t run r2: Accuracy/test_final out of bounds"]
    with NotifierState(files["state.sqlite"]) as state:
        assert state.file_offset(files["alerts.jsonl"]) == os.path.getsize(files["alerts.jsonl"])
    out, err = capsys.readouterr()
    assert "1 duplicates skipped" in out
    assert API_KEY not in out + err + caplog.text


def test_refused_alerts_are_dead_lettered_and_can_be_replayed(files, sendgrid_server, tmp_path):  # noqa: F811
    append(files["alerts.jsonl"], alert(test="t", run="r1"), b"not json", b'{"alert_id": 3}')
    sendgrid_server.script(401)
    assert notify(files, "--sendgrid-host", sendgrid_server.url, "--state", files["state.sqlite"]) == 0
    dead = [json.loads(line) for line in read(files["dead.jsonl"]).splitlines()]
    assert [(d["status"], d["reason"].split(":")[0]) for d in dead] == [
        (None, "invalid alert"), (None, "invalid alert"), (401, "sendgrid")]
    assert dead[0]["payload"] == "not json" and dead[2]["alert"]["test_name"] == "t"

    replay = {**files, "alerts.jsonl": files["dead.jsonl"], "dead.jsonl": str(tmp_path / "dead-again.jsonl")}
    assert notify(replay, "--sendgrid-host", sendgrid_server.url, "--state", files["state.sqlite"]) == 0
    assert [b["subject"] for b in sendgrid_server.accepted_bodies()] == [
        "[trainguard] t run r1: Accuracy/test_final out of bounds"]
    assert len(read(replay["dead.jsonl"]).splitlines()) == 2  # the two invalid payloads stay dead letters


def test_missing_key_or_bad_config_exit_2_without_a_traceback(files, capsys):
    append(files["alerts.jsonl"])
    assert notify(files, env={}) == 2
    assert "error: no SendGrid API key: set $SENDGRID_API_KEY" in capsys.readouterr().err
    with open(files["email.json"], "w") as f:
        json.dump({"sender": "alerts@example.com", "recipients": ["oncall"]}, f)
    assert notify(files) == 2
    assert "email.json: recipients[0]: must be an e-mail address" in capsys.readouterr().err


def long_lived(files, *source_args, env=None):
    """``python -m notifier`` as a child process, rendering to the dry-run directory."""
    return subprocess.Popen(
        [sys.executable, "-m", "notifier", "--config", files["email.json"], *source_args,
         "--dry-run", files["out"], "--dead-letter-file", files["dead.jsonl"], "--poll-seconds", "0.05"],
        cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop(process) -> str:
    """SIGTERM, then the process's stdout; it must exit cleanly."""
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return out


def rendered(files, name):
    return lambda: os.path.exists(os.path.join(files["out"], name))


def test_long_lived_process_tails_the_file_and_stops_on_sigterm(files):
    process = long_lived(files, "--alerts-file", files["alerts.jsonl"])
    try:
        append(files["alerts.jsonl"], alert(test="t", run="r1"))
        wait_until(rendered(files, "0001-t-r1.html"), timeout=30)
        append(files["alerts.jsonl"], alert(test="t", run="r2"))
        wait_until(rendered(files, "0002-t-r2.html"), timeout=30)
    finally:
        out = stop(process)
    assert "2 received, 0 duplicates skipped, 2 e-mails sent" in out


def test_long_lived_process_on_the_alerts_subscription(files, pubsub_server):
    publisher = pubsub_v1.PublisherClient()
    topic = publisher.create_topic(name=pubsub_server.topic_path("alerts")).name
    subscription = pubsub_server.subscription_path("alerts-email")
    with pubsub_v1.SubscriberClient() as subscriber:
        subscriber.create_subscription(request={"name": subscription, "topic": topic})
    process = long_lived(files, "--subscription", subscription,
                         env={k: os.environ[k] for k in ("PUBSUB_EMULATOR_HOST", "PUBSUB_PROJECT_ID", "no_grpc_proxy")})
    try:
        for item in (alert(test="t", run="r1"), alert(test="t", run="r2")):
            message = alert_message(item.to_row())
            publisher.publish(topic, message.data, **message.attributes).result(timeout=10)
        wait_until(lambda: len(glob.glob(os.path.join(files["out"], "*.html"))) == 2, timeout=30)
    finally:
        out = stop(process)
        publisher.stop()
    assert "2 received, 0 duplicates skipped, 2 e-mails sent" in out
    wait_until(lambda: pubsub_server.subscription_stats("alerts-email").acked == 2)


def test_once_leaves_alerts_over_the_budget_in_the_file_for_the_next_day(files, capsys):
    with open(files["email.json"], "w") as f:
        json.dump({"sender": "alerts@example.com", "recipients": ["oncall@example.com"], "daily_budget": 1}, f)
    append(files["alerts.jsonl"], alert(test="t", run="r1"), alert(test="t", run="r2"))
    assert notify(files, "--dry-run", files["out"]) == 0  # a budget of 1 is the summary alone
    assert "2 e-mails sent" not in capsys.readouterr().out
    assert sorted(n for n in os.listdir(files["out"]) if n.endswith(".html")) == ["0001-summary.html"]
    offset = os.path.getsize(files["alerts.jsonl"])
    append(files["alerts.jsonl"], alert(test="t", run="r3"))
    assert notify(files, "--dry-run", files["out"]) == 0
    assert "0 e-mails sent (0 budget summaries) carrying 0 alerts, 1 folded" in capsys.readouterr().out
    with NotifierState(os.path.join(files["out"], "state.sqlite")) as state:
        assert state.file_offset(files["alerts.jsonl"]) == offset  # r3 is read again by the next run


def test_a_missing_subscription_is_a_clean_error(files, pubsub_server, capsys):
    status = run(["--config", files["email.json"], "--subscription", pubsub_server.subscription_path("nope"),
                  "--dry-run", files["out"]], environ={})
    assert status == 1
    assert "streaming pull of projects/test-project/subscriptions/nope ended: 404" in capsys.readouterr().err


def test_health_endpoint_answers_200():
    server = start_health_server(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=10) as response:
            assert response.status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_underscore_options_and_out_dir_render_where_the_dry_run_is_told(files):
    append(files["alerts.jsonl"], alert(test="t", run="r1"))
    assert run(["--config", files["email.json"], "--alerts_file", files["alerts.jsonl"],
                "--dead_letter_file", files["dead.jsonl"], "--once", "--dry_run", "--out_dir", files["out"]],
               environ={}) == 0
    assert "0001-t-r1.html" in os.listdir(files["out"])


def test_out_dir_without_a_dry_run_is_a_usage_error(files, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["--config", files["email.json"], "--alerts_file", files["alerts.jsonl"], "--out_dir", files["out"]],
            environ={})
    assert exit_info.value.code == 2 and "add --dry_run" in capsys.readouterr().err


def test_an_unknown_notifier_option_exits_2_naming_the_nearest(files, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["--config", files["email.json"], "--alerts_file", files["alerts.jsonl"], "--dead_leter_file=x"],
            environ={})
    assert exit_info.value.code == 2
    assert "unknown option --dead_leter_file (did you mean --dead_letter_file?)" in capsys.readouterr().err


def test_a_signal_never_waits_for_a_lock_the_interrupted_main_thread_may_hold():
    """Ctrl-C arriving while the main thread was inside the source queue's lock deadlocked the notifier."""
    import threading

    from notifier.cli import Loop, install_signal_handlers

    class SourceWithHeldLock:
        lock = threading.Lock()
        waited = False

        def wakeup(self):
            if not self.lock.acquire(timeout=1):
                self.waited = True  # the real queue's lock would never come free: a deadlock
            else:
                self.lock.release()

    source = SourceWithHeldLock()
    loop = Loop(notifier=None, source=source)
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        install_signal_handlers(loop)
        with source.lock:  # the main thread is inside the queue, as in Queue.get
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert loop.stop_event.is_set() and not source.waited


def test_a_missing_alerts_file_is_named_not_read_as_empty(files, capsys):
    with pytest.raises(SystemExit) as done:
        notify(files, "--dry-run", files["out"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"--alerts_file {files['alerts.jsonl']} does not exist" in err and "received" not in err
