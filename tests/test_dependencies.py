"""Task dependencies through the public API (docs/dependencies.md): ``after=`` and
``after_policy`` on ``enqueue``, ``enqueue_many`` and ``AppTasks`` (on every backend,
through the ``tm`` fixture), and a chain of 1,000
tasks run by a real worker on SQLite and PostgreSQL (100 on MongoDB, whose CI server,
nx-27017, is a slow stand-in), and by three worker processes on PostgreSQL and MongoDB.

The storage semantics themselves are the contract suite's
(:mod:`taskmill.testing.dependencies`), run on every backend.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from taskmill import Context, InvalidTaskSpec, Taskmill, TaskStatus
from taskmill.model import CancelReason, TaskFilter

CHAIN = 1000
MONGO_CHAIN = 100


async def test_after_waits_and_policies_hold_through_the_api(tm: Taskmill) -> None:
    ran: list[str] = []

    @tm.handler("step")
    async def step(ctx: Context, params: dict[str, Any]) -> None:
        ran.append(params["name"])
        if params.get("fail"):
            raise RuntimeError("boom")

    first = await tm.enqueue("step", {"name": "first"})
    second = await tm.enqueue("step", {"name": "second"}, after=[first.id, first.id])
    bad = await tm.enqueue("step", {"name": "bad", "fail": True}, max_retries=0)
    skipped, anyway = await tm.enqueue_many(
        [
            {"task_type": "step", "params": {"name": "skipped"}, "after": [bad.id]},
            {
                "task_type": "step",
                "params": {"name": "anyway"},
                "after": [bad.id, second.id],
                "after_policy": "always",
            },
        ]
    )
    summary = await tm.progress_summary(TaskFilter())
    assert summary.waiting == 3
    await tm.run_worker(until_idle=True, concurrency=4, handle_signals=False)
    assert ran.index("first") < ran.index("second") < ran.index("anyway")
    assert "skipped" not in ran
    cancelled = await tm.get(skipped.id)
    assert cancelled is not None and cancelled.status is TaskStatus.CANCELLED
    assert cancelled.cancel_reason is CancelReason.PREEMPTED
    assert bad.id in (cancelled.error or "")
    done = await tm.get(anyway.id)
    assert done is not None and done.status is TaskStatus.COMPLETED
    assert (await tm.progress_summary(TaskFilter())).waiting == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"after": "not-a-list"}, "list of task ids"),
        ({"after": [""]}, "task ids"),
        ({"after": ["x"], "dedupe_key": "k"}, "dedupe_key"),
        ({"after": [], "after_policy": "sometimes"}, "after_policy"),
        ({"after": ["no-such-task"]}, "does not exist"),
    ],
)
async def test_bad_dependencies_are_refused_storing_nothing(
    options: dict[str, Any], message: str
) -> None:
    async with Taskmill("memory://", plugins=False) as tm:
        with pytest.raises(InvalidTaskSpec, match=message):
            await tm.enqueue("step", **options)
        assert (await tm.progress_summary(TaskFilter())).total == 0


async def test_an_app_cannot_depend_on_another_apps_task(tm: Taskmill) -> None:
    theirs = await tm.for_app("a").enqueue("step")
    mine = tm.for_app("b")
    with pytest.raises(InvalidTaskSpec, match="its own app"):
        await mine.enqueue("step", after=[theirs.id])
    ours = await mine.enqueue("step")
    waiting = await mine.enqueue("step", after=[ours.id])
    assert waiting.app_id == "b"
    assert (await mine.progress_summary()).waiting == 1


async def _run_chain(url: str, links: int = CHAIN) -> None:
    order: list[int] = []
    async with Taskmill(url, plugins=False) as tm:

        @tm.handler("link")
        async def link(ctx: Context, params: dict[str, Any]) -> None:
            order.append(params["n"])

        previous: list[str] = []
        for n in range(links):
            task = await tm.enqueue("link", {"n": n}, after=previous)
            previous = [task.id]
        assert (await tm.progress_summary(TaskFilter())).waiting == links - 1
        # Several slots and a short poll: only the dependencies keep the chain in order.
        await tm.run_worker(
            until_idle=True, concurrency=8, poll_interval=0.05, handle_signals=False
        )
        summary = await tm.progress_summary(TaskFilter())
        assert summary.completed == links, summary
    assert order == list(range(links))


async def test_a_chain_of_1000_runs_in_order_on_sqlite(tmp_path: Path) -> None:
    await _run_chain(f"sqlite:///{tmp_path / 'chain.db'}")


async def test_a_chain_of_1000_runs_in_order_on_postgres(postgres_url: str) -> None:
    await _run_chain(postgres_url)


async def test_a_chain_of_100_runs_in_order_on_mongo(mongo_url: str) -> None:
    await _run_chain(mongo_url, MONGO_CHAIN)


@pytest.mark.slow
async def test_three_postgres_worker_processes_run_a_chain_in_order_once(
    postgres_url: str, tmp_path: Path
) -> None:
    await _run_chain_in_processes(postgres_url, tmp_path, 150)


@pytest.mark.slow
async def test_three_mongo_worker_processes_run_a_chain_in_order_once(
    mongo_url: str, tmp_path: Path
) -> None:
    await _run_chain_in_processes(mongo_url, tmp_path, 60)


async def _run_chain_in_processes(url: str, tmp_path: Path, links: int) -> None:
    from collections import Counter

    from taskmill.testing import wait_until

    from tests.test_multiprocess_sqlite import Cluster, wait_exit

    cluster = Cluster(url, tmp_path / "runs.log")
    try:
        async with Taskmill(url, plugins=False) as tm:
            ids: list[str] = []
            for _ in range(links):
                task = await tm.enqueue("record", after=ids[-1:])
                ids.append(task.id)
            procs = [cluster.start("--concurrency", "4") for _ in range(3)]

            async def all_done() -> bool:
                for proc in procs:
                    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                return (await tm.progress_summary(TaskFilter())).completed == links

            await wait_until(all_done, timeout=180, interval=0.2)
        # Stopped gracefully, not killed mid-transaction (which nx-27017 does not
        # survive cleanly; see the store_url fixture).
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            await asyncio.to_thread(wait_exit, proc, 60)
    finally:
        cluster.close()
    runs = cluster.lines("ran")
    assert [row[0] for row in runs] == ids  # in chain order (O_APPEND log lines)
    assert max(Counter(row[0] for row in runs).values()) == 1
