"""A real worker process for the multi-process tests.

Handlers append one line per event to the ``--log`` file (``O_APPEND`` writes of a short
line are atomic), so the test can count exactly how often each handler ran, and where.

    python tests/worker_process.py --url sqlite:///x.db --log runs.log [--until-idle]
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from taskmill import Cancelled, Context, Taskmill
from taskmill.periodic import Schedule


def record(log: Path, *fields: object) -> None:
    line = " ".join(str(f) for f in fields) + "\n"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def build(
    url: str, log: Path, *, rate_limit: str | None = None, global_concurrency: int | None = None
) -> Taskmill:
    tm = Taskmill(url, plugins=False)
    pid = os.getpid()

    if rate_limit is not None:

        @tm.handler("rated", rate_limit=rate_limit)
        async def rated(ctx: Context, params: dict) -> int:
            record(log, "rated", ctx.task.id, pid, time.time())
            return pid

    if global_concurrency is not None:

        @tm.handler("capped", global_concurrency=global_concurrency)
        async def capped(ctx: Context, params: dict) -> int:
            record(log, "capped-start", ctx.task.id, pid, time.time())
            await asyncio.sleep(params.get("sleep", 0))
            record(log, "capped-end", ctx.task.id, pid, time.time())
            return pid

    @tm.handler("record")
    async def record_run(ctx: Context, params: dict) -> int:
        record(log, "ran", ctx.task.id, pid, ctx.task.attempts)
        await asyncio.sleep(params.get("sleep", 0))
        return pid

    @tm.handler("block-first")
    async def block_first(ctx: Context, params: dict) -> int:
        record(log, "started", ctx.task.id, pid, ctx.task.attempts)
        if ctx.task.attempts == 1:
            await asyncio.sleep(3600)  # the test kills this process meanwhile
        record(log, "ran", ctx.task.id, pid, ctx.task.attempts)
        return pid

    @tm.handler("steps")
    async def steps(ctx: Context, params: dict) -> int:
        record(log, "started", ctx.task.id, pid, ctx.task.attempts)
        try:
            for i in range(params["steps"]):
                ctx.check_cancelled()
                await asyncio.sleep(params.get("step_seconds", 0.1))
                await ctx.progress(i + 1, params["steps"])
        except (Cancelled, asyncio.CancelledError):
            record(log, "stopped", ctx.task.id, pid, ctx.task.attempts)
            raise
        record(log, "ran", ctx.task.id, pid, ctx.task.attempts)
        return pid

    @tm.handler("tick")
    async def tick(ctx: Context, params: dict) -> int:
        run_at = ctx.task.run_at.timestamp()
        record(log, "fired", ctx.task.id, pid, ctx.task.attempts, params["schedule"], run_at)
        return pid

    return tm


def add_schedules(tm: Taskmill, specs: list[str]) -> None:
    """``NAME:SECONDS`` each: a schedule firing ``tick`` every SECONDS (catch up latest)."""
    for spec in specs:
        name, seconds = spec.split(":")
        tm.add_schedule(
            Schedule(
                name,
                "tick",
                every=timedelta(seconds=int(seconds)),
                params={"schedule": name},
                catch_up="latest",
            )
        )


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--until-idle", action="store_true")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--rescue-interval", type=float, default=None)
    parser.add_argument("--shutdown-grace", type=float, default=30.0)
    parser.add_argument("--cancel-check-interval", type=float, default=0.5)
    # Long poll intervals leave only the store's notifications to explain a fast start.
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument("--min-poll-interval", type=float, default=0.01)
    parser.add_argument(
        "--barrier",
        type=Path,
        default=None,
        help="directory: wait until --parties processes are ready",
    )
    parser.add_argument("--parties", type=int, default=1)
    parser.add_argument(
        "--schedule",
        action="append",
        default=[],
        metavar="NAME:SECONDS",
        help="fire the tick handler every SECONDS (the worker runs the scheduler)",
    )
    # The limited handlers (rated, capped) exist only when asked for: every claim of a
    # worker with limited handlers writes their rate buckets, which the tests that do
    # not exercise limits need not pay for (nor could a store without global limits
    # serve them).
    parser.add_argument("--rate-limit", default=None)
    parser.add_argument("--global-concurrency", type=int, default=None)
    args = parser.parse_args(argv)

    tm = build(
        args.url,
        args.log,
        rate_limit=args.rate_limit,
        global_concurrency=args.global_concurrency,
    )
    add_schedules(tm, args.schedule)
    async with tm:
        if args.barrier is not None:
            (args.barrier / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(args.barrier.iterdir())) < args.parties:
                if time.monotonic() > deadline:
                    raise SystemExit("barrier timed out")
                await asyncio.sleep(0.01)
        record(args.log, "worker-ready", "-", os.getpid(), 0)
        worker = tm.worker(
            concurrency=args.concurrency,
            reserved_high_priority_slots=0,
            lease_seconds=args.lease,
            rescue_interval=args.rescue_interval,
            shutdown_grace=args.shutdown_grace,
            cancel_check_interval=args.cancel_check_interval,
            min_poll_interval=args.min_poll_interval,
            poll_interval=args.poll_interval,
        )
        if args.until_idle:
            await worker.run_until_idle()
        else:
            await worker.run()
        record(args.log, "worker-stopped", "-", os.getpid(), worker.processed)


if __name__ == "__main__":
    faulthandler.enable()  # a test that gives up on this process sends SIGABRT: stacks
    asyncio.run(main(sys.argv[1:]))
