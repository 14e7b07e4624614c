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

- **Errback.** ``{"errback": {"of": root, "into": key}}`` (a canvas's ``link_error``,
  released once the root has ended, however it ended): when the canvas failed (the
  root FAILED, or was CANCELLED by a dependency because a task of the canvas FAILED),
  the failure (the task that failed first, its error, the root) is passed under
  ``key``; otherwise the errback ends CANCELLED without its handler being called
  (:class:`~taskmill.errors.Cancelled`).
- **A description enqueued as a task** (``{"description": ...}``: a ``chain(...)``,
  ``group(...)`` or ``chord(...)`` given to ``enqueue_many``) fails, saying so.

An input that cannot be passed (its task did not complete, or is no longer stored)
fails the task at once (``Fail``): retrying would read the same.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from taskmill.canvas import CANVAS_KEY, GROUP_TYPE, member_id
from taskmill.canvas_plan import task_of_record
from taskmill.errors import Cancelled, Fail
from taskmill.model import JSON, CancelReason, Task, TaskFilter, TaskStatus
from taskmill.storage import TaskStorage

__all__ = ["member_params"]

log = logging.getLogger("taskmill.worker")


class ErrbackSkipped(Cancelled):
    """An errback's canvas did not fail: the errback ends CANCELLED (reason
    PREEMPTED: nobody cancelled it, its canvas made it moot) without its handler."""


_PAGE: Final = 500
_NAMED: Final = 3
"""At most this many tasks that did not complete are named in an error."""
_SEARCHES: Final = 64
"""At most this many queries look for the task that failed a canvas (an errback's)."""


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
    :raises Cancelled: ``task`` is an errback and its canvas did not fail.
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
    if "description" in marker:
        raise Fail(
            "this task is a chain, group or chord described with taskmill.canvas and "
            "enqueued as one task: store it with tm.chain(...), tm.group(...), "
            "tm.chord(...) or await description.apply(tm) (docs/canvas.md)"
        )
    errback = marker.get("errback")
    if errback is not None:
        if not isinstance(errback, dict):
            raise _malformed(marker)
        root, into = errback.get("of"), errback.get("into")
        if not isinstance(root, str) or not isinstance(into, str):
            raise _malformed(marker)
        failure = await _failure(storage, task, root)
        if batch:
            raise Fail(
                "a batch handler cannot be an errback (link_error): it reads "
                "ctx.task.params, which do not hold the failure; give it a plain handler"
            )
        params[into] = failure
        return params
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


async def _failure(storage: TaskStorage, task: Task, root_id: str) -> dict[str, JSON]:
    """What the errback ``task`` of the canvas ``root_id`` gets: the task that failed
    the canvas (the first to end FAILED among its descendants, a group's root only when
    none of its members did; the root itself when none did).

    :raises Cancelled: the canvas did not fail (COMPLETED, or CANCELLED by a user or
        not because one of its tasks failed).
    :raises Fail: the root is no longer stored.
    """
    root = await _stored(storage, root_id)
    if root is None:
        raise Fail(f"its canvas's root is task {_describe(root_id, None)}")
    culprit: Task | None = None
    if root.status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
        culprit = await _culprit(storage, root, task.id)
    failed = root.status is TaskStatus.FAILED or (
        root.status is TaskStatus.CANCELLED
        and root.cancel_reason is CancelReason.PREEMPTED
        and culprit is not None
    )
    if not failed:
        log.info(
            "task %s (%s), the errback of canvas %s: not run, the canvas is %s",
            task.id,
            task.task_type,
            root_id,
            root.status.value,
        )
        raise ErrbackSkipped(f"canvas {root_id} did not fail ({root.status.value})")
    culprit = culprit or root
    return {
        "task_id": culprit.id,
        "task_type": culprit.task_type,
        "status": culprit.status.value,
        "error": culprit.error,
        "root": root.id,
        "root_status": root.status.value,
    }


async def _culprit(storage: TaskStorage, root: Task, errback_id: str) -> Task | None:
    """The task that failed the canvas of ``root``: breadth first through its FAILED
    or CANCELLED descendants (a bounded number of queries), the FAILED one that
    finished first, preferring a task of the canvas's own to a group's root (whose
    failure only reports its members')."""
    failed: list[Task] = []
    level, queries = [root.id], 0
    ended = (TaskStatus.FAILED, TaskStatus.CANCELLED)
    while level and queries < _SEARCHES:
        found: list[str] = []
        for parent in level[: _SEARCHES - queries]:
            queries += 1
            page = await storage.query(TaskFilter(parent_id=parent, statuses=ended), limit=_PAGE)
            for child in page:
                if child.id == errback_id:
                    continue
                if child.status is TaskStatus.FAILED:
                    failed.append(child)
                found.append(child.id)
        level = found
    own = [t for t in failed if t.task_type != GROUP_TYPE] or failed
    if not own:
        return None
    return min(own, key=lambda t: (t.finished_at is None, t.finished_at or t.created_at))


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
