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

Every invocation also measures a **reference** beside taskmill, in the same rounds, and
reports taskmill's figures as ratios to it (issue 15):

- memory: the *task-per-item floor*, the same no-op handler run as one asyncio task per
  item, all created at once and gathered, no framework (this form gives the issue's figure);
  also the *strict floor* at each concurrency: at most ``concurrency`` tasks at once,
  each started from the done callback of the one before;
- SQLite: the *raw ceiling*, a minimal ``sqlite3`` loop (the driver taskmill's SQLite
  backend uses) on a table of its own in a fresh WAL file with taskmill's pragmas, each
  round one ``BEGIN IMMEDIATE`` transaction claiming 100 and one completing them;
- PostgreSQL: the raw asyncpg claim-100 / complete-100 loop of
  ``bench/postgres_prefetch_ab.py`` (2 connections, a schema of its own).

The runs alternate: each round runs the reference, then every setting once, so the
ratio of a run is to the reference of its own round. Settings are
``concurrency:prefetch:finish_window`` (``default`` for the worker's own default); by
default the defaults (``C:default:default``) and the
settings a user would choose for throughput (``C:1000:0.002``, see docs/benchmarks.md,
"The local queue") at ``--concurrency`` and ``--default-concurrency``.

Every run of every setting is recorded, with the machine it ran on and the load average
at its start, in ``bench/results/throughput-<date>-<backend>.json``;
``bench/results/throughput.md`` is regenerated from all recorded files. See
docs/benchmarks.md.

    uv run python bench/throughput.py --backend memory --backend sqlite \\
        --tasks 50000 --concurrency 100 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from taskmill import Context, TaskFilter, Taskmill

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_CONCURRENCY = 10
"""``tm.worker()``'s default: measured as the secondary figure."""
BACKEND_URLS = {"memory": "memory://", "sqlite": None}
"""``--backend`` names; SQLite's URL is a fresh temporary file per run."""
THROUGHPUT_PREFETCH = 1000
THROUGHPUT_FINISH_WINDOW = 0.002
"""The settings docs/benchmarks.md ("Defaults") gives for throughput."""
CEILING_BATCH = 100
"""Tasks the raw ceiling loops claim, then complete, per round."""
TARGET_RATIO = {"memory": 0.5, "sqlite": 0.25, "postgresql": 0.5}
"""Issue 15's targets: taskmill's processing as a share of the reference."""


@dataclass(frozen=True)
class Setting:
    """One worker configuration measured: ``concurrency:prefetch:finish_window``; a
    ``prefetch`` or ``finish_window`` of None (``default`` in the text) is the worker's
    default (prefetch auto, a 2 ms window)."""

    concurrency: int
    prefetch: int | None = 0
    finish_window: float | None = 0.0

    @classmethod
    def parse(cls, text: str) -> Setting:
        concurrency, prefetch, window = text.split(":")
        setting = cls(
            int(concurrency),
            None if prefetch == "default" else int(prefetch),
            None if window == "default" else float(window),
        )
        if (
            setting.concurrency < 1
            or (setting.prefetch or 0) < 0
            or (setting.finish_window or 0) < 0
        ):
            raise ValueError(text)
        return setting

    @property
    def label(self) -> str:
        prefetch = "default" if self.prefetch is None else self.prefetch
        window = "default" if self.finish_window is None else f"{self.finish_window:g}"
        return f"{self.concurrency}:{prefetch}:{window}"

    def worker_args(self) -> dict[str, Any]:
        """The keyword arguments of ``tm.worker`` (a default left out)."""
        args: dict[str, Any] = {"concurrency": self.concurrency}
        if self.prefetch is not None:
            args["prefetch"] = self.prefetch
        if self.finish_window is not None:
            args["finish_window"] = self.finish_window
        return args


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


async def drain(tm: Taskmill, setting: Setting, profile: Path | None) -> tuple[float, int]:
    """Run one worker until idle; returns (seconds, attempts it finished)."""
    worker = tm.worker(**setting.worker_args(), handle_signals=False)
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
        setting = Setting.parse(f"{args.concurrency}:{args.prefetch}:{args.finish_window}")
        seconds, processed = await drain(tm, setting, args.profile)
    print(json.dumps({"seconds": seconds, "processed": processed}))


def drain_in_worker_process(
    url: str, task_type: str, setting: Setting, profile: Path | None
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
        str(setting.concurrency),
        "--prefetch",
        "default" if setting.prefetch is None else str(setting.prefetch),
        "--finish-window",
        "default" if setting.finish_window is None else str(setting.finish_window),
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
    setting: Setting,
    worker_process: bool,
    profile: Path | None,
) -> dict[str, Any]:
    task_type = f"bench-noop-{uuid.uuid4().hex[:8]}"
    with store_for_run(backend, url) as run_url:
        tm = open_taskmill(run_url, task_type)
        async with tm:
            enqueue_seconds = await enqueue_all(tm, task_type, tasks, batch_size)
            if not worker_process:
                process_seconds, processed = await drain(tm, setting, profile)
        if worker_process:
            process_seconds, processed = drain_in_worker_process(
                run_url, task_type, setting, profile
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


# -- the references -----------------------------------------------------------------


async def memory_floor(tasks: int) -> float:
    """Tasks/s of the task-per-item floor: ``noop`` run as one asyncio task per item, all
    created at once and gathered, no framework and no store (the issue does not record its
    loop; this form gives its figure, about 67,000/s)."""
    items = [{"i": i} for i in range(tasks)]
    ctx = cast(Context, None)  # the handler does not look at it
    started = time.perf_counter()
    await asyncio.gather(*[asyncio.create_task(noop(ctx, params)) for params in items])
    return tasks / (time.perf_counter() - started)


async def strict_memory_floor(tasks: int, concurrency: int) -> float:
    """Tasks/s of the strict floor: one asyncio task per item, at most ``concurrency`` at
    once, a task's done callback starting the next one (as a worker's freed slot starts
    the next task). No gather and no pending tasks beyond the slots: the least Python a
    task-per-item runner can do."""
    items = iter([{"i": i} for i in range(tasks)])
    ctx = cast(Context, None)
    done = asyncio.get_running_loop().create_future()
    left = tasks

    def start() -> None:
        params = next(items, None)
        if params is not None:
            asyncio.create_task(noop(ctx, params)).add_done_callback(finished)

    def finished(task: asyncio.Task[None]) -> None:
        nonlocal left
        task.result()
        left -= 1
        if left == 0:
            done.set_result(None)
        else:
            start()

    started = time.perf_counter()
    for _ in range(min(concurrency, tasks)):
        start()
    await done
    return tasks / (time.perf_counter() - started)


def sqlite_ceiling(tasks: int, batch_size: int) -> dict[str, float]:
    """The raw SQLite ceiling: a fresh WAL file with taskmill's pragmas and a table of
    its own, ``tasks`` rows inserted in transactions of ``batch_size``, then one loop
    that per round claims ``CEILING_BATCH`` (one ``BEGIN IMMEDIATE`` transaction: an
    ``UPDATE ... RETURNING`` of the highest-priority pending rows) and completes them
    (a second transaction), until nothing is pending. Same driver as taskmill's SQLite
    backend (the standard library's ``sqlite3``, autocommit, statement cache 512)."""
    directory = tempfile.mkdtemp(prefix="taskmill-ceiling-")
    try:
        conn = sqlite3.connect(
            f"{directory}/ceiling.db", timeout=30.0, isolation_level=None, cached_statements=512
        )
        conn.execute("PRAGMA busy_timeout = 30000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY, priority INTEGER NOT NULL DEFAULT 0,"
            " status TEXT NOT NULL DEFAULT 'pending', locked_by TEXT, params TEXT NOT NULL)"
        )
        conn.execute("CREATE INDEX jobs_claim ON jobs (priority DESC, id) WHERE status = 'pending'")
        started = time.perf_counter()
        for first in range(0, tasks, batch_size):
            rows = [(json.dumps({"i": i}),) for i in range(first, min(tasks, first + batch_size))]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO jobs (params) VALUES (?)", rows)
            conn.execute("COMMIT")
        enqueue_seconds = time.perf_counter() - started
        claim = (
            "UPDATE jobs SET status = 'running', locked_by = ? WHERE id IN (SELECT id FROM jobs"
            " WHERE status = 'pending' ORDER BY priority DESC, id LIMIT ?) RETURNING id, params"
        )
        done = 0
        started = time.perf_counter()
        while True:
            conn.execute("BEGIN IMMEDIATE")
            claimed = conn.execute(claim, ("ceiling", CEILING_BATCH)).fetchall()
            conn.execute("COMMIT")
            if not claimed:
                break
            ids = [row[0] for row in claimed]
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                f"UPDATE jobs SET status = 'done' WHERE id IN ({', '.join('?' * len(ids))})", ids
            )
            conn.execute("COMMIT")
            done += len(ids)
        process_seconds = time.perf_counter() - started
        conn.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if done != tasks:
        raise RuntimeError(f"the SQLite ceiling completed {done} of {tasks}")
    return {"enqueue_per_s": tasks / enqueue_seconds, "process_per_s": tasks / process_seconds}


@dataclass(frozen=True)
class Reference:
    """What taskmill is compared with on one backend."""

    name: str
    description: str


REFERENCES = {
    "memory": Reference(
        "task-per-item floor",
        "the same no-op as one asyncio task per item, all created at once and gathered "
        "(asyncio.gather), no framework, no store (in this process); also recorded: the "
        "strict floor, at most `concurrency` tasks at once, each started from the done "
        "callback of the one before",
    ),
    "sqlite": Reference(
        "raw SQLite ceiling",
        f"a sqlite3 loop claiming {CEILING_BATCH} then completing {CEILING_BATCH} per round "
        "(one BEGIN IMMEDIATE transaction each) on a table of its own in a fresh WAL file, "
        "synchronous=NORMAL, busy_timeout 30 s (in this process)",
    ),
    "postgresql": Reference(
        "raw asyncpg ceiling",
        f"bench/postgres_prefetch_ab.py's loop: 2 connections, each claiming {CEILING_BATCH} "
        f"(UPDATE ... FOR UPDATE SKIP LOCKED ... RETURNING) then completing {CEILING_BATCH}, "
        "a schema of its own (in this process)",
    ),
}


def reference_kind(backend: str | None, url: str | None) -> str | None:
    """Which entry of ``REFERENCES`` a target is compared with (None: none)."""
    if url is None:
        return backend
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        return "memory"
    if scheme == "sqlite":
        return "sqlite"
    if scheme.startswith("postgres"):
        return "postgresql"
    return None


async def measure_reference(
    kind: str, url: str | None, tasks: int, batch_size: int
) -> dict[str, float]:
    """One run of the reference: tasks/s processed (and enqueued, for the ceilings)."""
    if kind == "memory":
        return {"process_per_s": await memory_floor(tasks)}
    if kind == "sqlite":
        return sqlite_ceiling(tasks, batch_size)
    assert url is not None
    from postgres_prefetch_ab import ceiling  # bench/ is the script's directory: on sys.path

    return {"process_per_s": await ceiling(url, tasks, CEILING_BATCH, 2)}


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


def figure_label(figure: dict[str, Any]) -> str:
    """``concurrency:prefetch:finish_window`` of a recorded figure (older files: C:0:0)."""
    return Setting(
        figure["concurrency"], figure.get("prefetch", 0), figure.get("finish_window", 0.0)
    ).label


def load_range(loads: list[float]) -> str:
    low, high = f"{min(loads):.1f}", f"{max(loads):.1f}"
    return low if low == high else f"{low}-{high}"


def write_summary(results_dir: Path) -> Path:
    """Regenerate the markdown table of every recorded run, newest first."""
    rows = []
    for path in sorted(results_dir.glob("throughput-*.json"), reverse=True):
        record = json.loads(path.read_text())
        machine = record["machine"]
        settings = record["settings"]
        reference = record.get("reference")
        for figure in record["figures"]:
            processing = ", ".join(f"{p:,.0f}" for p in figure["process_per_s"])
            if reference is not None and "ratio_to_reference" in figure:
                against = (
                    f"{reference['name']}: {figure['reference_per_s_median']:,.0f} | "
                    f"**{figure['ratio_to_reference_median']:.0%}** ("
                    + ", ".join(f"{r:.0%}" for r in figure["ratio_to_reference"])
                    + ")"
                )
            else:
                against = "— | —"
            loads = figure.get("load_1min") or [machine["load_average_1_5_15"][0]]
            rows.append(
                f"| {record['date'][:16].replace('T', ' ')} | {record['backend']} | "
                f"{settings['tasks']:,} | {settings['batch_size']:,} | "
                f"{figure_label(figure)} | {figure['worker']} | "
                f"{figure['enqueue_per_s_median']:,.0f} | "
                f"**{figure['process_per_s_median']:,.0f}** ({processing}) | {against} | "
                f"{load_range(loads)} | "
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
        "every run. The worker setting is `concurrency:prefetch:finish_window`. The "
        "reference is measured in the same invocation, in alternating rounds (files from "
        "before 2026-12-02 have none): the task-per-item floor for memory, the raw driver "
        "ceiling for SQLite and PostgreSQL; the ratio is taskmill's processing over the "
        "reference of the same round (median, then every round). Load is the 1-minute load "
        "average at the starts of the runs (older files: at the start of the invocation). "
        "A `+` after the commit means the working tree had uncommitted changes. How to run "
        "and read these: [docs/benchmarks.md](../../docs/benchmarks.md).\n\n"
        "| date (UTC) | backend | tasks | batch | worker setting | worker | enqueue/s | "
        "processed/s | reference/s (median) | ratio | load | machine | commit | file |\n"
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---|---|---|---|\n" + "\n".join(rows) + "\n"
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
    parser.add_argument(
        "--setting",
        action="append",
        type=Setting.parse,
        default=[],
        metavar="C:P:W",
        help="worker concurrency:prefetch:finish_window, P or W `default` for the worker's "
        "default (repeatable; default: C:default:default and "
        f"C:{THROUGHPUT_PREFETCH}:{THROUGHPUT_FINISH_WINDOW} for C in --concurrency and "
        "--default-concurrency)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds (each runs the reference and every setting)"
    )
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
    parser.add_argument("--prefetch", default="0", help=argparse.SUPPRESS)
    parser.add_argument("--finish-window", default="0", help=argparse.SUPPRESS)
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


def settings_of(args: argparse.Namespace) -> list[Setting]:
    """``--setting`` values, or the defaults and the throughput settings per concurrency."""
    if args.setting:
        return list(args.setting)
    concurrencies = [args.concurrency]
    if args.default_concurrency and args.default_concurrency != args.concurrency:
        concurrencies.append(args.default_concurrency)
    settings = [Setting(c, None, None) for c in concurrencies]
    settings += [Setting(c, THROUGHPUT_PREFETCH, THROUGHPUT_FINISH_WINDOW) for c in concurrencies]
    return settings


def setting_text(setting: Setting) -> str:
    if setting.prefetch is None and setting.finish_window is None:
        return "defaults"
    if setting.prefetch == 0 and setting.finish_window == 0:
        return "no local queue, no finish window"
    prefetch = "auto" if setting.prefetch is None else setting.prefetch
    window = 2 if setting.finish_window is None else setting.finish_window * 1000
    return f"prefetch {prefetch}, finish_window {window:g} ms"


async def bench_backend(
    args: argparse.Namespace, backend: str | None, url: str | None
) -> dict[str, Any]:
    label = backend_label(backend, url)
    machine = machine_details()  # before the runs, so the load average is not ours
    is_memory = (url or BACKEND_URLS.get(backend or "", "")) == "memory://"
    worker_process = False if is_memory else args.worker_process is not False
    if is_memory and args.worker_process:
        print("memory:// cannot be shared between processes; draining in-process")
    settings = settings_of(args)
    kind = reference_kind(backend, url)
    reference = REFERENCES.get(kind or "")
    runs: dict[Setting, list[dict[str, Any]]] = {s: [] for s in settings}
    reference_runs: list[dict[str, Any]] = []
    strict_runs: list[dict[str, Any]] = []
    for number in range(1, args.repeat + 1):
        # One round: the reference, then every setting once, so each ratio compares
        # figures taken under the same load.
        ref: dict[str, float] | None = None
        if reference is not None and kind is not None:
            gc.collect()  # each measurement starts from a collected heap
            load = round(os.getloadavg()[0], 2)
            ref = await measure_reference(kind, url, args.tasks, args.batch_size)
            reference_runs.append({"round": number, "load_1min": load, **ref})
            print(
                f"{label:>10}  round {number}/{args.repeat}  {reference.name}: "
                f"{ref['process_per_s']:>9,.0f}/s  load {load:.2f}",
                flush=True,
            )
        strict: dict[int, float] = {}
        if kind == "memory":
            for concurrency in sorted({s.concurrency for s in settings}):
                gc.collect()
                load = round(os.getloadavg()[0], 2)
                strict[concurrency] = await strict_memory_floor(args.tasks, concurrency)
                strict_runs.append(
                    {
                        "round": number,
                        "concurrency": concurrency,
                        "load_1min": load,
                        "process_per_s": strict[concurrency],
                    }
                )
                print(
                    f"{label:>10}  round {number}/{args.repeat}  strict floor (concurrency "
                    f"{concurrency}): {strict[concurrency]:>9,.0f}/s  load {load:.2f}",
                    flush=True,
                )
        for setting in settings:
            gc.collect()
            load = round(os.getloadavg()[0], 2)
            run = await run_once(
                backend or "url",
                url,
                tasks=args.tasks,
                batch_size=args.batch_size,
                setting=setting,
                worker_process=worker_process,
                profile=args.profile,
            )
            run["round"] = number
            run["load_1min"] = load
            if ref is not None:
                run["reference_per_s"] = ref["process_per_s"]
                run["ratio_to_reference"] = run["process_per_s"] / ref["process_per_s"]
            if setting.concurrency in strict:
                run["strict_floor_per_s"] = strict[setting.concurrency]
                run["ratio_to_strict_floor"] = run["process_per_s"] / strict[setting.concurrency]
            runs[setting].append(run)
            ratio = f"  {run['ratio_to_reference']:.0%} of reference" if ref else ""
            print(
                f"{label:>10}  round {number}/{args.repeat}  {setting.label:>14}: "
                f"enqueue {run['enqueue_per_s']:>9,.0f}/s  "
                f"processed {run['process_per_s']:>9,.0f}/s{ratio}  "
                f"extra attempts {run['extra_attempts']}  load {load:.2f}",
                flush=True,
            )
    figures = []
    for setting, setting_runs in runs.items():
        figure: dict[str, Any] = {
            "concurrency": setting.concurrency,
            "prefetch": setting.prefetch,
            "finish_window": setting.finish_window,
            "worker": "separate process" if worker_process else "in-process",
            "enqueue_per_s_median": statistics.median(r["enqueue_per_s"] for r in setting_runs),
            "process_per_s_median": statistics.median(r["process_per_s"] for r in setting_runs),
            "enqueue_per_s": [r["enqueue_per_s"] for r in setting_runs],
            "process_per_s": [r["process_per_s"] for r in setting_runs],
            "load_1min": [r["load_1min"] for r in setting_runs],
            "runs": setting_runs,
        }
        if reference is not None:
            ratios = [r["ratio_to_reference"] for r in setting_runs]
            figure["reference_per_s"] = [r["reference_per_s"] for r in setting_runs]
            figure["reference_per_s_median"] = statistics.median(figure["reference_per_s"])
            figure["ratio_to_reference"] = ratios
            figure["ratio_to_reference_median"] = statistics.median(ratios)
        if strict_runs:
            figure["strict_floor_per_s_median"] = statistics.median(
                r["strict_floor_per_s"] for r in setting_runs
            )
            figure["ratio_to_strict_floor_median"] = statistics.median(
                r["ratio_to_strict_floor"] for r in setting_runs
            )
        figures.append(figure)
    record: dict[str, Any] = {
        "benchmark": "throughput",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backend": label,
        "url": redact(url)
        if url
        else (BACKEND_URLS.get(backend or "") or "sqlite:///<fresh temp file per run>"),
        "settings": {
            "tasks": args.tasks,
            "batch_size": args.batch_size,
            "concurrencies": sorted({s.concurrency for s in settings}, reverse=True),
            "worker_settings": [s.label for s in settings],
            "repeat": args.repeat,
            "order": "alternating rounds: the reference, then every worker setting once",
            "reserved_high_priority_slots": 1,
            "handler": "async no-op",
            "worker_process": worker_process,
        },
        "machine": machine,
        "load_1min_after": round(os.getloadavg()[0], 2),
        "figures": figures,
    }
    if reference is not None and kind is not None:
        record["reference"] = {
            "name": reference.name,
            "description": reference.description,
            "target_ratio": TARGET_RATIO.get(kind),
            "runs": reference_runs,
        }
        if strict_runs:
            record["reference"]["strict_floor_runs"] = strict_runs
    return record


async def main(args: argparse.Namespace) -> None:
    targets: list[tuple[str | None, str | None]] = [(b, None) for b in args.backend]
    targets += [(None, u) for u in args.url]
    for backend, url in targets:
        record = await bench_backend(args, backend, url)
        reference = record.get("reference")
        for figure in record["figures"]:
            against = ""
            if reference is not None:
                target = reference["target_ratio"]
                median = figure["ratio_to_reference_median"]
                met = (
                    ""
                    if target is None
                    else f", target {target:.0%}: {'met' if median >= target else 'missed'}"
                )
                against = (
                    f"  {figure['ratio_to_reference_median']:.0%} of the {reference['name']} "
                    f"(median {figure['reference_per_s_median']:,.0f}/s{met})"
                )
            print(
                f"{record['backend']:>10}  {figure_label(figure):>14}  "
                f"median: enqueue {figure['enqueue_per_s_median']:>9,.0f}/s  "
                f"processed {figure['process_per_s_median']:>9,.0f}/s  "
                f"({figure['worker']}){against}"
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
