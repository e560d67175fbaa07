"""What the browser tests ask of a page once Chromium has opened it (no tests here).

Each helper reads the live DOM, after parsing, layout and image decoding: what a reader sees, not
what the HTML text looks like.
"""

from __future__ import annotations

import base64
import os
import pathlib
import urllib.parse
import urllib.request
from typing import Dict, List

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = "apt-get install chromium chromium-driver"
WIDTH, HEIGHT = 1280, 900
WIDE, NARROW = 1400, 600  # a desktop window, and the width mail clients render an e-mail at
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    # This machine's network is closed: without these Chromium keeps calling home and its connections
    # are refused, many at a time.
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    f"--window-size={WIDTH},{HEIGHT}",
)
ARTIFACTS_ENV = "TRAINGUARD_ARTIFACTS"
"""Set (to anything) to keep the screenshots in ``tests/browser/artifacts/`` instead of pytest's tmp dir."""


def browser_missing() -> str:
    """Why the browser tests cannot run here, or "" when they can."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        return f"{' and '.join(missing)} not found: the browser tests need Debian's Chromium and ChromeDriver (`{INSTALL}`)"
    try:
        import selenium  # noqa: F401 - only checking that it is installed
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return ""


FLAG = "__trainguardInjected"
"""A global that only an injected handler or script sets: every hostile payload here writes it."""
WATCH = f"""
window.{FLAG} = [];
window.alert = window.confirm = window.prompt = function (m) {{ window.{FLAG}.push('dialog: ' + m); }};
"""
"""Runs before any script of every page: a hostile ``alert(1)`` that did run is recorded, not shown."""
OVERFLOW_MARGIN_PX = 2  # sub-pixel rounding of borders
IMAGE_WAIT_MS = 10_000  # per image; a local PNG takes milliseconds


def payload(where: str) -> str:
    """JavaScript that records that the hostile string of ``where`` ran."""
    return f"window.{FLAG}.push('{where}')"


# Names a training job could choose: each would run ``payload`` if a page let it in as HTML.
FLAG_TEST = f'<img src=x onerror="{payload("test name")}"> & <b>bold</b>'
FLAG_RUN = f"<script>{payload('run id')}</script>"
FLAG_METRIC = f"<svg onload=\"{payload('metric name')}\"></svg>loss"
FLAG_TAG = f"<iframe srcdoc=\"<script>parent.{FLAG}.push('tag')</script>\"></iframe>"
FLAG_MESSAGE = f'"><img src=x onerror="{payload("message")}">'
LONG_RUN = "gs://checkpoints/" + "0123456789abcdef" * 12  # no space to break at: must not widen the page
LONG_TEST = "nightly-" + "-".join(["llama-70b-tp8-pp4-zero3-bf16"] * 6)


def watch_for_injection(browser) -> None:
    """Installs :data:`WATCH` in every document the browser opens from now on."""
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})


def open_page(browser, path: pathlib.Path, width: int = WIDTH) -> None:
    """Opens a local HTML file at ``width`` px and brings every image, lazy ones included, in to load.

    The width is emulated (as DevTools' device toolbar does) and set on every call, so a narrow page of one
    test never leaks into the next."""
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    browser.get(path.resolve().as_uri())
    assert browser.execute_script("return window.innerWidth") == width
    browser.execute_async_script(f"""
        const done = arguments[arguments.length - 1];
        const settled = image => new Promise(settle => {{
            image.addEventListener('load', settle, {{once: true}});
            image.addEventListener('error', settle, {{once: true}});
            setTimeout(settle, {IMAGE_WAIT_MS});  // reported as broken below, not as a script timeout
            if (image.complete) settle();
        }});
        (async () => {{
            for (const image of document.images) {{
                image.scrollIntoView();  // a lazy image loads only near the viewport, one at a time
                await settled(image);
            }}
            window.scrollTo(0, 0);
        }})().then(done);
    """)


def broken_images(browser) -> List[str]:
    """The src of every <img> that did not load and decode (naturalWidth 0)."""
    return browser.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
        ".map(i => i.getAttribute('src'))")


def links(browser) -> List[Dict[str, str]]:
    """Every <a href>: the attribute as written and the URL the browser resolved it to."""
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('a[href]'))"
        ".map(a => ({written: a.getAttribute('href'), resolved: a.href}))")


def dangling_anchors(browser) -> List[str]:
    """In-page links (``#id``) whose target element does not exist."""
    return browser.execute_script("""
        return Array.from(document.querySelectorAll('a[href^="#"]')).map(a => a.getAttribute('href'))
            .filter(h => !document.getElementById(decodeURIComponent(h.slice(1))));
    """)


def missing_files(browser, root: pathlib.Path) -> List[str]:
    """Relative links and image sources that do not name an existing file under ``root``."""
    missing = []
    sources = browser.execute_script("return Array.from(document.images).map(i => i.getAttribute('src'))")
    written = [link["written"] for link in links(browser)] + sources
    for reference in written:
        parts = urllib.parse.urlsplit(reference)
        if parts.scheme or parts.netloc or not parts.path:  # absolute, or only a #fragment
            continue
        target = (root / urllib.request.url2pathname(parts.path)).resolve()
        if not (target.is_file() and target.is_relative_to(root.resolve())):
            missing.append(reference)
    return missing


def injected(browser) -> List[str]:
    """What the hostile payloads managed to run (empty when they stayed text)."""
    return browser.execute_script(f"return window.{FLAG}")


def event_handler_attributes(browser) -> List[str]:
    """``tag.onxxx`` for every element carrying an inline event handler."""
    return browser.execute_script("""
        return Array.from(document.querySelectorAll('*')).flatMap(e => Array.from(e.attributes)
            .filter(a => a.name.toLowerCase().startsWith('on')).map(a => e.tagName.toLowerCase() + '.' + a.name));
    """)


def tag_counts(browser) -> Dict[str, int]:
    return browser.execute_script("""
        const counts = {};
        for (const e of document.querySelectorAll('*')) { const t = e.tagName.toLowerCase(); counts[t] = (counts[t] || 0) + 1; }
        return counts;
    """)


def visible_text(browser) -> str:
    """The page's rendered text (``innerText``: nothing hidden), whitespace collapsed."""
    return " ".join(browser.execute_script("return document.body.innerText").split())


def shows(browser, text: str) -> bool:
    return " ".join(text.split()) in visible_text(browser)


def overflow(browser) -> Dict[str, object]:
    """The page's scroll and client widths, and the first elements sticking out past the client width.

    The client width is the 1280 px window less a vertical scrollbar: content wider than that is what
    makes a horizontal scrollbar appear.
    """
    return browser.execute_script(f"""
        const limit = document.documentElement.clientWidth + {OVERFLOW_MARGIN_PX};
        const wide = Array.from(document.body.querySelectorAll('*'))
            .filter(e => e.getBoundingClientRect().right + window.scrollX > limit)
            .slice(0, 5).map(e => e.tagName.toLowerCase() + ' ' + Math.round(e.getBoundingClientRect().right)
                             + 'px: ' + (e.innerText || e.getAttribute('src') || '').slice(0, 80));
        return {{scrollWidth: document.documentElement.scrollWidth,
                 clientWidth: document.documentElement.clientWidth, wide: wide}};
    """)


def fits(browser, width: int = WIDTH) -> bool:
    """No horizontal scrolling of the page at ``width`` px."""
    widths = overflow(browser)
    return widths["clientWidth"] <= width and widths["scrollWidth"] <= widths["clientWidth"] + OVERFLOW_MARGIN_PX


SCROLLED = """
const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
const scrolled = e => { for (let p = e.parentElement; p; p = p.parentElement) if (scrolls(p)) return true; return false; };
"""


def sticking_out(browser) -> List[str]:
    """Elements reaching past the window's client width, but those inside a horizontally scrolling box.

    Such a box (the report's table container) scrolls on its own and is allowed to hold wide content;
    the box itself, and everything else, must fit."""
    return browser.execute_script(SCROLLED + f"""
        const limit = document.documentElement.clientWidth + {OVERFLOW_MARGIN_PX};
        return Array.from(document.body.querySelectorAll('*'))
            .filter(e => e.getBoundingClientRect().right + window.scrollX > limit && !scrolled(e))
            .slice(0, 5).map(e => e.tagName.toLowerCase() + ' ' + Math.round(e.getBoundingClientRect().right)
                             + 'px: ' + (e.innerText || e.getAttribute('src') || '').slice(0, 80));
    """)


def content_width(browser) -> float:
    """The body's width as a fraction of the window's client width (1: all of it)."""
    return browser.execute_script(
        "return document.body.getBoundingClientRect().width / document.documentElement.clientWidth")


def wrapped(browser, selector: str) -> List[str]:
    """Texts of the elements matching ``selector`` that the layout broke over more than one line.

    An inline element laid out on several lines has one client rect per line."""
    return browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).filter(e => e.getClientRects().length > 1)"
        ".map(e => e.textContent.slice(0, 80))", selector)


def table_columns(browser) -> List[int]:
    """Per table, the most cells of any of its rows, a cell spanning n columns counting n."""
    return browser.execute_script("""
        return Array.from(document.querySelectorAll('table')).map(t => Math.max(0, ...Array.from(t.rows).map(
            r => Array.from(r.cells).reduce((n, c) => n + c.colSpan, 0))));
    """)


def screenshot(browser, path: pathlib.Path, width: int = WIDTH) -> pathlib.Path:
    """A PNG of the whole page (beyond the viewport), ``width`` px wide."""
    height = browser.execute_script("return document.documentElement.scrollHeight")
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
