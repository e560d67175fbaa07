"""A fake SendGrid v3 Mail Send endpoint for tests: records requests, answers from a script.

:class:`FakeSendGrid` is a threaded :mod:`http.server` on ``127.0.0.1`` (free
port). Point the *real* client at it::

    with FakeSendGrid() as server:
        client = sendgrid.SendGridAPIClient("SG.test", host=server.url)
        server.script(429, 500, 202)      # the next three answers, in order
        ...
        server.accepted_bodies()          # JSON bodies of the requests answered 202

Answers: each ``POST /v3/mail/send`` takes the next reply from the scripted
queue, or the default reply (202 unless :meth:`set_default` changed it, e.g. to
500 while "SendGrid is down"). A reply is a status code or a :class:`Reply`
with headers (``Retry-After``) and a body; error replies carry SendGrid's error
JSON. Other paths answer 404. Every request is recorded with the status it got.

``sendgrid_server`` is a pytest fixture around it; import it into a test
module or conftest (``from tests.servers.sendgrid import sendgrid_server``).
"""

from __future__ import annotations

import collections
import dataclasses
import http.server
import json
import os
import threading
from typing import Dict, Iterator, List, Optional, Union

import pytest

MAIL_SEND_PATH = "/v3/mail/send"

_ERROR_MESSAGES = {
    400: "Bad Request",
    401: "The provided authorization grant is invalid, expired, or revoked",
    403: "You are not authorized to access this resource",
    429: "too many requests",
    500: "internal error",
    503: "service unavailable",
}


@dataclasses.dataclass(frozen=True)
class Reply:
    """One scripted answer."""
    status: int = 202
    headers: Dict[str, str] = dataclasses.field(default_factory=dict)
    body: Optional[bytes] = None  # None: empty for 2xx, SendGrid's error JSON otherwise

    def payload(self) -> bytes:
        if self.body is not None or self.status < 300:
            return self.body or b""
        message = _ERROR_MESSAGES.get(self.status, "error")
        return json.dumps({"errors": [{"message": message, "field": None, "help": None}]}).encode()


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """A request as received, and the status it was answered with."""
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes
    status: int

    def json(self):
        return json.loads(self.body)


ReplyLike = Union[int, Reply]


def _reply(value: ReplyLike) -> Reply:
    return value if isinstance(value, Reply) else Reply(int(value))


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        reply = self.server.fake.next_reply() if self.path == MAIL_SEND_PATH else Reply(404, body=b"not found")
        self.server.fake.record(RecordedRequest(self.command, self.path, dict(self.headers), body, reply.status))
        payload = reply.payload()
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeSendGrid


class FakeSendGrid:
    """See the module docstring."""

    def __init__(self, default: ReplyLike = 202):
        self._lock = threading.Condition()
        self._script: collections.deque = collections.deque()
        self._default = _reply(default)
        self._requests: List[RecordedRequest] = []
        self._server: Optional[_HTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle ------------------------------------------------------

    def start(self) -> FakeSendGrid:
        self._server = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-sendgrid",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    def __enter__(self) -> FakeSendGrid:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the ``host`` for ``SendGridAPIClient``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- scripting ------------------------------------------------------

    def script(self, *replies: ReplyLike) -> None:
        """Answer the next requests with ``replies``, in order (then the default again)."""
        with self._lock:
            self._script.extend(_reply(r) for r in replies)

    def set_default(self, reply: ReplyLike) -> None:
        """The answer when the script is empty (e.g. 500 while SendGrid is down, 202 when it is back)."""
        with self._lock:
            self._default = _reply(reply)

    def next_reply(self) -> Reply:
        with self._lock:
            return self._script.popleft() if self._script else self._default

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    # -- inspection -----------------------------------------------------

    @property
    def requests(self) -> List[RecordedRequest]:
        """Every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def accepted_bodies(self) -> List[dict]:
        """The JSON bodies of the mail-send requests that were answered 202."""
        return [r.json() for r in self.requests if r.path == MAIL_SEND_PATH and r.status == 202]

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> List[RecordedRequest]:
        """Block until at least ``count`` requests arrived; raises TimeoutError otherwise."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._requests) >= count, timeout):
                raise TimeoutError(f"{len(self._requests)} of {count} requests after {timeout} s")
            return list(self._requests)


@pytest.fixture
def sendgrid_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSendGrid]:
    """A started :class:`FakeSendGrid`; local addresses bypass any configured HTTP proxy."""
    current = [e for e in (os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or "").split(",") if e]
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, ",".join(current + ["127.0.0.1", "localhost"]))
    with FakeSendGrid() as server:
        yield server
