"""Throughput of the core path: bulk enqueue, then one worker process draining no-op tasks.

The detailed tool behind ``python -m bench headline``: any backend, any worker settings.

Each run enqueues ``--tasks`` no-op tasks with ``tm.enqueue_many`` in batches of
``--batch-size``, then one worker (``tm.worker(concurrency=..., prefetch=...,
finish_window=..., handle_signals=False)``) drains them with ``run_until_idle()``. Both
phases are timed and reported as tasks/s.

- ``memory://`` is not shared between processes, so its worker runs in this process.
- Every other store is drained by a worker process of its own (the script runs itself
  with ``--drain``), which times the drain alone (interpreter start-up and connecting
  are not counted) and reports it as JSON on stdout.
- SQLite gets a fresh database file for every run; a PostgreSQL ``--url`` a fresh schema
  (created by the store on open, dropped after the run); any other ``--url`` (MySQL,
  MongoDB) is shared, so each run uses a task type of its own and deletes its finished
  tasks afterwards.
- A setting ending in ``:delete`` runs the worker with ``delete_completed=True`` (a
  completed task leaves no row); it is skipped, and says so, where this checkout's
  ``WorkerOptions`` has no ``delete_completed``.
- A setting with ``:batch=N`` registers the no-op as a batch handler
  (``BatchOptions(max_size=N, max_wait=0.005)``, returning one ``None`` per task):
  docs/batches.md. Give it a concurrency of at least N.

Every round measures the backend's **reference** first (memory: the task-per-item floor
and the strict floor per concurrency; SQLite: the raw ``sqlite3`` ceiling; PostgreSQL: the
raw asyncpg ceiling, see bench/references.py), then every setting once, so each ratio
compares figures taken under the same load. Every measurement is one record of
``bench/results/throughput.jsonl`` (bench/README.md, "Records").

    uv run python bench/throughput.py --backend memory --backend sqlite \\
        --tasks 50000 --concurrency 100 --repeat 3
    uv run python bench/throughput.py --tasks 20000 --repeat 3 \\
        --url postgresql://taskmill:taskmill@127.0.0.1:5432/taskmill
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import harness
import references
import taskmill
from harness import (
    THROUGHPUT_FINISH_WINDOW,
    THROUGHPUT_PREFETCH,
    Measurement,
    Recorder,
    Skip,
)
from taskmill import BatchOptions, Context, TaskFilter, Taskmill
from taskmill.errors import ConfigurationError

DEFAULT_CONCURRENCY = 10
"""``tm.worker()``'s default: measured as the secondary figure."""
BACKEND_URLS = {"memory": "memory://", "sqlite": "sqlite://"}
"""``--backend`` names; ``sqlite://`` means a fresh temporary file per run."""
TARGET_RATIO = {"memory": 0.5, "sqlite": 0.25, "postgresql": 0.5}
"""Issue 15's targets: taskmill's processing as a share of the reference."""


DELETE_UNAVAILABLE = "delete mode: not available in this checkout"


def delete_mode_available() -> bool:
    """Whether this checkout's worker takes ``delete_completed``."""
    return "delete_completed" in attrs.fields_dict(taskmill.WorkerOptions)


def _store_cannot_delete(tm: Taskmill) -> bool:
    """Whether the store says it cannot delete a task in its finish (a store that does
    not say is tried: its worker refuses to start if it cannot)."""
    capabilities = getattr(tm.storage, "capabilities", None)
    return getattr(capabilities, "delete_on_finish", None) is False


async def delete_mode_unavailable(url: str) -> str | None:
    """Why delete mode cannot run on ``url`` in this checkout (None: it can)."""
    if not delete_mode_available():
        return DELETE_UNAVAILABLE
    async with store_for_run(url) as (run_url, _), open_taskmill(run_url, "probe") as tm:
        if _store_cannot_delete(tm):
            return f"{DELETE_UNAVAILABLE} ({type(tm.storage).__name__} cannot delete in a finish)"
    return None


@dataclass(frozen=True)
class Setting:
    """One worker configuration: ``concurrency:prefetch:finish_window[:delete]``; a
    ``prefetch`` or ``finish_window`` of None (``default`` in the text) is the worker's
    default (prefetch auto, a 2 ms window)."""

    concurrency: int
    prefetch: int | None = None
    finish_window: float | None = None
    delete_completed: bool = False
    batch: int | None = None
    """The no-op as a batch handler of this ``max_size`` (None: one call per task)."""

    @classmethod
    def parse(cls, text: str) -> Setting:
        parts = text.split(":")
        extras = parts[3:]
        batches = [e for e in extras if e.startswith("batch=")]
        if (
            len(parts) < 3
            or len(batches) > 1
            or any(e != "delete" and not e.startswith("batch=") for e in extras)
        ):
            raise ValueError(text)
        concurrency, prefetch, window = parts[:3]
        setting = cls(
            int(concurrency),
            None if prefetch == "default" else int(prefetch),
            None if window == "default" else float(window),
            "delete" in extras,
            int(batches[0].removeprefix("batch=")) if batches else None,
        )
        if setting.batch is not None and setting.batch < 1:
            raise ValueError(text)
        if setting.concurrency < 1 or (setting.prefetch or 0) < 0:
            raise ValueError(text)
        if (setting.finish_window or 0) < 0:
            raise ValueError(text)
        return setting

    @property
    def label(self) -> str:
        prefetch = "default" if self.prefetch is None else self.prefetch
        window = "default" if self.finish_window is None else f"{self.finish_window:g}"
        return (
            f"{self.concurrency}:{prefetch}:{window}"
            + (":delete" if self.delete_completed else "")
            + ("" if self.batch is None else f":batch={self.batch}")
        )

    def worker_args(self) -> dict[str, Any]:
        """The keyword arguments of ``tm.worker`` (a default left out)."""
        args: dict[str, Any] = {"concurrency": self.concurrency}
        if self.prefetch is not None:
            args["prefetch"] = self.prefetch
        if self.finish_window is not None:
            args["finish_window"] = self.finish_window
        if self.delete_completed:
            args["delete_completed"] = True
        return args

    def params(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "prefetch": "auto" if self.prefetch is None else self.prefetch,
            "finish_window": "default" if self.finish_window is None else self.finish_window,
            "delete_completed": self.delete_completed,
            "batch": self.batch,
        }


async def noop_batch(batch: list[Context]) -> list[None]:
    """The batch form of the no-op: one None outcome per task."""
    return [None] * len(batch)


def open_taskmill(url: str, task_type: str, batch: int | None = None) -> Taskmill:
    tm = Taskmill(url, plugins=False, auto_migrate=True)
    if batch is None:
        tm.register(task_type, references.noop)
    else:
        tm.register(task_type, noop_batch, batch=BatchOptions(max_size=batch, max_wait=0.005))
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
    tm = open_taskmill(args.url[0], args.task_type, args.handler_batch)
    setting = Setting.parse(
        f"{args.concurrency}:{args.prefetch}:{args.finish_window}"
        + (":delete" if args.delete_completed else "")
        + ("" if args.handler_batch is None else f":batch={args.handler_batch}")
    )
    async with tm:
        try:
            seconds, processed = await drain(tm, setting, args.profile)
        except ConfigurationError as refused:
            if not setting.delete_completed:
                raise
            print(json.dumps({"unavailable": str(refused)}))
            return
    print(json.dumps({"seconds": seconds, "processed": processed}))


def drain_command(url: str, task_type: str, setting: Setting) -> list[str]:
    """The command of a worker process draining ``task_type`` at ``setting``."""
    command = [
        sys.executable, str(Path(__file__).resolve()), "--drain", "--url", url,
        "--task-type", task_type, "--concurrency", str(setting.concurrency),
        "--prefetch", "default" if setting.prefetch is None else str(setting.prefetch),
        "--finish-window",
        "default" if setting.finish_window is None else str(setting.finish_window),
    ]  # fmt: skip
    if setting.delete_completed:
        command.append("--delete-completed")
    if setting.batch is not None:
        command += ["--handler-batch", str(setting.batch)]
    return command


def drain_in_worker_process(
    url: str, task_type: str, setting: Setting, profile: Path | None
) -> tuple[float, int]:
    command = drain_command(url, task_type, setting)
    if profile:
        command += ["--profile", str(profile)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the worker process failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "unavailable" in report:
        raise Skip(f"{DELETE_UNAVAILABLE}: {report['unavailable']}")
    return float(report["seconds"]), int(report["processed"])


@asynccontextmanager
async def store_for_run(url: str) -> AsyncIterator[tuple[str, bool]]:
    """(the storage URL of one run, whether the store is shared with other runs): a
    fresh SQLite file for ``sqlite://``, a fresh schema for PostgreSQL (dropped
    afterwards), else the URL itself (shared)."""
    if url == "sqlite://":
        directory = tempfile.mkdtemp(prefix="taskmill-bench-")
        try:
            yield f"sqlite:///{directory}/bench.db", False  # absolute path: four slashes
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    elif harness.is_postgres(url):
        schemas = harness.PostgresSchemas(url, "bench_run")
        run_url, schema = schemas.url()
        try:
            yield run_url, False
        finally:
            await schemas.drop(schema)
    else:
        yield url, url != "memory://"


async def run_once(
    url: str,
    setting: Setting,
    *,
    tasks: int,
    batch_size: int = 1000,
    worker_process: bool = True,
    profile: Path | None = None,
) -> dict[str, Any]:
    """One run: enqueue ``tasks`` no-op tasks, drain them with one worker at
    ``setting``, check every task ended COMPLETED (kept) or left no row (delete mode)."""
    if setting.delete_completed and not delete_mode_available():
        raise Skip(DELETE_UNAVAILABLE)
    task_type = f"bench-noop-{uuid.uuid4().hex[:8]}"
    async with store_for_run(url) as (run_url, shared):
        tm = open_taskmill(run_url, task_type, setting.batch)
        async with tm:
            if setting.delete_completed and _store_cannot_delete(tm):
                raise Skip(f"{DELETE_UNAVAILABLE} ({type(tm.storage).__name__})")
            enqueue_seconds = await enqueue_all(tm, task_type, tasks, batch_size)
            if not worker_process:
                try:
                    process_seconds, processed = await drain(tm, setting, profile)
                except ConfigurationError as refused:
                    if not setting.delete_completed:
                        raise
                    raise Skip(f"{DELETE_UNAVAILABLE}: {refused}") from None
        if worker_process:
            process_seconds, processed = await asyncio.to_thread(
                drain_in_worker_process, run_url, task_type, setting, profile
            )
        async with tm:
            only = TaskFilter(task_types=(task_type,))
            summary = await tm.progress_summary(only)
            extra_attempts: int | None = None
            if not setting.delete_completed:
                # Every task ran in one attempt unless a lease was lost (rescued, run
                # again): the flow-control check of issue 14.
                ran = await tm.query(only, limit=tasks + 1)
                extra_attempts = sum(t.attempts for t in ran) - len(ran)
            if shared:  # leave a shared store as we found it
                await tm.cleanup(timedelta(0))
    kept = 0 if setting.delete_completed else tasks
    if processed != tasks or summary.completed != kept or summary.total != kept:
        raise RuntimeError(
            f"run did not complete every task: {processed} of {tasks} attempts finished, "
            f"{summary.completed} COMPLETED and {summary.total} in all left in the store "
            f"(expected {kept})"
        )
    return {
        "enqueue_per_s": tasks / enqueue_seconds,
        "process_per_s": tasks / process_seconds,
        "extra_attempts": extra_attempts,
    }


async def enqueue_once(url: str, *, tasks: int, batch_size: int = 1000) -> dict[str, float]:
    """Bulk enqueue alone: ``tasks`` no-op tasks in calls of ``batch_size`` into a fresh
    store (schema, file), timed around the ``enqueue_many`` calls."""
    task_type = f"bench-noop-{uuid.uuid4().hex[:8]}"
    async with store_for_run(url) as (run_url, shared), open_taskmill(run_url, task_type) as tm:
        seconds = await enqueue_all(tm, task_type, tasks, batch_size)
        if shared:
            await tm.cancel_by_filter(TaskFilter(task_types=(task_type,)))
            await tm.cleanup(timedelta(0))
    return {"enqueue_per_s": tasks / seconds}


# -- references -----------------------------------------------------------------------

REFERENCE_NAMES = {
    "memory": "task-per-item floor",
    "sqlite": "raw sqlite3 ceiling",
    "postgresql": "raw asyncpg ceiling",
}


def reference_measurements(
    backend: str, url: str, tasks: int, batch_size: int, concurrencies: list[int]
) -> list[Measurement]:
    """The reference measurements of a backend (none for MySQL, MongoDB: see
    mysql_peers.py and mongo_peers.py)."""
    params = {"backend": backend, "tasks": tasks, "system": "reference"}
    if backend == "memory":
        out = [
            Measurement(REFERENCE_NAMES["memory"], lambda: references.memory_floor(tasks), params)
        ]
        for c in concurrencies:

            async def strict(c: int = c) -> dict[str, Any]:
                return await references.strict_memory_floor(tasks, c)

            out.append(Measurement(f"strict floor c{c}", strict, {**params, "concurrency": c}))
        return out
    if backend == "sqlite":

        async def ceiling() -> dict[str, Any]:
            return references.sqlite_ceiling(tasks, batch_size)

        return [Measurement(REFERENCE_NAMES["sqlite"], ceiling, params)]
    if backend == "postgresql":
        pg_params = {
            **params,
            "batch": references.CEILING_BATCH,
            "connections": references.CEILING_CONNECTIONS,
        }
        return [
            Measurement(
                REFERENCE_NAMES["postgresql"],
                lambda: references.postgres_ceiling(url, tasks),
                pg_params,
            )
        ]
    return []


# -- command line -------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Enqueue and processing throughput of no-op tasks, per backend.",
    )
    parser.add_argument(
        "--backend", action="append", choices=sorted(BACKEND_URLS), default=[],
        help="memory or sqlite (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--url", action="append", default=[],
        help="any storage URL, e.g. postgresql://... (repeatable)",
    )  # fmt: skip
    parser.add_argument("--tasks", type=int, default=50_000, help="tasks per run")
    parser.add_argument("--batch-size", type=int, default=1_000, help="tasks per enqueue_many call")
    parser.add_argument("--concurrency", type=int, default=100, help="worker slots, main figure")
    parser.add_argument(
        "--default-concurrency", type=int, default=DEFAULT_CONCURRENCY,
        help="slots for the secondary figure (0: skip it)",
    )  # fmt: skip
    parser.add_argument(
        "--setting", action="append", type=Setting.parse, default=[],
        metavar="C:P:W[:delete][:batch=N]",
        help="worker concurrency:prefetch:finish_window, P or W `default` for the worker's "
        "default, `:delete` for delete_completed=True, `:batch=N` for a batch handler "
        "(repeatable; default: C:default:default "
        f"and C:{THROUGHPUT_PREFETCH}:{THROUGHPUT_FINISH_WINDOW} for C in --concurrency and "
        "--default-concurrency)",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="rounds")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--worker-process", dest="worker_process", action="store_true", default=None,
        help="drain in a separate process (default except for memory://)",
    )  # fmt: skip
    mode.add_argument(
        "--in-process", dest="worker_process", action="store_false",
        help="drain in the benchmark's own process",
    )  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the (last) drain")
    parser.add_argument("--drain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--finish-window", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--delete-completed", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task-type", help=argparse.SUPPRESS)
    parser.add_argument("--handler-batch", type=int, help=argparse.SUPPRESS)
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
    """``--setting`` values, or the defaults and the best setting per concurrency."""
    if args.setting:
        return list(args.setting)
    concurrencies = [args.concurrency]
    if args.default_concurrency and args.default_concurrency != args.concurrency:
        concurrencies.append(args.default_concurrency)
    settings = [Setting(c) for c in concurrencies]
    settings += [Setting(c, THROUGHPUT_PREFETCH, THROUGHPUT_FINISH_WINDOW) for c in concurrencies]
    return settings


async def bench_target(args: argparse.Namespace, recorder: Recorder, url: str) -> None:
    backend = harness.backend_of(url)
    worker_process = url != "memory://" and args.worker_process is not False
    if url == "memory://" and args.worker_process:
        print("memory:// cannot be shared between processes; draining in-process")
    settings = settings_of(args)
    if any(s.delete_completed for s in settings):
        unavailable = await delete_mode_unavailable(url)
        if unavailable:
            print(f"{backend}: {unavailable}; its settings are left out")
            settings = [s for s in settings if not s.delete_completed]
    shown_url = "sqlite:///<fresh file per run>" if url == "sqlite://" else harness.redact(url)
    base = {"backend": backend, "url": shown_url, "tasks": args.tasks}
    measurements = reference_measurements(
        backend, url, args.tasks, args.batch_size, sorted({s.concurrency for s in settings})
    )
    reference_name = measurements[0].name if measurements else None
    for setting in settings:

        async def run(setting: Setting = setting) -> dict[str, Any]:
            return await run_once(
                url, setting, tasks=args.tasks, batch_size=args.batch_size,
                worker_process=worker_process, profile=args.profile,
            )  # fmt: skip

        params = {
            **base, "system": "taskmill", "batch_size": args.batch_size,
            "worker": "separate process" if worker_process else "in-process",
            **setting.params(),
        }  # fmt: skip
        measurements.append(Measurement(f"taskmill {setting.label}", run, params))
    print(f"{backend}: {len(measurements)} measurements x {args.repeat} rounds", flush=True)
    results = await harness.alternate(recorder, args.repeat, measurements)
    print(f"{backend}: medians of {args.repeat} rounds (tasks/s)")
    reference = results.get(reference_name or "", [])
    target = TARGET_RATIO.get(backend)
    for name, records in results.items():
        process = harness.median_of(records, "process_per_s")
        enqueue = harness.median_of(records, "enqueue_per_s")
        if process is None:
            print(f"  {name:<36} {records[-1]['figures'].get('skipped', 'no figure')}")
            continue
        line = f"  {name:<36} processed {process:>9,.0f}"
        if enqueue is not None:
            line += f"  enqueue {enqueue:>9,.0f}"
        if name.startswith("taskmill "):
            against = harness.ratios(records, reference)
            if against:
                median = statistics.median(against)
                line += f"  {median:.0%} of the {reference_name}"
                if target is not None:
                    line += f" (target {target:.0%}: {'met' if median >= target else 'missed'})"
            concurrency = records[0]["params"]["concurrency"]
            strict = harness.ratios(records, results.get(f"strict floor c{concurrency}", []))
            if strict:
                line += f", {statistics.median(strict):.0%} of the strict floor"
        print(line)


async def main(args: argparse.Namespace) -> None:
    recorder = Recorder("throughput", results_dir=args.results_dir, enabled=not args.no_record)
    targets = [BACKEND_URLS[b] for b in args.backend] + list(args.url)
    for url in targets:
        await bench_target(args, recorder, url)
    recorder.done()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.drain:
        asyncio.run(drain_in_this_process(arguments))
    else:
        asyncio.run(main(arguments))
