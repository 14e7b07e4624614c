"""A chain of N tasks, each ``after=`` the previous one, run in process by one worker;
against N independent tasks in the same invocation (alternating rounds, chain first).

Each round enqueues its tasks one ``tm.enqueue`` at a time (the chain has to: each task
names the previous id) and times the enqueue and the drain (``run_until_idle``)
separately; it checks that the chain ran in order and that every task COMPLETED. The
figures are the medians over ``--repeat`` rounds; every round is recorded, with the load
at its start, in ``bench/results/dependency-chain.jsonl``.

    uv run python bench/dependency_chain.py --backend sqlite --tasks 1000 --repeat 3
    uv run python bench/dependency_chain.py --url postgresql://taskmill:taskmill@127.0.0.1/taskmill
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from harness import RESULTS_DIR, Recorder, load_1min, now_iso, redact
from taskmill import Context, Taskmill
from taskmill.model import TaskFilter


async def one_round(url: str, tasks: int, *, chain: bool, concurrency: int) -> dict[str, float]:
    order: list[int] = []
    task_type = f"link-{uuid.uuid4().hex[:8]}"
    async with Taskmill(url, plugins=False) as tm:

        async def link(ctx: Context, params: dict[str, Any]) -> None:
            order.append(params["n"])

        tm.register(task_type, link)
        started = time.perf_counter()
        previous: list[str] = []
        for n in range(tasks):
            task = await tm.enqueue(task_type, {"n": n}, after=previous)
            if chain:
                previous = [task.id]
        enqueued = time.perf_counter()
        await tm.run_worker(
            until_idle=True, concurrency=concurrency, poll_interval=0.05, handle_signals=False
        )
        drained = time.perf_counter()
        summary = await tm.progress_summary(TaskFilter(task_types=(task_type,)))
        assert summary.completed == tasks, summary
        if chain:
            assert order == list(range(tasks)), "the chain ran out of order"
        await tm.cleanup(timedelta(0))
    return {"enqueue_s": enqueued - started, "drain_s": drained - enqueued}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite"], action="append", default=[])
    parser.add_argument("--url", action="append", default=[])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    recorder = Recorder(
        "dependency-chain", results_dir=args.results_dir, enabled=not args.no_record
    )
    targets: list[tuple[str, str]] = [("postgresql", u) for u in args.url]
    for _ in args.backend:
        targets.append(("sqlite", ""))
    if not targets:
        targets.append(("sqlite", ""))
    for name, url in targets:
        rounds: dict[str, list[dict[str, float]]] = {"chain": [], "independent": []}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeat):
                for kind in ("chain", "independent"):
                    target = url or f"sqlite:///{tmp}/{kind}-{r}.db"
                    load, date = load_1min(), now_iso()
                    figures = await one_round(
                        target, args.tasks, chain=kind == "chain", concurrency=args.concurrency
                    )
                    figures["drain_per_s"] = args.tasks / figures["drain_s"]
                    rounds[kind].append(figures)
                    print(name, kind, r, json.dumps(figures))
                    params = {
                        "backend": name,
                        "url": redact(url) if url else "sqlite:///<fresh file per round>",
                        "tasks": args.tasks,
                        "concurrency": args.concurrency,
                        "worker": "in process, poll_interval 0.05 s",
                    }
                    recorder.record(kind, figures, params=params, round=r + 1, load=load, date=date)
        for kind, found in rounds.items():
            enqueue = statistics.median(f["enqueue_s"] for f in found)
            drain = statistics.median(f["drain_s"] for f in found)
            print(f"{name} {kind}: enqueue {enqueue:.2f} s, drain {drain:.2f} s "
                  f"({args.tasks / drain:.0f} tasks/s)")  # fmt: skip
    recorder.done()


if __name__ == "__main__":
    asyncio.run(main())
