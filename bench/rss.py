"""Worker RSS over a long run: does memory stay flat?

Enqueues ``--tasks`` no-op tasks, then drains them with one worker process (the
``throughput.py --drain`` worker, so the same code path as the throughput figures) and
samples, every ``--interval`` seconds, the worker's resident set size (``VmRSS`` of
``/proc/<pid>/status``) and how many tasks are completed. Prints the samples and
records them in ``bench/results/rss.jsonl``; the figure is the RSS at the end against
the RSS at the first sample past 10 % of the tasks. The worker runs at its defaults
(``--prefetch`` and ``--finish-window`` set them otherwise).

    uv run python bench/rss.py --url "$TASKMILL_TEST_POSTGRES_URL" --tasks 200000
    uv run python bench/rss.py --tasks 200000   # a fresh SQLite file
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import Recorder, backend_of, load_1min, now_iso, redact
from taskmill import Context, TaskFilter, Taskmill

BENCH_DIR = Path(__file__).resolve().parent


async def noop(ctx: Context, params: dict[str, Any]) -> None:
    """The handler: does nothing, so the memory is the framework's."""
    return None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


async def run(
    url: str, tasks: int, concurrency: int, prefetch: str, finish_window: str, interval: float
) -> dict[str, Any]:
    task_type = f"rss_{uuid.uuid4().hex[:8]}"
    tm = Taskmill(url, plugins=False)
    tm.register(task_type, noop)
    async with tm:
        for first in range(0, tasks, 1000):
            await tm.enqueue_many(
                [
                    {"task_type": task_type, "params": {"i": i}}
                    for i in range(first, min(tasks, first + 1000))
                ]
            )
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            str(BENCH_DIR / "throughput.py"),
            "--drain",
            "--url",
            url,
            "--task-type",
            task_type,
            "--concurrency",
            str(concurrency),
            "--prefetch",
            prefetch,
            "--finish-window",
            finish_window,
            stdout=asyncio.subprocess.PIPE,
        )
        output = asyncio.create_task(worker.communicate())
        started = time.monotonic()
        samples: list[dict[str, float]] = []
        while not output.done():
            await asyncio.wait([output], timeout=interval)
            if output.done():
                break
            try:
                rss = rss_kib(worker.pid)
            except (FileNotFoundError, RuntimeError):
                break
            summary = await tm.progress_summary(TaskFilter(task_types=(task_type,)))
            sample = {
                "seconds": time.monotonic() - started,
                "completed": summary.completed,
                "rss_kib": rss,
                "load_1min": load_1min(),
            }
            samples.append(sample)
            print(
                f"{sample['seconds']:7.0f} s {summary.completed:>9,} done {rss / 1024:7.1f} MiB"
                f"  load {sample['load_1min']:.2f}",
                flush=True,
            )
        out, _ = await output
        if worker.returncode != 0:
            raise RuntimeError(f"the worker process failed ({worker.returncode})")
        report = json.loads(out.decode().strip().splitlines()[-1])
        await tm.cleanup(timedelta(0))
    return {"samples": samples, "drain": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="storage URL (default: a fresh SQLite file)")
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--prefetch", default="default", help="the worker's (default: its own)")
    parser.add_argument("--finish-window", default="default", help="the worker's")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    recorder = Recorder("rss", enabled=not args.no_record)
    load, date = load_1min(), now_iso()
    with tempfile.TemporaryDirectory() as directory:
        url = args.url or f"sqlite:///{Path(directory) / 'tasks.db'}"
        result = asyncio.run(
            run(url, args.tasks, args.concurrency, args.prefetch, args.finish_window, args.interval)
        )
    samples = result["samples"]
    past_tenth = [s for s in samples if s["completed"] >= args.tasks / 10]
    verdict: dict[str, Any] = {}
    if past_tenth:
        first, last = past_tenth[0], samples[-1]
        verdict = {
            "rss_kib_after_10_percent": first["rss_kib"],
            "completed_then": first["completed"],
            "rss_kib_at_end": last["rss_kib"],
            "completed_at_end": last["completed"],
            "growth": last["rss_kib"] / first["rss_kib"] - 1,
        }
        print(json.dumps(verdict))
    params = {
        "backend": "sqlite" if args.url is None else backend_of(args.url),
        "url": "sqlite:///<fresh file>" if args.url is None else redact(args.url),
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "prefetch": args.prefetch,
        "finish_window": args.finish_window,
        "interval": args.interval,
        "worker": "bench/throughput.py --drain in its own process",
    }
    figures = {**result, "verdict": verdict, "load_after": load_1min()}
    recorder.record("worker rss", figures, params=params, load=load, date=date)
    recorder.done()


if __name__ == "__main__":
    main()
