"""Where wire messages go: the transport interface and the JSONL file transport.

A transport delivers a batch of encoded messages and reports, per message,
None (delivered) or the exception that prevented it; it never retries (the
handler does). ``PubSubTransport`` lives in ``trainguard.pubsub_handler``.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, BinaryIO, Dict, List, Optional, Protocol, Sequence

from .encoding import EncodedMessage


class Transport(Protocol):
    """Delivers encoded messages: one result per message, None for success.

    A transport may also have ``open()``, which the handler's background
    thread calls once when it starts, to connect before the first send.
    """

    def send(self, messages: Sequence[EncodedMessage], timeout: float) -> List[Optional[BaseException]]:
        ...

    def close(self) -> None:
        ...


class JsonlWriter:
    """Appends wire messages to a JSONL file, one message per line."""

    def __init__(self, path: str, max_bytes: Optional[int] = None):
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self._file: Optional[BinaryIO] = None
        self.bytes_written = 0

    def write(self, payloads: Sequence[bytes]) -> None:
        if self._file is None:
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 (kept open across writes; close() closes it)
        data = b"".join(payload + b"\n" for payload in payloads)
        if self.max_bytes is not None and self.bytes_written + len(data) > self.max_bytes:
            raise OSError(f"{self.path} reached its limit of {self.max_bytes} bytes")
        self._file.write(data)
        self._file.flush()
        self.bytes_written += len(data)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


class JsonlTransport:
    """Transport writing each message as one line of a JSONL file."""

    def __init__(self, path: str):
        self.writer = JsonlWriter(path)

    def send(self, messages: Sequence[EncodedMessage], timeout: float) -> List[Optional[BaseException]]:
        try:
            self.writer.write([m.payload for m in messages])
        except OSError as e:
            return [e] * len(messages)
        return [None] * len(messages)

    def close(self) -> None:
        self.writer.close()


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """The messages of a JSONL file written by ``JsonlMetricHandler`` (or a spill)."""
    with open(path, "rb") as f:
        return [json.loads(line) for line in f if line.strip()]
