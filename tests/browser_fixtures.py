"""The ``browser`` and ``page`` fixtures of the dashboard tests: a test module imports
them by name (``from tests.browser_fixtures import browser, page``) and asks for
``page``, a fresh context's page in one headless Chromium per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, Page

from tests.browser_support import chromium

__all__ = ["browser", "page"]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """A headless Chromium for the test (tests/browser_support.py)."""
    async with chromium() as found:
        yield found


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A page of a context of its own (no cookie shared with another page)."""
    context = await browser.new_context()
    try:
        yield await context.new_page()
    finally:
        await context.close()
