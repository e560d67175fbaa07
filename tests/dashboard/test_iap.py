"""``--iap_audience``: every request needs Identity-Aware Proxy's signed header, verified with google-auth against
keys fetched from a certificate URL (here a local server holding a key this test signs with); the verified user
is who triage actions are recorded from."""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
import time
from typing import Iterator, List, Optional

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.auth import crypt, jwt

from dashboard.security import IAP_HEADER, IAP_ISSUER
from tests.dashboard.conftest import client_of
from tests.dashboard.test_triage import file_lines, regressed_alert, token

AUDIENCE = "/projects/123/global/backendServices/456"
USER = "ann@example.com"


def new_key():
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode()


@contextlib.contextmanager
def certs_server(public: str, fetches: Optional[List[str]] = None) -> Iterator[str]:
    """The URL of a local server publishing ``public`` as key k1, as IAP's certificate URL does; each GET's path
    is appended to ``fetches``."""
    body = json.dumps({"k1": public}).encode()

    class Certs(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if fetches is not None:
                fetches.append(self.path)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Certs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/iap/verify/public_key"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def keys():
    """(private key of kid k1, URL of a server publishing its public key as IAP's certificate URL does)."""
    private, public = new_key()
    with certs_server(public) as url:
        yield private, url


def assertion(private: bytes, kid: str = "k1", **claims) -> str:
    now = int(time.time())
    payload = {"iss": IAP_ISSUER, "aud": AUDIENCE, "email": f"accounts.google.com:{USER}", "sub": "accounts.google.com:1",
               "iat": now, "exp": now + 600, **claims}
    return jwt.encode(crypt.ES256Signer.from_string(private, key_id=kid), payload).decode()


@pytest.fixture
def client(keys, demo_store, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    # Behind IAP the page is https (Cloud Run), and the CSRF cookie is Secure.
    return client_of(f"--local_store={demo_store}", f"--iap_audience={AUDIENCE}", f"--iap_certs_url={keys[1]}",
                     base_url="https://dashboard.example")


def test_a_request_without_an_assertion_is_refused(client):
    response = client.get("/alerts")
    assert response.status_code == 401 and IAP_HEADER in response.text
    assert client.get("/healthz").status_code == 200  # the health check reveals nothing


def test_a_valid_assertion_lets_the_user_in(client, keys):
    response = client.get("/alerts", headers={IAP_HEADER: assertion(keys[0])})
    assert response.status_code == 200 and USER in response.text


@pytest.mark.parametrize("bad", ["forged", "audience", "issuer", "expired", "garbage", "no email"])
def test_an_invalid_assertion_is_refused(client, keys, bad):
    other_private, _ = new_key()
    now = int(time.time())
    token_text = {
        "forged": lambda: assertion(other_private),
        "audience": lambda: assertion(keys[0], aud="/projects/999/global/backendServices/1"),
        "issuer": lambda: assertion(keys[0], iss="https://evil.example"),
        "expired": lambda: assertion(keys[0], iat=now - 7200, exp=now - 3600),
        "garbage": lambda: "not.a.jwt",
        "no email": lambda: assertion(keys[0], email=""),
    }[bad]()
    response = client.get("/alerts", headers={IAP_HEADER: token_text})
    assert response.status_code == 401, response.text


def test_triage_records_the_verified_user(client, keys, demo_store):
    headers = {IAP_HEADER: assertion(keys[0])}
    alert_id = regressed_alert(demo_store)
    page = client.get(f"/alerts/{alert_id}", headers=headers).text
    response = client.post(f"/alerts/{alert_id}/triage", headers=headers,
                           data={"csrf_token": token(page), "action": "dismiss", "note": "by ann"})
    assert response.status_code == 200
    (message,) = file_lines(demo_store)
    assert message.triage.user == USER
    assert re.search(r"<td>ann@example.com</td>", client.get(f"/alerts/{alert_id}", headers=headers).text)
    assert client.post(f"/alerts/{alert_id}/triage", data={"csrf_token": token(page),
                                                           "action": "dismiss"}).status_code == 401
    assert len(file_lines(demo_store)) == 1


def test_fetching_the_keys_has_a_deadline(monkeypatch, keys):
    """IAP's key server that accepts and never answers: the fetch gives up after CERTS_TIMEOUT_SECONDS with one
    clear error, and the request is refused rather than hung."""
    from dashboard import security
    from tests.trainguard.support import SilentServer

    silent = SilentServer()
    try:
        monkeypatch.setattr(security, "CERTS_TIMEOUT_SECONDS", 0.5)
        verifier = security.IapVerifier(AUDIENCE, f"http://{silent.host}/keys")
        started = time.monotonic()
        with pytest.raises(security.IapError, match="could not fetch IAP keys"):
            verifier.verify(assertion(keys[0], email="accounts.google.com:pat@example.com"))
        assert time.monotonic() - started < 60  # generous for a loaded machine; google-auth alone waits 120 s
    finally:
        silent.close()


def test_assertions_with_unknown_key_ids_fetch_the_keys_again_at_most_once_a_minute(monkeypatch):
    """IAP rotates its keys, so an unknown key id fetches them again; a flood of forged ones must not fetch each
    time (the certificate server counts its GETs)."""
    from dashboard import security

    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    private, public = new_key()
    fetches: List[str] = []
    with certs_server(public, fetches) as url:
        verifier = security.IapVerifier(AUDIENCE, url)
        assert verifier.verify(assertion(private)) == USER
        for _ in range(20):
            with pytest.raises(security.IapError):
                verifier.verify(assertion(private, kid="unknown"))
        assert len(fetches) == 1  # the first fetch is under a minute old: no refresh yet
        monkeypatch.setattr(security, "CERTS_REFRESH_FLOOR_SECONDS", 0.0)
        with pytest.raises(security.IapError):
            verifier.verify(assertion(private, kid="unknown"))
        assert len(fetches) == 2  # past the floor, an unknown key id fetches again
