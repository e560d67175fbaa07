"""``python -m notifier`` / ``trainguard-email``: the notifier as a long-lived process.

    python -m notifier --config email.json --subscription projects/P/subscriptions/trainguard-alerts-email
    python -m notifier --config email.json --alerts_file alerts.jsonl --dry_run --out_dir email-dry-run --once

Runs until SIGTERM/SIGINT (then releases unsent alerts for redelivery), or
with ``--once`` until the alerts file is handled. See docs/email.md. Options are
spelled with underscores; the dashed spellings of earlier versions
(``--alerts-file``, ``--dry-run DIR``) still work.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.server
import logging
import os
import signal
import sys
import threading
import time
from typing import Mapping, Optional, Sequence

from notifier.api_key import DEFAULT_ENV_VAR, SecretError, resolve_api_key
from notifier.config import ConfigError, EmailConfig, load_config
from notifier.deadletter import FileDeadLetters, PubSubDeadLetters
from notifier.notifier import Notifier
from notifier.sending import DEFAULT_HOST, DryRunSender, SendGridSender
from notifier.sources import FileSource, PubSubSource, SourceError
from notifier.state import NotifierState
from trainguard.cli import DASHES_NOTE, RUNTIME_ERROR, StrictArgumentParser, cloud_failure, fail

PROG = "trainguard-email"
DEFAULT_DRY_RUN_DIR = "email-dry-run"
_LOGGER = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Options:
    """The command line, parsed."""
    config: str
    subscription: Optional[str] = None
    alerts_file: Optional[str] = None
    state: Optional[str] = None
    dead_letter_file: str = "email-dead-letter.jsonl"
    dead_letter_topic: Optional[str] = None
    dry_run: Optional[str] = None  # directory the e-mails are rendered to
    once: bool = False
    sendgrid_key_secret: Optional[str] = None
    sendgrid_key_env: str = DEFAULT_ENV_VAR
    sendgrid_host: str = DEFAULT_HOST
    project: Optional[str] = None
    max_outstanding: int = 1000
    max_lease_seconds: float = 4 * 3600.0
    poll_seconds: float = 1.0
    health_port: Optional[int] = None
    log_level: str = "INFO"

    @property
    def state_path(self) -> str:
        """``--state``, else ``<dry-run dir>/state.sqlite`` (a dry run never marks real alerts sent), else a default."""
        if self.state:
            return self.state
        return os.path.join(self.dry_run, "state.sqlite") if self.dry_run else "email-state.sqlite"


def _parser() -> argparse.ArgumentParser:
    parser = StrictArgumentParser(prog=PROG, description="Mail trainguard alerts through SendGrid, one digest "
                                                         "per run, without losing or repeating an alert.",
                                  epilog=DASHES_NOTE)
    parser.add_argument("--config", required=True, help="JSON configuration (see notifier/example-config.json).")
    source = parser.add_argument_group("alert source (exactly one)").add_mutually_exclusive_group(required=True)
    source.add_argument("--subscription", help="Pub/Sub subscription of the alerts topic "
                                               "(projects/<p>/subscriptions/<s>).")
    source.add_argument("--alerts_file", help="Alerts JSONL file to tail (the pipeline's --alerts_file).")
    parser.add_argument("--state", help="SQLite state file: sent alert ids, daily budget, file offsets "
                                        "(default email-state.sqlite; <out_dir>/state.sqlite with --dry_run).")
    dead = parser.add_mutually_exclusive_group()
    dead.add_argument("--dead_letter_file", default=Options.dead_letter_file,
                      help="JSONL file for alerts SendGrid refused for good (default %(default)s).")
    dead.add_argument("--dead_letter_topic", help="Pub/Sub topic for them instead (projects/<p>/topics/<t>).")
    parser.add_argument("--dry_run", nargs="?", const=DEFAULT_DRY_RUN_DIR, metavar="DIR",
                        help="Render e-mails as .html/.txt files to --out_dir instead of sending (--dry_run DIR, "
                             "the older form, names the directory too).")
    parser.add_argument("--out_dir", default=None, metavar="DIR",
                        help=f"Where --dry_run renders the e-mails (default {DEFAULT_DRY_RUN_DIR}).")
    parser.add_argument("--once", action="store_true",
                        help="With --alerts_file: mail what the file holds now, then exit.")
    key = parser.add_argument_group("SendGrid")
    key.add_argument("--sendgrid_key_secret", help="Secret Manager secret holding the API key "
                                                   "(projects/<p>/secrets/<s>[/versions/<v>] or <s> with --project).")
    key.add_argument("--sendgrid_key_env", default=DEFAULT_ENV_VAR,
                     help="Environment variable holding the API key otherwise (default %(default)s).")
    key.add_argument("--sendgrid_host", default=DEFAULT_HOST,
                     help="API base URL (default %(default)s; https://api.eu.sendgrid.com for EU residency).")
    parser.add_argument("--project", help="Google Cloud project for a bare secret name (else $GOOGLE_CLOUD_PROJECT).")
    pubsub = parser.add_argument_group("Pub/Sub")
    pubsub.add_argument("--max_outstanding", type=int, default=Options.max_outstanding,
                        help="Flow control: most unacknowledged messages held (default %(default)s).")
    pubsub.add_argument("--max_lease_seconds", type=float, default=Options.max_lease_seconds,
                        help="How long the client extends a held message's lease before Pub/Sub redelivers it "
                             "(default %(default)s).")
    parser.add_argument("--poll_seconds", type=float, default=Options.poll_seconds,
                        help="Longest idle wait between checks (default %(default)s).")
    parser.add_argument("--health_port", type=int, default=None,
                        help="Serve GET / -> 200 on this port (default $PORT when set, as on Cloud Run).")
    parser.add_argument("--log_level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def parse_options(argv: Optional[Sequence[str]], environ: Mapping[str, str] = os.environ) -> Options:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.once and not args.alerts_file:
        parser.error("--once needs --alerts_file")
    if args.once and not os.path.isfile(args.alerts_file):
        parser.error(f"--alerts_file {args.alerts_file} does not exist: name the file the pipeline wrote "
                     "(its --alerts_file; alerts.jsonl by default)")
    if args.out_dir is not None:
        if args.dry_run is None:
            parser.error("--out_dir is where --dry_run renders the e-mails: add --dry_run (or leave --out_dir out)")
        if args.dry_run not in (DEFAULT_DRY_RUN_DIR, args.out_dir):
            parser.error(f"--dry_run {args.dry_run} and --out_dir {args.out_dir} name two directories: keep one")
        args.dry_run = args.out_dir
    values = {field.name: getattr(args, field.name) for field in dataclasses.fields(Options)}
    if values["health_port"] is None and environ.get("PORT", "").isdigit():
        values["health_port"] = int(environ["PORT"])
    return Options(**values)


# --------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------


class SystemClock:
    """Wall-clock time; tests pass a clock of their own to :class:`Loop`."""

    @staticmethod
    def now() -> float:
        return time.time()

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)


def build_sender(options: Options, environ: Mapping[str, str]):
    if options.dry_run:
        return DryRunSender(options.dry_run)
    key = resolve_api_key(options.sendgrid_key_secret, options.project, environ, options.sendgrid_key_env)
    return SendGridSender(key, options.sendgrid_host)


def build_dead_letters(options: Options):
    if options.dead_letter_topic:
        return PubSubDeadLetters(options.dead_letter_topic)
    return FileDeadLetters(options.dead_letter_file)


def build_source(options: Options, state: NotifierState):
    if options.alerts_file:
        return FileSource(options.alerts_file, state)
    assert options.subscription is not None  # the options need one source or the other
    return PubSubSource(options.subscription, options.max_outstanding, options.max_lease_seconds).start()


def build_state(options: Options, config: EmailConfig) -> NotifierState:
    return NotifierState(options.state_path, config.max_sent_ids, config.sent_ids_max_age_days * 86400.0)


class Loop:
    """Feeds a source into a notifier on a clock: one :meth:`step` at a time, or until stopped."""

    def __init__(self, notifier: Notifier, source, clock=SystemClock, poll_seconds: float = 1.0):
        self.notifier = notifier
        self.source = source
        self.clock = clock
        self.poll_seconds = poll_seconds
        self.stop_event = threading.Event()

    def step(self, max_wait: Optional[float] = None) -> int:
        """Receive what arrives within the wait (at most until the notifier's next wake), then tick."""
        now = self.clock.now()
        limit = self.poll_seconds if max_wait is None else max_wait
        wake = self.notifier.next_wake(now)
        timeout = limit if wake is None else min(limit, max(0.0, wake - now))
        deliveries = self.source.poll(timeout)
        for delivery in deliveries:
            self.notifier.receive(delivery, self.clock.now())
        self.notifier.tick(self.clock.now())
        return len(deliveries)

    def run_until_stopped(self) -> None:
        while not self.stop_event.is_set():
            self.step()

    def stop(self) -> None:
        self.stop_event.set()
        self.source.wakeup()

    def drain(self) -> None:
        """``--once``: take everything available, close every group now, send (with retries), return."""
        while self.step(max_wait=0.0):
            pass
        self.notifier.flush(self.clock.now())
        while self.notifier.held_count and not self.stop_event.is_set():
            now = self.clock.now()
            wake = self.notifier.next_wake(now)
            if wake is None or self.notifier.held_for_budget(now):
                _LOGGER.warning("%d alert(s) wait for tomorrow's e-mail budget; they are mailed by the next run",
                                self.notifier.held_count)
                return
            self.clock.sleep(max(0.0, wake - now))
            self.notifier.tick(self.clock.now())


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # health probes are not worth a log line
        pass


def start_health_server(port: int) -> http.server.ThreadingHTTPServer:
    """A liveness endpoint (Cloud Run services must listen on $PORT)."""
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), _HealthHandler)
    threading.Thread(target=server.serve_forever, name="email-health", daemon=True).start()
    return server


def install_signal_handlers(loop: Loop) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    # Only the event: the handler runs in the main thread between two bytecodes, possibly while that thread holds
    # the source queue's lock, so waking the queue from here (Loop.stop) deadlocked. The loop sees the event
    # within one poll (--poll_seconds), as the event's lock is never held by the main thread.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: loop.stop_event.set())


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------


def run(argv: Optional[Sequence[str]] = None, environ: Mapping[str, str] = os.environ) -> int:
    """Parse ``argv``, run the notifier, return the exit status (2: bad configuration or no API key,
    1: the source failed, e.g. a missing subscription, or Google Cloud is out of reach: no credentials,
    an endpoint that does not answer; one line on stderr, no traceback)."""
    options = parse_options(argv, environ)
    try:
        return _run(options, environ)
    except Exception as e:
        line = cloud_failure(e)
        if line is None:
            raise
        return fail(PROG, line, RUNTIME_ERROR)


def _run(options: Options, environ: Mapping[str, str]) -> int:
    logging.basicConfig(level=options.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(options.config)
        sender = build_sender(options, environ)
    except (ConfigError, SecretError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    dead_letters = build_dead_letters(options)
    health = start_health_server(options.health_port) if options.health_port else None
    with build_state(options, config) as state:
        source = build_source(options, state)
        notifier = Notifier(config, state, sender, dead_letters)
        loop = Loop(notifier, source, SystemClock, options.poll_seconds)
        install_signal_handlers(loop)
        _LOGGER.info("reading %s; sending via %s; dead letters to %s; state %s", source.describe(),
                     sender.describe(), dead_letters.describe(), options.state_path)
        if not options.once:
            print(f"{PROG}: reading {source.describe()}; Ctrl-C stops it", file=sys.stderr, flush=True)
            if options.alerts_file and not os.path.exists(options.alerts_file):
                print(f"{PROG}: {options.alerts_file} does not exist yet: waiting for the pipeline to write it",
                      file=sys.stderr, flush=True)
        status = 0
        try:
            loop.drain() if options.once else loop.run_until_stopped()
        except SourceError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            status = 1
        finally:
            notifier.close()
            source.close()
            if health:
                health.shutdown()
                health.server_close()
    print(f"{PROG}: {notifier.stats.line()}")
    return status


def main() -> None:
    sys.exit(run())
