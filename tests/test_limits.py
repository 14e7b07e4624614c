"""Declaring global limits: parsing, clear errors, and what a worker's claim carries."""

from __future__ import annotations

import asyncio

import pytest
from taskmill import Context, InvalidLimit, TaskFilter, Taskmill, TaskmillError
from taskmill.limits import Bucket, Rate, TypeLimit, limited_caps, parse_rate, refill


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("100/s", 100, 1.0), ("30/min", 30, 60.0), ("5/h", 5, 3600.0), (" 7 / sec ", 7, 1.0)],
)
def test_rate_strings_parse(text: str, count: int, period: float) -> None:
    assert parse_rate(text) == Rate(count=count, period=period)


@pytest.mark.parametrize("text", ["", "100", "0/s", "-1/s", "1.5/s", "10/day", "ten/s", "10/S"])
def test_bad_rate_strings_get_a_clear_error(text: str) -> None:
    with pytest.raises(InvalidLimit, match='"100/s", "30/min" or "5/h"'):
        parse_rate(text)


async def test_the_decorator_refuses_bad_limits_at_registration(tmp_path) -> None:
    tm = Taskmill(f"sqlite:///{tmp_path / 't.db'}", plugins=False)

    async def handler(ctx: Context, params: dict) -> None:
        return None

    with pytest.raises(TaskmillError, match="rate_limit 'fast' is not understood"):
        tm.handler("a", rate_limit="fast")(handler)
    with pytest.raises(InvalidLimit, match="global_concurrency must be a whole number >= 1"):
        tm.register("b", handler, global_concurrency=0)
    assert [h.task_type for h in tm.registry] == []
    record = tm.register("c", handler, rate_limit="10/min", global_concurrency=2)
    assert record.limit == TypeLimit(rate=Rate(10, 60.0), max_running=2)
    assert tm.register("d", handler).limit is None


def test_bucket_refills_continuously_up_to_one_period() -> None:
    rate = Rate(10, 1.0)
    assert refill(None, rate, 5.0) == 10.0
    assert refill(Bucket(0.0, 100.0), rate, 100.25) == pytest.approx(2.5)
    assert refill(Bucket(3.0, 100.0), rate, 200.0) == 10.0
    assert refill(Bucket(3.0, 100.0), rate, 99.0) == 3.0  # a clock behind never refills


def test_caps_take_the_tightest_of_handler_cap_tokens_and_free_slots() -> None:
    handlers = {(None, "a"): None, (None, "b"): 4, ("x", "a"): None}
    limits = {
        (None, "a"): TypeLimit(rate=Rate(10, 1.0)),
        (None, "b"): TypeLimit(max_running=3),
        ("x", "a"): TypeLimit(rate=Rate(10, 1.0), max_running=5),
    }
    caps = limited_caps(
        handlers,
        limits,
        tokens={(None, "a"): 2.99, ("x", "a"): 9.0},
        running={(None, "b"): 1, ("x", "a"): 5},
    )
    assert caps == {(None, "a"): 2, (None, "b"): 2, ("x", "a"): 0}


async def test_a_worker_claims_within_the_global_limits_on_every_backend(tm: Taskmill) -> None:
    """Through the API on each backend (``tm``): one claim batch of a worker with free
    slots takes only what the limits allow, and a spent bucket takes nothing more."""
    running = 0
    peak = 0

    @tm.handler("capped", global_concurrency=2)
    async def capped(ctx: Context, params: dict) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1

    @tm.handler("rated", rate_limit="3/h")
    async def rated(ctx: Context, params: dict) -> None:
        return None

    await tm.enqueue_many([{"task_type": "capped"} for _ in range(5)])
    worker = tm.worker(concurrency=8, task_types=["capped"])
    assert [await worker.tick() for _ in range(3)] == [2, 2, 1]
    assert peak <= 2
    await tm.enqueue_many([{"task_type": "rated"} for _ in range(5)])
    worker = tm.worker(concurrency=8, task_types=["rated"])
    assert [await worker.tick(), await worker.tick()] == [3, 0]
    summary = await tm.progress_summary(TaskFilter(task_types=("rated",)))
    assert (summary.completed, summary.pending) == (3, 2)
