"""Enqueue-to-start latency on ``mysql://``: one idle worker process polling (MySQL has
no LISTEN/NOTIFY), tasks enqueued one at a time from this process.

Each task carries the wall-clock time just before its ``enqueue`` call; the handler,
in the worker process, appends (task id, start time) to a file. The latency is the
difference, per task (same machine, same clock). p50 and p99 over ``--tasks`` tasks
are printed and recorded in ``bench/results/mysql-latency.jsonl``.

    uv run python bench/mysql_latency.py --url mysql://taskmill:taskmill@127.0.0.1/tm_lat
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Recorder, load_1min, now_iso, redact
from taskmill import Context, Taskmill


async def serve(url: str, stamps: Path) -> None:
    """The worker process: run ``stamp`` tasks until terminated."""
    async with Taskmill(url, plugins=False) as tm:

        async def stamp(ctx: Context, params: dict[str, Any]) -> None:
            with stamps.open("a") as out:
                out.write(f"{ctx.task.id} {time.time()!r}\n")

        tm.register("stamp", stamp)
        await tm.run_worker(concurrency=10)


async def measure(url: str, tasks: int, stamps: Path) -> list[float]:
    latencies: list[float] = []
    async with Taskmill(url, plugins=False) as tm:
        for _ in range(tasks):
            before = time.time()
            task = await tm.enqueue("stamp")
            deadline = time.monotonic() + 30
            while True:
                text = await asyncio.to_thread(stamps.read_text)
                lines = dict(line.split() for line in text.splitlines())
                if task.id in lines:
                    latencies.append(float(lines[task.id]) - before)
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"task {task.id} did not start within 30 s")
                await asyncio.sleep(0.002)
    return latencies


async def create_schema(url: str) -> None:
    """Open the store once (creating its schema) before the worker starts."""
    async with Taskmill(url, plugins=False):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--serve", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.url, Path(args.serve)))
        return
    load, date = load_1min(), now_iso()
    with tempfile.TemporaryDirectory() as tmp:
        stamps = Path(tmp) / "stamps"
        stamps.touch()
        asyncio.run(create_schema(args.url))
        worker = subprocess.Popen(
            [sys.executable, __file__, "--url", args.url, "--serve", str(stamps)]
        )
        try:
            time.sleep(2)  # let the worker connect and go idle
            latencies = asyncio.run(measure(args.url, args.tasks, stamps))
        finally:
            worker.terminate()
            worker.wait(30)
    ms = sorted(x * 1000 for x in latencies)
    result = {
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))],
        "max_ms": ms[-1],
    }
    print(json.dumps(result, indent=2))
    recorder = Recorder("mysql-latency", enabled=not args.no_record)
    params = {"url": redact(args.url), "tasks": args.tasks, "worker": "one idle process, polling"}
    recorder.record("enqueue to start", result, params=params, load=load, date=date)
    recorder.done()


if __name__ == "__main__":
    main()
