"""Where a worker's time goes: a cProfile of one drain, written as a readable top-N.

Enqueues ``--tasks`` no-op tasks, then drains them in this process with one worker under
cProfile, and writes ``bench/results/profiles/profile-<backend>-c<concurrency>.txt``
(a readable artifact, not a record): the run's settings, commit and load, the tasks/s
(with the profiler on, so slower than ``throughput.py``), and the top ``--top``
functions by own time and by cumulative time, with the µs per task each costs. See
docs/benchmarks.md ("Where the time goes").

    uv run python bench/profile_worker.py --url memory:// --tasks 20000
    uv run python bench/profile_worker.py --url "$TASKMILL_TEST_POSTGRES_URL" --tasks 20000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import harness
from taskmill import Context, Taskmill


async def noop(ctx: Context, params: dict[str, Any]) -> None:
    """The profiled handler: does nothing, so the profile is the framework's cost."""
    return None


def _label(url: str) -> str:
    scheme = url.split(":", 1)[0]
    return {"postgres": "postgresql"}.get(scheme, scheme)


def _top(profile: cProfile.Profile, sort: str, top: int, tasks: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.strip_dirs().sort_stats(sort).print_stats(top)
    lines = out.getvalue().splitlines()
    # pstats prints seconds; add the µs per task of the column sorted on.
    total = stats.total_tt  # type: ignore[attr-defined]
    header = f"total profiled time {total:.3f} s = {total / tasks * 1e6:.1f} µs per task"
    return "\n".join([header, *lines])


async def profile_once(
    url: str, tasks: int, concurrency: int, prefetch: int | None
) -> dict[str, Any]:
    task_type = f"profile_{uuid.uuid4().hex[:8]}"
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
        options: dict[str, Any] = {"concurrency": concurrency, "handle_signals": False}
        if prefetch is not None:
            options["prefetch"] = prefetch
        worker = tm.worker(**options)
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        await worker.run_until_idle()
        profiler.disable()
        seconds = time.perf_counter() - started
        await tm.cleanup(timedelta(0))  # a shared store: leave it as found
    return {
        "profiler": profiler,
        "seconds": seconds,
        "processed": worker.processed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default="memory://", help="storage URL (default memory://)")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--prefetch", type=int, default=None, help="worker prefetch (default: auto; 0: none)"
    )
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, help="where to write (default bench/results/...)")
    parser.add_argument(
        "--dump", type=Path, help="also save the raw profile here (for pstats: callers)"
    )
    args = parser.parse_args()
    load_at_start = harness.load_1min()
    run = asyncio.run(profile_once(args.url, args.tasks, args.concurrency, args.prefetch))
    label = _label(args.url)
    if args.dump:
        run["profiler"].dump_stats(str(args.dump))
    out = args.out or harness.RESULTS_DIR / "profiles" / (
        f"profile-{label}-c{args.concurrency}"
        + (f"-p{args.prefetch}" if args.prefetch is not None else "")
        + ".txt"
    )
    load = os.getloadavg()
    git, box = harness.git_state(), harness.machine()
    body = [
        f"backend {label}, {args.tasks} no-op tasks, concurrency {args.concurrency}, "
        f"prefetch {'auto' if args.prefetch is None else args.prefetch}, one worker in this "
        "process",
        f"commit {git['commit']}{' (uncommitted changes)' if git['dirty'] else ''}, "
        f"{box['cores']} cores {box['cpu_model']}, Python {box['python']}",
        f"load average at the start: {load_at_start:.2f}; at the end: "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"processed {run['processed']} in {run['seconds']:.2f} s = "
        f"{run['processed'] / run['seconds']:.0f} tasks/s under the profiler",
        "",
        "== by own time (tottime) ==",
        _top(run["profiler"], "tottime", args.top, args.tasks),
        "",
        "== by cumulative time ==",
        _top(run["profiler"], "cumulative", args.top, args.tasks),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(body) + "\n")
    print("\n".join(body[:3]))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
