"""Contract: chains, groups and chords (docs/canvas.md), through a ``Taskmill`` and its
worker on the store under test (the ``edge_taskmill`` fixture of
:class:`~taskmill.testing.edges.EdgeContract`).

A canvas is built of tasks with ``after=`` dependencies, parents and reserved params,
so a store that keeps dependencies (the ``dependencies`` capability) runs every canvas
the same way: results passed on and gathered in order, a failure cancelling what waits
for it, one cancel of the root reaching every task, canvases nested in canvases, and an
errback (``link_error``) run only when its canvas fails.
"""

from __future__ import annotations

from typing import Any

from taskmill import canvas
from taskmill.app import Taskmill
from taskmill.canvas import ERRBACK_INPUT
from taskmill.context import Context
from taskmill.errors import Fail
from taskmill.model import CancelReason, TaskFilter, TaskStatus
from taskmill.testing.capabilities import requires

__all__ = ["CanvasContract"]

_WORKER: dict[str, Any] = {
    "handle_signals": False,
    "min_poll_interval": 0.01,
    "reserved_high_priority_slots": 0,
    "concurrency": 4,
}


def _add(n: int) -> dict[str, Any]:
    return {"task_type": "add", "params": {"n": n}}


def _register(tm: Taskmill, told: list[dict[str, Any]]) -> None:
    """``add`` (its input, or 0, plus ``n``), ``broken`` (fails) and ``notify`` (an
    errback: records the failure it is given)."""

    @tm.handler("add")
    async def add(ctx: Context, params: dict[str, Any]) -> Any:
        given = params.get("input", 0)
        return (sum(given) if isinstance(given, list) else given) + params["n"]

    @tm.handler("broken", max_retries=0)
    async def broken(ctx: Context, params: dict[str, Any]) -> None:
        raise Fail("it broke")

    @tm.handler("notify", max_retries=0)
    async def notify(ctx: Context, params: dict[str, Any]) -> str:
        told.append(params[ERRBACK_INPUT])
        return "told"


async def _drain(tm: Taskmill) -> None:
    await tm.run_worker(until_idle=True, **_WORKER)


class CanvasContract:
    """Chains, groups and chords, flat and nested, on every store with dependencies."""

    @requires("dependencies")
    async def test_a_chain_passes_each_result_on_and_ends_with_the_last(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill
        _register(tm, [])
        chain = await tm.chain(_add(1), _add(10), _add(100), pass_result=True)
        await _drain(tm)
        done = await chain.wait(timeout=30)
        assert (done.status, done.result) == (TaskStatus.COMPLETED, 111)
        assert [t.result for t in [await tm.wait(i, timeout=5) for i in chain.links]] == [
            1,
            11,
            111,
        ]

    @requires("dependencies")
    async def test_a_group_gathers_results_in_order_and_a_chord_calls_back_with_them(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill
        _register(tm, [])
        group = await tm.group([_add(3), _add(1), _add(2)])
        chord = await tm.chord([_add(5), _add(6)], _add(100))
        await _drain(tm)
        assert (await group.wait(timeout=30)).result == [3, 1, 2]
        assert (await chord.wait(timeout=30)).result == 111  # 5 + 6 + 100

    @requires("dependencies")
    async def test_a_failed_link_cancels_the_rest_and_one_cancel_reaches_every_task(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill
        _register(tm, [])
        failing = await tm.chain(_add(1), {"task_type": "broken"}, _add(2))
        await _drain(tm)
        assert (await failing.wait(timeout=30)).status is TaskStatus.CANCELLED
        statuses = [(await tm.wait(i, timeout=5)).status for i in failing.links]
        assert statuses == [TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED]

        waiting = await tm.chain(_add(1), canvas.group([_add(2), _add(3)]), _add(4))
        await waiting.cancel()
        every = await tm.query(TaskFilter(), limit=1000)
        mine = [t for t in every if t.id not in failing.links]
        assert mine and all(t.status is TaskStatus.CANCELLED for t in mine)

    @requires("dependencies")
    async def test_canvases_nest_and_results_flow_through_them(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill
        _register(tm, [])
        nested = await tm.chain(
            _add(1),
            canvas.group([_add(2), canvas.chain(_add(3), _add(4), pass_result=True)]),
            _add(100),
            pass_result=True,
        )
        groups = await tm.group([canvas.chain(_add(1), _add(1), pass_result=True), _add(5)])
        await _drain(tm)
        # 1; the group gets 1: [1 + 2, (1 + 3) + 4] = [3, 8]; then 3 + 8 + 100.
        assert (await nested.wait(timeout=30)).result == 111
        assert (await groups.wait(timeout=30)).result == [2, 5]

    @requires("dependencies")
    async def test_an_errback_runs_only_when_its_canvas_fails(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill
        told: list[dict[str, Any]] = []
        _register(tm, told)
        errback = {"task_type": "notify"}
        failing = await tm.chain(_add(1), {"task_type": "broken"}, link_error=errback)
        fine = await tm.group([_add(1), _add(2)], link_error=errback)
        assert failing.errback is not None and fine.errback is not None
        await _drain(tm)
        ran = await tm.wait(failing.errback, timeout=30)
        assert ran.status is TaskStatus.COMPLETED
        assert [(f["task_id"], f["error"]) for f in told] == [(failing.links[1], "it broke")]
        moot = await tm.wait(fine.errback, timeout=30)
        assert (moot.status, moot.cancel_reason) == (
            TaskStatus.CANCELLED,
            CancelReason.PREEMPTED,
        )
