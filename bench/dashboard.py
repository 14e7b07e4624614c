"""The dashboard's task list over a large store: server time and browser time.

A store gets ``--tasks`` tasks (100,000; two apps, four task types, a tenth of them
cancelled); the service (``create_app``) runs on uvicorn in this process, and an admin
session reads the task list:

- ``server``: the ``Server-Timing`` the dashboard reports (from the request to the start
  of the response: the store's query and the rendering) for page 1 and page 100 of the
  whole list and of a list filtered by task type and status, ``--repeat`` times each
  (page 100 is reached by following the "Next page" cursors, as a reader does), and for
  the overview (its counts per status, app and type);
- ``browser``: the same pages loaded in headless Chromium (Debian's package, through
  Playwright): navigation start to DOMContentLoaded and to the load event;
- ``events``: an open task-list page while the service pushes ``--event-rate`` (1,000)
  events per second at it for ``--event-seconds``: the share of that time its main
  thread was busy (long tasks, and every task, measured in the page), and how many
  events reached it.

    uv run python bench/dashboard.py --backend sqlite
    uv run python bench/dashboard.py --url postgresql://taskmill:taskmill@127.0.0.1/taskmill

A PostgreSQL URL gets a schema of its own, dropped afterwards. Results are printed and
recorded in ``bench/results/dashboard.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import RESULTS_DIR, PostgresSchemas, Recorder, load_1min, now_iso
from taskmill import TaskFilter, Taskmill
from taskmill_http import create_app
from taskmill_http.events import EXTERNAL_JOB_UPDATE
from taskmill_http.jobs import UpsertJobBody
from taskmill_http.service import Service

from tests.browser_support import chromium, sign_in
from tests.http_support import serve, wait_for

TOKENS = {"bench-admin": "*"}
TYPES = ("resize", "encode", "index", "notify")


async def seed(tm: Taskmill, total: int) -> None:
    batch = 1000
    for start in range(0, total, batch):
        specs = [
            {
                "task_type": TYPES[n % len(TYPES)],
                "app_id": "photos" if n % 2 else "music",
                "params": {"n": n},
                "dedupe_key": f"key-{n}",
            }
            for n in range(start, min(start + batch, total))
        ]
        await tm.enqueue_many(specs)
    # A tenth cancelled: the status filter has something to select.
    old = await tm.query(TaskFilter(task_types=("resize",)), limit=total // 10)
    for task in old:
        await tm.cancel(task.id, cascade=False)


def server_ms(response: httpx.Response) -> float:
    match = re.search(r"app;dur=([\d.]+)", response.headers.get("server-timing", ""))
    assert match is not None, "no Server-Timing header"
    return float(match.group(1))


async def signed_in_client(base: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=60)
    form = await client.get("/ui/login")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None
    await client.post("/ui/login", data={"csrf": found.group(1), "token": "bench-admin"})
    return client


async def page_urls(client: httpx.AsyncClient, first: str, pages: int) -> list[str]:
    """The URLs of pages 1..``pages``, found by following the Next links."""
    urls = [first]
    while len(urls) < pages:
        response = await client.get(urls[-1])
        found = re.search(r'href="([^"]+)" rel="next"', response.text)
        assert found is not None, f"the list ended after {len(urls)} pages"
        urls.append(found.group(1).replace("&amp;", "&"))
    return urls


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95) - 1)], 2),
        "min_ms": round(ordered[0], 2),
        "max_ms": round(ordered[-1], 2),
    }


async def bench_server(client: httpx.AsyncClient, lists: dict[str, list[str]], repeat: int) -> Any:
    figures: dict[str, Any] = {}
    for name, urls in lists.items():
        for label, url in (("page_1", urls[0]), ("page_100", urls[-1])):
            times = []
            for _ in range(repeat):
                response = await client.get(url)
                assert response.status_code == 200
                assert response.text.count("data-task-id=") >= 50
                times.append(server_ms(response))
            figures[f"{name}/{label}"] = summary(times)
    times = []
    for _ in range(repeat):  # the overview counts the whole store, per app and type
        response = await client.get("/ui/")
        assert response.status_code == 200
        times.append(server_ms(response))
    figures["overview"] = summary(times)
    return figures


async def bench_browser(base: str, lists: dict[str, list[str]], repeat: int) -> Any:
    figures: dict[str, Any] = {}
    async with chromium() as browser:
        context = await browser.new_context()
        page = await context.new_page()
        await sign_in(page, base, "bench-admin")
        for name, urls in lists.items():
            for label, url in (("page_1", urls[0]), ("page_100", urls[-1])):
                dom, load = [], []
                for _ in range(repeat):
                    await page.goto(base + url)
                    timing = await page.evaluate(
                        "() => { const t = performance.getEntriesByType('navigation')[0];"
                        " return [t.domContentLoadedEventEnd, t.loadEventEnd]; }"
                    )
                    dom.append(float(timing[0]))
                    load.append(float(timing[1]))
                figures[f"{name}/{label}"] = {
                    "dom_content_loaded": summary(dom),
                    "load": summary(load),
                }
        await context.close()
    return figures


_BUSY_PROBE = """
() => {
  window.__busy = { long: 0, longCount: 0, all: 0 };
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      window.__busy.long += e.duration;
      window.__busy.longCount++;
    }
  }).observe({ type: "longtask" });
  // Every frame's gap beyond 16.7 ms is main-thread time the page could not paint.
  let last = performance.now();
  const frame = (now) => { window.__busy.all += Math.max(0, now - last - 16.7); last = now;
    requestAnimationFrame(frame); };
  requestAnimationFrame(frame);
}
"""


async def bench_events(base: str, service: Service, rate: int, seconds: float) -> Any:
    jobs = [f"job-{n}" for n in range(200)]
    for job_id in jobs:  # external jobs the list shows beside its tasks
        service.jobs.upsert("photos", job_id, UpsertJobBody(title=job_id))
    async with chromium() as browser:
        context = await browser.new_context()
        page = await context.new_page()
        await sign_in(page, base, "bench-admin", "/ui/tasks")
        await page.wait_for_selector("body[data-live=open]")
        await page.evaluate(_BUSY_PROBE)
        sent = 0
        began = time.perf_counter()
        tick = 0.01
        while (elapsed := time.perf_counter() - began) < seconds:
            due = int(elapsed * rate)
            while sent < due:
                job = service.jobs.get("photos", jobs[sent % len(jobs)])
                data = {
                    "job_id": job.job_id,
                    "app_id": "photos",
                    "title": job.title,
                    "status": "running",
                    "progress": {"done": sent % 100, "total": 100, "message": None},
                }
                service.hub.publish(EXTERNAL_JOB_UPDATE, "photos", data)
                sent += 1
            await asyncio.sleep(tick)
        wall = time.perf_counter() - began

        async def received() -> int:
            return int(await page.evaluate("Number(document.body.dataset.eventsSeen || 0)"))

        async def all_received() -> bool:
            return await received() >= sent

        await wait_for(all_received, timeout=30)
        busy = await page.evaluate("window.__busy")
        seen = await received()
        await context.close()
    return {
        "rate_per_second": rate,
        "seconds": round(wall, 2),
        "sent": sent,
        "received": seen,
        "long_task_ms": round(busy["long"], 1),
        "long_tasks": busy["longCount"],
        "long_task_share": round(busy["long"] / (wall * 1000), 4),
        "frame_overrun_ms": round(busy["all"], 1),
        "frame_overrun_share": round(busy["all"] / (wall * 1000), 4),
    }


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    async with Taskmill(url, plugins=False) as tm:
        began = time.perf_counter()
        await seed(tm, args.tasks)
        seeded = time.perf_counter() - began
        print(f"seeded {args.tasks} tasks in {seeded:.1f} s", file=sys.stderr)
        app = create_app(tm, TOKENS)
        service: Service = app.state.service
        async with serve(app) as base:
            client = await signed_in_client(base)
            try:
                lists = {
                    "all": await page_urls(client, "/ui/tasks", 100),
                    "type_and_status": await page_urls(
                        client, "/ui/tasks?task_type=encode&status=pending", 100
                    ),
                }
                server = await bench_server(client, lists, args.repeat)
            finally:
                await client.aclose()
            browser = await bench_browser(base, lists, max(3, args.repeat // 4))
            events = await bench_events(base, service, args.event_rate, args.event_seconds)
        count = (await tm.progress_summary()).total
        assert count >= args.tasks
    return {"tasks": args.tasks, "server": server, "browser": browser, "events": events}


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite"], action="append", default=[])
    parser.add_argument("--url", action="append", default=[], help="a PostgreSQL URL")
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--event-rate", type=int, default=1000)
    parser.add_argument("--event-seconds", type=float, default=10.0)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    recorder = Recorder("dashboard", results_dir=args.results_dir, enabled=not args.no_record)
    targets: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in args.backend:
            targets.append(("sqlite", f"sqlite:///{Path(tmp) / 'dashboard.db'}"))
        for url in args.url:
            targets.append(("postgresql", url))
        if not targets:
            targets.append(("sqlite", f"sqlite:///{Path(tmp) / 'dashboard.db'}"))
        for name, url in targets:
            schemas = PostgresSchemas(url, "bench_dashboard") if name == "postgresql" else None
            schema = None
            if schemas is not None:
                url, schema = schemas.url()
            load, date = load_1min(), now_iso()
            try:
                figures = await run(url, args)
            finally:
                if schemas is not None and schema is not None:
                    await schemas.drop(schema)
            print(json.dumps(figures, indent=2))
            params = {
                "backend": name,
                "tasks": args.tasks,
                "repeat": args.repeat,
                "event_rate": args.event_rate,
                "event_seconds": args.event_seconds,
            }
            recorder.record(name, figures, params=params, load=load, date=date)
    recorder.done()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
