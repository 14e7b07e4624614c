"""Enqueueing a task type no handler serves: silent by default in the Python API
(another process may serve it; the task waits, PENDING), refused with
``Taskmill(strict_types=True)``, on every backend."""

from __future__ import annotations

from typing import Any

import pytest
from taskmill import (
    Context,
    InvalidTaskSpec,
    Taskmill,
    TaskmillError,
    TaskStatus,
    UnknownTaskType,
)


async def resize(ctx: Context, params: dict[str, Any]) -> None:
    return None


async def test_by_default_a_task_no_handler_serves_is_stored_pending(backend_url: str) -> None:
    async with Taskmill(backend_url, plugins=False) as tm:
        tm.register("resize", resize)
        task = await tm.enqueue("resise")
        assert task.status is TaskStatus.PENDING
        stored = await tm.get(task.id)
        assert stored is not None and stored.status is TaskStatus.PENDING


async def test_strict_types_refuses_a_type_no_handler_serves_naming_close_matches(
    backend_url: str,
) -> None:
    async with Taskmill(backend_url, plugins=False, strict_types=True) as tm:
        tm.register("resize", resize)
        tm.register("encode", resize, app_id="photos")

        with pytest.raises(UnknownTaskType) as caught:
            await tm.enqueue("resise")
        message = str(caught.value)
        assert message.startswith("no handler registered here serves task type 'resise'")
        assert "did you mean 'resize'?" in message
        assert isinstance(caught.value, InvalidTaskSpec | TaskmillError)

        with pytest.raises(UnknownTaskType, match=r"handlers for app 'photos' only"):
            await tm.enqueue("encode")
        with pytest.raises(UnknownTaskType, match=r"'encode' of app 'other'"):
            await tm.for_app("other").enqueue("encode")
        assert await tm.query() == []  # nothing was stored

        # Served types go through: the host's handler serves every app.
        assert (await tm.enqueue("resize")).status is TaskStatus.PENDING
        assert (await tm.for_app("photos").enqueue("encode")).app_id == "photos"
        assert (await tm.for_app("other").enqueue("resize")).app_id == "other"


async def test_strict_types_covers_bulk_enqueues_and_children_all_or_nothing(
    backend_url: str,
) -> None:
    async with Taskmill(backend_url, plugins=False, strict_types=True) as tm:
        tm.register("resize", resize)
        with pytest.raises(UnknownTaskType, match="'resise'"):
            await tm.enqueue_many([{"task_type": "resize"}, {"task_type": "resise"}])
        assert await tm.query() == []

        parent = await tm.enqueue("resize")
        with pytest.raises(UnknownTaskType):
            await tm.batch_children(parent.id, [{"task_type": "thumb"}])
        assert [t.id for t in await tm.query()] == [parent.id]
