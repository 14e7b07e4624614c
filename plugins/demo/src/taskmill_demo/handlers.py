"""The demo's handlers: small but honest examples of the handler API.

``async def`` handlers that report progress with ``await ctx.progress(done, total,
message)`` and stop at ``ctx.check_cancelled()``, a plain ``def`` handler that runs in a
worker thread and calls ``ctx.progress(...)`` without ``await``, a handler that fails
transiently and succeeds on a retry, and one that dead-letters a bad input with
``taskmill.Fail``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from taskmill import Context, Fail, HandlerRegistrar

APP_ID = "media"
"""The app id every demo handler and task has."""

SCAN = "scan"
THUMBNAIL = "thumbnail"
OCR = "ocr"
FETCH = "fetch"
VALIDATE = "validate"

TASK_TYPES: tuple[str, ...] = (SCAN, THUMBNAIL, OCR, FETCH, VALIDATE)
"""Every task type the demo registers, in the order its summary lists them."""

BAD_RECORD_EMAIL = "nobody@"
"""The one input ``validate`` rejects with :class:`~taskmill.Fail`."""

FETCH_MAX_RETRIES = 5


async def scan_folder(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Walk a generated list of file names and count the ones that match a suffix."""
    suffixes: list[str] = params["suffixes"]
    files = [
        f"{params['folder']}/file-{i:04d}{suffixes[i % len(suffixes)]}"
        for i in range(int(params["files"]))
    ]
    matches = 0
    for done, name in enumerate(files, start=1):
        ctx.check_cancelled()
        await asyncio.sleep(params["seconds_per_file"])
        if name.endswith(params["match"]):
            matches += 1
        await ctx.progress(done, len(files), f"{matches} {params['match']} files so far")
    return {"scanned": len(files), "matches": matches}


async def make_thumbnail(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Resize an (imaginary) image in a few short steps."""
    steps = int(params["steps"])
    for step in range(1, steps + 1):
        ctx.check_cancelled()
        await asyncio.sleep(params["seconds_per_step"])
        await ctx.progress(step, steps, f"{params['image']}: pass {step}/{steps}")
    size = int(params["size"])
    return {"thumbnail": f"{params['image']}@{size}x{size}.webp"}


async def ocr_document(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Recognise text page by page; the longest-running demo task."""
    pages = int(params["pages"])
    words = 0
    for page in range(1, pages + 1):
        ctx.check_cancelled()
        await ctx.progress(page - 1, pages, f"reading page {page} of {pages}")
        await asyncio.sleep(params["seconds_per_page"])
        words += 180 + (page * 37) % 90
    await ctx.progress(pages, pages, f"{words} words on {pages} pages")
    return {"document": params["document"], "pages": pages, "words": words}


async def fetch_url(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Download a feed from a flaky (simulated) server.

    The server drops the first ``flaky_attempts`` connections: those attempts raise
    ``RuntimeError``, the worker retries them with exponential backoff, and a later
    attempt succeeds (the handler allows ``FETCH_MAX_RETRIES`` retries).
    """
    await ctx.progress(0, 2, f"connecting to {params['url']}")
    await asyncio.sleep(params["seconds"] / 2)
    ctx.check_cancelled()
    if ctx.task.attempts <= int(params["flaky_attempts"]):
        raise RuntimeError(f"connection to {params['url']} reset by peer (simulated)")
    await ctx.progress(1, 2, "downloading")
    await asyncio.sleep(params["seconds"] / 2)
    await ctx.progress(2, 2, "downloaded")
    return {
        "url": params["url"],
        "bytes": 2048 + 512 * len(params["url"]),
        "attempt": ctx.task.attempts,
    }


def validate_record(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
    """Check a record field by field — a plain ``def`` handler, run in a worker thread.

    Raises :class:`~taskmill.Fail` (no retry: the input will not get better) for a
    record whose email has no domain, so the task ends FAILED in the dead-letter state.
    """
    record: dict[str, Any] = params["record"]
    fields = sorted(record)
    for checked, field in enumerate(fields, start=1):
        ctx.check_cancelled()
        time.sleep(params["seconds_per_field"])
        if field == "email" and not str(record[field]).partition("@")[2]:
            raise Fail(f"record {record['id']}: email {record[field]!r} has no domain")
        ctx.progress(checked, len(fields), f"checked {field}")
    return {"record": record["id"], "valid": True}


def register(registry: HandlerRegistrar) -> None:
    """Register the demo handlers under the ``media`` app."""
    registry.register(SCAN, scan_folder, app_id=APP_ID, concurrency=2)
    registry.register(THUMBNAIL, make_thumbnail, app_id=APP_ID)
    registry.register(OCR, ocr_document, app_id=APP_ID, timeout=60)
    registry.register(FETCH, fetch_url, app_id=APP_ID, max_retries=FETCH_MAX_RETRIES)
    registry.register(VALIDATE, validate_record, app_id=APP_ID, max_retries=1)
