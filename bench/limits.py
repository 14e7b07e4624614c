"""Claim throughput on PostgreSQL with global limits in place against none, in one run.

Each round enqueues ``--tasks`` tasks of one type, then ``--claimers`` concurrent
claimers (one store, one pool) drain them: ``claim_batch`` of ``--batch`` tasks, then
``finish_batch`` of what was claimed, until nothing is left. Rounds alternate between
no limits and a claim carrying both a rate limit (``--rate``, set high enough not to
bind) and a global concurrency limit (``--global-concurrency``, also not binding), so
the machine's load falls on both alike. The figure is claimed tasks per second of wall
time spent inside ``claim_batch`` calls (summed over the claimers), plus the drain's
wall-clock rate. Every round checks that every task ended COMPLETED with one attempt.
Results are printed and, unless ``--no-record``, every round is recorded (with the
load at its start) in ``bench/results/limits.jsonl``.

    uv run python bench/limits.py --url postgresql://u:p@127.0.0.1/db --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from datetime import timedelta

from harness import Recorder, backend_of, load_1min, now_iso
from taskmill import TaskFilter, Taskmill, TaskStatus
from taskmill.limits import TypeLimit, parse_rate
from taskmill.model import AttemptOutcome
from taskmill.serialization import dumps
from taskmill.storage import (
    ClaimRequest,
    Finish,
    FinishKind,
    HandlerKey,
    Lease,
    NewTask,
    TaskStorage,
    utcnow,
)

TYPE = "bench.limits"


def _new() -> NewTask:
    return NewTask(
        id=str(uuid.uuid4()),
        task_type=TYPE,
        params={},
        params_json="{}",
        app_id=None,
        priority=0,
        max_retries=0,
    )


async def _claimer(
    storage: TaskStorage, request: ClaimRequest, spent: list[float], counts: list[int]
) -> None:
    while True:
        started = time.perf_counter()
        batch = await storage.claim_batch(request)
        spent.append(time.perf_counter() - started)
        if not batch:
            return
        counts.append(len(batch))
        now = utcnow()
        await storage.finish_batch(
            [
                Finish(
                    lease=Lease(t.id, request.worker_id, t.attempts),
                    kind=FinishKind.COMPLETE,
                    outcome=AttemptOutcome.COMPLETED,
                    started_at=t.started_at or now,
                    finished_at=now,
                    result_json=dumps(None),
                )
                for t in batch
            ]
        )


async def _round(tm: Taskmill, args: argparse.Namespace, limited: bool) -> dict[str, float]:
    storage = tm.storage
    await storage.cleanup(
        older_than=timedelta(0),
        statuses=frozenset({TaskStatus.COMPLETED}),
    )
    for start in range(0, args.tasks, 500):
        await storage.enqueue([_new() for _ in range(min(500, args.tasks - start))])
    limits: dict[HandlerKey, TypeLimit] = {}
    if limited:
        limits = {
            (None, TYPE): TypeLimit(rate=parse_rate(args.rate), max_running=args.global_concurrency)
        }
    spent: list[float] = []
    counts: list[int] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(
            _claimer(
                storage,
                ClaimRequest(
                    worker_id=f"bench-{n}",
                    handlers={(None, TYPE): None},
                    limit=args.batch,
                    lease_seconds=60,
                    limits=limits,
                ),
                spent,
                counts,
            )
            for n in range(args.claimers)
        )
    )
    wall = time.perf_counter() - started
    claimed = sum(counts)
    summary = await storage.summary(TaskFilter(task_types=(TYPE,)))
    assert claimed == args.tasks == summary.completed, (claimed, summary)
    return {
        "claimed": claimed,
        "claim_seconds": sum(spent),
        "claims_per_claim_second": claimed / sum(spent),
        "drain_seconds": wall,
        "drained_per_second": claimed / wall,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--claimers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", default="1000000/s")
    parser.add_argument("--global-concurrency", type=int, default=100000)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()

    recorder = Recorder("limits", enabled=not args.no_record)
    params = {k: v for k, v in vars(args).items() if k not in ("url", "no_record")}
    params["backend"] = backend_of(args.url)
    rounds: dict[str, list[dict[str, float]]] = {"none": [], "limits": []}
    async with Taskmill(args.url, plugins=False) as tm:
        await _round(tm, argparse.Namespace(**{**vars(args), "tasks": 200}), False)  # warm-up
        for n in range(args.rounds):
            for name in ("none", "limits") if n % 2 == 0 else ("limits", "none"):
                load, date = load_1min(), now_iso()
                result = await _round(tm, args, name == "limits")
                rounds[name].append(result)
                recorder.record(name, result, params=params, round=n + 1, load=load, date=date)
                print(
                    f"round {n + 1} {name:>6}: {result['claims_per_claim_second']:8.0f} "
                    f"claimed/s in claim_batch, {result['drained_per_second']:7.0f}/s drained"
                )
    medians = {
        name: {
            "claims_per_claim_second": statistics.median(
                r["claims_per_claim_second"] for r in results
            ),
            "drained_per_second": statistics.median(r["drained_per_second"] for r in results),
        }
        for name, results in rounds.items()
    }
    ratio = (
        medians["limits"]["claims_per_claim_second"] / medians["none"]["claims_per_claim_second"]
    )
    drain_ratio = medians["limits"]["drained_per_second"] / medians["none"]["drained_per_second"]
    print(
        f"median: limits/none = {ratio:.2f} (claim_batch), {drain_ratio:.2f} (drain); "
        f"target >= 0.80"
    )
    recorder.done()


if __name__ == "__main__":
    asyncio.run(main())
