"""What a worker does when an attempt of a chain's, group's or chord's task starts,
before its handler is called (docs/canvas.md): the params of such a task hold the
reserved key :data:`~taskmill.canvas.CANVAS_KEY`, and :func:`member_params` turns them
into the params its handler gets.

- **Input.** ``{"input": {"from": id, "into": key}}`` (a chain link) passes the result
  of task ``id``; ``{"input": {"children": n, "into": key}}`` (a group's root, a
  chord's callback) passes the results of the task's first ``n`` members, in order.
  They are read from the store at every attempt, never kept in memory, so a retry, or
  a rescue after the worker died, gets the same input. A task deleted by its finish
  (``delete_completed``) is read from its tombstone while the event log keeps it
  (``event_retention``).
- **Completion of a half-stored canvas.** ``{"root": id, "rest": [records]}`` (a
  canvas's first task): when the root is not stored, the process that created the
  canvas died before storing all of it (or another process started this task while
  its creator was still storing the rest), and the records are stored now, in order,
  under their own ids (a task already stored is not stored twice).

An input that cannot be passed (its task did not complete, or is no longer stored)
fails the task at once (``Fail``): retrying would read the same.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from taskmill.canvas import CANVAS_KEY, member_id, task_of_record
from taskmill.errors import Fail
from taskmill.model import JSON, Task, TaskFilter, TaskStatus
from taskmill.storage import TaskStorage

__all__ = ["member_params"]

log = logging.getLogger("taskmill.worker")

_PAGE: Final = 500
_NAMED: Final = 3
"""At most this many tasks that did not complete are named in an error."""


async def member_params(
    storage: TaskStorage, task: Task, *, batch: bool = False
) -> dict[str, JSON]:
    """The params ``task``'s handler is called with: its stored params without
    :data:`~taskmill.canvas.CANVAS_KEY`, and its input under the key it names. When
    ``task`` is the first of a canvas whose root is not stored, the rest of the canvas
    is stored first.

    :param batch: the handler is a batch handler, which reads ``ctx.task.params``
        only: a task with an input fails.
    :raises Fail: the input cannot be passed (see the module's docstring), or the
        reserved key is malformed.
    :raises TaskmillError: the store failed (the attempt is retried as for any error).
    """
    marker = task.params.get(CANVAS_KEY)
    params = {k: v for k, v in task.params.items() if k != CANVAS_KEY}
    if not isinstance(marker, dict):
        raise _malformed(marker)
    rest = marker.get("rest")
    if rest:
        if not isinstance(rest, list):
            raise _malformed(marker)
        await _complete(storage, task, marker.get("root"), rest)
    source = marker.get("input")
    if source is None:
        return params
    if batch:
        raise Fail(
            "a batch handler cannot take the input of a chain or chord (pass_result): it "
            "reads ctx.task.params, which hold only a reference to it; give the task a "
            "plain handler, or build the canvas with pass_result=False"
        )
    if not isinstance(source, dict) or not isinstance(source.get("into"), str):
        raise _malformed(marker)
    params[source["into"]] = await _input(storage, task, source)
    return params


def _malformed(marker: object) -> Fail:
    return Fail(
        f"params key {CANVAS_KEY!r} is reserved for chains, groups and chords, and holds "
        f"something else: {marker!r:.200}"
    )


async def _complete(storage: TaskStorage, task: Task, root: Any, rest: list[Any]) -> None:
    """Store the ``rest`` of ``task``'s canvas unless its root (stored last) is there."""
    if not isinstance(root, str):
        raise _malformed(root)
    if await _stored(storage, root) is not None:
        return
    log.info(
        "task %s (%s): the root %s of its chain, group or chord is not stored (its "
        "creator stopped, or is still storing it): storing the %d tasks after this one",
        task.id,
        task.task_type,
        root,
        len(rest),
    )
    for record in rest:  # one call each: a task may depend on the one before it
        await storage.enqueue([task_of_record(record)])


async def _stored(storage: TaskStorage, task_id: str) -> Task | None:
    """The task, or the tombstone of one its finish deleted, or None."""
    return await storage.get(task_id) or await storage.deleted_task(task_id)


async def _input(storage: TaskStorage, task: Task, source: dict[str, Any]) -> JSON:
    one = source.get("from")
    if isinstance(one, str):
        found = await _stored(storage, one)
        if found is None or found.status is not TaskStatus.COMPLETED:
            raise Fail(f"its input is the result of task {_describe(one, found)}")
        return found.result
    count = source.get("children")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise _malformed(source)
    ids = [member_id(task.id, i) for i in range(count)]
    members = await _members(storage, task.id, ids)
    missed = [
        f"#{i} {_describe(ids[i], m)}"
        for i, m in enumerate(members)
        if m is None or m.status is not TaskStatus.COMPLETED
    ]
    if missed:
        more = f"; and {len(missed) - _NAMED} more" if len(missed) > _NAMED else ""
        raise Fail(
            f"its input is the results of {count} tasks, and {len(missed)} did not "
            f"complete: {'; '.join(missed[:_NAMED])}{more}"
        )
    return [m.result for m in members if m is not None]


def _describe(task_id: str, task: Task | None) -> str:
    if task is None:
        return (
            f"{task_id}, which is no longer stored (deleted when it finished, and its "
            "tombstone pruned after event_retention; docs/canvas.md)"
        )
    error = (task.error or "").split("\n", 1)[0]
    return f"{task_id} ({task.task_type}), which is {task.status.value}" + (
        f": {error}" if error else ""
    )


async def _members(storage: TaskStorage, parent_id: str, ids: Sequence[str]) -> list[Task | None]:
    """The tasks ``ids`` (children of ``parent_id``) in order, None for one no longer
    stored: one query per page of children, then each one missing read alone (a
    tombstone)."""
    wanted = set(ids)
    found: dict[str, Task] = {}
    after: str | None = None
    while len(found) < len(wanted):
        page = await storage.query(TaskFilter(parent_id=parent_id), limit=_PAGE, after=after)
        found.update((t.id, t) for t in page if t.id in wanted)
        if len(page) < _PAGE:
            break
        after = page[-1].id
    for task_id in ids:
        if task_id not in found:
            stored = await _stored(storage, task_id)
            if stored is not None:
                found[task_id] = stored
    return [found.get(task_id) for task_id in ids]
