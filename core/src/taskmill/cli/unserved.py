"""Pending tasks that no handler serves: counted and named after ``worker --until-idle``
and ``stats``, so that a task type without a handler is never silently left waiting."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import attrs

from taskmill.app import Taskmill
from taskmill.cli.messages import warn
from taskmill.model import TaskFilter, TaskStatus
from taskmill.operations import handler_hint
from taskmill.registry import Handler
from taskmill.workers import unserved

SCAN_LIMIT = 5000
"""How many pending tasks are read, at most, to name the types no handler serves."""


def handler_label(key: tuple[str | None, str]) -> str:
    """A handler's ``(app_id, task_type)`` as messages print it: ``app/type``."""
    app_id, task_type = key
    return task_type if app_id is None else f"{app_id}/{task_type}"


async def _pending_of(tm: Taskmill, pending: TaskFilter, app_id: str | None, task_type: str) -> int:
    """Pending tasks of ``task_type`` (of ``app_id``; None: of every app) within
    ``pending``."""
    if pending.task_types is not None and task_type not in pending.task_types:
        return 0
    if app_id is not None and pending.app_id not in (None, app_id):
        return 0
    scope = attrs.evolve(pending, task_types=(task_type,), app_id=app_id or pending.app_id)
    return (await tm.progress_summary(scope)).pending


async def unserved_pending(
    tm: Taskmill, served: Sequence[Handler], scope: TaskFilter
) -> tuple[int, Counter[tuple[str | None, str]], bool]:
    """Pending tasks within ``scope`` that none of the ``served`` handlers would run.

    :returns: how many there are (counted by the store), their ``(app_id,
        task_type)`` keys with counts among the first pending tasks read, and whether
        those counts cover them all.
    """
    pending = attrs.evolve(scope, statuses=(TaskStatus.PENDING,))
    total = (await tm.progress_summary(pending)).pending
    if not total:
        return 0, Counter(), True
    served_keys = {h.key for h in served}
    app_keys = [h.key for h in tm.registry if h.app_id is not None]
    count = 0
    for app_id, task_type in served_keys:
        count += await _pending_of(tm, pending, app_id, task_type)
        if app_id is None:
            # An app with a handler of its own for the type is not served by the
            # host's: its tasks count only when that handler is served (above).
            for other, same in app_keys:
                if same == task_type:
                    count -= await _pending_of(tm, pending, other, same)
    unserved = total - count
    keys: Counter[tuple[str | None, str]] = Counter()
    if unserved <= 0:
        return 0, keys, True
    read = 0
    while read < min(total, SCAN_LIMIT):
        page = await tm.query(pending, limit=500, offset=read)
        if not page:
            break
        read += len(page)
        for task in page:
            handler = tm.registry.lookup(task.app_id, task.task_type)
            if handler is None or handler.key not in served_keys:
                keys[(task.app_id, task.task_type)] += 1
    return unserved, keys, read >= total


async def report_unserved(
    tm: Taskmill, served: Sequence[Handler], scope: TaskFilter, whose: str
) -> None:
    """Say on stderr how many pending tasks no handler of ``whose`` serves, and of
    which types (with close matches among the handlers' types)."""
    unserved, keys, complete = await unserved_pending(tm, served, scope)
    if not unserved:
        return
    parts = []
    for (app_id, task_type), n in keys.most_common(10):
        name = repr(task_type) + ("" if app_id is None else f" of app {app_id!r}")
        hint = handler_hint(served, app_id, task_type)
        count = f"{n}{'' if complete else '+'} task{'' if n == 1 and complete else 's'}"
        parts.append(f"{name} ({count}{'; ' + hint if hint else ''})")
    types = f": {', '.join(parts)}" if parts else ""
    warn(
        f"{unserved} pending task{'' if unserved == 1 else 's'} of types no handler "
        f"{whose} serves{types}; they wait for a worker with handlers for them "
        "(installed plugins, --import modules or the imports setting)"
    )


async def pending_keys(
    tm: Taskmill, scope: TaskFilter
) -> tuple[Counter[tuple[str | None, str]], bool]:
    """The ``(app_id, task_type)`` keys of the pending tasks within ``scope``, with
    counts, among the first :data:`SCAN_LIMIT` read; and whether they cover them all."""
    pending = attrs.evolve(scope, statuses=(TaskStatus.PENDING,))
    keys: Counter[tuple[str | None, str]] = Counter()
    read = 0
    while read < SCAN_LIMIT:
        page = await tm.query(pending, limit=500, offset=read)
        read += len(page)
        for task in page:
            keys[(task.app_id, task.task_type)] += 1
        if len(page) < 500:
            return keys, True
    return keys, False


async def report_unserved_by_workers(tm: Taskmill, scope: TaskFilter) -> None:
    """Say on stderr how many pending tasks within ``scope`` are of types none of the
    live workers serves (from the store's worker registry); nothing on a store without
    one, or while no worker is alive (then nothing runs at all, and ``taskmill workers``
    says so: the warning is for the types the running workers leave behind)."""
    if not tm.storage.capabilities.worker_registry:
        return
    workers = await tm.workers()
    if not any(w.alive for w in workers):
        return
    keys, complete = await pending_keys(tm, scope)
    if not keys:
        return
    missing = unserved(keys, workers)
    if not missing:
        return
    count = sum(keys[key] for key in missing)
    plus = "" if complete else "+"
    parts = []
    for key in sorted(missing, key=lambda k: (-keys[k], k[0] or "", k[1]))[:10]:
        app_id, task_type = key
        n = keys[key]
        name = repr(task_type) + ("" if app_id is None else f" of app {app_id!r}")
        parts.append(f"{name} ({n}{plus} task{'' if n == 1 and complete else 's'})")
    warn(
        f"{count}{plus} pending task{'' if count == 1 and complete else 's'} of types no "
        f"live worker serves: {', '.join(parts)}; they wait until a worker with their "
        "handlers runs (`taskmill workers` lists the live workers)"
    )
