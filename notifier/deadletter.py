"""Where alerts go when they cannot be mailed: a JSONL file or a Pub/Sub topic.

Alerts are dead-lettered when SendGrid refuses their e-mail for good (400, 401,
403, ...) and payloads are dead-lettered when they are not alerts at all. A
message is acknowledged (or the file offset moves on) only after its dead
letter was written; a failing dead-letter sink raises, and the alerts stay
unacknowledged.

Both sinks keep the alert payload as it was received, so the alerts can be
mailed again once the problem is fixed: the dead-letter file is itself a valid
``--alerts_file`` input (each line's ``alert`` object), and a subscription on
the dead-letter topic a valid ``--subscription``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import Dict, Optional, Sequence

_ATTRIBUTE_MAX_BYTES = 1024  # Pub/Sub limit of an attribute value


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """One payload and why it was not mailed."""
    payload: bytes
    attributes: Dict[str, str]
    reason: str
    status: Optional[int] = None  # SendGrid's HTTP status, when there was one


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def dead_letter_record(letter: DeadLetter, now: float) -> Dict:
    """The JSON line of the file sink: ``alert`` (the payload's object) or ``payload`` (undecodable text)."""
    record: Dict = {"failed_at": _iso(now), "reason": letter.reason, "status": letter.status,
                    "attributes": letter.attributes}
    try:
        decoded = json.loads(letter.payload)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        record["alert"] = decoded
    else:
        record["payload"] = letter.payload.decode("utf-8", errors="backslashreplace")
    return record


class FileDeadLetters:
    """Appends dead letters to a JSONL file, flushed and fsynced before returning."""

    def __init__(self, path: str):
        self.path = path

    def describe(self) -> str:
        return self.path

    def write(self, letters: Sequence[DeadLetter], now: float) -> None:
        if os.path.dirname(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        lines = "".join(json.dumps(dead_letter_record(letter, now), sort_keys=True) + "\n" for letter in letters)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())


def _attribute(text: str) -> str:
    return text.encode("utf-8")[:_ATTRIBUTE_MAX_BYTES].decode("utf-8", errors="ignore")


class PubSubDeadLetters:
    """Publishes each payload unchanged to ``topic`` with its attributes plus ``reason`` and ``status``."""

    def __init__(self, topic: str, publisher=None, timeout_seconds: float = 60.0):
        from google.cloud import pubsub_v1  # imported only on this path

        self.topic = topic
        self.timeout_seconds = timeout_seconds
        self._publisher = publisher or pubsub_v1.PublisherClient()

    def describe(self) -> str:
        return self.topic

    def write(self, letters: Sequence[DeadLetter], now: float) -> None:
        futures = []
        for letter in letters:
            attributes = {**letter.attributes, "reason": _attribute(letter.reason), "failed_at": _iso(now)}
            if letter.status is not None:
                attributes["status"] = str(letter.status)
            futures.append(self._publisher.publish(self.topic, letter.payload, **attributes))
        for future in futures:
            future.result(timeout=self.timeout_seconds)

    def close(self) -> None:
        self._publisher.stop()
