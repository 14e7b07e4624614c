"""Throughput of the core path: bulk enqueue, then one worker process draining no-op tasks.

Each run enqueues ``--tasks`` no-op tasks with ``tm.enqueue_many`` in batches of
``--batch-size``, then one worker (``tm.worker(concurrency=..., handle_signals=False)``)
drains them with ``run_until_idle()``. Both phases are timed and reported as tasks/s.

- ``memory://`` is not shared between processes, so its worker runs in the benchmark's
  own process.
- Every other store is drained by a separate worker process by default (the script
  re-runs itself with ``--drain``), which times the drain alone — interpreter start-up
  and connecting are not counted — and reports it as JSON on stdout.
- SQLite gets a fresh database file in a temporary directory for every run. A store
  given with ``--url`` is shared, so each run uses a task type of its own and deletes
  its finished tasks afterwards.

Every run of every setting is recorded, with the machine it ran on, in
``bench/results/throughput-<date>-<backend>.json``; ``bench/results/throughput.md`` is
regenerated from all recorded files. See docs/benchmarks.md.

    uv run python bench/throughput.py --backend memory --backend sqlite \\
        --tasks 50000 --concurrency 100 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from taskmill import Context, TaskFilter, Taskmill

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_CONCURRENCY = 10
"""``tm.worker()``'s default: measured as the secondary figure."""
BACKEND_URLS = {"memory": "memory://", "sqlite": None}
"""``--backend`` names; SQLite's URL is a fresh temporary file per run."""


async def noop(ctx: Context, params: dict[str, Any]) -> None:
    """The benchmarked handler: does nothing, so the figures are the framework's cost."""
    return None


# -- one run --------------------------------------------------------------------------


def open_taskmill(url: str, task_type: str) -> Taskmill:
    tm = Taskmill(url, plugins=False)
    tm.register(task_type, noop)
    return tm


async def enqueue_all(tm: Taskmill, task_type: str, tasks: int, batch_size: int) -> float:
    """Enqueue ``tasks`` no-op tasks in batches; returns the seconds it took."""
    started = time.perf_counter()
    for first in range(0, tasks, batch_size):
        specs = [
            {"task_type": task_type, "params": {"i": i}}
            for i in range(first, min(tasks, first + batch_size))
        ]
        await tm.enqueue_many(specs)
    return time.perf_counter() - started


async def drain(tm: Taskmill, concurrency: int, profile: Path | None) -> tuple[float, int]:
    """Run one worker until idle; returns (seconds, attempts it finished)."""
    worker = tm.worker(concurrency=concurrency, handle_signals=False)
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    await worker.run_until_idle()
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - started
    if profiler and profile:
        profiler.dump_stats(profile)
    return seconds, worker.processed


async def drain_in_this_process(args: argparse.Namespace) -> None:
    """``--drain``: the worker process of a run. Prints its figures as one JSON line."""
    tm = open_taskmill(args.url[0], args.task_type)
    async with tm:
        seconds, processed = await drain(tm, args.concurrency, args.profile)
    print(json.dumps({"seconds": seconds, "processed": processed}))


def drain_in_worker_process(
    url: str, task_type: str, concurrency: int, profile: Path | None
) -> tuple[float, int]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--drain",
        "--url",
        url,
        "--task-type",
        task_type,
        "--concurrency",
        str(concurrency),
    ]
    if profile:
        command += ["--profile", str(profile)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the worker process failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return float(report["seconds"]), int(report["processed"])


@contextmanager
def store_for_run(backend: str, url: str | None) -> Iterator[str]:
    """The storage URL of one run: a fresh SQLite file, or the given URL."""
    if url is not None:
        yield url
        return
    if backend != "sqlite":
        yield BACKEND_URLS[backend] or ""
        return
    directory = tempfile.mkdtemp(prefix="taskmill-bench-")
    try:
        yield f"sqlite:///{directory}/bench.db"  # an absolute path: four slashes
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def run_once(
    backend: str,
    url: str | None,
    *,
    tasks: int,
    batch_size: int,
    concurrency: int,
    worker_process: bool,
    profile: Path | None,
) -> dict[str, Any]:
    task_type = f"bench-noop-{uuid.uuid4().hex[:8]}"
    with store_for_run(backend, url) as run_url:
        tm = open_taskmill(run_url, task_type)
        async with tm:
            enqueue_seconds = await enqueue_all(tm, task_type, tasks, batch_size)
            if not worker_process:
                process_seconds, processed = await drain(tm, concurrency, profile)
        if worker_process:
            process_seconds, processed = drain_in_worker_process(
                run_url, task_type, concurrency, profile
            )
        async with tm:
            summary = await tm.progress_summary(TaskFilter(task_types=(task_type,)))
            # Every task ran in one attempt unless a lease was lost (rescued, run again):
            # the flow-control check of issue 14.
            ran = await tm.query(TaskFilter(task_types=(task_type,)), limit=tasks + 1)
            extra_attempts = sum(t.attempts for t in ran) - len(ran)
            if url is not None:  # a shared store: leave it as we found it
                await tm.cleanup(timedelta(0))
    if summary.completed != tasks or processed != tasks:
        raise RuntimeError(
            f"run did not complete every task: {summary.completed} of {tasks} completed, "
            f"{processed} attempts finished"
        )
    return {
        "enqueue_seconds": enqueue_seconds,
        "enqueue_per_s": tasks / enqueue_seconds,
        "process_seconds": process_seconds,
        "process_per_s": tasks / process_seconds,
        "extra_attempts": extra_attempts,
    }


# -- recording ----------------------------------------------------------------------


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def machine_details() -> dict[str, Any]:
    """What the figures depend on besides the code."""
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "ram_gib": _ram_gib(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite_library": sqlite3.sqlite_version,
        "os": platform.platform(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        # Other work on the machine shows up in the figures: record how busy it was.
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def redact(url: str) -> str:
    """The URL without its password, fit for a results file."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username}:***@{host}" if parts.username else host
    return urlunsplit(parts._replace(netloc=netloc))


def backend_label(backend: str | None, url: str | None) -> str:
    if backend is not None:
        return backend
    assert url is not None
    return re.sub(r"[^a-z0-9]+", "-", urlsplit(url).scheme.lower()) or "url"


def write_results(results_dir: Path, record: dict[str, Any]) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = record["date"].replace("-", "").replace(":", "")[:15] + "Z"
    path = results_dir / f"throughput-{stamp}-{record['backend']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def write_summary(results_dir: Path) -> Path:
    """Regenerate the markdown table of every recorded run, newest first."""
    rows = []
    for path in sorted(results_dir.glob("throughput-*.json"), reverse=True):
        record = json.loads(path.read_text())
        machine = record["machine"]
        settings = record["settings"]
        for figure in record["figures"]:
            processing = ", ".join(f"{p:,.0f}" for p in figure["process_per_s"])
            rows.append(
                f"| {record['date'][:16].replace('T', ' ')} | {record['backend']} | "
                f"{settings['tasks']:,} | {settings['batch_size']:,} | "
                f"{figure['concurrency']} | {figure['worker']} | "
                f"{figure['enqueue_per_s_median']:,.0f} | "
                f"**{figure['process_per_s_median']:,.0f}** ({processing}) | "
                f"{machine['cores']} cores {machine['cpu_model']}, "
                f"Python {machine['python']}, SQLite {machine['sqlite_library']} | "
                f"`{machine['git_commit'][:10]}`{'+' if machine['git_dirty'] else ''} | "
                f"[json]({path.name}) |"
            )
    summary = results_dir / "throughput.md"
    summary.write_text(
        "# Recorded throughput runs\n\n"
        "Generated by `bench/throughput.py` from the JSON files in this directory (do not "
        "edit by hand). Figures are tasks per second; processing shows the median, then "
        "every run. A `+` after the commit means the working tree had uncommitted "
        "changes. How to run and read these: [docs/benchmarks.md]"
        "(../../docs/benchmarks.md).\n\n"
        "| date (UTC) | backend | tasks | batch | concurrency | worker | enqueue/s | "
        "processed/s | machine | commit | file |\n"
        "|---|---|---:|---:|---:|---|---:|---:|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    return summary


# -- command line -------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Enqueue and processing throughput of no-op tasks, per backend.",
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=sorted(BACKEND_URLS),
        default=[],
        help="memory or sqlite (repeatable)",
    )
    parser.add_argument(
        "--url",
        action="append",
        default=[],
        help="any storage URL, e.g. postgresql://... (repeatable)",
    )
    parser.add_argument("--tasks", type=int, default=50_000, help="tasks per run")
    parser.add_argument("--batch-size", type=int, default=1_000, help="tasks per enqueue_many call")
    parser.add_argument(
        "--concurrency", type=int, default=100, help="worker slots for the main figure"
    )
    parser.add_argument(
        "--default-concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="slots for the secondary figure (0: skip it)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--worker-process",
        dest="worker_process",
        action="store_true",
        default=None,
        help="drain in a separate process (default except for memory://, which cannot be shared)",
    )
    mode.add_argument(
        "--in-process",
        dest="worker_process",
        action="store_false",
        help="drain in the benchmark's own process",
    )
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument(
        "--no-record", action="store_true", help="print the figures without writing result files"
    )
    parser.add_argument(
        "--profile", type=Path, help="write a cProfile of the (last) drain to this file"
    )
    parser.add_argument("--drain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task-type", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drain:
        if len(args.url) != 1 or not args.task_type:
            parser.error("--drain needs one --url and --task-type")
        return args
    if not args.backend and not args.url:
        args.backend = ["memory", "sqlite"]
    for name in ("tasks", "batch_size", "concurrency", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


async def bench_backend(
    args: argparse.Namespace, backend: str | None, url: str | None
) -> dict[str, Any]:
    label = backend_label(backend, url)
    machine = machine_details()  # before the runs, so the load average is not ours
    is_memory = (url or BACKEND_URLS.get(backend or "", "")) == "memory://"
    worker_process = False if is_memory else args.worker_process is not False
    if is_memory and args.worker_process:
        print("memory:// cannot be shared between processes; draining in-process")
    concurrencies = [args.concurrency]
    if args.default_concurrency and args.default_concurrency != args.concurrency:
        concurrencies.append(args.default_concurrency)
    figures = []
    for concurrency in concurrencies:
        runs = []
        for number in range(1, args.repeat + 1):
            run = await run_once(
                backend or "url",
                url,
                tasks=args.tasks,
                batch_size=args.batch_size,
                concurrency=concurrency,
                worker_process=worker_process,
                profile=args.profile,
            )
            runs.append(run)
            print(
                f"{label:>10}  concurrency {concurrency:>4}  run {number}/{args.repeat}: "
                f"enqueue {run['enqueue_per_s']:>9,.0f}/s  "
                f"processed {run['process_per_s']:>9,.0f}/s  "
                f"extra attempts {run['extra_attempts']}",
                flush=True,
            )
        figures.append(
            {
                "concurrency": concurrency,
                "worker": "separate process" if worker_process else "in-process",
                "enqueue_per_s_median": statistics.median(r["enqueue_per_s"] for r in runs),
                "process_per_s_median": statistics.median(r["process_per_s"] for r in runs),
                "enqueue_per_s": [r["enqueue_per_s"] for r in runs],
                "process_per_s": [r["process_per_s"] for r in runs],
                "runs": runs,
            }
        )
    return {
        "benchmark": "throughput",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backend": label,
        "url": redact(url)
        if url
        else (BACKEND_URLS.get(backend or "") or "sqlite:///<fresh temp file per run>"),
        "settings": {
            "tasks": args.tasks,
            "batch_size": args.batch_size,
            "concurrencies": concurrencies,
            "repeat": args.repeat,
            "reserved_high_priority_slots": 1,
            "handler": "async no-op",
            "worker_process": worker_process,
        },
        "machine": machine,
        "figures": figures,
    }


async def main(args: argparse.Namespace) -> None:
    targets: list[tuple[str | None, str | None]] = [(b, None) for b in args.backend]
    targets += [(None, u) for u in args.url]
    for backend, url in targets:
        record = await bench_backend(args, backend, url)
        for figure in record["figures"]:
            print(
                f"{record['backend']:>10}  concurrency {figure['concurrency']:>4}  "
                f"median: enqueue {figure['enqueue_per_s_median']:>9,.0f}/s  "
                f"processed {figure['process_per_s_median']:>9,.0f}/s  "
                f"({figure['worker']})"
            )
        if not args.no_record:
            path = write_results(args.results_dir, record)
            shown = path.relative_to(REPO_DIR) if path.is_relative_to(REPO_DIR) else path
            print(f"recorded {shown}")
    if not args.no_record:
        write_summary(args.results_dir)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.drain:
        asyncio.run(drain_in_this_process(arguments))
    else:
        asyncio.run(main(arguments))
