"""taskmill-postgres with and without the worker's local queue, beside a raw asyncpg ceiling.

One invocation, alternating rounds (the machine is shared: ratios within a round are
the figure, absolute rates move with the load). Each round runs, in this order:

- the **ceiling**: no framework, a table of its own (id, priority, status, locked_by);
  ``--ceiling-connections`` loops each claim ``--ceiling-batch`` rows
  (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING``)
  and complete them in one ``UPDATE ... WHERE id = ANY($1)``;
- taskmill, one worker in this process after the enqueue phase, for every
  ``--setting`` (``concurrency:prefetch:finish_window``);
- with ``--graphile CONCURRENCY:MODE`` (repeatable; MODE ``defaults`` or ``best``:
  ``localQueue`` of 1000 and batched completions), graphile-worker itself, pinned in
  ``bench/graphile_worker/package.json`` (``cd bench/graphile_worker && npm ci`` first),
  one Node runner in its own process after its bulk enqueue (``addJobs``).

Every run uses a PostgreSQL schema of its own, dropped afterwards. Recorded in
``bench/results/postgres-prefetch-ab-<date>.json`` with the load average before each
round. See docs/benchmarks.md.

    uv run python bench/postgres_prefetch_ab.py --url "$TASKMILL_TEST_POSTGRES_URL"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
from taskmill import Context, TaskFilter, Taskmill

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_SETTINGS = ["10:0:0", "10:1000:0.002", "100:0:0", "100:1000:0.002"]


async def noop(ctx: Context, params: dict[str, Any]) -> None:
    """The benchmarked handler: does nothing, so the figures are the framework's cost."""
    return None


async def enqueue_noops(tm: Taskmill, tasks: int) -> None:
    """Enqueue ``tasks`` no-op tasks (``params`` ``{"i": n}``) in calls of 1,000, as
    every PostgreSQL benchmark here does before it drains."""
    for first in range(0, tasks, 1000):
        await tm.enqueue_many(
            [
                {"task_type": "noop", "params": {"i": i}}
                for i in range(first, min(tasks, first + 1000))
            ]
        )


def write_record(results_dir: Path, name: str, document: dict[str, Any]) -> Path:
    """Write ``document`` as ``<results_dir>/<name>-<UTC time>.json`` and say so."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results_dir.mkdir(exist_ok=True)
    path = results_dir / f"{name}-{stamp}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"recorded {path}")
    return path


def medians_by(runs: list[dict[str, Any]], group: str, skip: tuple[str, ...] = ()) -> Any:
    """Per value of ``runs``' field ``group`` (in first-seen order), the median of every
    other numeric field of its runs, leaving out ``round`` and ``skip``."""
    groups = list(dict.fromkeys(r[group] for r in runs))
    fields = [k for k in runs[0] if k not in ("round", group, *skip)]
    return {
        g: {k: statistics.median(r[k] for r in runs if r[group] == g) for k in fields}
        for g in groups
    }


def machine_line() -> str:
    """The machine, as the records name it."""
    return f"{os.cpu_count()} cores {platform.machine()}, Python {platform.python_version()}"


def with_schema(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query["schema"] = schema
    return urlunsplit(parts._replace(query=urlencode(query)))


def plain_dsn(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme="postgresql", query=""))


async def ceiling(url: str, tasks: int, batch: int, connections: int) -> float:
    """Tasks/s of the raw claim-n/complete-n loop on ``connections`` connections."""
    schema = f"bench_ceiling_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(plain_dsn(url))
    try:
        await admin.execute(f"CREATE SCHEMA {schema}")
        await admin.execute(
            f"CREATE TABLE {schema}.jobs (id bigserial PRIMARY KEY, priority int NOT NULL "
            "DEFAULT 0, status text NOT NULL DEFAULT 'pending', locked_by text, "
            "payload jsonb NOT NULL)"
        )
        await admin.execute(
            f"CREATE INDEX ON {schema}.jobs (priority DESC, id) WHERE status = 'pending'"
        )
        await admin.execute(
            f"INSERT INTO {schema}.jobs (payload) "
            "SELECT jsonb_build_object('i', g) FROM generate_series(1, $1) g",
            tasks,
        )
        await admin.execute(f"ANALYZE {schema}.jobs")
        claim = (
            f"UPDATE {schema}.jobs SET status = 'running', locked_by = $1 WHERE id IN "
            f"(SELECT id FROM {schema}.jobs WHERE status = 'pending' "
            "ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING id, payload"
        )
        complete = f"UPDATE {schema}.jobs SET status = 'done' WHERE id = ANY($1::bigint[])"

        async def loop(name: str) -> int:
            done = 0
            connection = await asyncpg.connect(plain_dsn(url))
            try:
                while True:
                    rows = await connection.fetch(claim, name, batch)
                    if not rows:
                        return done
                    await connection.execute(complete, [r["id"] for r in rows])
                    done += len(rows)
            finally:
                await connection.close()

        started = time.perf_counter()
        counts = await asyncio.gather(*(loop(f"c{i}") for i in range(connections)))
        seconds = time.perf_counter() - started
        if sum(counts) != tasks:
            raise RuntimeError(f"the ceiling loop completed {sum(counts)} of {tasks}")
        return tasks / seconds
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await admin.close()


async def taskmill_run(
    url: str, tasks: int, concurrency: int, prefetch: int, window: float
) -> dict[str, float]:
    schema = f"bench_ab_{uuid.uuid4().hex[:8]}"
    run_url = with_schema(url, schema)
    tm = Taskmill(run_url, plugins=False)
    tm.register("noop", noop)
    try:
        async with tm:
            started = time.perf_counter()
            await enqueue_noops(tm, tasks)
            enqueue_seconds = time.perf_counter() - started
            worker = tm.worker(
                concurrency=concurrency,
                prefetch=prefetch,
                finish_window=window,
                handle_signals=False,
            )
            started = time.perf_counter()
            await worker.run_until_idle()
            seconds = time.perf_counter() - started
            summary = await tm.progress_summary(TaskFilter(task_types=("noop",)))
            if summary.completed != tasks or worker.processed != tasks:
                raise RuntimeError(f"{summary.completed} of {tasks} completed")
    finally:
        admin = await asyncpg.connect(plain_dsn(url))
        try:
            await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        finally:
            await admin.close()
    return {"process_per_s": tasks / seconds, "enqueue_per_s": tasks / enqueue_seconds}


GRAPHILE_DIR = BENCH_DIR / "graphile_worker"


async def graphile_run(url: str, tasks: int, concurrency: int, mode: str) -> dict[str, float]:
    schema = f"bench_gw_{uuid.uuid4().hex[:8]}"
    try:
        report = await asyncio.to_thread(run_graphile_bench, url, schema, tasks, concurrency, mode)
        if int(report["processed"]) != tasks:
            raise RuntimeError(f"graphile-worker processed {report['processed']} of {tasks}")
    finally:
        await drop_schema(url, schema)
    return {
        "process_per_s": tasks / float(report["seconds"]),
        "enqueue_per_s": tasks / float(report["enqueueSeconds"]),
    }


def run_graphile_bench(
    url: str, schema: str, tasks: int, concurrency: int, mode: str, batch: int = 1000
) -> dict[str, Any]:
    """Run ``bench.mjs`` (graphile-worker) once; its JSON report."""
    done = subprocess.run(
        ["node", "bench.mjs", plain_dsn(url), schema, str(tasks), str(concurrency), mode,
         str(batch)],
        cwd=GRAPHILE_DIR,
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"graphile-worker failed ({done.returncode}):\n{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


async def drop_schema(url: str, schema: str) -> None:
    """Drop a run's schema (and everything in it)."""
    admin = await asyncpg.connect(plain_dsn(url))
    try:
        await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await admin.close()


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    return done.stdout.strip()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("TASKMILL_TEST_POSTGRES_URL"))
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--setting",
        action="append",
        help="concurrency:prefetch:finish_window (repeatable; default "
        + ", ".join(DEFAULT_SETTINGS)
        + ")",
    )
    parser.add_argument(
        "--graphile",
        action="append",
        default=[],
        help="also run graphile-worker at CONCURRENCY:MODE (defaults|best); repeatable",
    )
    parser.add_argument("--ceiling-batch", type=int, default=100)
    parser.add_argument("--ceiling-connections", type=int, default=2)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if not args.url:
        parser.error("--url or $TASKMILL_TEST_POSTGRES_URL is needed")
    settings = args.setting or DEFAULT_SETTINGS
    systems = [*settings, *(f"graphile-worker {peer}" for peer in args.graphile)]
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        load = os.getloadavg()
        row: dict[str, Any] = {"load_before": load[0]}
        row["ceiling_per_s"] = await ceiling(
            args.url, args.tasks, args.ceiling_batch, args.ceiling_connections
        )
        for setting in settings:
            concurrency, prefetch, window = setting.split(":")
            row[setting] = await taskmill_run(
                args.url, args.tasks, int(concurrency), int(prefetch), float(window)
            )
        for peer in args.graphile:
            concurrency, mode = peer.split(":")
            row[f"graphile-worker {peer}"] = await graphile_run(
                args.url, args.tasks, int(concurrency), mode
            )
        rounds.append(row)
        print(
            f"round {number + 1} (load {load[0]:.2f}): ceiling {row['ceiling_per_s']:.0f}/s; "
            + "; ".join(
                f"{s} {row[s]['process_per_s']:.0f}/s "
                f"({row[s]['process_per_s'] / row['ceiling_per_s']:.0%} of ceiling)"
                for s in systems
            ),
            flush=True,
        )
    summary = {
        s: {
            "median_process_per_s": statistics.median(r[s]["process_per_s"] for r in rounds),
            "median_ratio_to_ceiling": statistics.median(
                r[s]["process_per_s"] / r["ceiling_per_s"] for r in rounds
            ),
            "median_ratio_to_first_setting": statistics.median(
                r[s]["process_per_s"] / r[settings[0]]["process_per_s"] for r in rounds
            ),
            "median_enqueue_per_s": statistics.median(r[s]["enqueue_per_s"] for r in rounds),
        }
        for s in systems
    }
    print(json.dumps(summary, indent=2))
    if args.no_record:
        return
    settings_record = {
        "tasks": args.tasks,
        "rounds": args.rounds,
        "taskmill": settings,
        "ceiling_batch": args.ceiling_batch,
        "ceiling_connections": args.ceiling_connections,
        "graphile_worker": args.graphile,
        "worker": "one worker in the benchmark's process, after the enqueue phase",
    }
    record("postgres-prefetch-ab", settings_record, rounds, summary)


def record(name: str, settings: dict[str, Any], rounds: list[Any], summary: Any) -> None:
    """Write ``bench/results/<name>-<UTC time>.json``: the settings, the machine, the
    commit and whether the tree had uncommitted changes, the rounds and the summary."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = BENCH_DIR / "results" / f"{name}-{stamp}.json"
    document = {
        "settings": settings,
        "machine": {"cpus": os.cpu_count(), "commit": _git("rev-parse", "HEAD")},
        "dirty": bool(_git("status", "--porcelain")),
        "rounds": rounds,
        "summary": summary,
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"recorded {out}")


if __name__ == "__main__":
    asyncio.run(main())
