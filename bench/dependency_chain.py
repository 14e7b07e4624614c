"""A chain of N tasks, each ``after=`` the previous one, run in process by one worker;
against N independent tasks in the same invocation (alternating rounds, chain first).

Each round enqueues its tasks one ``tm.enqueue`` at a time (the chain has to: each task
names the previous id) and times the enqueue and the drain (``run_until_idle``)
separately; it checks that the chain ran in order and that every task COMPLETED. The
figures are the medians over ``--repeat`` rounds, recorded with the machine's load
(``uptime``) in ``bench/results/dependency-chain-<time>-<backend>.json``.

    uv run python bench/dependency_chain.py --backend sqlite --tasks 1000 --repeat 3
    uv run python bench/dependency_chain.py --url postgresql://taskmill:taskmill@127.0.0.1/taskmill
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from taskmill import Context, Taskmill
from taskmill.model import TaskFilter


def uptime() -> str:
    """The machine's load, as ``uptime`` prints it."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


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
    parser.add_argument("--results-dir", type=Path, default=Path(__file__).with_name("results"))
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    targets: list[tuple[str, str]] = [("postgresql", u) for u in args.url]
    for _ in args.backend:
        targets.append(("sqlite", ""))
    if not targets:
        targets.append(("sqlite", ""))
    for name, url in targets:
        rounds: dict[str, list[dict[str, float]]] = {"chain": [], "independent": []}
        load_before = uptime()
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeat):
                for kind in ("chain", "independent"):
                    target = url or f"sqlite:///{tmp}/{kind}-{r}.db"
                    figures = await one_round(
                        target, args.tasks, chain=kind == "chain", concurrency=args.concurrency
                    )
                    rounds[kind].append(figures)
                    print(name, kind, r, json.dumps(figures))
        load_after = uptime()
        medians = {
            kind: {
                key: statistics.median(f[key] for f in found) for key in ("enqueue_s", "drain_s")
            }
            for kind, found in rounds.items()
        }
        for kind, m in medians.items():
            per_s = args.tasks / m["drain_s"]
            print(f"{name} {kind}: enqueue {m['enqueue_s']:.2f} s, drain {m['drain_s']:.2f} s "
                  f"({per_s:.0f} tasks/s)")  # fmt: skip
        if args.no_record:
            continue
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        record = {
            "benchmark": "dependency-chain",
            "backend": name,
            "tasks": args.tasks,
            "repeat": args.repeat,
            "concurrency": args.concurrency,
            "worker": "in process, poll_interval 0.05 s",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "load_before": load_before,
            "load_after": load_after,
            "medians": medians,
            "rounds": rounds,
        }
        args.results_dir.mkdir(parents=True, exist_ok=True)
        path = args.results_dir / f"dependency-chain-{stamp}-{name}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print("recorded", path)


if __name__ == "__main__":
    asyncio.run(main())
