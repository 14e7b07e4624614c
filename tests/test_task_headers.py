"""The ``taskmill_task_headers`` hook: what plugins return is stored with the task under
the reserved params key ``taskmill.headers`` on every enqueue path, read back with
``taskmill.headers_of``, kept out of the handler's ``params``; a user's params that use
the key are refused (docs/plugins.md#taskmill_task_headers)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import taskmill
from taskmill import (
    Context,
    InvalidTaskSpec,
    PluginError,
    Task,
    TaskFilter,
    Taskmill,
    TaskSpec,
    TaskStatus,
    headers_of,
    hookimpl,
)
from taskmill.headers import HEADERS_KEY


class Stamp:
    """Gives every task the header ``stamp`` (and records what it was called with)."""

    def __init__(self, value: str = "s", key: str = "stamp") -> None:
        self.value, self.key = value, key
        self.calls: list[tuple[str, str | None, str]] = []

    @hookimpl
    def taskmill_task_headers(self, spec: TaskSpec, task_id: str) -> dict[str, str]:
        self.calls.append((spec.task_type, spec.app_id, task_id))
        return {self.key: f"{self.value}:{spec.task_type}"}


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tasks.db'}"


def with_plugins(url: str, *plugins: object, **options: Any) -> Taskmill:
    """A ``Taskmill`` with ``plugins`` only (not the installed ones)."""
    tm = Taskmill(url, plugins=False, **options)
    for number, plugin in enumerate(plugins):
        tm.add_plugin(plugin, name=f"{type(plugin).__name__}-{number}")
    return tm


def test_the_key_and_the_helper_are_public() -> None:
    assert HEADERS_KEY == "taskmill.headers"
    assert taskmill.headers_of is headers_of
    assert "headers_of" in taskmill.__all__


async def test_every_enqueue_path_stores_the_headers(tmp_path: Path) -> None:
    stamp = Stamp()
    async with with_plugins(sqlite_url(tmp_path), stamp) as tm:
        one = await tm.enqueue("a", {"x": 1})
        assert one.params == {"x": 1, HEADERS_KEY: {"stamp": "s:a"}}
        assert headers_of(one) == {"stamp": "s:a"}
        assert stamp.calls == [("a", None, one.id)]
        many = await tm.enqueue_many([{"task_type": "b"}, TaskSpec("c", {"y": 2})])
        assert [headers_of(t) for t in many] == [{"stamp": "s:b"}, {"stamp": "s:c"}]
        assert many[1].params["y"] == 2
        bound = await tm.for_app("photos").enqueue("d")
        assert headers_of(bound) == {"stamp": "s:d"}
        assert stamp.calls[-1] == ("d", "photos", bound.id)
        (child,) = await tm.batch_children(one.id, [{"task_type": "e"}])
        assert headers_of(child) == {"stamp": "s:e"}
        chain = await tm.chain({"task_type": "f"}, {"task_type": "g"}, pass_result=True)
        links = [await tm.get(i) for i in chain.links]
        assert [headers_of(t) for t in links if t is not None] == [
            {"stamp": "s:f"},
            {"stamp": "s:g"},
        ]
        # What the store returns later is what was stored.
        again = await tm.get(one.id)
        assert again is not None and headers_of(again) == {"stamp": "s:a"}


async def test_the_handler_gets_its_params_without_the_headers(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def spawner(ctx: Context, params: dict[str, Any]) -> str:
        seen["params"] = params
        seen["task_params"] = dict(ctx.task.params)
        child = await ctx.spawn("plain", {"n": 1})
        return child.id

    def plain(ctx: Context, params: dict[str, Any]) -> int:
        seen["plain"] = params
        seen["plain_headers"] = headers_of(ctx.task)
        return int(params["n"])

    async def linked(ctx: Context, params: dict[str, Any]) -> Any:
        seen.setdefault("linked", []).append(params)
        return params.get("input", 0)

    async with with_plugins(sqlite_url(tmp_path), Stamp()) as tm:
        tm.register("spawner", spawner)
        tm.register("plain", plain)
        tm.register("linked", linked)
        task = await tm.enqueue("spawner", {"k": "v"})
        chain = await tm.chain(
            {"task_type": "linked", "params": {"a": 1}}, {"task_type": "linked"}, pass_result=True
        )
        await tm.run_worker(until_idle=True, handle_signals=False)
        done = await tm.wait(task.id, timeout=10)
        assert done.status is TaskStatus.COMPLETED
        assert seen["params"] == {"k": "v"}
        assert seen["task_params"] == {"k": "v", HEADERS_KEY: {"stamp": "s:spawner"}}
        assert seen["plain"] == {"n": 1}
        assert seen["plain_headers"] == {"stamp": "s:plain"}
        child = await tm.get(str(done.result))
        assert child is not None and child.parent_id == task.id
        last = await tm.wait(chain.id, timeout=10)
        assert last.status is TaskStatus.COMPLETED
        assert seen["linked"] == [{"a": 1}, {"input": 0}]


@pytest.mark.parametrize(
    "enqueue",
    [
        lambda tm: tm.enqueue("a", {HEADERS_KEY: {"x": "y"}}),
        lambda tm: tm.enqueue_many(
            [{"task_type": "a"}, {"task_type": "b", "params": {HEADERS_KEY: 1}}]
        ),
        lambda tm: tm.for_app("photos").enqueue("a", {HEADERS_KEY: None}),
        lambda tm: tm.chain({"task_type": "a", "params": {HEADERS_KEY: {}}}),
        lambda tm: tm.group([{"task_type": "a"}, {"task_type": "b", "params": {HEADERS_KEY: {}}}]),
        lambda tm: tm.chain({"task_type": "a"}, {"task_type": "b"}, pass_result=HEADERS_KEY),
        lambda tm: tm.chord([{"task_type": "a"}], {"task_type": "b"}, pass_result=HEADERS_KEY),
    ],
    ids=["enqueue", "enqueue_many", "app", "chain", "group", "chain_input", "chord_input"],
)
@pytest.mark.parametrize("with_plugin", [False, True], ids=["no_plugin", "plugin"])
async def test_params_that_use_the_reserved_key_are_refused(
    tmp_path: Path, enqueue: Any, with_plugin: bool
) -> None:
    async with with_plugins(sqlite_url(tmp_path), *([Stamp()] if with_plugin else [])) as tm:
        with pytest.raises(InvalidTaskSpec, match=r"'taskmill\.headers' is reserved") as raised:
            await enqueue(tm)
        assert raised.value.field in ("params", "pass_result")
        assert (await tm.progress_summary()).total == 0, "nothing is stored"


async def test_ctx_spawn_with_the_reserved_key_fails_the_handler(tmp_path: Path) -> None:
    async def spawner(ctx: Context, params: dict[str, Any]) -> None:
        await ctx.spawn("child", {HEADERS_KEY: {"forged": "1"}})

    async with Taskmill(sqlite_url(tmp_path), plugins=False) as tm:
        tm.register("spawner", spawner, max_retries=0)
        task = await tm.enqueue("spawner")
        await tm.run_worker(until_idle=True, handle_signals=False)
        done = await tm.wait(task.id, timeout=10)
        assert done.status is TaskStatus.FAILED
        assert done.error is not None and "'taskmill.headers' is reserved" in done.error
        assert (await tm.progress_summary()).total == 1


async def test_without_a_plugin_nothing_is_stored_and_the_hook_is_not_called(
    tmp_path: Path,
) -> None:
    async with Taskmill(sqlite_url(tmp_path), plugins=False) as tm:
        assert [tm.plugins.provides_headers] == [False]
        task = await tm.enqueue("a", {"x": 1})
        assert task.params == {"x": 1} and headers_of(task) == {}
        stamp = Stamp()
        tm.add_plugin(stamp)
        assert [tm.plugins.provides_headers] == [True]
        assert headers_of(await tm.enqueue("a")) == {"stamp": "s:a"}


class Silent:
    @hookimpl
    def taskmill_task_headers(self) -> None:
        return None


class Broken:
    @hookimpl
    def taskmill_task_headers(self, spec: TaskSpec) -> dict[str, str]:
        raise RuntimeError("boom")


class Sloppy:
    @hookimpl
    def taskmill_task_headers(self) -> dict[Any, Any]:
        return {"good": "yes", "number": 3, 4: "four"}


async def test_headers_are_merged_and_bad_ones_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = Stamp("first"), Stamp("second", key="other")
    clash = Stamp("clash")  # registered last: called first, wins "stamp"
    plugins = [first, second, Silent(), Broken(), Sloppy(), clash]
    with caplog.at_level(logging.ERROR, logger="taskmill.plugins"):
        async with with_plugins(sqlite_url(tmp_path), *plugins) as tm:
            task = await tm.enqueue("a")
    assert headers_of(task) == {"stamp": "clash:a", "other": "second:a", "good": "yes"}
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "taskmill_task_headers failed (ignored)" in messages
    assert "'number': 3, not strings (left out)" in messages
    assert "4: 'four', not strings (left out)" in messages


async def test_when_every_plugin_returns_nothing_the_params_are_unchanged(
    tmp_path: Path,
) -> None:
    async with with_plugins(sqlite_url(tmp_path), Silent()) as tm:
        task = await tm.enqueue("a", {"x": 1})
        assert task.params == {"x": 1}


def test_an_async_implementation_is_refused_at_registration() -> None:
    class Async:
        @hookimpl
        async def taskmill_task_headers(self) -> dict[str, str]:
            return {}

    tm = Taskmill("memory://", plugins=False)
    with pytest.raises(PluginError, match="taskmill_task_headers must be a plain def"):
        tm.add_plugin(Async())


def test_headers_of_ignores_what_is_not_a_mapping_of_strings() -> None:
    def task(params: dict[str, Any]) -> Task:
        now = datetime.now(UTC)
        return Task(
            id="t",
            task_type="a",
            status=TaskStatus.PENDING,
            created_at=now,
            run_at=now,
            updated_at=now,
            params=params,
        )

    assert headers_of(task({})) == {}
    assert headers_of(task({HEADERS_KEY: "text"})) == {}
    assert headers_of(task({HEADERS_KEY: {"a": "1", "b": 2}})) == {"a": "1"}
    stored = task({HEADERS_KEY: {"a": "1"}})
    headers_of(stored)["x"] = "y"  # a copy: the task is not changed through it
    assert stored.params == {HEADERS_KEY: {"a": "1"}}


async def test_the_headers_count_towards_the_params_size_limit(tmp_path: Path) -> None:
    big = Stamp("x" * 2000)
    async with with_plugins(sqlite_url(tmp_path), big, max_params_bytes=1000) as tm:
        with pytest.raises(taskmill.InvalidParams):
            await tm.enqueue("a")


async def test_headers_given_with_a_task_are_stored_and_checked() -> None:
    """``TaskSpec.headers`` (``enqueue(headers=...)``) are stored under the reserved
    key without any plugin, kept out of the handler's params, and refused, naming the
    field, when they are not text or too many."""
    seen: list[dict[str, Any]] = []
    async with Taskmill("memory://", plugins=False) as tm:

        @tm.handler("h")
        async def handler(ctx: Context, params: dict[str, Any]) -> None:
            seen.append(params)

        task = await tm.enqueue("h", {"x": 1}, headers={"traceparent": "00-abc", "k": "v"})
        (other,) = await tm.enqueue_many([{"task_type": "h", "headers": {"k": "w"}}])
        assert headers_of(task) == {"traceparent": "00-abc", "k": "v"}
        assert headers_of(other) == {"k": "w"}
        await tm.run_worker(until_idle=True, handle_signals=False)
        assert sorted(map(str, seen)) == sorted(["{'x': 1}", "{}"])
        for bad in ({"n": 1}, {f"h{i}": "v" for i in range(17)}, {"nul": "a\x00b"}, ["x"]):
            with pytest.raises(InvalidTaskSpec) as refused:
                await tm.enqueue("h", headers=bad)  # type: ignore[arg-type]
            assert refused.value.field == "headers", refused.value
        assert len(await tm.query(TaskFilter(), limit=10)) == 2
