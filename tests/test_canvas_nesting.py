"""Nested canvases and errbacks (docs/canvas.md "Nesting" and "link_error"): a chain
whose steps are groups and chords, groups and chords of chains, and ``link_error``, on
every backend through the ``tm`` fixture (a few tasks each), with the cancel of the
whole and the completion of a nested canvas whose creator died half-way; then the
API's refusals and limits on the memory store.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from taskmill import (
    CancelReason,
    Chain,
    Chord,
    Context,
    Fail,
    Group,
    InvalidTaskSpec,
    TaskFilter,
    Taskmill,
    TaskSpec,
    TaskStatus,
    canvas,
)
from taskmill.canvas import (
    CANVAS_KEY,
    ERRBACK_INPUT,
    GROUP_TYPE,
    MAX_DEPTH,
    MAX_TASKS,
    ChainSpec,
    GroupSpec,
    errback_id,
)
from taskmill.canvas_plan import plan_chain
from taskmill.testing import wait_until

from tests.test_canvas import OPTIONS, add, register_add, run_until_idle, stored

pytest_plugins = ("tests.cli_fixtures",)  # the cli and url fixtures


def register_errback(tm: Taskmill, seen: list[dict[str, Any]], *, fails: bool = False) -> None:
    """``notify``: records the params it got (the failure under ``"failure"``)."""

    @tm.handler("notify", max_retries=0)
    async def notify(ctx: Context, params: dict[str, Any]) -> str:
        seen.append(params)
        if fails:
            raise Fail("the errback broke too")
        return f"told about {params[ERRBACK_INPUT]['task_id']}"


def register_total(tm: Taskmill) -> None:
    """``total``: the sum of its input (a list, nested lists flattened) plus ``n``."""

    def flat(value: Any) -> int:
        return sum(flat(v) for v in value) if isinstance(value, list) else int(value)

    @tm.handler("total")
    async def total(ctx: Context, params: dict[str, Any]) -> int:
        return flat(params.get("input", 0)) + int(params.get("n", 0))


async def _true(value: bool) -> bool:
    return value


# -- on every backend ---------------------------------------------------------------


async def test_a_chain_through_a_group_passes_results_in_and_out(tm: Taskmill) -> None:
    seen: list[dict[str, Any]] = []
    register_add(tm, seen)
    register_total(tm)
    # add 1 -> group [add 10, chain(add 100 -> add 1000)] -> total: Celery's
    # chain(a, group(b, chain(c, d)), e).
    inner = canvas.chain(add(100), add(1000), pass_result=True)
    flow = await tm.chain(
        add(1), canvas.group([add(10), inner]), {"task_type": "total"}, pass_result=True
    )
    assert isinstance(flow, Chain) and len(flow.links) == 3
    first, group_root, _ = flow.links
    # Stored at once: the group's root is a child of the chain's root, its members
    # children of the group's root, and the inner chain's first link a child of its
    # last.
    root_group = await stored(tm, group_root)
    assert root_group.task_type == GROUP_TYPE and root_group.parent_id == flow.id
    members = await tm.query(TaskFilter(parent_id=group_root))
    assert len(members) == 2 and {t.task_type for t in members} == {"add"}
    chained = [t for t in members if t.params.get("n") == 1000]
    assert len(chained) == 1
    (inner_first,) = await tm.query(TaskFilter(parent_id=chained[0].id))
    assert inner_first.params["n"] == 100
    assert (await stored(tm, first)).parent_id == flow.id

    await run_until_idle(tm)

    ended = await flow.wait(timeout=10)
    # [1 + 10, (1 + 100) + 1000] = [11, 1101]; total = 1112
    assert ended.status is TaskStatus.COMPLETED and ended.result == 1112
    assert (await tm.wait(group_root, timeout=0)).result == [11, 1101]
    # Each member of the group got the first step's result; the inner chain passed on.
    assert sorted(p.get("input", 0) for p in seen if p["n"] in (10, 100)) == [1, 1]
    assert [p["input"] for p in seen if p["n"] == 1000] == [101]


async def test_groups_and_chords_of_chains_end_with_their_results_in_order(
    tm: Taskmill,
) -> None:
    register_add(tm)
    register_total(tm)
    group = await tm.group(
        [canvas.chain(add(1), add(2), pass_result=True), add(5), canvas.group([add(6), add(7)])]
    )
    chord = await tm.chord(
        [
            canvas.chain(add(1), add(2), pass_result=True),
            canvas.chord([add(3)], {"task_type": "total", "params": {"n": 4}}),
        ],
        {"task_type": "total"},
    )
    assert isinstance(group, Group) and isinstance(chord, Chord)
    await run_until_idle(tm)

    assert (await group.wait(timeout=10)).result == [3, 5, [6, 7]]
    # chain 1 + 2 = 3; the inner chord's callback gets [3] as its input: 3 + 4
    done = await chord.wait(timeout=10)
    assert done.status is TaskStatus.COMPLETED and done.result == 3 + 7
    assert [(await stored(tm, m)).result for m in chord.members] == [3, 7]


async def test_a_failure_deep_in_a_canvas_fails_it_and_runs_its_errback(tm: Taskmill) -> None:
    register_add(tm)
    told: list[dict[str, Any]] = []
    register_errback(tm, told)

    @tm.handler("broken", max_retries=0)
    async def broken(ctx: Context, params: dict[str, Any]) -> None:
        raise Fail("no such file")

    description = canvas.chain(
        add(1),
        canvas.group([add(2), canvas.chain(add(3), {"task_type": "broken"})]),
        add(4),
        link_error={"task_type": "notify", "params": {"to": "ops"}},
    )
    flow = await description.apply(tm)
    assert isinstance(flow, Chain) and flow.errback == errback_id(flow.id)
    errback = await stored(tm, flow.errback)
    assert errback.status is TaskStatus.PENDING and errback.parent_id == flow.id

    await run_until_idle(tm)

    root = await flow.wait(timeout=10)
    assert root.status is TaskStatus.CANCELLED and root.cancel_reason is CancelReason.PREEMPTED
    ran = await tm.wait(flow.errback, timeout=10)
    assert ran.status is TaskStatus.COMPLETED
    (failed,) = await tm.query(TaskFilter(task_types=["broken"]))
    assert failed.status is TaskStatus.FAILED
    assert ran.result == f"told about {failed.id}"
    (params,) = told
    assert params["to"] == "ops" and CANVAS_KEY not in params
    assert params[ERRBACK_INPUT] == {
        "task_id": failed.id,
        "task_type": "broken",
        "status": "failed",
        "error": "no such file",
        "root": flow.id,
        "root_status": "cancelled",
    }
    # The group's root failed naming its member; the step after it was cancelled.
    group_root = await stored(tm, flow.links[1])
    assert group_root.status is TaskStatus.FAILED and failed.parent_id is not None
    assert "did not complete" in (group_root.error or "")


async def test_an_errback_is_cancelled_unrun_when_the_canvas_completes_and_may_fail_itself(
    tm: Taskmill,
) -> None:
    register_add(tm)
    told: list[dict[str, Any]] = []
    register_errback(tm, told, fails=True)

    @tm.handler("broken", max_retries=0)
    async def broken(ctx: Context, params: dict[str, Any]) -> None:
        raise Fail("it broke")

    fine = await canvas.group([add(1), add(2)], link_error={"task_type": "notify"}).apply(tm)
    # One task with an errback: a chain of one.
    alone = await canvas.chain({"task_type": "broken"}, link_error={"task_type": "notify"}).apply(
        tm
    )
    assert isinstance(fine, Group) and fine.errback is not None
    assert alone.errback is not None
    await run_until_idle(tm)

    assert (await fine.wait(timeout=10)).result == [1, 2]
    skipped = await tm.wait(fine.errback, timeout=10)
    assert skipped.status is TaskStatus.CANCELLED and skipped.attempts == 1
    # The errback of the single task ran, and failed: that changes nothing else.
    failed = await alone.wait(timeout=10)
    assert failed.status is TaskStatus.FAILED and failed.error == "it broke"
    errback = await tm.wait(alone.errback, timeout=10)
    assert errback.status is TaskStatus.FAILED and errback.error == "the errback broke too"
    assert [p[ERRBACK_INPUT]["task_id"] for p in told] == [alone.id]
    assert (await stored(tm, alone.id)).status is TaskStatus.FAILED


async def test_cancelling_the_root_cancels_a_nested_canvas_and_its_errback(tm: Taskmill) -> None:
    started: list[str] = []

    @tm.handler("block")
    async def block(ctx: Context, params: dict[str, Any]) -> None:
        started.append(ctx.task.id)
        await asyncio.Event().wait()  # until cancelled

    register_add(tm)
    told: list[dict[str, Any]] = []
    register_errback(tm, told)
    flow = await canvas.chain(
        canvas.group([{"task_type": "block"}, canvas.chain({"task_type": "block"}, add(1))]),
        add(2),
        link_error={"task_type": "notify"},
    ).apply(tm)
    assert flow.errback is not None
    worker = tm.worker(**OPTIONS, cancel_check_interval=0.05)
    running = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: _true(len(started) == 2), timeout=30)

        assert (await flow.cancel()).status is TaskStatus.CANCELLED

        async def all_ended() -> bool:
            return (await tm.progress_summary(TaskFilter())).cancelled == 6

        # 2 blocks, add 1 (the inner chain's last link), the group's root, add 2 (the
        # root) and the errback: all CANCELLED, none run.
        await wait_until(all_ended, timeout=30)
        await wait_until(lambda: _true(worker.running == 0), timeout=30)
    finally:
        await worker.stop()
        await running
    assert told == []
    assert (await stored(tm, flow.errback)).status is TaskStatus.CANCELLED
    summary = await tm.progress_summary(TaskFilter())
    assert summary.total == 6 and summary.cancelled == 6


async def test_a_nested_canvas_whose_creator_died_half_way_is_completed_by_its_first_task(
    tm: Taskmill,
) -> None:
    register_add(tm)
    register_total(tm)
    told: list[dict[str, Any]] = []
    register_errback(tm, told)

    @tm.handler("broken", max_retries=0)
    async def broken(ctx: Context, params: dict[str, Any]) -> None:
        raise Fail("it broke")

    specs = [
        TaskSpec("add", {"n": 1}),
        canvas.group([TaskSpec("add", {"n": 2}), canvas.chain(TaskSpec("add", {"n": 3}))]),
        TaskSpec("total"),
    ]
    nested = plan_chain(specs, True, tm.new_task)
    failing = plan_chain(
        [
            canvas.chord(
                [TaskSpec("broken"), TaskSpec("add", {"n": 1})],
                TaskSpec("total"),
                link_error=TaskSpec("notify"),
            )
        ],
        False,
        tm.new_task,
    )
    assert len(nested.layers) == 4 and failing.errback is not None
    # The creator stored the first call of each and died.
    await tm.storage.enqueue(list(nested.layers[0]))
    await tm.storage.enqueue(list(failing.layers[0]))
    assert await tm.get(nested.root) is None and await tm.get(failing.errback) is None

    await run_until_idle(tm)

    # 1 -> [1 + 2, 1 + 3] -> 3 + 4
    assert (await tm.wait(nested.root, timeout=10)).result == 7
    assert (await tm.wait(failing.root, timeout=10)).status is TaskStatus.CANCELLED
    assert (await tm.wait(failing.errback, timeout=10)).status is TaskStatus.COMPLETED
    assert [p[ERRBACK_INPUT]["error"] for p in told] == ["it broke"]
    stored_ids = {t.id for t in await tm.query(limit=100)}
    assert set(nested.ids) | set(failing.ids) == stored_ids


# -- the API ------------------------------------------------------------------------


@pytest.fixture
async def memory_tm() -> Any:
    async with Taskmill("memory://", plugins=False) as tm:
        yield tm


def _nested(depth: int) -> TaskSpec:
    spec: TaskSpec = TaskSpec("add", {"n": 1})
    for _ in range(depth):
        spec = canvas.chain(spec)
    return spec


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda tm: tm.chain(add(1), canvas.group([add(2)], link_error=add(9))),
            "link_error belongs to the outermost canvas",
        ),
        (lambda tm: tm.chain(_nested(MAX_DEPTH + 1)), f"nest at most {MAX_DEPTH} deep"),
        (
            lambda tm: tm.group([add(n) for n in range(MAX_TASKS)]),
            f"at most {MAX_TASKS} tasks",
        ),
        (
            lambda tm: tm.chain(add(1), canvas.chord([add(2)], canvas.chain(add(3)))),
            "a chord's callback is one task",
        ),
        (
            lambda tm: tm.chord([add(1)], canvas.group([add(2)])),
            "a chord's callback is one task",
        ),
        (
            lambda tm: tm.chain(
                add(1),
                canvas.group([add(2), {"task_type": "add", "params": {"input": 0}}]),
                pass_result=True,
            ),
            "member 1 already have 'input'",
        ),
        (
            lambda tm: canvas.chain(
                add(1), link_error={"task_type": "n", "params": {ERRBACK_INPUT: 1}}
            ).apply(tm),
            f"already have {ERRBACK_INPUT!r}",
        ),
        (
            lambda tm: tm.chain(add(1), canvas.group([{**add(2), "dedupe_key": "k"}])),
            "dedupe key",
        ),
        (
            lambda tm: tm.chain(add(1), canvas.group([{**add(2), "app_id": "photos"}])),
            "belong to one app",
        ),
        (lambda tm: tm.chain(canvas.group([add(2), {"task_type": ""}])), "task_type"),
    ],
)
async def test_bad_nested_canvases_are_refused_storing_nothing(
    memory_tm: Taskmill, build: Any, message: str
) -> None:
    with pytest.raises(InvalidTaskSpec, match=re.escape(message)):
        await build(memory_tm)
    assert await memory_tm.query() == []


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: canvas.chain(), "a chain needs at least one task"),
        (lambda: canvas.group([]), "a group needs at least one task"),
        (lambda: canvas.group(add(1)), "as a list of specs"),  # type: ignore[arg-type]
        (lambda: canvas.chord(add(1), add(2)), "as a list of specs"),  # type: ignore[arg-type]
        (lambda: canvas.chain(add(1), pass_result=""), "pass_result is True, False"),
        (lambda: canvas.chain(add(1), link_error=canvas.chain(add(2))), "link_error is one"),
        (lambda: canvas.chain(add(1), {"task": "x"}), "unknown task spec field"),
        (
            lambda: canvas.group([add(1), {**add(2), "app_id": "a"}, {**add(3), "app_id": "b"}]),
            "belong to one app",
        ),
    ],
)
def test_bad_descriptions_are_refused_when_built(build: Any, message: str) -> None:
    with pytest.raises(InvalidTaskSpec, match=re.escape(message)):
        build()


async def test_nesting_as_deep_as_allowed_and_descriptions_read_well(memory_tm: Taskmill) -> None:
    tm = memory_tm
    register_add(tm)
    deepest = await tm.chain(_nested(MAX_DEPTH))
    described = canvas.chain(add(1), canvas.group([add(2), canvas.chord([add(3)], add(4))]))
    assert isinstance(described, ChainSpec) and isinstance(described.steps[1], GroupSpec)
    assert repr(described) == "chain('add', group('add', chord('add', 'add')))"
    await run_until_idle(tm)
    assert (await deepest.wait(timeout=10)).result == 1


async def test_a_description_enqueued_as_a_task_fails_saying_so(memory_tm: Taskmill) -> None:
    tm = memory_tm
    (task,) = await tm.enqueue_many([canvas.group([add(1)])])
    await run_until_idle(tm)
    failed = await tm.wait(task.id, timeout=10)
    assert failed.status is TaskStatus.FAILED
    assert "described with taskmill.canvas and enqueued as one task" in (failed.error or "")


async def test_an_app_bound_client_stamps_a_nested_canvas_and_its_errback(
    memory_tm: Taskmill,
) -> None:
    tm = memory_tm
    register_add(tm)
    register_errback(tm, [])
    photos = tm.for_app("photos")
    flow = await canvas.chain(
        add(1), canvas.group([add(2), add(3)]), link_error={"task_type": "notify"}
    ).apply(photos)
    tasks = await tm.query()
    assert len(tasks) == 5 and {t.app_id for t in tasks} == {"photos"}
    await run_until_idle(tm)
    assert (await photos.wait(flow.id, timeout=10)).result == [2, 3]
    assert flow.errback is not None
    skipped = await tm.wait(flow.errback, timeout=10)
    assert skipped.status is TaskStatus.CANCELLED
    assert skipped.cancel_reason is CancelReason.PREEMPTED  # moot, not cancelled by anyone
    with pytest.raises(InvalidTaskSpec, match="bound to app 'photos'"):
        await photos.chain(add(1), canvas.group([{**add(2), "app_id": "other"}]))


async def test_an_errback_is_not_run_for_a_canvas_a_user_cancelled_member_ended(
    memory_tm: Taskmill,
) -> None:
    """A member cancelled by hand cancels the rest of the chain: no task FAILED, so no
    errback; a group's root that FAILED naming a member someone cancelled does run it."""
    tm = memory_tm
    register_add(tm)
    told: list[dict[str, Any]] = []
    register_errback(tm, told)
    flow = await canvas.chain(add(1), add(2), link_error={"task_type": "notify"}).apply(tm)
    group = await canvas.group([add(1), add(2)], link_error={"task_type": "notify"}).apply(tm)
    await tm.cancel(flow.links[0])
    await tm.cancel(group.members[1])
    await run_until_idle(tm)
    assert (await flow.wait(timeout=10)).status is TaskStatus.CANCELLED
    assert flow.errback is not None and group.errback is not None
    assert (await tm.wait(flow.errback, timeout=10)).status is TaskStatus.CANCELLED
    assert (await group.wait(timeout=10)).status is TaskStatus.FAILED
    assert (await tm.wait(group.errback, timeout=10)).status is TaskStatus.COMPLETED
    (params,) = told
    assert params[ERRBACK_INPUT]["task_id"] == group.id  # no member FAILED: the root did


def test_taskmill_show_lists_a_nested_canvas_one_level_at_a_time(cli: Any, url: str) -> None:
    async def build() -> Chain:
        async with Taskmill(url, plugins=False) as tm:
            return await tm.chain(add(1), canvas.group([add(2), add(3)]), add(4))

    flow = asyncio.run(build())
    shown = cli("--url", url, "show", flow.id, "--json")
    assert shown.returncode == 0, shown.stderr
    children = json.loads(shown.stdout)["children"]
    assert [(c["id"], c["task_type"]) for c in children] == [
        (flow.links[0], "add"),
        (flow.links[1], GROUP_TYPE),
    ]
    members = json.loads(cli("--url", url, "show", flow.links[1], "--json").stdout)
    assert members["children_total"] == 2
    assert {c["task_type"] for c in members["children"]} == {"add"}


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("## Nesting", ["nested: [[10, 20, 30], 600]"]),
        (
            "## link_error",
            [
                "ok: completed",
                "  errback: cancelled",
                "broken: failed",
                "  errback: ops: resize failed: no such file: b.png",
            ],
        ),
    ],
)
def test_the_documented_nesting_and_errback_examples_print_what_the_page_says(
    section: str, expected: list[str], tmp_path: Path
) -> None:
    docs = (Path(__file__).parent.parent / "docs" / "canvas.md").read_text()
    match = re.search(r"```python\n(.*?)```", docs[docs.index(section) :], re.S)
    assert match is not None
    (tmp_path / "example.py").write_text(match.group(1))
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected
    for line in expected:
        assert line in docs  # the page shows what it prints


async def test_tm_chain_group_and_chord_take_link_error(memory_tm: Taskmill) -> None:
    """``link_error=`` on the client's own calls stores the same errback as a
    description's ``apply``: run when the canvas fails, moot when it completes."""
    tm = memory_tm
    register_add(tm)
    told: list[dict[str, Any]] = []
    register_errback(tm, told)

    @tm.handler("broken", max_retries=0)
    async def broken(ctx: Context, params: dict[str, Any]) -> None:
        raise Fail("it broke")

    failing = await tm.chain(add(1), {"task_type": "broken"}, link_error={"task_type": "notify"})
    fine = await tm.group([add(1), add(2)], link_error={"task_type": "notify"})
    chord = await tm.chord([add(1), {"task_type": "broken"}], add(0), link_error=add(9))
    assert isinstance(failing, Chain) and isinstance(fine, Group) and isinstance(chord, Chord)
    assert failing.errback and fine.errback and chord.errback
    await run_until_idle(tm)

    assert (await failing.wait(timeout=10)).status is TaskStatus.FAILED
    ran = await tm.wait(failing.errback, timeout=10)
    assert ran.status is TaskStatus.COMPLETED
    assert [p[ERRBACK_INPUT]["error"] for p in told] == ["it broke"]
    assert (await tm.wait(fine.errback, timeout=10)).cancel_reason is CancelReason.PREEMPTED
    assert (await chord.wait(timeout=10)).status is TaskStatus.CANCELLED
    assert (await tm.wait(chord.errback, timeout=10)).status is TaskStatus.COMPLETED
