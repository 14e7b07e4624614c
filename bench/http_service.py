"""The service under load: ``taskmill serve`` in a process of its own, clients here.

- ``post``: ``--clients`` concurrent clients (50) each POST /v1/tasks one task at a
  time, ``--requests`` in all: requests/s and p50/p99 latency.
- ``batch``: POST /v1/tasks:batch with ``--batch-size`` (1000) tasks per request from a
  few concurrent clients: tasks/s.
- ``fanout``: ``--subscribers`` (100) event streams open on GET /v1/events; tasks are
  enqueued in this process (another ``Taskmill`` on the store) one at a time, and for
  every subscriber and event the delay from the enqueue's commit (when the call
  returned) to the event's arrival is measured: p50/p99/max.

- ``--client node`` (``post`` only): the load comes from ``bench/http_node_client.mjs``
  (Node's ``fetch``, keep-alive), as an app in another language would send it, after
  ``--sequential`` lone creates from one client; with ``--handler`` that script also
  serves the task type as an HTTP handler (200 ``null``), registered with ``PUT
  /v1/handlers``, so the service's ``--worker`` runs every task created (the realistic
  setting: service and worker in one process), and it reports when the last ran.

    uv run python bench/http_service.py --mode post --url sqlite:///... (or postgresql://)
    uv run python bench/http_service.py --mode post --client node --worker --handler \
        --clients 32 --requests 5000 --sequential 500 --url postgresql://...

On PostgreSQL each run gets a schema of its own (``bench_http_<hex>``), dropped after, as
a SQLite run gets a fresh file. Results are printed and recorded in
``bench/results/http-service.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from harness import PostgresSchemas, Recorder, is_postgres, load_1min, now_iso, redact
from taskmill import Taskmill

TOKEN = "bench-token"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Service:
    """``taskmill serve`` on a free port, in a process of its own."""

    def __init__(self, url: str, workdir: Path, worker: bool = False) -> None:
        tokens = workdir / "tokens.toml"
        tokens.write_text(f'[tokens]\n"{TOKEN}" = "bench"\n')
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from taskmill.cli import main; sys.exit(main())",
                "serve",
                "--url",
                url,
                "--port",
                str(self.port),
                "--tokens",
                str(tokens),
                "--log-level",
                "warning",
                *(["--worker"] if worker else []),
            ],
            env={**os.environ, "TASKMILL_ENABLE_PLUGINS": "http"},
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.base}/openapi.json").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("taskmill serve did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


class Connection:
    """A keep-alive HTTP/1.1 connection on raw asyncio streams: a load generator whose
    own cost stays small beside the service's (httpx's pool costs more than the service
    at 50 concurrent clients)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def bench_post(port: int, clients: int, requests: int) -> dict[str, Any]:
    latencies: list[float] = []
    remaining = requests
    connections = [await Connection.open(port) for _ in range(clients)]

    async def client(connection: Connection, n: int) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            body = json.dumps({"task_type": "bench-post", "params": {"n": n}}).encode()
            began = time.perf_counter()
            status, answer = await connection.post("/v1/tasks", body)
            latencies.append(time.perf_counter() - began)
            assert status == 201, answer

    began = time.perf_counter()
    await asyncio.gather(*(client(c, i) for i, c in enumerate(connections)))
    elapsed = time.perf_counter() - began
    for connection in connections:
        connection.close()
    return {
        "requests": requests,
        "clients": clients,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(requests / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
    }


async def bench_batch(base: str, clients: int, batches: int, size: int) -> dict[str, Any]:
    remaining = batches
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    body = json.dumps([{"task_type": "bench-batch", "params": {"n": i}} for i in range(size)])
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:

        async def client() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                response = await http.post("/v1/tasks:batch", content=body, headers=headers)
                assert response.status_code == 201, response.text[:300]

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    tasks = batches * size
    return {
        "tasks": tasks,
        "batch_size": size,
        "clients": clients,
        "seconds": round(elapsed, 3),
        "tasks_per_s": round(tasks / elapsed, 1),
    }


async def subscriber(
    port: int, ready: asyncio.Event, arrivals: dict[str, list[float]], opened: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    await writer.drain()
    opened.append(1)
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"data: "):
                text = line[6:]
                if b'"kind":"enqueued"' in text:
                    task_id = json.loads(text)["task"]["id"]
                    arrivals.setdefault(task_id, []).append(time.perf_counter())
            if line.startswith(b"event: ready"):
                ready.set()
    finally:
        writer.close()


async def bench_fanout(url: str, port: int, subscribers: int, events: int) -> dict[str, Any]:
    arrivals: dict[str, list[float]] = {}
    opened: list[int] = []
    readies = [asyncio.Event() for _ in range(subscribers)]
    readers = [asyncio.create_task(subscriber(port, ready, arrivals, opened)) for ready in readies]
    await asyncio.gather(*(r.wait() for r in readies))
    committed: dict[str, float] = {}
    async with Taskmill(url, plugins=False) as tm:
        bench = tm.for_app("bench")
        for i in range(events):
            task = await bench.enqueue("bench-fanout", {"i": i})
            committed[task.id] = time.perf_counter()
            await asyncio.sleep(0.02)
        deadline = time.monotonic() + 30
        while sum(len(v) for v in arrivals.values()) < subscribers * events:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    delays = [
        (at - committed[task_id]) * 1000
        for task_id, times in arrivals.items()
        if task_id in committed
        for at in times
    ]
    return {
        "subscribers": subscribers,
        "events": events,
        "deliveries": len(delays),
        "expected_deliveries": subscribers * events,
        "p50_ms": round(percentile(delays, 50), 2),
        "p99_ms": round(percentile(delays, 99), 2),
        "max_ms": round(max(delays), 2),
        "mean_ms": round(statistics.fmean(delays), 2),
    }


def backend_of(url: str) -> str:
    return url.split(":", 1)[0]


NODE_CLIENT = Path(__file__).with_name("http_node_client.mjs")


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that ended)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def local_postgres() -> list[int]:
    """The pids of this machine's PostgreSQL processes (server and backends)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def bench_node(base: str, args: argparse.Namespace, service_pid: int) -> dict[str, Any]:
    """The ``post`` load from Node (``http_node_client.mjs``): its JSON report, with the
    CPU seconds the service process and (on a local PostgreSQL) the server spent
    meanwhile (backends that ended during the run are not counted)."""
    node = shutil.which("node")
    if node is None:
        raise SystemExit("--client node needs `node` (18 or newer) on PATH")
    command = [
        node, str(NODE_CLIENT), "--base", base, "--token", TOKEN,
        "--clients", str(args.clients), "--requests", str(args.requests),
        "--task-type", "bench-post", "--sequential", str(args.sequential),
        *(["--handler"] if args.handler else []),
        *(["--fetch"] if args.fetch else []),
    ]  # fmt: skip
    postgres = local_postgres() if args.url and args.url.startswith("postgres") else []
    service_before, postgres_before = cpu_seconds([service_pid]), cpu_seconds(postgres)
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the Node client failed ({done.returncode}):\n{done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    report["service_cpu_s"] = round(cpu_seconds([service_pid]) - service_before, 2)
    if postgres:
        report["postgres_cpu_s"] = round(cpu_seconds(local_postgres()) - postgres_before, 2)
    return report


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        # A PostgreSQL run gets a schema of its own, dropped after, as a SQLite run gets
        # a fresh file: the rows and dead tuples of earlier runs (and the autovacuum
        # they start) do not weigh on this one.
        schemas = PostgresSchemas(url, prefix="bench_http") if is_postgres(url) else None
        schema = None
        if schemas is not None:
            url, schema = schemas.url()
        try:
            # A fresh store (a new SQLite file, a new schema) goes with its tasks.
            return await run_in(url, tmp, args, clean_up=bool(args.url) and schemas is None)
        finally:
            if schemas is not None and schema is not None:
                await schemas.drop(schema)


async def run_in(url: str, tmp: str, args: argparse.Namespace, *, clean_up: bool) -> dict[str, Any]:
    """One measurement on the store at ``url``, with ``tmp`` for the service's files;
    with ``clean_up`` (a store shared with other runs) its tasks are removed after."""
    async with Taskmill(url, plugins=False):
        pass  # create the schema before the service opens it
    service = Service(url, Path(tmp), worker=args.worker)
    try:
        if args.mode == "post" and args.client == "node":
            result = await asyncio.to_thread(bench_node, service.base, args, service.process.pid)
        elif args.mode == "post":
            result = await bench_post(service.port, args.clients, args.requests)
        elif args.mode == "batch":
            result = await bench_batch(
                service.base, args.batch_clients, args.batches, args.batch_size
            )
        else:
            result = await bench_fanout(url, service.port, args.subscribers, args.events)
    finally:
        service.stop()
    if clean_up:
        async with Taskmill(url, plugins=False) as tm:
            from taskmill import TaskFilter

            for task_type in ("bench-post", "bench-batch", "bench-fanout"):
                await tm.cancel_by_filter(TaskFilter(task_types=(task_type,)))
            await tm.cleanup(__import__("datetime").timedelta(0))
    return {"mode": args.mode, "backend": backend_of(url), **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["post", "batch", "fanout"], default="post")
    parser.add_argument("--url", default=None, help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--batch-clients", type=int, default=2)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument(
        "--worker",
        action="store_true",
        help="taskmill serve --worker: a worker in the service's process (idle unless "
        "--handler registers one for the bench's task type)",
    )
    parser.add_argument("--client", choices=["python", "node"], default="python")
    parser.add_argument(
        "--handler",
        action="store_true",
        help="--client node: serve the task type as an HTTP handler the worker calls",
    )
    parser.add_argument(
        "--sequential", type=int, default=0, help="--client node: lone creates first"
    )
    parser.add_argument(
        "--fetch", action="store_true", help="--client node: fetch() instead of node:http"
    )
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if (args.handler or args.sequential or args.fetch) and args.client != "node":
        parser.error("--handler, --sequential and --fetch go with --client node")
    recorder = Recorder("http-service", enabled=not args.no_record)
    load, date = load_1min(), now_iso()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    params = {
        key: value for key, value in vars(args).items() if key != "no_record" and value is not None
    }
    params["url"] = redact(args.url) if args.url else "sqlite:///<fresh file>"
    if args.url and is_postgres(args.url):
        params["schema"] = "fresh per run (bench_http_<hex>), dropped after"
    params["backend"] = result.pop("backend")
    recorder.record(args.mode, result, params=params, load=load, date=date)
    recorder.done()


if __name__ == "__main__":
    main()
