"""What keeps the dashboard safe: CSRF tokens on every form, and Identity-Aware Proxy's signed header.

CSRF: a random per-browser cookie (``HttpOnly``, ``SameSite=Strict``) and, in each form, an HMAC of it under a
per-process secret. A POST whose token does not match its cookie changes nothing (403).

IAP: with ``--iap_audience`` every request must carry ``x-goog-iap-jwt-assertion``, an ES256 JWT signed by
Google's IAP keys (``IAP_CERTS_URL``), whose audience is ours and issuer IAP's; the verified e-mail is who
triage actions are recorded from. Verification is google-auth's (``google.auth.jwt.decode``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from typing import Callable, Dict, Optional

CSRF_COOKIE = "trainguard_csrf"
CSRF_FIELD = "csrf_token"
IAP_HEADER = "x-goog-iap-jwt-assertion"
IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
IAP_ISSUER = "https://cloud.google.com/iap"
CERTS_TTL_SECONDS = 3600.0
CERTS_TIMEOUT_SECONDS = 10.0  # the deadline of one fetch of IAP's keys (google-auth's default is 120 s)
# An assertion naming a key id we do not hold fetches the keys again (IAP rotates them), at most this often: a flood
# of forged assertions must not make every request a fetch.
CERTS_REFRESH_FLOOR_SECONDS = 60.0


class Csrf:
    """Issues and checks the tokens of one dashboard process."""

    def __init__(self, secret: Optional[bytes] = None):
        self._secret = secret or secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(32)

    def token(self, cookie: str) -> str:
        return hmac.new(self._secret, cookie.encode("utf-8"), hashlib.sha256).hexdigest()

    def valid(self, cookie: Optional[str], token: Optional[str]) -> bool:
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.token(cookie), token)


class IapError(Exception):
    """A request without a valid IAP assertion."""


class IapVerifier:
    """Verifies IAP's assertion; the keys are fetched from ``certs_url`` (a JSON object: key id -> PEM) and kept for
    an hour. ``fetch``: how to GET the keys (default: google-auth's requests transport)."""

    def __init__(self, audience: str, certs_url: str = IAP_CERTS_URL,
                 fetch: Optional[Callable[[str], Dict[str, str]]] = None):
        self.audience = audience
        self.certs_url = certs_url
        self._fetch = fetch or _fetch_certs
        self._certs: Dict[str, str] = {}
        self._fetched = 0.0
        self._lock = threading.Lock()

    def _keys(self, refresh: bool = False) -> Dict[str, str]:
        with self._lock:
            age = time.monotonic() - self._fetched
            if (refresh and age >= CERTS_REFRESH_FLOOR_SECONDS) or not self._certs or age > CERTS_TTL_SECONDS:
                self._certs = self._fetch(self.certs_url)
                self._fetched = time.monotonic()
            return self._certs

    def verify(self, assertion: Optional[str]) -> str:
        """The verified user's e-mail; :class:`IapError` for a missing, forged, expired or foreign assertion."""
        from google.auth import exceptions, jwt

        if not assertion:
            raise IapError(f"no {IAP_HEADER} header: this dashboard is served behind Identity-Aware Proxy")
        try:
            header = jwt.decode_header(assertion)
        except (ValueError, exceptions.GoogleAuthError) as e:
            raise IapError(f"unreadable IAP assertion: {e}") from None
        keys = self._keys()
        if header.get("kid") not in keys:
            keys = self._keys(refresh=True)  # IAP rotates its keys
        try:
            claims = jwt.decode(assertion, certs=keys, audience=self.audience)
        except (ValueError, exceptions.GoogleAuthError) as e:
            raise IapError(f"invalid IAP assertion: {e}") from None
        if claims.get("iss") != IAP_ISSUER:
            raise IapError(f"IAP assertion from issuer {claims.get('iss')!r}, not {IAP_ISSUER}")
        email = claims.get("email")
        if not isinstance(email, str) or not email:
            raise IapError("IAP assertion names no user")
        return email.removeprefix("accounts.google.com:")


def _fetch_certs(url: str) -> Dict[str, str]:
    import json

    import google.auth.transport.requests
    from google.auth import exceptions

    try:
        response = google.auth.transport.requests.Request()(url, method="GET", timeout=CERTS_TIMEOUT_SECONDS)
    except exceptions.TransportError as e:
        raise IapError(f"could not fetch IAP keys from {url}: {e}") from None
    if response.status != 200:
        raise IapError(f"could not fetch IAP keys from {url}: HTTP {response.status}")
    return json.loads(response.data.decode("utf-8"))
