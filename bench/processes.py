"""``taskmill worker --processes N`` against one process, for CPU-bound sync handlers.

Each task runs about ``--cpu-ms`` milliseconds of pure Python (a loop calibrated once,
before the runs). The tasks are enqueued, then drained by the real command,
``taskmill worker --processes N --until-idle``, timed from its start to its exit (so
the children's start-up counts against the supervisor, as it would for a user). Every
run checks that every task ended COMPLETED with one attempt. Each run also reports its
steady rate: the tasks that finished between the 10th and the 90th percentile of the
stored finish times, over that span, which leaves out the start-up and the last tasks'
tail (a long-running worker's rate); it is read from the store afterwards, so measuring
it adds nothing to the run. Results are printed and, unless ``--no-record``, every run
is one record of ``bench/results/processes.jsonl``, with the 1-minute load average at
its start. Any store shared between processes
works; a PostgreSQL URL can name a schema of its own (``?schema=bench_processes``).

    uv run python bench/processes.py --url sqlite:///tmp/p.db --tasks 400 --processes 1 2
    uv run python bench/processes.py --tasks 3000 --processes 1 2 --repeat 3 \\
        --url "postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill?schema=bench_processes"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from harness import RESULTS_DIR, Recorder, backend_of, load_1min, now_iso, redact
from taskmill import TaskFilter, Taskmill, TaskStatus

HANDLERS = '''
"""The benchmark's CPU-bound handler: about CPU_LOOPS iterations of pure Python."""
import os

LOOPS = int(os.environ["CPU_LOOPS"])


def register(tm):
    @tm.handler("bench.cpu", max_retries=0)
    def cpu(ctx, params):
        total = 0
        for i in range(LOOPS):
            total += i * i % 7
        return total
'''


def _loops_for(cpu_ms: float) -> int:
    """How many iterations of the handler's loop take ``cpu_ms`` here."""
    loops = 100_000
    started = time.process_time()
    total = 0
    for i in range(loops):
        total += i * i % 7
    took = time.process_time() - started
    return max(1, int(loops * (cpu_ms / 1000) / took))


async def _enqueue(url: str, tasks: int) -> None:
    async with Taskmill(url, plugins=False) as tm:
        await tm.enqueue_many([{"task_type": "bench.cpu"} for _ in range(tasks)])


async def _check(url: str, tasks: int) -> float:
    """Check every task completed once; return the steady rate (tasks/s between the
    10th and 90th percentile of the finish times)."""
    async with Taskmill(url, plugins=False) as tm:
        done = await tm.query(TaskFilter(task_types=("bench.cpu",)), limit=tasks + 1)
        assert len(done) == tasks, len(done)
        assert all(t.status is TaskStatus.COMPLETED and t.attempts == 1 for t in done)
        ends = sorted(t.finished_at.timestamp() for t in done if t.finished_at is not None)
        low, high = ends[len(ends) // 10], ends[len(ends) * 9 // 10]
        return (len(ends) * 9 // 10 - len(ends) // 10) / max(high - low, 1e-9)


def _drain(url: str, processes: int, concurrency: int, workdir: Path, loops: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKMILL_")}
    env["PYTHONPATH"] = str(workdir)
    env["CPU_LOOPS"] = str(loops)
    command = [sys.executable, "-m", "taskmill", "--url", url, "worker", "--import"]
    command += ["bench_cpu_handlers", "--until-idle", "--processes", str(processes)]
    command += ["--concurrency", str(concurrency), "--reserved-high", "0"]
    started = time.perf_counter()
    process = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"worker failed ({process.returncode}):\n{process.stderr[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="a store shared between processes")
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--cpu-ms", type=float, default=5.0)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=4, help="slots per process")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    loops = _loops_for(args.cpu_ms)
    recorder = Recorder("processes", results_dir=args.results_dir, enabled=not args.no_record)
    runs: dict[int, list[float]] = {n: [] for n in args.processes}
    steady: dict[int, list[float]] = {n: [] for n in args.processes}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "bench_cpu_handlers.py").write_text(HANDLERS)
        for round_ in range(args.repeat):
            for n in args.processes:  # alternating, so the machine's load falls on each
                asyncio.run(_clear(args.url))
                asyncio.run(_enqueue(args.url, args.tasks))
                load, date = load_1min(), now_iso()
                took = _drain(args.url, n, args.concurrency, workdir, loops)
                steady_rate = asyncio.run(_check(args.url, args.tasks))
                rate = args.tasks / took
                runs[n].append(rate)
                steady[n].append(steady_rate)
                params = {
                    "backend": backend_of(args.url),
                    "url": redact(args.url),
                    "tasks": args.tasks,
                    "cpu_ms": args.cpu_ms,
                    "processes": n,
                    "concurrency_per_process": args.concurrency,
                }
                figures = {"seconds": took, "tasks_per_s": rate, "steady_tasks_per_s": steady_rate}
                recorder.record(
                    f"--processes {n}", figures, params=params, round=round_ + 1, load=load,
                    date=date,
                )  # fmt: skip
                print(
                    f"round {round_ + 1}: --processes {n}: {took:.2f} s, {rate:,.0f} tasks/s "
                    f"start to exit, {steady_rate:,.0f} tasks/s steady, load {load:.2f}",
                    flush=True,
                )
    medians = {n: statistics.median(r) for n, r in runs.items()}
    steady_medians = {n: statistics.median(r) for n, r in steady.items()}
    base = medians[min(medians)]
    steady_base = steady_medians[min(steady_medians)]
    for n, median in medians.items():
        print(
            f"--processes {n}: median {median:,.0f} tasks/s start to exit "
            f"({median / base:.2f}x), {steady_medians[n]:,.0f} steady "
            f"({steady_medians[n] / steady_base:.2f}x)"
        )
    recorder.done()


async def _clear(url: str) -> None:
    """Delete the finished tasks of earlier runs."""
    async with Taskmill(url, plugins=False) as tm:
        await tm.cleanup(timedelta(0))


if __name__ == "__main__":
    main()
