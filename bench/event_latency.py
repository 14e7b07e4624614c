"""Event delivery latency: change committed in one process → `tm.events()` subscriber
in another.

A writer process enqueues tasks one by one at a fixed rate (each enqueue commits an
ENQUEUED event); this process subscribes with ``tm.events()`` and measures, for every
event, ``received - event.at`` (both on this machine's clock). Prints p50/p95/p99/max
and records them in ``bench/results/event-latency.jsonl``.

    uv run python bench/event_latency.py --events 500 --rate 100
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import Recorder, load_1min, now_iso
from taskmill import EventKind, TaskFilter, Taskmill

WRITER = """
import asyncio, sys, time
from taskmill import Taskmill
async def main(url, count, rate):
    async with Taskmill(url, plugins=False) as tm:
        for i in range(count):
            await tm.enqueue("latency-probe", {"i": i})
            await asyncio.sleep(1 / rate)
asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
"""


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


async def measure(url: str, count: int, rate: float, poll_interval: float) -> list[float]:
    latencies: list[float] = []
    async with Taskmill(url, plugins=False) as tm:
        stream = tm.events(TaskFilter(task_types=("latency-probe",)), poll_interval=poll_interval)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.2)  # subscribed before the writer starts
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, url, str(count), str(rate)
        )
        event = await first
        while True:
            if event.kind is EventKind.ENQUEUED:
                latencies.append((time.time() - event.at.timestamp()) * 1000)
            if len(latencies) >= count:
                break
            event = await stream.__anext__()
        await writer.wait()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--rate", type=float, default=100.0, help="events per second")
    parser.add_argument(
        "--poll-interval", type=float, action="append", help="subscriber's max poll interval"
    )
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    polls = args.poll_interval or [0.1, 0.02]
    recorder = Recorder("event-latency", enabled=not args.no_record)
    for poll in polls:
        load, date = load_1min(), now_iso()
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'events.db'}"
            asyncio.run(_create(url))
            latencies = asyncio.run(measure(url, args.events, args.rate, poll))
        run = {
            "events": len(latencies),
            "p50_ms": round(statistics.median(latencies), 2),
            "p95_ms": round(percentile(latencies, 95), 2),
            "p99_ms": round(percentile(latencies, 99), 2),
            "max_ms": round(max(latencies), 2),
        }
        params = {"backend": "sqlite", "poll_interval_s": poll, "rate_per_s": args.rate}
        recorder.record(f"poll {poll:g} s", run, params=params, load=load, date=date)
        print(
            f"sqlite poll≤{poll * 1000:.0f} ms: {len(latencies)} events at {args.rate:.0f}/s  "
            f"p50 {run['p50_ms']} ms  p95 {run['p95_ms']} ms  p99 {run['p99_ms']} ms  "
            f"max {run['max_ms']} ms"
        )
    recorder.done()


async def _create(url: str) -> None:
    async with Taskmill(url, plugins=False):
        pass


if __name__ == "__main__":
    main()
