"""Triage from the dashboard: the forms write trainguard-triage's control message to the store's triage file,
only with their CSRF token; the alert shows the action as pending until a replay applies it, then its state."""

from __future__ import annotations

import html
import json
import re

import duckdb
import pytest

from core.locations import triage_file_for
from pipeline.triage import main as triage_main
from tests.dashboard.conftest import client_of, replay
from trainguard import wire

CIFAR = "pt-cifar-tpu-v3-8"


def regressed_alert(store) -> str:
    with duckdb.connect(str(store), read_only=True) as connection:
        return connection.execute("SELECT alert_id FROM alerts WHERE test_name = ? AND metric_name = "
                                  "'Accuracy/test_max' AND run_id LIKE '%011'", [CIFAR]).fetchone()[0]


def token(page: str) -> str:
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', page).group(1)


def file_lines(store) -> list:
    path = triage_file_for(str(store))
    try:
        with open(path, "rb") as f:
            return [wire.parse_message(line)[0] for line in f if line.strip()]
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("form", [{}, {"csrf_token": ""}, {"csrf_token": "0" * 64}])
def test_a_post_without_its_csrf_token_changes_nothing(demo_client, demo_store, form):
    alert_id = regressed_alert(demo_store)
    demo_client.get(f"/alerts/{alert_id}")  # the browser has its cookie, but not the form's token
    response = demo_client.post(f"/alerts/{alert_id}/triage", data={**form, "action": "dismiss", "note": "x"})
    assert response.status_code == 403
    assert file_lines(demo_store) == []


def test_a_token_is_good_only_with_its_own_cookie(demo_store):
    alert_id = regressed_alert(demo_store)
    mine, theirs = client_of(f"--local_store={demo_store}"), client_of(f"--local_store={demo_store}")
    their_token = token(theirs.get(f"/alerts/{alert_id}").text)
    mine.get(f"/alerts/{alert_id}")
    response = mine.post(f"/alerts/{alert_id}/triage", data={"csrf_token": their_token, "action": "dismiss"})
    assert response.status_code == 403 and file_lines(demo_store) == []


def test_dismiss_is_pending_until_a_replay_applies_it(demo_client, demo_store):
    alert_id = regressed_alert(demo_store)
    page = demo_client.get(f"/alerts/{alert_id}").text
    response = demo_client.post(f"/alerts/{alert_id}/triage", follow_redirects=False,
                                data={"csrf_token": token(page), "action": "dismiss", "note": "flaky <host> & co"})
    assert response.status_code == 303 and response.headers["location"] == f"/alerts/{alert_id}?sent=1"
    (message,) = file_lines(demo_store)
    assert message.test == CIFAR
    assert message.triage.action == "dismiss" and message.triage.alert_id == alert_id
    assert message.triage.note == "flaky <host> & co" and message.triage.user == "tester"
    pending = demo_client.get(f"/alerts/{alert_id}").text
    assert "pending: dismissed" in pending and "state-open" in pending
    assert "flaky &lt;host&gt; &amp; co" in pending
    listed = demo_client.get("/alerts?state=open").text
    assert "pending: dismissed" in listed

    replay(demo_store, demo_store.parent / "alerts.jsonl", demo_client)
    applied = demo_client.get(f"/alerts/{alert_id}").text
    assert "state-dismissed" in applied and 'class="pending"' not in applied
    assert "applied" in applied and "flaky &lt;host&gt; &amp; co" in applied
    assert alert_id in demo_client.get("/alerts?state=dismissed").text


def test_the_form_writes_what_trainguard_triage_writes(demo_client, demo_store):
    alert_id = regressed_alert(demo_store)
    page = demo_client.get(f"/alerts/{alert_id}").text
    demo_client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page), "action": "dismiss",
                                                         "note": "same"})
    assert triage_main(["dismiss", alert_id, "--note=same", "--user=tester", f"--local_store={demo_store}"]) == 0
    ours, theirs = file_lines(demo_store)
    assert ours.triage._replace(time=0) == theirs.triage._replace(time=0)


def test_accept_and_mute(demo_client, demo_store):
    alert_id = regressed_alert(demo_store)
    page = demo_client.get(f"/alerts/{alert_id}").text
    for form in ({"action": "accept", "note": "new baseline"}, {"action": "mute", "mute_for": "3d"}):
        response = demo_client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page), **form})
        assert response.status_code == 200  # followed to the alert's page
    accept, mute = file_lines(demo_store)
    assert (accept.triage.action, accept.triage.metric, accept.triage.run) == (
        "accept", "Accuracy/test_max", f"{CIFAR}-011")
    assert mute.triage.action == "mute" and mute.triage.until - mute.triage.time == pytest.approx(3 * 86400)
    assert "pending: accepted" in demo_client.get(f"/alerts/{alert_id}").text
    replay(demo_store, demo_store.parent / "alerts.jsonl", demo_client)
    assert "state-accepted" in demo_client.get(f"/alerts/{alert_id}").text


@pytest.mark.parametrize("form", [{"action": "explode"}, {"action": "mute", "mute_for": "forever"}])
def test_a_bad_form_is_refused(demo_client, demo_store, form):
    alert_id = regressed_alert(demo_store)
    page = demo_client.get(f"/alerts/{alert_id}").text
    response = demo_client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page), **form})
    assert response.status_code == 400 and file_lines(demo_store) == []
    assert demo_client.post("/alerts/nope/triage", data={"csrf_token": token(page),
                                                         "action": "dismiss"}).status_code == 404


def test_the_state_filter_reads_the_stored_triage_table(small_client):
    """The hand-built store's hostile test has one alert dismissed in its ``triage`` table."""
    page = small_client.get("/alerts?state=dismissed").text
    assert len(re.findall(r'class="state state-dismissed"', page)) == 1
    assert "h0" in html.unescape(page) and "h1&lt;i&gt;" not in page
    assert len(re.findall(r'class="state state-open"', small_client.get("/alerts?state=open").text)) == 3


def test_with_topic_actions_are_published_and_pending_until_the_store_has_them(demo_store, pubsub_server):
    from google.cloud import pubsub_v1

    topic = pubsub_server.topic_path("metrics")
    pubsub_v1.PublisherClient().create_topic(name=topic)
    subscriber = pubsub_v1.SubscriberClient()
    subscription = pubsub_server.subscription_path("pipeline")
    subscriber.create_subscription(name=subscription, topic=topic)
    client = client_of(f"--local_store={demo_store}", f"--topic={topic}", "--user=pat")
    alert_id = regressed_alert(demo_store)
    page = client.get(f"/alerts/{alert_id}").text
    response = client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page), "action": "dismiss",
                                                               "note": "via topic"})
    assert response.status_code == 200 and "pending: dismissed" in response.text
    [received] = subscriber.pull(subscription=subscription, max_messages=5, timeout=10).received_messages
    message, rejections = wire.parse_message(received.message.data)
    assert rejections == [] and message.triage.alert_id == alert_id and message.triage.user == "pat"
    assert dict(received.message.attributes)["id"] == message.id
    assert file_lines(demo_store) == []  # nothing went to the local triage file


def test_a_dismissed_value_is_marked_triaged_on_the_test_page(demo_client, demo_store):
    alert_id = regressed_alert(demo_store)
    page = demo_client.get(f"/alerts/{alert_id}").text
    demo_client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page), "action": "dismiss"})
    replay(demo_store, demo_store.parent / "alerts.jsonl", demo_client)
    test_page = demo_client.get("/test", params={"name": CIFAR}).text
    specs = {s["title"]: s for s in (json.loads(t) for t in re.findall(
        r'<script type="application/json" id="[^"]+">(.*?)</script>', test_page, re.S))}
    chart = specs["Accuracy/test_max"]
    marked = [run for run, value in zip(chart["runs"], chart["triaged"]) if value is not None]
    assert marked == [f"{CIFAR}-011"]
    assert chart["out"][chart["runs"].index(f"{CIFAR}-011")] is None  # triaged, not drawn as out of bounds
