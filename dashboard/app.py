"""The dashboard's web application (Starlette): routes, the pages they render, and the triage form's POST.

``create_app(settings)`` -> an ASGI app. Every page is a GET of a stable URL whose names are query parameters
(``/test?name=...``, ``/run?test=...&run=...``: any name, ``/`` and ``../`` included, stays data), rendered by a
Jinja2 template with autoescaping. The triage POST needs the form's CSRF token and changes nothing without it.
A page's data is kept while the store and the triage sink are unchanged (``dashboard.store.PageCache``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import urllib.parse
from typing import Any, Callable, MutableMapping, Optional, Tuple, TypeVar

import jinja2
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from core.config import ConfigSet
from dashboard import pages, queries
from dashboard.security import CSRF_COOKIE, CSRF_FIELD, Csrf, IapError, IapVerifier
from dashboard.store import PageCache, Reader, StoreBusy
from dashboard.triage import MUTE_CHOICES, ActionSink, form_action
from pipeline.triage import TriageError, parse_time

HERE = os.path.dirname(os.path.abspath(__file__))
T = TypeVar("T")
logger = logging.getLogger(__name__)
MAX_PAGE = 1000
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}


@dataclasses.dataclass
class Settings:
    """What the app serves from: a source (``dashboard.store``), where triage actions go, and who may ask."""
    source: Any                 # DuckDBSource or BigQuerySource
    sink: ActionSink
    user: str = ""              # who local actions are from (without IAP)
    configs: Optional[ConfigSet] = None  # the pipeline's configs: the live window checks a run's curves replay
    iap: Optional[IapVerifier] = None
    csrf: Csrf = dataclasses.field(default_factory=Csrf)


def url(path: str, **params: Any) -> str:
    """A page's URL with its names as query parameters (empty ones left out)."""
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return f"{path}?{query}" if query else path


def fmt_time(seconds: Optional[float]) -> str:
    if seconds is None or (isinstance(seconds, float) and not math.isfinite(seconds)):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def fmt_num(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return "+inf" if value == math.inf else "-inf" if value == -math.inf else f"{value:.6g}"
    return str(value)


def _json(value: Any, **_: Any) -> str:
    """JSON for ``|tojson`` (the chart specs: the test page's are a few hundred kB), by orjson: several times
    faster than ``json.dumps``; Jinja still escapes ``<``, ``>``, ``&`` and ``'`` in it."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str).decode()


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.policies["json.dumps_function"] = _json
    env.globals.update(url=url, fmt_time=fmt_time, fmt_num=fmt_num, mute_choices=list(MUTE_CHOICES))
    return env


def create_app(settings: Settings) -> Starlette:
    env = environment()
    cache = PageCache()

    def read(key: Tuple[Any, ...], page: Callable[[Reader], T]) -> T:
        """``page(reader)``, kept under ``key`` and the versions of the source and the triage sink (read anew
        once either changes; not kept while either is being written)."""
        def fresh() -> T:
            with settings.source.reader() as reader:
                return page(reader)

        versions = (settings.source.version(), settings.sink.version())
        return fresh() if None in versions else cache.get((key, versions), fresh)

    def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        cookie = request.cookies.get(CSRF_COOKIE) or request.state.new_cookie
        html = env.get_template(template).render(request=request, csrf_field=CSRF_FIELD,
                                                 csrf_token=settings.csrf.token(cookie), user=request.state.user,
                                                 source_label=settings.source.label,
                                                 writable=settings.sink.writable, **context)
        return HTMLResponse(html, status_code=status)

    def problem(request: Request, status: int, message: str) -> HTMLResponse:
        return render(request, "error.html", status=status, message=message)

    def page_number(request: Request) -> int:
        try:
            return max(1, min(MAX_PAGE, int(request.query_params.get("page", "1"))))
        except ValueError:
            return 1

    def alerts_page(request: Request) -> Response:
        p = request.query_params
        now = time.time()
        try:
            since = parse_time(p["since"], now) if p.get("since") else None
            until = parse_time(p["until"], now) if p.get("until") else None
        except Exception as e:  # noqa: BLE001 - argparse's ArgumentTypeError carries the message for the user
            return problem(request, 400, str(e))
        f = queries.AlertFilter(state=p.get("state") or None, test=p.get("test") or None,
                                kind=p.get("kind") or None, since=since, until=until)
        number = page_number(request)
        listing = read(("alerts", f, number), lambda reader: pages.alert_listing(reader, f, number, settings.sink))
        return render(request, "alerts.html", listing=listing, filter=f, page=number, kinds=queries.alert_kinds(f.kind),
                      params={k: p.get(k, "") for k in ("state", "test", "kind", "since", "until")})

    def alert_page(request: Request) -> Response:
        alert_id = request.path_params["alert_id"]
        view = read(("alert", alert_id),
                    lambda reader: pages.alert_detail(reader, alert_id, settings.sink, settings.configs))
        if view is None:
            return problem(request, 404, f"no alert {alert_id!r}")
        message = request.query_params.get("sent")
        return render(request, "alert.html", page=view, sent=message)

    async def triage_post(request: Request) -> Response:
        form = await request.form()
        if not settings.csrf.valid(request.cookies.get(CSRF_COOKIE), str(form.get(CSRF_FIELD) or "")):
            return PlainTextResponse("missing or invalid CSRF token: reload the page and try again", status_code=403)
        if not settings.sink.writable:
            return PlainTextResponse("this dashboard has nowhere to send triage actions", status_code=409)
        alert_id = request.path_params["alert_id"]
        from starlette.concurrency import run_in_threadpool

        def write() -> Optional[str]:
            with settings.source.reader() as reader:
                alert = queries.alert_by_id(reader, alert_id)
            if alert is None:
                return None
            triage = form_action(alert, str(form.get("action") or ""), str(form.get("note") or ""),
                                 request.state.user or settings.user, str(form.get("mute_for") or "1d"))
            return settings.sink.send(alert.test, triage)

        try:
            where = await run_in_threadpool(write)
        except (ValueError, TriageError) as e:
            return PlainTextResponse(str(e), status_code=400)
        if where is None:
            return PlainTextResponse(f"no alert {alert_id!r}", status_code=404)
        logger.info("dashboard: triage of %s by %s: %s", alert_id, request.state.user or settings.user, where)
        return RedirectResponse(url(f"/alerts/{urllib.parse.quote(alert_id, safe='')}", sent="1"), status_code=303)

    def tests_page(request: Request) -> Response:
        listing = read(("tests",), queries.tests)
        return render(request, "tests.html", tests=listing)

    def test_page(request: Request) -> Response:
        name = request.query_params.get("name", "")
        number = page_number(request)
        view = read(("test", name, number), lambda reader: pages.test_detail(reader, name, number, settings.configs))
        if view is None:
            return problem(request, 404, f"no test {name!r}")
        return render(request, "test.html", page=view, number=number)

    def run_page(request: Request) -> Response:
        test, run = request.query_params.get("test", ""), request.query_params.get("run", "")
        view = read(("run", test, run),
                    lambda reader: pages.run_detail(reader, test, run, settings.sink, settings.configs))
        if view is None:
            return problem(request, 404, f"no run {run!r} of test {test!r}")
        return render(request, "run.html", page=view)

    def dead_letters_page(request: Request) -> Response:
        reason = request.query_params.get("reason") or None
        number = page_number(request)

        def both(reader: Reader) -> Tuple[list, list]:
            return (queries.dead_letter_counts(reader),
                    queries.dead_letters(reader, reason, (number - 1) * queries.DEAD_LETTERS_LIMIT,
                                         queries.DEAD_LETTERS_LIMIT + 1))

        counts, letters = read(("dead letters", reason, number), both)
        return render(request, "dead_letters.html", counts=counts, letters=letters[:queries.DEAD_LETTERS_LIMIT],
                      more=len(letters) > queries.DEAD_LETTERS_LIMIT, reason=reason, number=number)

    def dead_letter_page(request: Request) -> Response:
        letter_id = request.path_params["dead_letter_id"]
        letter = read(("dead letter", letter_id), lambda reader: queries.dead_letter(reader, letter_id))
        if letter is None:
            return problem(request, 404, "no such dead letter")
        return render(request, "dead_letter.html", letter=letter)

    def home(request: Request) -> Response:
        return RedirectResponse("/alerts", status_code=302)

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(routes=[
        Route("/", home), Route("/healthz", healthz),
        Route("/alerts", alerts_page), Route("/alerts/{alert_id}", alert_page),
        Route("/alerts/{alert_id}/triage", triage_post, methods=["POST"]),
        Route("/tests", tests_page), Route("/test", test_page), Route("/run", run_page),
        Route("/dead-letters", dead_letters_page), Route("/dead-letters/{dead_letter_id}", dead_letter_page),
        Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ], middleware=[Middleware(Guard, settings=settings)])
    app.state.settings = settings
    app.state.cache = cache
    return app


class Guard:
    """ASGI middleware: IAP verification (when configured), the CSRF cookie, security headers, and one line for a
    busy store."""

    def __init__(self, app, settings: Settings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        scope.setdefault("state", {})
        user = ""
        if self.settings.iap is not None and scope["path"] != "/healthz":
            try:
                user = self.settings.iap.verify(request.headers.get("x-goog-iap-jwt-assertion"))
            except IapError as e:
                await PlainTextResponse(f"forbidden: {e}", status_code=401)(scope, receive, send)
                return
        new_cookie = None if request.cookies.get(CSRF_COOKIE) else Csrf.new_cookie()
        scope["state"]["user"] = user
        scope["state"]["new_cookie"] = new_cookie

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                if new_cookie:
                    secure = "; Secure" if self.settings.iap is not None else ""
                    headers.append((b"set-cookie", f"{CSRF_COOKIE}={new_cookie}; Path=/; HttpOnly; "
                                                   f"SameSite=Strict{secure}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except StoreBusy as e:
            await PlainTextResponse(str(e), status_code=503, headers={"retry-after": "2"})(
                scope, receive, send_with_headers)
