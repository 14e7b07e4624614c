"""Batch handlers (issue 27 item 3, docs/batches.md): one call for many tasks, each
task claimed, leased, cancelled, progressed and finished on its own, on every backend
(the ``tm`` fixture)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from taskmill import (
    BatchOptions,
    CancelReason,
    Context,
    Fail,
    InvalidHandler,
    Retry,
    Taskmill,
    TaskStatus,
)
from taskmill.testing import wait_until

OPTIONS: dict[str, Any] = {
    "handle_signals": False,
    "min_poll_interval": 0.01,
    # Every slot for batches (the slots reserved for high priority are not counted in a
    # batch's size); test_a_full_batch... checks the reserved slot's effect.
    "reserved_high_priority_slots": 0,
}


async def test_a_full_batch_is_one_call_and_each_task_gets_its_own_outcome(tm: Taskmill):
    calls: list[int] = []

    @tm.handler("double", batch=BatchOptions(max_size=50, max_wait=5))
    async def double(batch: list[Context]) -> list[Any]:
        calls.append(len(batch))
        return [ctx.task.params["n"] * 2 for ctx in batch]

    tasks = await tm.enqueue_many([{"task_type": "double", "params": {"n": i}} for i in range(200)])
    started = time.monotonic()
    # 51 slots, one reserved for high priority: 50 for batches, four full ones, each
    # called at once, not after max_wait (5 s).
    worker = tm.worker(concurrency=51, prefetch=0, **{**OPTIONS, "reserved_high_priority_slots": 1})
    await worker.run_until_idle()
    assert time.monotonic() - started < 5
    assert sum(calls) == 200 and max(calls) == 50
    for i, task in enumerate(tasks):
        done = await tm.get(task.id)
        assert done is not None and (done.status, done.result) == (TaskStatus.COMPLETED, i * 2)
        assert [a.outcome.value for a in await tm.attempts(task.id)] == ["completed"]


async def test_a_partial_batch_is_called_after_max_wait(tm: Taskmill):
    sizes: list[int] = []

    @tm.handler("t", batch=BatchOptions(max_size=100, max_wait=0.2))
    async def handle(batch: list[Context]) -> list[None]:
        sizes.append(len(batch))
        return [None] * len(batch)

    await tm.enqueue_many([{"task_type": "t"} for _ in range(3)])
    started = time.monotonic()
    await tm.worker(concurrency=10, **OPTIONS).run_until_idle()
    assert sum(sizes) == 3
    assert time.monotonic() - started >= 0.2


async def test_exceptions_per_task_and_for_the_whole_batch(tm: Taskmill):
    @tm.handler("mixed", batch=BatchOptions(max_size=3, max_wait=5), max_retries=0)
    async def mixed(batch: list[Context]) -> list[Any]:
        outcomes: list[Any] = []
        for ctx in batch:
            kind = ctx.task.params["kind"]
            outcomes.append(
                {"ok": True} if kind == "ok" else Fail("bad address") if kind == "fail" else
                ValueError("boom")
            )  # fmt: skip
        return outcomes

    @tm.handler("broken", batch=BatchOptions(max_size=2, max_wait=5), max_retries=0)
    async def broken(batch: list[Context]) -> list[Any]:
        raise RuntimeError("the SMTP server is down")

    mixed_tasks = await tm.enqueue_many(
        [{"task_type": "mixed", "params": {"kind": k}} for k in ("ok", "fail", "error")]
    )
    broken_tasks = await tm.enqueue_many([{"task_type": "broken"} for _ in range(2)])
    await tm.worker(concurrency=5, **OPTIONS).run_until_idle()
    ok, failed, errored = [await tm.get(t.id) for t in mixed_tasks]
    assert ok is not None and (ok.status, ok.result) == (TaskStatus.COMPLETED, {"ok": True})
    assert failed is not None and failed.status is TaskStatus.FAILED
    assert failed.error is not None and "bad address" in failed.error
    assert errored is not None and errored.status is TaskStatus.FAILED
    assert errored.error is not None and "ValueError: boom" in errored.error
    for task in broken_tasks:
        stored = await tm.get(task.id)
        assert stored is not None and stored.status is TaskStatus.FAILED
        assert stored.error is not None and "the SMTP server is down" in stored.error


async def test_a_retry_outcome_retries_that_task_alone(tm: Taskmill):
    seen: Counter[str] = Counter()

    @tm.handler("flaky", batch=BatchOptions(max_size=2, max_wait=0.05))
    async def flaky(batch: list[Context]) -> list[Any]:
        out: list[Any] = []
        for ctx in batch:
            seen[ctx.task.id] += 1
            first = ctx.task.params["flaky"] and ctx.task.attempts == 1
            out.append(Retry(0, "later") if first else "sent")
        return out

    calm, flaky_task = await tm.enqueue_many(
        [{"task_type": "flaky", "params": {"flaky": f}} for f in (False, True)]
    )
    await tm.worker(concurrency=2, **OPTIONS).run_until_idle()
    assert seen == Counter({calm.id: 1, flaky_task.id: 2})
    for task in (calm, flaky_task):
        stored = await tm.get(task.id)
        assert stored is not None and (stored.status, stored.result) == (
            TaskStatus.COMPLETED,
            "sent",
        )


async def test_a_wrong_number_of_outcomes_fails_the_batch_saying_so(tm: Taskmill):
    @tm.handler("short", batch=BatchOptions(max_size=2, max_wait=5), max_retries=0)
    async def short(batch: list[Context]) -> list[Any]:
        return [1]

    tasks = await tm.enqueue_many([{"task_type": "short"} for _ in range(2)])
    await tm.worker(concurrency=2, **OPTIONS).run_until_idle()
    for task in tasks:
        stored = await tm.get(task.id)
        assert stored is not None and stored.status is TaskStatus.FAILED
        assert stored.error is not None and "returned 1 outcomes for 2 tasks" in stored.error


async def test_progress_is_per_task(tm: Taskmill):
    @tm.handler("p", batch=BatchOptions(max_size=3, max_wait=5))
    async def report(batch: list[Context]) -> list[None]:
        for i, ctx in enumerate(batch):
            await ctx.progress(i + 1, 10, f"item {i}")
        return [None] * len(batch)

    tasks = await tm.enqueue_many([{"task_type": "p"} for _ in range(3)])
    await tm.worker(concurrency=3, **OPTIONS).run_until_idle()
    stored = [await tm.get(t.id) for t in tasks]
    progress = sorted((s.progress.done, s.progress.message) for s in stored if s is not None)
    assert progress == [(1, "item 0"), (2, "item 1"), (3, "item 2")]


async def test_a_cancelled_task_leaves_its_batch_and_the_others_complete(tm: Taskmill):
    release = asyncio.Event()
    checked: dict[str, bool] = {}

    @tm.handler("slow", batch=BatchOptions(max_size=3, max_wait=5))
    async def slow(batch: list[Context]) -> list[str]:
        await release.wait()
        for ctx in batch:
            checked[ctx.task.id] = ctx.cancelled
        return ["done"] * len(batch)

    a, b, c = await tm.enqueue_many([{"task_type": "slow"} for _ in range(3)])
    worker = tm.worker(concurrency=3, cancel_check_interval=0.05, **OPTIONS)
    running = asyncio.create_task(worker.run_until_idle())

    async def all_running() -> bool:
        stored = [await tm.get(t.id) for t in (a, b, c)]
        return all(s is not None and s.status is TaskStatus.RUNNING for s in stored)

    await wait_until(all_running, timeout=20)
    await tm.cancel(b.id, reason=CancelReason.USER)

    async def b_interrupted() -> bool:
        return worker.held == 2  # b's attempt ended (and was written); a and c wait

    await wait_until(b_interrupted, timeout=20)
    release.set()
    await running
    assert checked[b.id] is True and checked[a.id] is False
    for task, status in (
        (a, TaskStatus.COMPLETED),
        (b, TaskStatus.CANCELLED),
        (c, TaskStatus.COMPLETED),
    ):
        stored = await tm.get(task.id)
        assert stored is not None and stored.status is status


async def test_a_sync_batch_handler_runs_on_a_thread(tm: Taskmill):
    @tm.handler("sync", batch=BatchOptions(max_size=4, max_wait=5))
    def sync(batch: list[Context]) -> list[int]:
        time.sleep(0.01)
        return [len(batch)] * len(batch)

    tasks = await tm.enqueue_many([{"task_type": "sync"} for _ in range(4)])
    await tm.worker(concurrency=4, **OPTIONS).run_until_idle()
    assert {(await tm.get(t.id)).result for t in tasks} == {4}  # type: ignore[union-attr]


async def test_a_timeout_applies_to_the_call(tm: Taskmill):
    @tm.handler("stuck", batch=BatchOptions(max_size=2, max_wait=5), timeout=0.2, max_retries=0)
    async def stuck(batch: list[Context]) -> list[None]:
        await asyncio.sleep(30)
        return [None] * len(batch)

    tasks = await tm.enqueue_many([{"task_type": "stuck"} for _ in range(2)])
    started = time.monotonic()
    await tm.worker(concurrency=2, **OPTIONS).run_until_idle()
    assert time.monotonic() - started < 20
    for task in tasks:
        stored = await tm.get(task.id)
        assert stored is not None and stored.status is TaskStatus.FAILED
        assert stored.error is not None and "timed out" in stored.error


@pytest.mark.parametrize("backend_url", ["memory"], indirect=True)
async def test_registration_refuses_a_handler_that_cannot_take_a_batch(tm: Taskmill):
    async def two(ctx: Context, params: dict[str, Any]) -> None:
        return None

    with pytest.raises(InvalidHandler, match="must take one argument, \\(batch\\)"):
        tm.register("two", two, batch=BatchOptions())
    with pytest.raises(ValueError, match="max_size must be a whole number from 1"):
        BatchOptions(max_size=0)
    with pytest.raises(ValueError, match="max_wait must be seconds"):
        BatchOptions(max_wait=-1)


def test_the_documented_example_runs(tmp_path: Path) -> None:
    """docs/batches.md's example, run as a user would, in a directory of its own."""
    docs = (Path(__file__).parent.parent / "docs" / "batches.md").read_text()
    match = re.search(r"```python\n(.*?)```", docs, re.S)
    assert match is not None
    (tmp_path / "example.py").write_text(match.group(1))
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000"]
    assert "not a path: 'http://x'" in done.stderr
