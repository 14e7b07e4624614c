"""Take the dashboard screenshots of the README and docs/dashboard.md.

A store on a temporary SQLite file gets a small, lived-in workload (tasks running with
progress, finished ones, a dead letter with its error, children, an external job); a
worker in this process runs it, the service runs on uvicorn, and headless Chromium
(Debian's package, through Playwright) signs in as an admin and takes:

- docs/images/dashboard-overview.png: the overview;
- docs/images/dashboard-task.png: a task's detail page (the parent of a batch);
- docs/images/dashboard-charts.png: the charts (every app; the last 15 minutes, as
  the store is new);
- docs/images/dashboard-workers.png: the workers page (this process's worker).

The charts and the workers are shot as their sections only (not the whole page), which
keeps the images small.

    uv run python docs/screenshots.py [--out DIR]

tests/test_dashboard.py runs it into a temporary directory, so the test run takes them
too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taskmill import Context, Fail, Taskmill, TaskStatus  # noqa: E402
from taskmill_http import Limits, create_app  # noqa: E402
from taskmill_http.jobs import ProgressBody, UpsertJobBody  # noqa: E402
from taskmill_http.service import Service  # noqa: E402

from tests.browser_support import chromium, sign_in  # noqa: E402
from tests.http_support import serve, wait_for  # noqa: E402

ADMIN = "screenshot-admin"


def build(url: str, hold: asyncio.Event) -> Taskmill:
    tm = Taskmill(url, plugins=False)

    @tm.handler("album", app_id="photos", max_retries=2)
    async def album(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        await ctx.progress(1, 2, "collecting")
        if ctx.task.attempts == 1:
            raise ConnectionError("storage node photos-3 refused the connection")
        await ctx.progress(2, 2, "published")
        return {"album": params["album"], "thumbnails": 3}

    @tm.handler("thumbnail", app_id="photos")
    async def thumbnail(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        await ctx.progress(params["done"], 10, f"frame {params['done']} of 10")
        await ctx.set_data(frames=params["done"])
        if params.get("finish"):
            return {"width": 320, "height": 240}
        await hold.wait()
        return {}

    @tm.handler("transcode", app_id="music", max_retries=0)
    async def transcode(ctx: Context, params: dict[str, Any]) -> None:
        raise Fail(f"codec {params['codec']!r} is not installed on this worker")

    return tm


async def workload(tm: Taskmill) -> str:
    photos, music = tm.for_app("photos"), tm.for_app("music")
    album = await photos.enqueue("album", {"album": "summer-2026"}, dedupe_key="summer-2026")
    await photos.enqueue("album", {"album": "summer-2026"}, dedupe_key="summer-2026")
    await photos.batch_children(
        album.id,
        [{"task_type": "thumbnail", "params": {"done": d, "finish": d > 7}} for d in (3, 6, 9)],
    )
    await photos.enqueue_many(
        [{"task_type": "thumbnail", "params": {"done": 10, "finish": True}}] * 6
    )
    await music.enqueue_many(
        [{"task_type": "transcode", "params": {"codec": c}} for c in ("opus", "flac")]
    )
    await music.enqueue("index", {"library": "main"}, delay=3600)
    await music.suspend("index")
    return album.id


async def take(out: Path) -> list[Path]:
    hold = asyncio.Event()
    with tempfile.TemporaryDirectory() as tmp:
        tm = build(f"sqlite:///{Path(tmp) / 'screens.db'}", hold)
        async with tm:
            # Queue depth sampled every second: the charts have a few samples to show.
            app = create_app(tm, {ADMIN: "*"}, limits=Limits(depth_sample_seconds=1.0))
            service: Service = app.state.service
            async with serve(app) as base, chromium() as browser:
                album = await workload(tm)
                worker = tm.worker(concurrency=8, reserved_high_priority_slots=0)
                running = asyncio.create_task(worker.run())

                async def settled() -> bool:
                    summary = await tm.progress_summary()
                    return summary.pending <= 1 and summary.running == 2

                await wait_for(settled, timeout=30)
                service.jobs.upsert(
                    "photos",
                    "backup-2026-12",
                    UpsertJobBody(title="Nightly photo backup", progress=ProgressBody(42, 100)),
                )
                taken = []
                context = await browser.new_context(
                    viewport={"width": 1200, "height": 900}, timezone_id="Europe/Paris"
                )
                page = await context.new_page()
                await sign_in(page, base, ADMIN)
                await page.wait_for_selector("body[data-live=open]")
                taken.append(out / "dashboard-overview.png")
                await page.screenshot(path=str(taken[-1]), full_page=True)
                await page.goto(f"{base}/ui/tasks/{album}")
                await page.wait_for_selector("body[data-live=open]")
                taken.append(out / "dashboard-task.png")
                await page.screenshot(path=str(taken[-1]), full_page=True)

                def sampled() -> bool:
                    return len(service.metrics.timeline(None, 1).queue_depth) >= 4

                await wait_for(sampled, timeout=30)
                await page.goto(f"{base}/ui/charts?minutes=15")  # all of it is new
                await page.wait_for_selector("#chart-throughput")
                taken.append(out / "dashboard-charts.png")
                await page.locator("#charts").screenshot(path=str(taken[-1]))
                await page.goto(f"{base}/ui/workers")
                await page.wait_for_selector("#workers-table")
                taken.append(out / "dashboard-workers.png")
                await page.locator("#workers").screenshot(path=str(taken[-1]))
                await context.close()
                hold.set()
                await worker.stop()
                await running
            assert (await tm.get(album)).status is TaskStatus.COMPLETED  # type: ignore[union-attr]
    return taken


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="Take the dashboard screenshots.")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(take(args.out)):
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
