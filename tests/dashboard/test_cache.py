"""A page's data is kept between requests only while what it was read from is unchanged: the store (a replay writes
it) and the triage sink (a form writes the triage file). Real replays into a real store, real requests."""

from __future__ import annotations

import time

from dashboard.store import SETTLE_SECONDS, PageCache
from pipeline.main import main as pipeline_main
from tests.dashboard.conftest import client_of
from tests.dashboard.test_triage import regressed_alert, token


def settle() -> None:
    """Past the time a just-written file is not cached from (``dashboard.store.file_version``)."""
    time.sleep(SETTLE_SECONDS + 0.2)


def test_a_kept_page_is_read_anew_once_a_replay_writes_the_store(demo_client, demo_store, tmp_path):
    cache = demo_client.app.state.cache
    settle()
    before = demo_client.get("/dead-letters").text
    hits = cache.hits
    assert demo_client.get("/dead-letters").text == before and cache.hits == hits + 1  # kept: the store is unchanged

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"not json <b>\n')
    demo_client.app.state.settings.source.connection.close()  # this process replays: DuckDB wants the file to itself
    assert pipeline_main([f"--input_files={broken}", f"--local_store={demo_store}", "--report_dir=",
                          f"--alerts_file={tmp_path / 'alerts.jsonl'}"]) == 0
    just_written = demo_client.get("/dead-letters").text  # the store still settling: read, not kept
    assert "not json &lt;b&gt;" in just_written and "not json" not in before
    settle()
    misses = cache.misses
    assert demo_client.get("/dead-letters").text == just_written and cache.misses == misses + 1  # a new version


def test_a_kept_alert_shows_a_triage_action_as_soon_as_it_is_written(demo_client, demo_store):
    alert_id = regressed_alert(demo_store)
    settle()
    page = demo_client.get(f"/alerts/{alert_id}").text
    hits = demo_client.app.state.cache.hits
    assert demo_client.get(f"/alerts/{alert_id}").text == page and demo_client.app.state.cache.hits == hits + 1
    demo_client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page), "action": "dismiss",
                                                         "note": "kept?"})
    assert "pending: dismissed" in demo_client.get(f"/alerts/{alert_id}").text
    assert "pending: dismissed" in demo_client.get("/alerts?state=open").text
    settle()
    assert "pending: dismissed" in demo_client.get(f"/alerts/{alert_id}").text


def test_a_kept_alert_shows_an_action_published_to_the_topic_at_once(demo_store, pubsub_server):
    from google.cloud import pubsub_v1

    topic = pubsub_server.topic_path("metrics")
    pubsub_v1.PublisherClient().create_topic(name=topic)
    client = client_of(f"--local_store={demo_store}", f"--topic={topic}", "--user=pat")
    alert_id = regressed_alert(demo_store)
    settle()
    page = client.get(f"/alerts/{alert_id}").text
    hits = client.app.state.cache.hits
    assert client.get(f"/alerts/{alert_id}").text == page and client.app.state.cache.hits == hits + 1
    assert "pending: dismissed" not in page
    client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page), "action": "dismiss"})
    assert "pending: dismissed" in client.get(f"/alerts/{alert_id}").text  # the store is unchanged: not the kept page


def test_the_least_recently_used_page_is_dropped_beyond_the_limit():
    cache, reads = PageCache(entries=2), []

    def read(key):
        return cache.get(key, lambda: reads.append(key) or key.upper())

    assert [read("a"), read("b"), read("a"), read("c")] == ["A", "B", "A", "C"]  # "b": the least recently used
    assert [read("a"), read("c"), read("b")] == ["A", "C", "B"] and reads == ["a", "b", "c", "b"]
    assert (cache.hits, cache.misses) == (3, 4)
