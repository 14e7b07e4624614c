"""taskmill-mongo beside a raw PyMongo loop (and Celery, where it runs) on one server.

One invocation, alternating rounds (the machine is shared: ratios within a round are the
figure, absolute rates move with the load). Each round runs, in this order:

- **raw, update_many**: the ceiling. No framework, a database of its own, one minimal
  collection (``_id``, ``seq``, ``status``, ``priority``, ``params``) with a
  (status, priority DESC, seq) index; one loop claims 100 the way taskmill-mongo
  designed its claim (read candidate ids in claim order, one conditional
  ``update_many`` stamping a claim token, read back by the token) and completes those
  100 with one ``update_many``, until none is left. No transactions, no lock: one
  sequential client needs neither;
- **raw, find_one_and_update**: the same collection and completion, but each task is
  claimed by its own ``find_one_and_update`` (sorted, ``status: pending`` ->
  ``running``), ``--fou-loops`` loops at once, completing in batches of 100: the claim
  style the design did not pick;
- **raw, update_many in a locked transaction**: the ceiling loop with what
  ``serializeWrites`` makes taskmill do on the stand-in around each claim and each
  completion: take the writer-lock document (one ``find_one_and_update``), run the
  work in a multi-document transaction opened by a no-op write, free the lock (one
  ``update_one``). Not a ceiling: the stand-in's share of taskmill's cost;
- **taskmill**, for every ``--setting`` (``concurrency:prefetch:finish_window``): a
  database of its own, ``enqueue_many`` in batches of ``--batch-size`` (the bulk
  enqueue figure), then one worker in this process, ``run_until_idle()`` timed alone;
- **Celery** with kombu's MongoDB transport, with ``--celery-python`` (the interpreter
  of a throwaway venv holding celery and pymongo: celery is not a dependency of this
  workspace): ``bench/mongo_celery_peer.py`` runs there, in its own process, once per
  ``--celery-concurrency``.

Then, once: the **enqueue-to-start latency** of an idle taskmill worker in another
process (one task at a time, from just before the enqueue until the handler writes its
start to a pipe; the worker is woken by the store's change-stream notifications, and polls
as the fallback):
``--latency-samples`` tasks 50-150 ms apart at the default ``poll_interval`` and at
``--fast-poll``, and ``--idle-samples`` tasks 2-3 s apart (the worker's polling backed
off to ``poll_interval``); and **processing with a history**: ``--history`` finished
tasks (with their attempt-log documents, copies of a task taskmill itself ran and
finished) are inserted with ``insert_many`` into a taskmill database, then the drain at
``--history-setting`` alternates between an empty database and that one.

``--count-commands`` runs only the drains of each ``--setting`` and counts the commands
they send, by name (``bench/results/mongo-commands.jsonl``).

Every URL is the one given: ``?directConnection=true&serializeWrites=true`` on the
stand-in nx-27017 (taskmill's ``serializeWrites`` is removed from the raw loops' and
Celery's URLs, which do not know it). Recorded as one record of
``bench/results/mongo-peers.jsonl`` (bench/harness.py) holding the load average before
each phase, the settings and the versions. See docs/benchmarks.md.

    uv run python bench/mongo_peers.py \\
        --url "mongodb://127.0.0.1:PORT/bench?directConnection=true&serializeWrites=true"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pymongo
from harness import Recorder, load_1min, now_iso, redact
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, ReturnDocument, monitoring
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from taskmill import Context, TaskFilter, Taskmill
from taskmill_mongo.options import parse_url

BENCH_DIR = Path(__file__).resolve().parent
SCRIPT = str(Path(__file__).resolve())
DEFAULT_SETTINGS = ["10:0:0", "10:1000:0.002", "100:0:0", "100:1000:0.002"]
TASK = "noop"
STAMP = "stamp"
BATCH = 100
Doc = dict[str, Any]


async def noop(ctx: Context, params: dict[str, Any]) -> None:
    """The benchmarked handler: does nothing, so the figures are the framework's cost."""
    return None


# -- URLs and databases ----------------------------------------------------------------


def with_database(url: str, database: str) -> str:
    """``url`` naming ``database`` (its query kept)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def driver_url(url: str) -> str:
    """``url`` as the driver takes it: taskmill's own ``serializeWrites`` removed."""
    return parse_url(url, {}).driver_url


def fresh_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


async def drop(url: str, database: str) -> None:
    client: AsyncMongoClient[Doc] = AsyncMongoClient(driver_url(url))
    try:
        await client.drop_database(database)
    finally:
        await client.close()


# -- the raw loops -----------------------------------------------------------------------


async def _raw_collection(url: str, tasks: int) -> tuple[AsyncMongoClient[Doc], str, float]:
    """A database with ``tasks`` pending jobs; (client, database name, enqueue seconds)."""
    name = fresh_name("mb_raw")
    client: AsyncMongoClient[Doc] = AsyncMongoClient(driver_url(with_database(url, name)))
    db = client[name]
    await db.jobs.create_index(
        [("status", ASCENDING), ("priority", DESCENDING), ("seq", ASCENDING)], name="claim"
    )
    await db.jobs.create_index([("token", ASCENDING)], name="token", sparse=True)
    started = time.perf_counter()
    for first in range(0, tasks, 1000):
        await db.jobs.insert_many(
            [
                {
                    "_id": uuid.uuid4().hex,
                    "seq": i,
                    "status": "pending",
                    "priority": 100,
                    "params": json.dumps({"i": i}),
                }
                for i in range(first, min(tasks, first + 1000))
            ]
        )
    return client, name, time.perf_counter() - started


async def _claim_many(db: AsyncDatabase[Doc], session: AsyncClientSession | None) -> list[Doc]:
    """The designed claim: candidate ids in claim order, one conditional update_many
    stamping a token, the claimed documents read back by it."""
    ids = [
        d["_id"]
        async for d in db.jobs.find({"status": "pending"}, {"_id": 1}, session=session)
        .sort([("priority", DESCENDING), ("seq", ASCENDING)])
        .limit(BATCH)
    ]
    if not ids:
        return []
    token = uuid.uuid4().hex
    await db.jobs.update_many(
        {"_id": {"$in": ids}, "status": "pending"},
        {"$set": {"status": "running", "token": token}},
        session=session,
    )
    return [d async for d in db.jobs.find({"token": token}, session=session)]


async def _complete(
    db: AsyncDatabase[Doc], ids: list[str], session: AsyncClientSession | None
) -> None:
    await db.jobs.update_many(
        {"_id": {"$in": ids}, "status": "running"}, {"$set": {"status": "done"}}, session=session
    )


async def _check_done(db: AsyncDatabase[Doc], tasks: int, what: str) -> None:
    done = await db.jobs.count_documents({"status": "done"})
    if done != tasks:
        raise RuntimeError(f"{what}: {done} of {tasks} jobs done")


async def raw_update_many(url: str, tasks: int) -> dict[str, float]:
    """The ceiling: claim 100 (designed style) / complete 100 until none is left."""
    client, name, enqueue_s = await _raw_collection(url, tasks)
    db = client[name]
    try:
        started = time.perf_counter()
        while claimed := await _claim_many(db, None):
            await _complete(db, [d["_id"] for d in claimed], None)
        seconds = time.perf_counter() - started
        await _check_done(db, tasks, "raw update_many")
    finally:
        await client.drop_database(name)
        await client.close()
    return {"process_per_s": tasks / seconds, "enqueue_per_s": tasks / enqueue_s}


async def raw_find_one_and_update(url: str, tasks: int, loops: int) -> dict[str, float]:
    """Claim one task per ``find_one_and_update``, ``loops`` loops at once, each
    completing its claims in batches of 100 (and what is left when none is pending)."""
    client, name, _ = await _raw_collection(url, tasks)
    db = client[name]

    async def loop() -> None:
        held: list[str] = []
        while True:
            doc = await db.jobs.find_one_and_update(
                {"status": "pending"},
                {"$set": {"status": "running"}},
                projection={"_id": 1, "params": 1},
                sort=[("priority", DESCENDING), ("seq", ASCENDING)],
                return_document=ReturnDocument.AFTER,
            )
            if doc is not None:
                held.append(doc["_id"])
            if held and (doc is None or len(held) >= BATCH):
                await _complete(db, held, None)
                held = []
            if doc is None:
                return

    try:
        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(loops)))
        seconds = time.perf_counter() - started
        await _check_done(db, tasks, "raw find_one_and_update")
    finally:
        await client.drop_database(name)
        await client.close()
    return {"process_per_s": tasks / seconds}


async def raw_locked(url: str, tasks: int) -> dict[str, float]:
    """The ceiling loop with serializeWrites' cost: each claim and each completion in a
    transaction (opened by a no-op write, as taskmill-mongo opens its own on the
    stand-in) under a writer-lock document taken and freed as taskmill takes its own."""
    client, name, _ = await _raw_collection(url, tasks)
    db = client[name]
    await db.counters.insert_one({"_id": "writer", "owner": None, "until": 0})
    await db.counters.insert_one({"_id": "events", "value": 0})

    async def locked(work: Callable[[AsyncClientSession], Awaitable[list[Doc]]]) -> list[Doc]:
        token = uuid.uuid4().hex
        while True:
            now = int(time.time() * 1e6)
            got = await db.counters.find_one_and_update(
                {"_id": "writer", "$or": [{"owner": None}, {"until": {"$lt": now}}]},
                {"$set": {"owner": token, "until": now + 30_000_000}},
            )
            if got is not None:
                break
            await asyncio.sleep(0.001)
        try:

            async def body(s: AsyncClientSession) -> list[Doc]:
                await db.counters.update_one({"_id": "events"}, {"$inc": {"value": 0}}, session=s)
                return await work(s)

            async with client.start_session() as session:
                return await session.with_transaction(body)
        finally:
            await db.counters.update_one(
                {"_id": "writer", "owner": token}, {"$set": {"owner": None}}
            )

    try:
        started = time.perf_counter()
        while claimed := await locked(lambda s: _claim_many(db, s)):
            ids = [d["_id"] for d in claimed]

            async def complete(s: AsyncClientSession, ids: list[str] = ids) -> list[Doc]:
                await _complete(db, ids, s)
                return []

            await locked(complete)
        seconds = time.perf_counter() - started
        await _check_done(db, tasks, "raw locked")
    finally:
        await client.drop_database(name)
        await client.close()
    return {"process_per_s": tasks / seconds}


# -- taskmill ----------------------------------------------------------------------------


def taskmill_app(url: str) -> Taskmill:
    tm = Taskmill(url, plugins=False)
    tm.register(TASK, noop)

    async def started(ctx: Context, params: dict[str, Any]) -> None:
        sys.stdout.write(f"{params['n']} {time.time():.6f}\n")
        sys.stdout.flush()

    tm.register(STAMP, started)
    return tm


async def enqueue(tm: Taskmill, tasks: int, batch_size: int) -> float:
    started = time.perf_counter()
    for first in range(0, tasks, batch_size):
        await tm.enqueue_many(
            [
                {"task_type": TASK, "params": {"i": i}}
                for i in range(first, min(tasks, first + batch_size))
            ]
        )
    return time.perf_counter() - started


async def drain(tm: Taskmill, tasks: int, setting: str) -> float:
    """Seconds of one worker's ``run_until_idle()`` over ``tasks`` pending no-op tasks;
    checks that every one completed."""
    concurrency, prefetch, window = setting.split(":")
    worker = tm.worker(
        concurrency=int(concurrency),
        prefetch=int(prefetch),
        finish_window=float(window),
        handle_signals=False,
    )
    before = (await tm.progress_summary(TaskFilter(task_types=(TASK,)))).completed
    started = time.perf_counter()
    await worker.run_until_idle()
    seconds = time.perf_counter() - started
    done = (await tm.progress_summary(TaskFilter(task_types=(TASK,)))).completed - before
    if done != tasks or worker.processed != tasks:
        raise RuntimeError(f"taskmill {setting}: {done} of {tasks} completed")
    return seconds


async def taskmill_run(url: str, tasks: int, batch_size: int, setting: str) -> dict[str, float]:
    name = fresh_name("mb_tm")
    try:
        async with taskmill_app(with_database(url, name)) as tm:
            enqueue_s = await enqueue(tm, tasks, batch_size)
            seconds = await drain(tm, tasks, setting)
    finally:
        await drop(url, name)
    return {"process_per_s": tasks / seconds, "enqueue_per_s": tasks / enqueue_s}


# -- Celery (in a throwaway venv) ----------------------------------------------------------


def celery_run(python: str, url: str, tasks: int, concurrency: int, *extra: str) -> dict[str, Any]:
    name = fresh_name("mb_celery")
    try:
        done = subprocess.run(
            [
                python,
                str(BENCH_DIR / "mongo_celery_peer.py"),
                "--url",
                driver_url(with_database(url, name)),
                "--tasks",
                str(tasks),
                "--concurrency",
                str(concurrency),
                *extra,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
    finally:
        asyncio.run(drop(url, name))
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "no output"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def celery_versions(python: str) -> list[str]:
    done = subprocess.run(
        [python, "-c", "import celery, kombu; print(celery.__version__, kombu.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


# -- latency: an idle worker in another process --------------------------------------------


async def serve(url: str, poll: float) -> None:
    """An idle worker until SIGTERM (in the worker process)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with taskmill_app(url) as tm:
        worker = tm.worker(concurrency=10, handle_signals=False, poll_interval=poll)
        running = asyncio.create_task(worker.run())
        print("ready", flush=True)
        await stop.wait()
        await worker.stop()
        await running


async def latencies(
    url: str, samples: int, poll: float, gap: tuple[float, float] = (0.05, 0.15)
) -> list[float]:
    """Milliseconds from just before each enqueue until its handler started, one task at
    a time to an idle worker process polling at most every ``poll`` seconds, with a
    pause drawn from ``gap`` (seconds) between tasks."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        "--serve",
        url,
        "--poll",
        str(poll),
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        if (await proc.stdout.readline()).strip() != b"ready":
            raise RuntimeError("the latency worker did not start")
        await asyncio.sleep(2 * poll + 0.5)  # connected and idle: polling at its slowest
        rng = random.Random(7)
        measured: list[float] = []
        async with taskmill_app(url) as tm:
            for n in range(samples):
                began = time.time()
                await tm.enqueue(STAMP, {"n": n})
                line = await asyncio.wait_for(proc.stdout.readline(), 60)
                marker, at = line.decode().split()
                if marker != str(n):
                    raise RuntimeError(f"expected task {n} to start, got {line!r}")
                measured.append((float(at) - began) * 1000)
                await asyncio.sleep(rng.uniform(*gap))
        return measured
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def summarize_latency(values: list[float]) -> dict[str, float]:
    return {
        "samples": len(values),
        "p50_ms": round(percentile(values, 50), 1),
        "p90_ms": round(percentile(values, 90), 1),
        "p99_ms": round(percentile(values, 99), 1),
        "max_ms": round(max(values), 1),
        "mean_ms": round(statistics.fmean(values), 1),
    }


# -- history: finished tasks in the taskmill layout ------------------------------------------


async def add_history(url: str, count: int, chunk: int = 5000) -> float:
    """Insert ``count`` COMPLETED tasks with one attempt-log document each: copies (new
    id, seq and params) of a task taskmill itself ran and finished. Seconds taken."""
    database = parse_url(url, {}).database
    async with taskmill_app(url) as tm:
        model = await tm.enqueue(TASK, {"i": -1})
        await tm.worker(handle_signals=False).run_until_idle()
    client: AsyncMongoClient[Doc] = AsyncMongoClient(driver_url(url))
    db = client[database]
    try:
        task_doc = await db.tasks.find_one({"_id": model.id})
        attempt_doc = await db.attempts.find_one({"task_id": model.id})
        assert task_doc is not None and attempt_doc is not None
        assert task_doc["status"] == "completed"
        attempt_doc.pop("_id")
        started = time.perf_counter()
        counter = await db.counters.find_one_and_update(
            {"_id": "tasks"}, {"$inc": {"value": count}}, return_document=ReturnDocument.AFTER
        )
        assert counter is not None
        first = int(counter["value"]) - count + 1
        for at in range(0, count, chunk):
            tasks: list[Doc] = []
            attempts: list[Doc] = []
            for i in range(at, min(count, at + chunk)):
                task_id = uuid.uuid4().hex
                tasks.append(
                    {**task_doc, "_id": task_id, "seq": first + i, "params": f'{{"i": {i}}}'}
                )
                attempts.append({**attempt_doc, "task_id": task_id})
            await db.tasks.insert_many(tasks, ordered=False)
            await db.attempts.insert_many(attempts, ordered=False)
        seconds = time.perf_counter() - started
        stored = await db.tasks.count_documents({"status": "completed"})
        if stored < count:
            raise RuntimeError(f"history: {stored} of {count} finished tasks stored")
        return seconds
    finally:
        await client.close()


async def history_phase(args: argparse.Namespace) -> dict[str, Any]:
    """The c10 drain on an empty database and on one holding ``--history`` finished
    tasks, alternating (empty, full, empty, full, ...)."""
    setting = args.history_setting
    full = fresh_name("mb_hist")
    full_url = with_database(args.url, full)
    out: dict[str, Any] = {"setting": setting, "finished_tasks": args.history, "runs": []}
    try:
        async with taskmill_app(full_url):
            pass  # creates the collections and indexes
        out["load_before_fill"] = load_1min()
        out["seconds_to_add_them"] = round(await add_history(full_url, args.history), 1)
        print(f"history: {args.history} finished tasks in {out['seconds_to_add_them']} s")
        for _ in range(args.history_rounds):
            row: dict[str, float] = {"load_before": load_1min()}
            row["empty_per_s"] = (await taskmill_run(args.url, args.tasks, 1000, setting))[
                "process_per_s"
            ]
            async with taskmill_app(full_url) as tm:
                await enqueue(tm, args.tasks, 1000)
                row["with_history_per_s"] = args.tasks / await drain(tm, args.tasks, setting)
            row["ratio"] = row["with_history_per_s"] / row["empty_per_s"]
            print(f"history round: {row}", flush=True)
            out["runs"].append(row)
        out["median_ratio"] = statistics.median(r["ratio"] for r in out["runs"])
    finally:
        await drop(args.url, full)
    return out


# -- round trips: the commands a drain sends -------------------------------------------------


class CommandCounter(monitoring.CommandListener):
    """Counts the commands every client of this process sends, by name."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name = event.command_name
        if name == "findAndModify" and event.command.get("findAndModify") == "counters":
            query = event.command.get("query", {})
            name = f"findAndModify counters {query.get('_id')}"
        elif name == "update" and event.command.get("update") == "counters":
            updates = event.command.get("updates", [{}])
            name = f"update counters {updates[0].get('q', {}).get('_id')}"
        self.counts[name] = self.counts.get(name, 0) + 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        return None

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        return None


async def command_counts(url: str, tasks: int, settings: list[str]) -> dict[str, Any]:
    """The commands one drain sends per task, by name, for each setting."""
    counter = CommandCounter()
    monitoring.register(counter)
    out: dict[str, Any] = {}
    for setting in settings:
        name = fresh_name("mb_cmd")
        try:
            async with taskmill_app(with_database(url, name)) as tm:
                await enqueue(tm, tasks, 1000)
                counter.counts.clear()
                seconds = await drain(tm, tasks, setting)
                counts = dict(counter.counts)
        finally:
            await drop(url, name)
        total = sum(counts.values())
        out[setting] = {
            "tasks": tasks,
            "process_per_s": tasks / seconds,
            "commands": total,
            "commands_per_task": total / tasks,
            "by_name": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
        }
        print(setting, json.dumps(out[setting], indent=2), flush=True)
    return out


# -- the run -----------------------------------------------------------------------------


async def server_details(url: str) -> dict[str, Any]:
    client: AsyncMongoClient[Doc] = AsyncMongoClient(driver_url(url))
    try:
        hello = await client.admin.command("hello")
        info = await client.admin.command("buildInfo")
    finally:
        await client.close()
    return {
        "hello_max_wire_version": hello.get("maxWireVersion"),
        "build_info_version": info.get("version"),
    }


def versions() -> dict[str, str]:
    found = {"pymongo": pymongo.__version__}
    for dist in ("nx-27017", "taskmill", "taskmill-mongo"):
        try:
            found[dist] = version(dist)
        except Exception:  # not installed: say so
            found[dist] = "not installed"
    return found


async def rounds(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for number in range(args.rounds):
        row: dict[str, Any] = {"load_before": load_1min()}
        row["raw_update_many"] = await raw_update_many(args.url, args.tasks)
        row["raw_find_one_and_update"] = await raw_find_one_and_update(
            args.url, args.tasks, args.fou_loops
        )
        row["raw_locked"] = await raw_locked(args.url, args.tasks)
        ceiling = row["raw_update_many"]["process_per_s"]
        for setting in args.setting:
            figures = await taskmill_run(args.url, args.tasks, args.batch_size, setting)
            figures["ratio_to_ceiling"] = figures["process_per_s"] / ceiling
            row[f"taskmill {setting}"] = figures
        if args.celery_python:
            for concurrency in args.celery_concurrency:
                figures = await asyncio.to_thread(
                    celery_run, args.celery_python, args.url, args.celery_tasks, concurrency
                )
                if "process_per_s" in figures:
                    figures["ratio_to_ceiling"] = figures["process_per_s"] / ceiling
                row[f"celery c{concurrency}"] = figures
        row["load_after"] = load_1min()
        out.append(row)
        print(
            f"round {number + 1} (load {row['load_before']}): "
            + "; ".join(
                f"{k} {v['process_per_s']:.0f}/s"
                for k, v in row.items()
                if isinstance(v, dict) and "process_per_s" in v
            ),
            flush=True,
        )
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    if not results:
        return {}
    systems = [k for k, v in results[0].items() if isinstance(v, dict) and "process_per_s" in v]
    summary: dict[str, Any] = {}
    for s in systems:
        runs = [r[s] for r in results if "process_per_s" in r.get(s, {})]
        summary[s] = {
            "median_process_per_s": round(statistics.median(r["process_per_s"] for r in runs)),
            "median_ratio_to_ceiling": round(
                statistics.median(
                    r[s]["process_per_s"] / r["raw_update_many"]["process_per_s"]
                    for r in results
                    if "process_per_s" in r.get(s, {})
                ),
                3,
            ),
        }
        enqueues = [r["enqueue_per_s"] for r in runs if "enqueue_per_s" in r]
        if enqueues:
            summary[s]["median_enqueue_per_s"] = round(statistics.median(enqueues))
    return summary


def code_under_test(label: str) -> dict[str, Any]:
    """The label and the taskmill-mongo package this process imported (its directory:
    the store is split over the package's modules; the record's envelope has the
    commit of the checkout this script is in)."""
    import taskmill_mongo

    return {"label": label, "taskmill_mongo_source": str(Path(taskmill_mongo.__file__).parent)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    record: dict[str, Any] = {
        "benchmark": "mongo-peers",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "url": redact(args.url),
        **code_under_test(args.label),
        "settings": {
            "tasks": args.tasks,
            "celery_tasks": args.celery_tasks,
            "batch_size": args.batch_size,
            "raw_batch": BATCH,
            "fou_loops": args.fou_loops,
            "taskmill_settings": args.setting,
            "celery_concurrency": args.celery_concurrency if args.celery_python else [],
            "rounds": args.rounds,
            "latency_samples": args.latency_samples,
            "latency_polls": [1.0, args.fast_poll],
            "idle_samples": args.idle_samples,
            "history": args.history,
            "history_setting": args.history_setting,
        },
        "versions": versions(),
        "server": await server_details(args.url),
    }
    if args.celery_python:
        celery_v, kombu_v = celery_versions(args.celery_python)
        record["versions"].update(celery=celery_v, kombu=kombu_v)
        # As shipped, without bench/mongo_celery_peer.py's workarounds: its error.
        record["celery_as_shipped"] = await asyncio.to_thread(
            celery_run, args.celery_python, args.url, 10, 10, "--as-shipped"
        )
        print("celery as shipped:", record["celery_as_shipped"], flush=True)
    record["rounds"] = await rounds(args)
    record["summary"] = summarize(record["rounds"])
    if args.latency_samples:
        record["latency"] = {}
        # Pauses of 50-150 ms (as bench/postgres_vs_procrastinate.py), at the default
        # poll_interval and at --fast-poll; then pauses of 2-3 s, long enough for the
        # worker's polling to back off to poll_interval (1 s) between tasks.
        cases = [
            (f"poll_interval_{poll}_gap_0.05-0.15s", args.latency_samples, poll, (0.05, 0.15))
            for poll in (1.0, args.fast_poll)
        ]
        cases.append(("poll_interval_1.0_gap_2-3s", args.idle_samples, 1.0, (2.0, 3.0)))
        for label, samples, poll, gap in cases:
            if not samples:
                continue
            name = fresh_name("mb_lat")
            try:
                before = load_1min()
                values = await latencies(with_database(args.url, name), samples, poll, gap)
            finally:
                await drop(args.url, name)
            record["latency"][label] = {"load_before": before, **summarize_latency(values)}
            print(f"latency, {label}:", record["latency"][label], flush=True)
    if args.history:
        record["history"] = await history_phase(args)
    record["load_at_end"] = load_1min()
    return record


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="mongodb://... (its database is not used)")
    parser.add_argument("--tasks", type=int, default=5_000, help="tasks per run")
    parser.add_argument("--batch-size", type=int, default=1000, help="enqueue_many batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--setting",
        action="append",
        help="taskmill concurrency:prefetch:finish_window (repeatable; default "
        + ", ".join(DEFAULT_SETTINGS)
        + ")",
    )
    parser.add_argument("--fou-loops", type=int, default=1)
    parser.add_argument("--celery-python", help="python of a venv with celery and pymongo")
    parser.add_argument("--celery-tasks", type=int, help="default: --tasks")
    parser.add_argument("--celery-concurrency", type=int, action="append")
    parser.add_argument("--latency-samples", type=int, default=50)
    parser.add_argument("--fast-poll", type=float, default=0.1)
    parser.add_argument("--idle-samples", type=int, default=20, help="latency with 2-3 s pauses")
    parser.add_argument("--history", type=int, default=1_000_000, help="0: skip")
    parser.add_argument("--history-setting", default="10:0:0")
    parser.add_argument("--history-rounds", type=int, default=2)
    parser.add_argument("--results-dir", type=Path, default=BENCH_DIR / "results")
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument(
        "--label",
        default="",
        help="recorded with the results (say, which taskmill-mongo: a run of an older "
        "copy puts it first on PYTHONPATH)",
    )
    parser.add_argument(
        "--count-commands",
        action="store_true",
        help="only count the commands a drain sends per task, at each --setting",
    )
    # The latency worker's mode (the script runs itself).
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.setting = args.setting or DEFAULT_SETTINGS
    args.celery_concurrency = args.celery_concurrency or [10, 100]
    args.celery_tasks = args.celery_tasks or args.tasks
    if not args.url and not args.serve:
        parser.error("--url is needed")
    return args


def main() -> None:
    args = parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.poll))
        return
    if args.count_commands:
        recorder = Recorder(
            "mongo-commands", results_dir=args.results_dir, enabled=not args.no_record
        )
        load, date = load_1min(), now_iso()
        counted: dict[str, Any] = {
            "url": redact(args.url),
            **code_under_test(args.label),
            "versions": versions(),
        }
        figures = {"settings": asyncio.run(command_counts(args.url, args.tasks, args.setting))}
        recorder.record("command counts", figures, params=counted, load=load, date=date)
        recorder.done()
        return
    recorder = Recorder("mongo-peers", results_dir=args.results_dir, enabled=not args.no_record)
    load, date = load_1min(), now_iso()
    record = asyncio.run(bench(args))
    print(json.dumps(record["summary"], indent=2))
    params = {key: record.pop(key) for key in ("url", "settings", "versions", "server")}
    params.update({key: record.pop(key) for key in ("label", "taskmill_mongo_source")})
    record.pop("benchmark", None)
    record.pop("date", None)
    recorder.record("peers", record, params=params, load=load, date=date)
    recorder.done()


if __name__ == "__main__":
    main()
