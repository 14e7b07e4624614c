"""Contract: unusual input gets the same answer on every backend (docs/semantics.md,
"Limits").

Each case goes through a :class:`~taskmill.Taskmill` built on the store under test,
as an application would call it: a value is either stored and read back exactly as
written, with the model's types (ints stay ints, floats stay floats, timestamps stay
timezone-aware, emoji and NUL inside JSON stay), or refused with an
:class:`~taskmill.errors.InvalidInput` (a ``ValueError``) that names the field and
stores nothing. No driver exception ever reaches the caller. The memory store is the
reference and passes the same tests.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest

from taskmill.app import Taskmill
from taskmill.context import Context
from taskmill.errors import InvalidInput, InvalidTaskSpec, TaskNotFound
from taskmill.headers import HEADERS_KEY
from taskmill.hookspecs import headers_of
from taskmill.model import Task, TaskFilter, TaskStatus
from taskmill.serialization import dumps
from taskmill.storage import TaskStorage
from taskmill.validation import (
    APP_ID_MAX,
    DEDUPE_KEY_MAX,
    ERROR_MAX,
    MAX_RETRIES_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RUN_AT_MIN,
    TASK_ID_MAX,
    TASK_TYPE_MAX,
    USER_ID_MAX,
)

__all__ = ["EdgeContract"]

_EMOJI = "\N{ROCKET}"  # four bytes in UTF-8: the widest character a key can hold
_INDIA = timezone(timedelta(hours=5, minutes=30))

# (case id, enqueue keyword arguments, the field the refusal names, text the message has)
REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("task type over the limit", {"task_type": "t" * 256}, "task_type", "255"),
    ("empty task type", {"task_type": ""}, "task_type", "non-empty"),
    ("task type not a str", {"task_type": 7}, "task_type", "str"),
    ("NUL in the task type", {"task_type": "ec\x00ho"}, "task_type", "NUL"),
    ("lone surrogate in the task type", {"task_type": "a\ud800"}, "task_type", "surrogate"),
    ("app id over the limit", {"app_id": "a" * 1000}, "app_id", "255"),
    ("NUL in the app id", {"app_id": "a\x00"}, "app_id", "NUL"),
    ("user id over the limit", {"user_id": "u" * 256}, "user_id", "255"),
    ("NUL in the user id", {"user_id": "\x00"}, "user_id", "NUL"),
    ("dedupe key over the limit", {"dedupe_key": "k" * 5000}, "dedupe_key", "1024"),
    ("NUL in the dedupe key", {"dedupe_key": "a\x00b"}, "dedupe_key", "NUL"),
    ("lone surrogate in the dedupe key", {"dedupe_key": "\udc80"}, "dedupe_key", "surrogate"),
    ("parent id longer than any id", {"parent_id": "p" * 65}, "parent_id", "64"),
    ("NUL in a dependency id", {"after": ["x\x00"]}, "after", "NUL"),
    ("priority 2**31", {"priority": 2**31}, "priority", str(PRIORITY_MAX)),
    ("priority below the range", {"priority": -(2**31) - 1}, "priority", str(PRIORITY_MIN)),
    ("priority 2**63", {"priority": 2**63}, "priority", "64 bits"),
    ("priority a bool", {"priority": True}, "priority", "bool"),
    ("priority a float", {"priority": 1.5}, "priority", "float"),
    ("priority a string", {"priority": "high"}, "priority", "str"),
    ("negative max_retries", {"max_retries": -1}, "max_retries", "from 0"),
    ("max_retries 2**40", {"max_retries": 2**40}, "max_retries", str(MAX_RETRIES_MAX)),
    ("infinite delay", {"delay": math.inf}, "delay", "finite"),
    ("NaN delay", {"delay": math.nan}, "delay", "finite"),
    ("negative delay", {"delay": -3600}, "delay", ">= 0"),
    ("negative timedelta delay", {"delay": timedelta(seconds=-1)}, "delay", ">= 0"),
    ("delay of 1e12 seconds", {"delay": 1e12}, "delay", "100 years"),
    ("timedelta.max delay", {"delay": timedelta.max}, "delay", "100 years"),
    ("delay a string", {"delay": "5"}, "delay", "str"),
    ("delay and run_at", {"delay": 1, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, "delay", "both"),
    ("naive run_at", {"run_at": datetime(2030, 1, 1)}, "run_at", "timezone-aware"),
    ("run_at before 1970", {"run_at": datetime(1969, 12, 31, tzinfo=UTC)}, "run_at", "1970"),
    ("run_at in year 9999", {"run_at": datetime(9999, 6, 1, tzinfo=UTC)}, "run_at", "9999"),
    ("run_at datetime.max", {"run_at": datetime.max.replace(tzinfo=UTC)}, "run_at", "9999"),
    ("run_at datetime.min", {"run_at": datetime.min.replace(tzinfo=UTC)}, "run_at", "1970"),
    ("params not a dict", {"params": ["a"]}, "params", "dict"),
    ("params with NaN", {"params": {"x": math.nan}}, "params", "JSON"),
    ("params with a set", {"params": {"x": {1}}}, "params", "JSON"),
    ("params with a lone surrogate", {"params": {"x": "\ud800"}}, "params", "surrogate"),
    ("params over max_params_bytes", {"params": {"b": "x" * (1024 * 1024)}}, "params", "bytes"),
]

# (case id, enqueue keyword arguments): stored and read back equal, with equal types
STORED: list[tuple[str, dict[str, Any]]] = [
    ("task type at the limit, ASCII", {"task_type": "t" * TASK_TYPE_MAX}),
    ("task type at the limit, emoji", {"task_type": _EMOJI * TASK_TYPE_MAX}),
    ("app id at the limit, emoji", {"app_id": _EMOJI * APP_ID_MAX}),
    ("app id empty", {"app_id": ""}),
    ("user id at the limit, emoji", {"user_id": _EMOJI * USER_ID_MAX}),
    ("dedupe key at the limit, emoji", {"dedupe_key": _EMOJI * DEDUPE_KEY_MAX}),
    ("dedupe key of other scripts", {"dedupe_key": "résumé ünïcödé 東京 \u2028 \U0001f600"}),
    ("priority at the top", {"priority": PRIORITY_MAX}),
    ("priority at the bottom", {"priority": PRIORITY_MIN}),
    ("max_retries at the top", {"max_retries": MAX_RETRIES_MAX}),
    ("max_retries zero", {"max_retries": 0}),
    ("run_at with microseconds", {"run_at": datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)}),
    ("run_at at the epoch", {"run_at": RUN_AT_MIN}),
    ("run_at in another zone", {"run_at": datetime(2031, 5, 6, 7, 8, 9, 7, tzinfo=_INDIA)}),
    ("run_at late in year 9998", {"run_at": datetime(9998, 12, 31, 23, 59, 59, 999999, UTC)}),
    (
        "params of every JSON type",
        {
            "params": {
                "int": 2,
                "float": 2.0,
                "neg": -0.5,
                "big": 2**70,
                "tiny": 5e-324,
                "bool": True,
                "none": None,
                "list": [1, 1.0, "1"],
                "nested": {"a": {"b": [{}]}},
            }
        },
    ),
    (
        "params with NUL, emoji and odd keys",
        {"params": {"a\x00": "b\x00c", "": "empty key", "$x.y": 1, _EMOJI: "\U0001f600\u2028"}},
    ),
    ("empty params", {"params": {}}),
]

_DEFAULTS: dict[str, Any] = {"task_type": "edge"}


def _types(value: Any) -> Any:
    """``value`` with the type of every leaf beside it, so that 2 and 2.0 differ."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return (type(value).__name__, value)


class EdgeContract:
    """Every value stored as written or refused the same way, on every backend."""

    @pytest.fixture
    async def edge_taskmill(self, storage: TaskStorage) -> AsyncIterator[Taskmill]:
        """A ``Taskmill`` on a second store object of the database under test, without
        plugins. A backend whose store cannot be rebuilt from ``storage.url`` overrides
        it."""
        other = type(storage).from_url(storage.url)
        async with Taskmill(storage=other, plugins=False) as tm:
            yield tm

    @staticmethod
    async def _everything(tm: Taskmill) -> list[tuple[str, str, Any]]:
        tasks = await tm.query(TaskFilter(), limit=10_000)
        return sorted((t.id, t.task_type, t.params) for t in tasks)

    @pytest.mark.parametrize(
        ("kwargs", "field", "says"),
        [pytest.param(kw, field, says, id=case) for case, kw, field, says in REFUSED],
    )
    async def test_unusual_input_is_refused_naming_the_field_and_stores_nothing(
        self, edge_taskmill: Taskmill, kwargs: dict[str, Any], field: str, says: str
    ) -> None:
        tm = edge_taskmill
        await tm.enqueue("keep", {"n": 1})
        before = await self._everything(tm)
        spec = {**_DEFAULTS, **kwargs}
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "enqueue": lambda: tm.enqueue(**spec),
            "enqueue_many": lambda: tm.enqueue_many([{"task_type": "ok"}, spec]),
        }
        for call, refused in calls.items():
            with pytest.raises(InvalidInput) as excinfo:
                await refused()
            error = excinfo.value
            assert isinstance(error, ValueError)
            assert error.field == field, f"{call}: {error}"
            assert says in str(error), f"{call}: {error}"
        assert await self._everything(tm) == before

    async def test_headers_are_kept_with_their_task_and_bad_ones_store_nothing(
        self, edge_taskmill: Taskmill
    ) -> None:
        """``TaskSpec.headers`` (a caller's trace context, say) read back as given, out of
        the handler's params; headers no store keeps are refused naming the field."""
        tm = edge_taskmill
        given = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "k": "é ✓ 𝄞"}
        task = await tm.enqueue("keep", {"n": 1}, headers=given)
        stored = await tm.get(task.id)
        assert stored is not None and headers_of(stored) == given
        assert {k: v for k, v in stored.params.items() if k != HEADERS_KEY} == {"n": 1}
        before = await self._everything(tm)
        too_many = {f"h{i}": "v" for i in range(17)}
        for bad in ({"nul": "a\x00b"}, {"n": 1}, {"x" * 129: "v"}, too_many):
            with pytest.raises(InvalidTaskSpec) as refused:
                await tm.enqueue("keep", headers=bad)  # type: ignore[arg-type]
            assert refused.value.field == "headers", refused.value
        assert await self._everything(tm) == before

    @pytest.mark.parametrize("kwargs", [pytest.param(kw, id=case) for case, kw in STORED])
    async def test_values_at_the_edges_read_back_as_written_with_their_types(
        self, edge_taskmill: Taskmill, kwargs: dict[str, Any]
    ) -> None:
        tm = edge_taskmill
        enqueued = await tm.enqueue(**{**_DEFAULTS, **kwargs})
        for task in (enqueued, await tm.get(enqueued.id)):
            assert task is not None
            for name, value in kwargs.items():
                stored = getattr(task, name)
                if isinstance(value, datetime):
                    assert stored == value and stored.utcoffset() == timedelta(0)
                else:
                    assert _types(stored) == _types(value), name
            (found,) = await tm.query(TaskFilter(task_types=[task.task_type]), limit=10)
            assert found.id == enqueued.id

    async def test_a_dedupe_key_at_the_limit_still_dedupes(self, edge_taskmill: Taskmill) -> None:
        key = _EMOJI * DEDUPE_KEY_MAX
        leader = await edge_taskmill.enqueue("edge", dedupe_key=key)
        alias = await edge_taskmill.enqueue("edge", dedupe_key=key)
        assert alias.alias_of == leader.id
        other = await edge_taskmill.enqueue("edge", dedupe_key=key[:-1] + "x")
        assert other.alias_of is None

    async def test_ids_no_store_can_hold_read_as_unknown(self, edge_taskmill: Taskmill) -> None:
        tm = edge_taskmill
        await tm.enqueue("keep")
        for task_id in ("x\x00y", "\ud800", "i" * (TASK_ID_MAX + 1), "x" * 5000):
            assert await tm.get(task_id) is None
            assert await tm.attempts(task_id) == []
            assert await tm.query(after=task_id) == []
            for call in (tm.cancel, tm.retry, tm.wait):
                with pytest.raises(TaskNotFound):
                    await call(task_id)
            with pytest.raises(TaskNotFound):
                await tm.batch_children(task_id, [{"task_type": "child"}])

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("task_types", ["a\x00"]),
            ("app_id", "\x00"),
            ("user_id", "a\udc80"),
            ("dedupe_key", "k\x00"),
            ("parent_id", "\ud800"),
            ("text", "\x00"),
        ],
    )
    async def test_a_filter_value_no_store_holds_is_refused(
        self, edge_taskmill: Taskmill, field: str, value: Any
    ) -> None:
        with pytest.raises(InvalidTaskSpec) as excinfo:
            TaskFilter(**{field: value})
        assert excinfo.value.field == field
        assert isinstance(excinfo.value, ValueError)
        # A long value is harmless in a filter: it selects nothing, on every store.
        assert await edge_taskmill.query(TaskFilter(task_types=["t" * 5000])) == []
        assert (await edge_taskmill.progress_summary(TaskFilter(user_id="u" * 5000))).total == 0

    @pytest.mark.parametrize(
        ("task_type", "app_id", "field"),
        [
            ("s" * 256, None, "task_type"),
            ("s\x00", None, "task_type"),
            ("s", "a" * 256, "app_id"),
            ("s", "\udc80", "app_id"),
        ],
    )
    async def test_scopes_no_store_holds_are_refused(
        self, edge_taskmill: Taskmill, task_type: str, app_id: str | None, field: str
    ) -> None:
        tm = edge_taskmill
        for call in (tm.suspend, tm.resume, tm.preempt):
            with pytest.raises(InvalidTaskSpec) as excinfo:
                await call(task_type, app_id=app_id)
            assert excinfo.value.field == field
        assert await tm.suspensions() == []

    async def test_handler_options_out_of_range_are_refused_when_a_handler_is_added(
        self, edge_taskmill: Taskmill
    ) -> None:
        async def handler(ctx: Context, params: dict[str, Any]) -> None:
            return None

        bad: list[dict[str, Any]] = [
            {"task_type": "t" * 256},
            {"task_type": "t\x00"},
            {"task_type": "t", "timeout": math.inf},
            {"task_type": "t", "timeout": math.nan},
            {"task_type": "t", "timeout": 0},
            {"task_type": "t", "max_retries": 2**40},
            {"task_type": "t", "app_id": "a" * 256},
        ]
        for options in bad:
            with pytest.raises(InvalidTaskSpec, match=r"task_type|timeout|max_retries|app_id"):
                edge_taskmill.register(handler=handler, **options)
        with pytest.raises(InvalidTaskSpec, match="worker_id is 256 characters long"):
            edge_taskmill.worker(worker_id="w" * 256)

    async def test_what_a_handler_writes_reads_back_with_its_types(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill
        result = {"int": 3, "float": 3.0, "big": 2**70, "nul": "a\x00b", "emoji": _EMOJI}

        @tm.handler("writes")
        async def writes(ctx: Context, params: dict[str, Any]) -> dict[str, Any]:
            await ctx.progress(2, 2, message=f"done {_EMOJI}")
            await ctx.set_data(count=1, ratio=1.0, text="x\x00y")
            return result

        task = await tm.enqueue("writes")
        await tm.run_worker(until_idle=True, concurrency=1)
        done = await tm.get(task.id)
        assert done is not None and done.status is TaskStatus.COMPLETED
        assert _types(done.result) == _types(result)
        assert _types(done.data) == _types({"count": 1, "ratio": 1.0, "text": "x\x00y"})
        assert _types([done.progress.done, done.progress.total]) == _types([2.0, 2.0])
        assert done.progress.message == f"done {_EMOJI}"
        assert done.progress.pct == 100.0

    async def test_a_handler_error_no_store_could_hold_is_kept_escaped_and_bounded(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill

        texts = {
            "nul": "bad \x00 byte",
            "surrogate": "bad \udc80 half",
            "long": "head " + "x" * (ERROR_MAX * 3) + " tail",
        }

        @tm.handler("breaks", max_retries=0)
        async def breaks(ctx: Context, params: dict[str, Any]) -> None:
            raise RuntimeError(texts[params["text"]])

        tasks = {name: await tm.enqueue("breaks", {"text": name}) for name in texts}
        await tm.run_worker(until_idle=True, concurrency=1)
        for name, task in tasks.items():
            failed = await tm.get(task.id)
            assert failed is not None and failed.status is TaskStatus.FAILED, name
            assert failed.error is not None
            assert len(failed.error) <= ERROR_MAX, name
            assert "\x00" not in failed.error
            failed.error.encode("utf-8")
            (attempt,) = await tm.attempts(task.id)
            assert attempt.error == failed.error
        nul = await tm.get(tasks["nul"].id)
        assert nul is not None and nul.error is not None and "bad \\x00 byte" in nul.error
        long = await tm.get(tasks["long"].id)
        assert long is not None and long.error is not None
        assert long.error.startswith("RuntimeError: head ") and "characters cut" in long.error

    async def test_a_handler_result_or_message_no_store_holds_fails_clearly(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill

        @tm.handler("surrogate-result", max_retries=0)
        async def surrogate_result(ctx: Context, params: dict[str, Any]) -> str:
            return "half \ud800"

        @tm.handler("bad-message", max_retries=0)
        async def bad_message(ctx: Context, params: dict[str, Any]) -> None:
            await ctx.progress(1, 2, message="m" * 5000)

        first = await tm.enqueue("surrogate-result")
        second = await tm.enqueue("bad-message")
        await tm.run_worker(until_idle=True, concurrency=1)
        one: Task | None = await tm.get(first.id)
        assert one is not None and one.status is TaskStatus.FAILED
        assert one.error is not None and "surrogate" in one.error and one.result is None
        two = await tm.get(second.id)
        assert two is not None and two.status is TaskStatus.FAILED
        assert two.error is not None and "progress message" in two.error and "4096" in two.error

    @pytest.mark.parametrize(
        ("call", "field"),
        [
            pytest.param(lambda tm: tm.query(limit=10**20), "limit", id="limit 10**20"),
            pytest.param(lambda tm: tm.query(limit=-1), "limit", id="negative limit"),
            pytest.param(lambda tm: tm.query(limit=1.5), "limit", id="float limit"),
            pytest.param(lambda tm: tm.query(offset=2**63), "offset", id="offset 2**63"),
            pytest.param(lambda tm: tm.query(offset=-5), "offset", id="negative offset"),
            pytest.param(
                lambda tm: tm.cleanup(timedelta(days=-1)), "older_than", id="negative age"
            ),
            pytest.param(lambda tm: tm.cleanup(3600), "older_than", id="age not a timedelta"),
            pytest.param(
                lambda tm: tm.query(TaskFilter(statuses=["bogus"])), "statuses", id="bad status"
            ),
            pytest.param(
                lambda tm: tm.cancel_by_filter(TaskFilter(), reason="bogus"),
                "reason",
                id="bad cancel reason",
            ),
            pytest.param(lambda tm: tm.wait("x", timeout=math.nan), "timeout", id="NaN wait"),
            pytest.param(lambda tm: tm.wait("x", timeout=-1), "timeout", id="negative wait"),
        ],
    )
    async def test_reads_and_controls_out_of_range_are_refused(
        self, edge_taskmill: Taskmill, call: Callable[[Taskmill], Awaitable[object]], field: str
    ) -> None:
        await edge_taskmill.enqueue("keep")
        before = await self._everything(edge_taskmill)
        with pytest.raises(InvalidTaskSpec) as excinfo:
            await call(edge_taskmill)
        assert excinfo.value.field == field
        assert await self._everything(edge_taskmill) == before

    async def test_the_longest_retention_age_deletes_what_finished(
        self, edge_taskmill: Taskmill
    ) -> None:
        tm = edge_taskmill
        task = await tm.enqueue("old")
        await tm.cancel(task.id)
        assert await tm.cleanup(timedelta.max) == 0  # finished just now: not older
        assert await tm.cleanup(timedelta(0)) == 1
        assert await tm.get(task.id) is None

    async def test_a_store_ceiling_refuses_params_data_and_results_over_it(
        self, edge_taskmill: Taskmill
    ) -> None:
        # The ceiling a store declares (StorageCapabilities.max_value_bytes, set by MySQL
        # and MongoDB from their servers) is enforced by the core, the same for any
        # store: here a small one is set on this store object.
        tm = edge_taskmill
        ceiling = 2000
        caps = attrs.evolve(tm.storage.capabilities, max_value_bytes=ceiling)
        object.__setattr__(tm.storage, "capabilities", caps)
        before = await self._everything(tm)
        with pytest.raises(InvalidInput) as excinfo:
            await tm.enqueue("big", {"b": "x" * ceiling})
        assert excinfo.value.field == "params" and str(ceiling) in str(excinfo.value)
        assert await self._everything(tm) == before

        @tm.handler("big-result", max_retries=3)
        async def big_result(ctx: Context, params: dict[str, Any]) -> str:
            return _EMOJI * (ceiling // 4 + 1)

        @tm.handler("big-data", max_retries=0)
        async def big_data(ctx: Context, params: dict[str, Any]) -> None:
            for _ in range(ceiling // 50):
                await ctx.set_data(**{f"k{_}": "d" * 90})

        result = await tm.enqueue("big-result")
        data = await tm.enqueue("big-data")
        fits = await tm.enqueue("big-result-fits")
        await tm.run_worker(until_idle=True, concurrency=2)
        failed = await tm.get(result.id)
        assert failed is not None and failed.status is TaskStatus.FAILED
        assert failed.attempts == 1, "a result over the ceiling is not retried"
        assert failed.error is not None and str(ceiling) in failed.error
        refused = await tm.get(data.id)
        assert refused is not None and refused.status is TaskStatus.FAILED
        assert refused.error is not None and "task data would be" in refused.error
        assert len(dumps(refused.data).encode()) <= ceiling
        assert (await tm.get(fits.id)) is not None

    async def test_the_stores_own_ceiling_keeps_a_value_at_it_and_refuses_one_byte_more(
        self, edge_taskmill: Taskmill
    ) -> None:
        # The store's real ceiling (MySQL's from max_allowed_packet, MongoDB's from the
        # document size): params of exactly max_value_bytes are kept, one byte more is
        # refused by the core, and a result one byte over fails the task at once.
        ceiling = edge_taskmill.storage.capabilities.max_value_bytes
        if ceiling is None:  # no ceiling: a value far over the default params limit is kept
            async with Taskmill(
                storage=type(edge_taskmill.storage).from_url(edge_taskmill.storage.url),
                plugins=False,
                max_params_bytes=8 * 1024 * 1024,
            ) as tm:
                value = {"b": _EMOJI * (1024 * 1024)}
                kept = await tm.enqueue("big", value)
                back = await tm.get(kept.id)
                assert back is not None and back.params == value
            return
        async with Taskmill(
            storage=type(edge_taskmill.storage).from_url(edge_taskmill.storage.url),
            plugins=False,
            max_params_bytes=2 * ceiling,
        ) as tm:
            assert tm.storage.capabilities.max_value_bytes == ceiling
            wrapper = len(dumps({"b": ""}))
            kept = await tm.enqueue("big", {"b": "x" * (ceiling - wrapper)})
            back = await tm.get(kept.id)
            assert back is not None and len(dumps(back.params)) == ceiling
            before = await self._everything(tm)
            with pytest.raises(InvalidInput) as excinfo:
                await tm.enqueue("big", {"b": "x" * (ceiling + 1 - wrapper)})
            assert f"over the limit of {ceiling} bytes" in str(excinfo.value)
            assert type(tm.storage).__name__ in str(excinfo.value)
            assert await self._everything(tm) == before

            @tm.handler("too-big", max_retries=3)
            async def too_big(ctx: Context, params: dict[str, Any]) -> str:
                return "x" * (ceiling + 1 - len(dumps("")))

            task = await tm.enqueue("too-big")
            await tm.run_worker(until_idle=True, concurrency=1)
            done = await tm.get(task.id)
            assert done is not None and done.status is TaskStatus.FAILED
            assert done.attempts == 1 and done.result is None  # a retry gives the same
            assert done.error is not None
            assert f"{ceiling + 1} bytes as JSON, over the {ceiling} bytes" in done.error

    async def test_children_with_one_bad_spec_store_nothing(self, edge_taskmill: Taskmill) -> None:
        tm = edge_taskmill
        parent = await tm.enqueue("parent")
        before = await self._everything(tm)
        with pytest.raises(InvalidInput) as excinfo:
            await tm.batch_children(
                parent.id, [{"task_type": "child"}, {"task_type": "child", "priority": 2**40}]
            )
        assert excinfo.value.field == "priority"
        assert await self._everything(tm) == before
