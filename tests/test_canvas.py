"""Chains, groups and chords (docs/canvas.md), built on dependencies, children and cancel
with cascade: on every backend through the ``tm`` fixture (memory, SQLite, PostgreSQL,
MySQL, MongoDB; a few tasks each, MongoDB's test server being slow), and the API's
refusals, its interplay with apps, delete on complete and batch handlers, the
completion of a canvas whose creator died half-way, and ``taskmill show``, on the
embedded stores.
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
    BatchOptions,
    CancelReason,
    Chain,
    Chord,
    Context,
    Fail,
    Group,
    InvalidTaskSpec,
    Retry,
    StorageUnavailable,
    Task,
    TaskFilter,
    Taskmill,
    TaskSpec,
    TaskStatus,
    UnknownTaskType,
)
from taskmill.canvas import CANVAS_KEY, GROUP_TYPE
from taskmill.canvas_plan import plan_chain, plan_group
from taskmill.testing import wait_until

pytest_plugins = ("tests.cli_fixtures",)  # the cli and url fixtures

OPTIONS: dict[str, Any] = {
    "handle_signals": False,
    "min_poll_interval": 0.01,
    "reserved_high_priority_slots": 0,
    "concurrency": 4,
}


def add(n: int) -> dict[str, Any]:
    return {"task_type": "add", "params": {"n": n}}


def register_add(tm: Taskmill, seen: list[dict[str, Any]] | None = None) -> None:
    """``add``: its input (0 without one) plus ``n``; records the params it got."""

    @tm.handler("add")
    async def add_handler(ctx: Context, params: dict[str, Any]) -> int:
        if seen is not None:
            seen.append(params)
        total: int = params.get("input", 0) + params["n"]
        return total


async def run_until_idle(tm: Taskmill, **options: Any) -> None:
    await tm.run_worker(until_idle=True, **{**OPTIONS, **options})


async def stored(tm: Taskmill, task_id: str) -> Task:
    task = await tm.get(task_id)
    assert task is not None, task_id
    return task


# -- on every backend ---------------------------------------------------------------


async def test_a_chain_passes_each_result_to_the_next_link(tm: Taskmill) -> None:
    seen: list[dict[str, Any]] = []
    register_add(tm, seen)
    chain = await tm.chain(add(1), add(10), add(100), pass_result=True)
    assert isinstance(chain, Chain) and chain.links[-1] == chain.id
    first, second, _ = chain.links
    # Stored at once, before anything ran: the earlier links are children of the last.
    children = await tm.query(TaskFilter(parent_id=chain.id))
    assert {t.id for t in children} == {first, second}
    assert (await tm.progress_summary(TaskFilter())).waiting == 2

    await run_until_idle(tm)

    done = await chain.wait(timeout=10)
    assert done.status is TaskStatus.COMPLETED and done.result == 111
    assert (await tm.wait(chain.id, timeout=0)).result == 111
    assert [(await stored(tm, i)).result for i in chain.links] == [1, 11, 111]
    # The handler's params: the spec's, and the previous result as "input"; never the
    # reserved key, which the stored params keep.
    assert seen == [{"n": 1}, {"n": 10, "input": 1}, {"n": 100, "input": 11}]
    assert CANVAS_KEY in (await stored(tm, second)).params


async def test_a_failing_middle_link_cancels_the_links_after_it(tm: Taskmill) -> None:
    ran: list[str] = []

    @tm.handler("step")
    async def step(ctx: Context, params: dict[str, Any]) -> str:
        ran.append(params["name"])
        if params.get("fail"):
            raise Fail("the middle link broke")
        return str(params["name"])

    chain = await tm.chain(
        {"task_type": "step", "params": {"name": "a"}},
        {"task_type": "step", "params": {"name": "b", "fail": True}},
        {"task_type": "step", "params": {"name": "c"}},
        {"task_type": "step", "params": {"name": "d"}},
    )
    await run_until_idle(tm)

    assert ran == ["a", "b"]
    a, b, c, d = [await stored(tm, i) for i in chain.links]
    assert a.status is TaskStatus.COMPLETED
    assert b.status is TaskStatus.FAILED and b.error == "the middle link broke"
    for later, before in ((c, b), (d, c)):
        assert later.status is TaskStatus.CANCELLED
        assert later.cancel_reason is CancelReason.PREEMPTED
        assert before.id in (later.error or "")
    assert (await chain.wait(timeout=0)).status is TaskStatus.CANCELLED


async def test_a_group_ends_with_its_members_results_in_order(tm: Taskmill) -> None:
    finished: list[int] = []
    done = {i: asyncio.Event() for i in range(3)}

    @tm.handler("member")
    async def member(ctx: Context, params: dict[str, Any]) -> int:
        i: int = params["i"]
        if i + 1 in done:  # finish in reverse order: the result keeps the given one
            await asyncio.wait_for(done[i + 1].wait(), 30)
        finished.append(i)
        done[i].set()
        return i * 10

    group = await tm.group([{"task_type": "member", "params": {"i": i}} for i in range(3)])
    assert isinstance(group, Group)
    root = await stored(tm, group.id)
    assert root.task_type == GROUP_TYPE and root.status is TaskStatus.PENDING
    members = await tm.query(TaskFilter(parent_id=group.id))
    assert sorted(t.id for t in members) == sorted(group.members)

    await run_until_idle(tm)

    assert finished == [2, 1, 0]
    ended = await tm.wait(group.id, timeout=10)
    assert ended.status is TaskStatus.COMPLETED and ended.result == [0, 10, 20]
    assert (await group.wait(timeout=0)).result == [0, 10, 20]


async def test_a_group_with_a_failed_member_fails_naming_it(tm: Taskmill) -> None:
    @tm.handler("member")
    async def member(ctx: Context, params: dict[str, Any]) -> int:
        if params["i"] == 1:
            raise Fail("no such image")
        return int(params["i"])

    group = await tm.group([{"task_type": "member", "params": {"i": i}} for i in range(2)])
    await run_until_idle(tm)

    ended = await group.wait(timeout=10)
    assert ended.status is TaskStatus.FAILED
    assert ended.error is not None
    assert f"1 did not complete: #1 {group.members[1]} (member), which is failed" in ended.error
    assert "no such image" in ended.error
    ok = await stored(tm, group.members[0])
    assert ok.status is TaskStatus.COMPLETED  # the other member ran to its end


async def test_a_chord_calls_back_with_the_results_in_order(tm: Taskmill) -> None:
    register_add(tm)

    @tm.handler("sum")
    async def total(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        return {"sum": sum(params["input"]), "parts": params["input"], "label": params["label"]}

    chord = await tm.chord(
        [add(1), add(2), add(3)], {"task_type": "sum", "params": {"label": "abc"}}
    )
    assert isinstance(chord, Chord) and chord.callback == chord.id
    await run_until_idle(tm)

    ended = await chord.wait(timeout=10)
    assert ended.status is TaskStatus.COMPLETED
    assert ended.result == {"sum": 6, "parts": [1, 2, 3], "label": "abc"}
    assert ended.task_type == "sum"
    assert {t.id for t in await tm.query(TaskFilter(parent_id=chord.id))} == set(chord.members)


async def test_cancelling_the_root_cancels_every_task_of_the_canvas(tm: Taskmill) -> None:
    started: list[str] = []

    @tm.handler("block")
    async def block(ctx: Context, params: dict[str, Any]) -> None:
        started.append(ctx.task.id)
        await asyncio.Event().wait()  # until cancelled

    register_add(tm)
    chain = await tm.chain({"task_type": "block"}, add(1), add(2))
    group = await tm.group([{"task_type": "block"}, {"task_type": "block"}])
    worker = tm.worker(**OPTIONS, cancel_check_interval=0.05)
    running = asyncio.create_task(worker.run())
    try:
        # The chain's first link and both members run; nothing else can.
        await wait_until(lambda: _true(len(started) == 3), timeout=30)

        for canvas_root in (await chain.cancel(), await group.cancel()):
            assert canvas_root.status is TaskStatus.CANCELLED

        everything = [*chain.links, *group.members, group.id]

        async def all_cancelled() -> bool:
            tasks = [await stored(tm, i) for i in everything]
            return all(t.status is TaskStatus.CANCELLED for t in tasks)

        await wait_until(all_cancelled, timeout=30)
        await wait_until(lambda: _true(worker.running == 0), timeout=30)  # handlers stopped
    finally:
        await worker.stop()
        await running
    assert (await tm.progress_summary(TaskFilter())).cancelled == len(everything)


async def _true(value: bool) -> bool:
    return value


async def test_a_retried_link_gets_the_same_input_from_the_store(tm: Taskmill) -> None:
    register_add(tm)
    seen: list[tuple[int, Any, bool]] = []

    @tm.handler("double")
    async def double(ctx: Context, params: dict[str, Any]) -> int:
        seen.append((ctx.task.attempts, params["input"], CANVAS_KEY in params))
        if ctx.task.attempts == 1:
            raise Retry(delay=0)
        return int(params["input"]) * 2

    chain = await tm.chain(add(21), {"task_type": "double"}, pass_result=True)
    await run_until_idle(tm)

    ended = await chain.wait(timeout=10)
    assert ended.status is TaskStatus.COMPLETED and ended.result == 42
    assert seen == [(1, 21, False), (2, 21, False)]
    assert [a.outcome.value for a in await tm.attempts(chain.id)] == ["failed", "completed"]


async def test_a_canvas_whose_creator_died_half_way_is_completed_by_its_first_task(
    tm: Taskmill,
) -> None:
    register_add(tm)
    specs = [TaskSpec("add", {"n": n}) for n in (1, 2, 3)]
    chain = plan_chain(specs, True, tm.new_task)
    group = plan_group(specs[:2], tm.new_task)
    # The creator stored the first call of each and died: the roots are missing.
    await tm.storage.enqueue(list(chain.layers[0]))
    await tm.storage.enqueue(list(group.layers[0]))
    assert await tm.get(chain.root) is None and await tm.get(group.root) is None

    await run_until_idle(tm)

    assert (await tm.wait(chain.root, timeout=10)).result == 6
    assert (await tm.wait(group.root, timeout=10)).result == [1, 2]
    assert (await tm.progress_summary(TaskFilter())).completed == 3 + 3


async def test_members_deleted_on_complete_pass_their_results_by_their_tombstones(
    tm: Taskmill,
) -> None:
    register_add(tm)
    chain = await tm.chain(add(1), add(2), pass_result=True)
    group = await tm.group([add(5), add(6)])
    await run_until_idle(tm, delete_completed=True)

    # Every task is gone, the roots too; their results stay readable for event_retention.
    assert await tm.query() == []
    assert (await chain.wait(timeout=10)).result == 3
    assert (await group.wait(timeout=10)).result == [5, 6]


# -- the API ------------------------------------------------------------------------


@pytest.fixture
async def memory_tm() -> Any:
    async with Taskmill("memory://", plugins=False) as tm:
        yield tm


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda tm: tm.chain(), "a chain needs at least one task"),
        (lambda tm: tm.group([]), "a group needs at least one task"),
        (lambda tm: tm.group(add(1)), "as a list of specs"),
        (lambda tm: tm.chord([], add(1)), "header needs at least one task"),
        (lambda tm: tm.chain(add(1), {**add(2), "dedupe_key": "k"}), "dedupe key"),
        (lambda tm: tm.group([{**add(2), "parent_id": "p"}]), "parent_id"),
        (lambda tm: tm.chord([add(1)], {**add(2), "after_policy": "always"}), "after_policy"),
        (
            lambda tm: tm.group([{"task_type": "add", "params": {CANVAS_KEY: 1}}]),
            "is reserved",
        ),
        (
            lambda tm: tm.chain(
                add(1), {"task_type": "add", "params": {"input": 0}}, pass_result=True
            ),
            "already have 'input'",
        ),
        (lambda tm: tm.chain(add(1), add(2), pass_result=""), "pass_result is True, False"),
        (lambda tm: tm.group([add(1), {**add(2), "app_id": "photos"}]), "belong to one app"),
        (lambda tm: tm.chain(add(1), {"task_type": ""}), "task_type"),
        (lambda tm: tm.chain(add(1), add(2), {**add(3), "after": ["nowhere"]}), "does not exist"),
    ],
)
async def test_bad_canvases_are_refused_storing_nothing(
    memory_tm: Taskmill, build: Any, message: str
) -> None:
    with pytest.raises(InvalidTaskSpec, match=re.escape(message)):
        await build(memory_tm)
    assert await memory_tm.query() == []


async def test_a_failed_later_call_cancels_what_the_first_stored(
    memory_tm: Taskmill, monkeypatch: pytest.MonkeyPatch
) -> None:
    tm = memory_tm
    calls = 0
    enqueue = tm.storage.enqueue

    async def second_call_fails(tasks: Any) -> list[Task]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise StorageUnavailable("the store went away")
        return await enqueue(tasks)

    monkeypatch.setattr(tm.storage, "enqueue", second_call_fails)
    with pytest.raises(StorageUnavailable):
        await tm.chain(add(1), add(2), add(3))
    (first,) = await tm.query()
    assert first.status is TaskStatus.CANCELLED


async def test_an_app_bound_client_builds_canvases_of_its_app(memory_tm: Taskmill) -> None:
    tm = memory_tm
    register_add(tm)
    photos = tm.for_app("photos")
    group = await photos.group([add(1), add(2)])
    chain = await photos.chain(add(1), add(2), pass_result=True)
    assert {t.app_id for t in await tm.query()} == {"photos"}
    await run_until_idle(tm)
    assert (await group.wait(timeout=10)).result == [1, 2]
    assert (await photos.wait(chain.id, timeout=10)).result == 3
    assert await tm.for_app("other").get(group.id) is None
    with pytest.raises(InvalidTaskSpec, match="bound to app 'photos'"):
        await photos.group([{**add(1), "app_id": "other"}])


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_large_group_reads_its_results_in_pages(store: str, tmp_path: Path) -> None:
    url = "memory://" if store == "memory" else f"sqlite:///{tmp_path / 'tasks.db'}"
    async with Taskmill(url, plugins=False) as tm:
        register_add(tm)
        group = await tm.group([add(n) for n in range(1203)])  # pages of 500 children
        await run_until_idle(tm, concurrency=50)
        assert (await group.wait(timeout=30)).result == list(range(1203))


async def test_strict_types_checks_the_members_and_knows_the_group_root() -> None:
    async with Taskmill("memory://", plugins=False, strict_types=True) as tm:
        register_add(tm)
        group = await tm.group([add(1), add(2)])  # no worker here registered the root's type
        with pytest.raises(UnknownTaskType, match="did you mean 'add'"):
            await tm.group([add(1), {"task_type": "ad"}])
        await run_until_idle(tm)
        assert (await group.wait(timeout=10)).result == [1, 2]
        assert len(await tm.query()) == 3


async def test_pass_result_names_the_key_or_passes_nothing(memory_tm: Taskmill) -> None:
    tm = memory_tm
    seen: list[dict[str, Any]] = []

    @tm.handler("echo")
    async def echo(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
        seen.append(params)
        return {"got": params}

    named = await tm.chain(
        {"task_type": "echo", "params": {"x": 1}}, {"task_type": "echo"}, pass_result="image"
    )
    plain = await tm.chord([{"task_type": "echo"}], {"task_type": "echo"}, pass_result=False)
    await run_until_idle(tm)
    assert (await named.wait(timeout=10)).result == {"got": {"image": {"got": {"x": 1}}}}
    assert (await plain.wait(timeout=10)).result == {"got": {}}


async def test_an_input_no_longer_stored_fails_the_task_saying_why(memory_tm: Taskmill) -> None:
    tm = memory_tm
    register_add(tm)
    task = await tm.enqueue(
        "add", {"n": 1, CANVAS_KEY: {"input": {"from": "gone", "into": "input"}}}
    )
    odd = await tm.enqueue("add", {"n": 1, CANVAS_KEY: "not a reference"})
    await run_until_idle(tm)
    failed = await tm.wait(task.id, timeout=10)
    assert failed.status is TaskStatus.FAILED and failed.attempts == 1
    assert "result of task gone, which is no longer stored" in (failed.error or "")
    malformed = await tm.wait(odd.id, timeout=10)
    assert malformed.status is TaskStatus.FAILED
    assert "is reserved for chains, groups and chords" in (malformed.error or "")


async def test_a_batch_handler_cannot_take_an_input(memory_tm: Taskmill) -> None:
    tm = memory_tm
    register_add(tm)

    @tm.handler("rows", batch=BatchOptions(max_size=2, max_wait=0))
    async def rows(batch: list[Context]) -> list[Any]:
        return [len(ctx.task.params) for ctx in batch]

    linked = await tm.chain(add(1), {"task_type": "rows"}, pass_result=True)
    unlinked = await tm.chain(add(1), {"task_type": "rows"})
    await run_until_idle(tm)
    failed = await linked.wait(timeout=10)
    assert failed.status is TaskStatus.FAILED
    assert "a batch handler cannot take the input" in (failed.error or "")
    assert (await unlinked.wait(timeout=10)).status is TaskStatus.COMPLETED


async def test_another_processes_worker_serves_the_group_root(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"
    async with Taskmill(url, plugins=False) as web:  # enqueues, runs no worker
        group = await web.group([add(1), add(2)])
        assert web.registry.lookup(None, GROUP_TYPE) is None
        async with Taskmill(url, plugins=False) as other:
            register_add(other)
            await run_until_idle(other)
            assert other.registry.lookup(None, GROUP_TYPE) is not None
        assert (await group.wait(timeout=10)).result == [1, 2]


def test_taskmill_show_lists_the_tasks_of_a_canvas(cli: Any, url: str) -> None:
    async def build() -> Group:
        async with Taskmill(url, plugins=False) as tm:
            return await tm.group([add(1), add(2), add(3)])

    group = asyncio.run(build())
    shown = cli("--url", url, "show", group.id, COLUMNS="200")
    assert shown.returncode == 0, shown.stderr
    assert "children (3)" in shown.stdout
    for member in group.members:
        assert re.search(rf"^\s*{member[:8]}\s+add\s+-\s+pending", shown.stdout, re.M), shown.stdout
    document = json.loads(cli("--url", url, "show", group.id, "--json").stdout)
    assert [c["id"] for c in document["children"]] == list(group.members)
    assert document["children_total"] == 3


async def test_the_dashboard_shows_a_canvas_root_with_its_tasks(tmp_path: Path) -> None:
    import httpx
    from taskmill_http import create_app

    from tests.http_support import TOKENS, serve

    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as tm:
        chord = await tm.for_app("photos").chord([add(1), add(2)], {"task_type": "sum"})
        async with (
            serve(create_app(tm, TOKENS)) as base,
            httpx.AsyncClient(base_url=base) as client,
        ):
            form = await client.get("/ui/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf is not None
            data = {"csrf": csrf.group(1), "token": "tok-photos", "next": "/ui/"}
            await client.post("/ui/login", data=data)
            page = await client.get(f"/ui/tasks/{chord.id}")
    assert page.status_code == 200
    assert "Children (2)" in page.text
    for member in chord.members:
        assert f"/ui/tasks/{member}" in page.text


def test_the_documented_example_runs(tmp_path: Path) -> None:
    """docs/canvas.md's example, run as a user would, in a directory of its own."""
    docs = (Path(__file__).parent.parent / "docs" / "canvas.md").read_text()
    match = re.search(r"```python\n(.*?)```", docs, re.S)
    assert match is not None
    (tmp_path / "example.py").write_text(match.group(1))
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "chain: 'A-CAT.PNG'",
        "group: [1, 4, 9]",
        "chord: 14",
        "failed chain: cancelled; resize failed: no such file: b.png",
    ]
