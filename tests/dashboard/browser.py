"""`tune dashboard` opened in headless Debian Chromium (Playwright; no browser is ever downloaded)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.cli.test_dashboard import start_dashboard, stop

CHROMIUM = "/usr/bin/chromium"
HAVE_CHROMIUM = Path(CHROMIUM).exists()


@contextlib.contextmanager
def dashboard_page(url: str, study: str, **page_options: Any) -> Iterator[Any]:
    """A page on `tune dashboard --storage URL --study STUDY`, its first chart drawn; the browser and
    the dashboard are stopped afterwards, whatever happens."""
    from playwright.sync_api import sync_playwright

    proc, port = start_dashboard("--storage", url, "--study", study)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox"] if os.geteuid() == 0 else [])
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 1000}, **page_options)
                page.goto(f"http://127.0.0.1:{port}/")
                page.locator(".js-plotly-plot").first.wait_for(timeout=90_000)
                yield page
            finally:
                browser.close()
    finally:
        stop(proc)


def wait_idle(page: Any) -> None:
    """The rerun finished: no status widget, and no element left over from the page before (stale)."""
    page.wait_for_timeout(500)
    page.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]') "
                           "&& !document.querySelector('[data-stale=true]')", timeout=60_000)
