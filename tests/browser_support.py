"""A real headless Chromium (Debian's ``chromium`` package) driven by Playwright, for
the dashboard tests, the screenshots (docs/screenshots.py) and the benchmark
(bench/dashboard.py). Never downloads a browser: ``.ci/run`` installs the package."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator

from playwright.async_api import Browser, Page, async_playwright

CHROMIUM = os.environ.get("TASKMILL_TEST_CHROMIUM", "/usr/bin/chromium")
"""The browser the tests drive (``apt-get install chromium``)."""
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium, closed on exit. Without the browser installed, Playwright's
    launch fails naming the missing executable (``apt-get install -y chromium``; ``.ci/run``
    does)."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def sign_in(page: Page, base_url: str, token: str, path: str = "/ui/") -> None:
    """Open ``path`` of the dashboard, which asks for a token, and sign in with it; the
    page then shows ``path``."""
    await page.goto(base_url + path)
    await page.wait_for_url(re.compile(r"/ui/login"))
    await page.fill("#token", token)
    await page.click("form.login button[type=submit]")
    await page.wait_for_url(re.compile(re.escape(path.split("?")[0]) + r"(\?|$)"))
