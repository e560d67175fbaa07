"""The alerts topic: every alert published to Pub/Sub for whoever acts on it (paging, chat, e-mail)."""

from __future__ import annotations

from typing import Any, Dict

import apache_beam as beam
from apache_beam import PCollection
from apache_beam.io.gcp.pubsub import PubsubMessage, WriteToPubSub

from sinks.alerts_file import alert_json

# Attributes of an alert message, so that subscribers can filter without parsing the payload.
ATTR_TEST, ATTR_RUN, ATTR_KIND = "test", "run", "kind"


def alert_message(row: Dict) -> PubsubMessage:
    """An alert row -> the Pub/Sub message: the alerts file's JSON line as data, test/run/kind as attributes."""
    return PubsubMessage(alert_json(row).encode("utf-8"),
                         {ATTR_TEST: row["test_name"], ATTR_RUN: row["run_id"], ATTR_KIND: row["kind"]})


class PublishAlerts(beam.PTransform[PCollection[Dict[str, Any]], None]):
    """Alert rows -> messages on the Pub/Sub topic ``topic`` (``projects/<p>/topics/<t>``).

    The payload is byte for byte the line ``--alerts_file`` gets, so one
    consumer works on both. Delivery is at least once (a retried bundle
    publishes again); ``alert_id`` is deterministic, so consumers dedupe on it.
    """

    def __init__(self, topic: str):
        super().__init__()
        self.topic = topic

    def expand(self, alert_rows):
        return (alert_rows
                | "ToMessage" >> beam.Map(alert_message).with_output_types(PubsubMessage)
                | "Publish" >> WriteToPubSub(self.topic, with_attributes=True))
