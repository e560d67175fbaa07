"""Helpers for the trainer-side tests: reading back and checking wire messages."""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence

from tests.support import REPO_ROOT
from trainguard import wire
from trainguard.encoding import EncodedMessage
from trainguard.handlers import JsonlMetricHandler, PublisherConfig, WireHandler

ROOT = REPO_ROOT


def parse_all(payloads: Iterable[bytes]) -> List[wire.Message]:
    """Parses payloads as the pipeline does, failing on any rejection."""
    messages = []
    for payload in payloads:
        message, rejections = wire.parse_message(payload)
        assert rejections == [], rejections
        messages.append(message)
    return messages


def jsonl_payloads(path: str) -> List[bytes]:
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return [line.rstrip(b"\n") for line in f if line.strip()]


class P(NamedTuple):
    """A parsed point with names (``wire.Point`` is a plain tuple)."""
    tag: str
    value: float
    step: Optional[int]
    time: float


def points_of(messages: Sequence[wire.Message]) -> List[P]:
    return [P(*point) for message in messages for point in message.points]


def events_of(messages: Sequence[wire.Message]) -> List[wire.Event]:
    return [event for message in messages for event in message.events]


def expected_ts(message: wire.Message) -> str:
    """The ``ts`` attribute the message must carry (its event time in millis)."""
    return str(wire.event_time_millis([P(*p)._asdict() for p in message.points],
                                      [e._asdict() for e in message.events]))


def received(server, topic: str) -> List[wire.Message]:
    """The messages on a topic of the Pub/Sub test server, checked as the pipeline will see them."""
    raw = server.published_messages(topic)
    messages = parse_all([m.data for m in raw])
    for stored, message in zip(raw, messages):
        assert dict(stored.attributes) == wire.message_attributes(message.test, message.run,
                                                                  int(expected_ts(message)), message.id,
                                                                  json.loads(stored.data)["schema"])
    assert len({m.id for m in messages}) == len(messages)
    return messages


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.01) -> Any:
    """Polls ``condition`` until it is truthy (a liveness wait, not a timing assertion)."""
    give_up = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def run_python(code: str, env: Optional[Dict[str, str]] = None, timeout: float = 60.0,
               args: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter with the repository importable."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


class ScriptedTransport:
    """A stand-in for the network: fails while ``failing`` is set, blocks while
    ``blocked`` is set, and otherwise records what it receives."""

    def __init__(self) -> None:
        self.received: List[EncodedMessage] = []
        self.sends: List[int] = []  # messages per delivered send
        self.attempts = 0
        self.failures_left = 0
        self.failing = False
        self.unblocked = threading.Event()
        self.unblocked.set()
        self.closed = False

    def send(self, messages: Sequence[EncodedMessage], timeout: float):
        self.attempts += 1
        self.unblocked.wait(timeout)
        if not self.unblocked.is_set():
            return [TimeoutError("blocked")] * len(messages)
        if self.failing or self.failures_left > 0:
            self.failures_left = max(self.failures_left - 1, 0)
            return [ConnectionError("unreachable")] * len(messages)
        self.received.extend(messages)
        self.sends.append(len(messages))
        return [None] * len(messages)

    def close(self) -> None:
        self.closed = True

    @property
    def payloads(self) -> List[bytes]:
        return [m.payload for m in self.received]


class SilentServer:
    """A TCP listener on 127.0.0.1 that accepts connections, reads what it is
    sent and never answers: an endpoint that hangs every request (a
    black-holed load balancer). Closing it resets the connections."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.bytes_received = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._connections: List[socket.socket] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            for key, _ in self._selector.select(timeout=0.05):
                if key.fileobj is self._listener:
                    connection, _ = self._listener.accept()
                    self._connections.append(connection)
                    self._selector.register(connection, selectors.EVENT_READ)
                    continue
                data = key.fileobj.recv(65536)
                if data:
                    self.bytes_received += len(data)
                else:
                    self._selector.unregister(key.fileobj)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join()
        for connection in self._connections:
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            connection.close()  # linger 0: a reset, so a waiting client fails at once
        self._listener.close()
        self._selector.close()


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Handlers:
    """Makes handlers for a test and closes them at its end."""

    def __init__(self) -> None:
        self.made: List[WireHandler] = []

    def jsonl(self, path: str, test: Optional[str] = "test", run: Optional[str] = "run",
              **config: Any) -> JsonlMetricHandler:
        handler = JsonlMetricHandler(path, test, run, PublisherConfig(**config))
        self.made.append(handler)
        return handler

    def scripted(self, transport: ScriptedTransport, test: Optional[str] = "test", run: Optional[str] = "run",
                 **config: Any) -> WireHandler:
        handler = WireHandler(transport, test, run, PublisherConfig(**config))
        self.made.append(handler)
        return handler

    def add(self, handler: WireHandler) -> WireHandler:
        self.made.append(handler)
        return handler

    def close_all(self) -> None:
        for handler in self.made:
            handler.close(timeout=5.0)


def json_equal(a: bytes, b: bytes) -> bool:
    return json.loads(a) == json.loads(b)
