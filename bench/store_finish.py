"""The store's finish alone: keep mode against delete mode, on SQLite (or any URL).

Each measurement enqueues ``--tasks`` tasks into a fresh store (a new SQLite file; on a
server URL, the store the URL names, which must be disposable), claims them all, then
times ``finish_batch_applied`` of COMPLETE finishes in batches of ``--batch`` (a
worker's finish writer sends at most 128 on SQLite), with ``Finish.delete`` false
(keep mode: the row updated, its attempt logged) or true (delete mode: the tombstone
written, the row deleted). No worker runs: this is the store's cost per finish.
Rounds alternate the two modes; every measurement is a record of
``bench/results/store-finish.jsonl``. See docs/retention.md ("What it costs").

    uv run python bench/store_finish.py
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import harness
from harness import Measurement, Recorder
from taskmill.discovery import storage_for_url
from taskmill.model import AttemptOutcome, Task
from taskmill.storage import ClaimRequest, Finish, FinishKind, Lease, NewTask, utcnow


async def finish_rate(url: str, tasks: int, batch: int, delete: bool) -> dict[str, Any]:
    """Finishes per second of ``tasks`` claimed tasks, ``batch`` per call."""
    storage = storage_for_url(url)
    await storage.open(auto_migrate=True)
    try:
        task_type = f"finish_{uuid.uuid4().hex[:8]}"
        new = [
            NewTask(
                id=str(uuid.uuid4()), task_type=task_type, params={}, params_json="{}",
                app_id=None, priority=0, max_retries=3,
            )
            for _ in range(tasks)
        ]  # fmt: skip
        for first in range(0, tasks, 1000):
            await storage.enqueue(new[first : first + 1000])
        claimed: list[Task] = []
        request = ClaimRequest(
            worker_id="bench", handlers={(None, task_type): None}, limit=1000, lease_seconds=600
        )
        while len(claimed) < tasks:
            claimed += await storage.claim_batch(request)
        now = utcnow()
        finishes = [
            Finish(
                lease=Lease(task_id=t.id, worker_id="bench", attempt=t.attempts),
                kind=FinishKind.COMPLETE,
                outcome=AttemptOutcome.COMPLETED,
                started_at=now,
                finished_at=now,
                result_json="null",
                delete=delete,
            )
            for t in claimed
        ]
        started = time.perf_counter()
        for first in range(0, tasks, batch):
            applied = await storage.finish_batch_applied(finishes[first : first + batch])
            if not all(applied):
                raise RuntimeError("a finish was not applied: the store is not disposable")
        seconds = time.perf_counter() - started
    finally:
        await storage.close()
    return {"finishes_per_s": round(tasks / seconds, 1), "seconds": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="a disposable store (default: a fresh SQLite file)")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    recorder = Recorder("store-finish", enabled=not args.no_record)
    scratch = Path(tempfile.mkdtemp(prefix="taskmill-finish-"))

    def measurement(delete: bool) -> Measurement:
        async def run() -> dict[str, Any]:
            url = args.url or f"sqlite:///{scratch / (uuid.uuid4().hex + '.db')}"
            return await finish_rate(url, args.tasks, args.batch, delete)

        mode = "delete" if delete else "keep"
        return Measurement(
            mode,
            run,
            {"backend": harness.backend_of(args.url or "sqlite://"), "tasks": args.tasks,
             "batch": args.batch, "mode": mode},
        )  # fmt: skip

    records = asyncio.run(
        harness.alternate(recorder, args.rounds, [measurement(False), measurement(True)])
    )
    for name, rows in records.items():
        rate = harness.median_of(rows, "finishes_per_s")
        print(f"{name}: median {rate:,.0f} finishes/s")
    recorder.done()
    for leftover in scratch.iterdir():
        leftover.unlink()
    scratch.rmdir()


if __name__ == "__main__":
    main()
