"""The dashboard's bulk actions: retry every FAILED or CANCELLED task of the list's
filter, and cancel the tasks selected on the list (their children and aliases too).

Both count before they ask: the confirmation says how many tasks will change, and the
result says how many did, and why the others were refused. Retries go task by task
(``retry(id)``: the store has no filter-level redrive), each one's refusal (an alias, a
dedupe key another task holds, a task no longer failed) counted by its reason.
"""

from __future__ import annotations

import collections

import attrs
from starlette.requests import Request
from taskmill.errors import TaskmillError, TaskNotFound
from taskmill.model import ACTIVE_STATUSES, Task, TaskFilter, TaskStatus
from taskmill.operations import TaskOperations

from taskmill_http.dashboard.listing import HOST_SCAN_BATCH, ListQuery
from taskmill_http.errors import ServiceError
from taskmill_http.tokens import Caller

BULK_MAX = 1000
"""The most tasks one bulk action changes (retried, or selected plus their children and
aliases); the confirmation says when a filter holds more."""
RETRYABLE = (TaskStatus.FAILED, TaskStatus.CANCELLED)
"""The statuses "Retry all" redrives."""


def list_query(filter: str, caller: Caller) -> ListQuery:
    """The list's filter as a form carries it (the list's own query string)."""
    scope = {"type": "http", "method": "GET", "query_string": filter.encode(), "headers": []}
    return ListQuery.from_request(Request(scope), caller)


def retryable(query: ListQuery) -> bool:
    """The list shows only FAILED and/or CANCELLED tasks, so "Retry all" applies."""
    return bool(query.statuses) and all(s in RETRYABLE for s in query.statuses)


async def retry_targets(ops: TaskOperations, query: ListQuery) -> tuple[list[Task], bool]:
    """The tasks "Retry all" redrives (oldest first), and whether there are more than
    :data:`BULK_MAX`."""
    found: list[Task] = []
    after: str | None = None
    while len(found) <= BULK_MAX:
        rows = await ops.query(query.task_filter(), limit=HOST_SCAN_BATCH, after=after)
        found.extend(t for t in rows if query.matches(t))
        if len(rows) < HOST_SCAN_BATCH:
            break
        after = rows[-1].id
    return found[:BULK_MAX], len(found) > BULK_MAX


async def retry_count(ops: TaskOperations, query: ListQuery) -> int:
    """How many tasks "Retry all" would redrive (at most :data:`BULK_MAX` + 1 for the
    host's list, which the store cannot count)."""
    if query.host_only:
        targets, more = await retry_targets(ops, query)
        return len(targets) + int(more)
    summary = await ops.progress_summary(query.task_filter())
    return sum(getattr(summary, s.value) for s in query.statuses if s in RETRYABLE)


def refusal(exc: TaskmillError) -> str:
    """Why a retry was refused, in words shared by every task refused the same way."""
    text = str(exc)
    if isinstance(exc, TaskNotFound):
        return "the task is gone"
    if "alias" in text:
        return "an alias (retry its leader)"
    if "dedupe key" in text:
        return "another task is active for its dedupe key"
    if "only failed or cancelled" in text:
        return "no longer failed or cancelled"
    return type(exc).__name__


@attrs.frozen
class RetryResult:
    retried: int
    refused: dict[str, int]

    def message(self) -> str:
        """The result as the page says it."""
        text = f"Retried {self.retried} tasks; refused {sum(self.refused.values())}"
        if self.refused:
            reasons = "; ".join(f"{n}: {why}" for why, n in sorted(self.refused.items()))
            return f"{text} ({reasons})."
        return f"{text}."


async def retry_all(ops: TaskOperations, query: ListQuery) -> RetryResult:
    """Redrive every task of ``query`` (up to :data:`BULK_MAX`), counting refusals."""
    targets, _ = await retry_targets(ops, query)
    retried = 0
    refused: collections.Counter[str] = collections.Counter()
    for task in targets:
        try:
            await ops.retry(task.id)
            retried += 1
        except TaskmillError as exc:
            refused[refusal(exc)] += 1
    return RetryResult(retried, dict(refused))


def selected_ids(raw: str) -> list[str]:
    """The ids of a "cancel selected" form (checkboxes, joined by commas).

    :raises ServiceError: 422 for none, or more than :data:`BULK_MAX`.
    """
    ids = list(dict.fromkeys(i.strip() for i in raw.split(",") if i.strip()))
    if not ids:
        raise ServiceError(422, "invalid_body", "select at least one task")
    if len(ids) > BULK_MAX:
        raise ServiceError(422, "invalid_body", f"select at most {BULK_MAX} tasks")
    return ids


async def cancel_tree(ops: TaskOperations, ids: list[str]) -> tuple[list[str], list[str]]:
    """The active tasks cancelling ``ids`` with its cascade changes: the selected ones
    that are active and visible, then their active descendants and aliases (at most
    :data:`BULK_MAX` tasks read); and the selected ids that are not active."""
    selected: list[str] = []
    inactive: list[str] = []
    level: list[Task] = []
    for task_id in ids:
        task = await ops.get(task_id)
        if task is None or task.status not in ACTIVE_STATUSES:
            inactive.append(task_id)
        else:
            selected.append(task.id)
            level.append(task)
    active: dict[str, None] = dict.fromkeys(selected)
    seen = set(active)
    while level and len(seen) < BULK_MAX:
        found: list[Task] = []
        for task in level:
            related = await ops.query(TaskFilter(parent_id=task.id), limit=BULK_MAX)
            if task.dedupe_key is not None and task.alias_of is None:
                same_key = TaskFilter(
                    app_id=task.app_id,
                    task_types=(task.task_type,),
                    dedupe_key=task.dedupe_key,
                    statuses=tuple(ACTIVE_STATUSES),
                )
                aliases = await ops.query(same_key, limit=BULK_MAX)
                related += [t for t in aliases if t.alias_of == task.id]
            for other in related:
                if other.id not in seen:
                    seen.add(other.id)
                    found.append(other)
                    if other.status in ACTIVE_STATUSES:
                        active[other.id] = None
        level = found
    return list(active), inactive


async def cancel_selected(ops: TaskOperations, ids: list[str]) -> tuple[int, int, int]:
    """Cancel the selected tasks with their children and aliases: (tasks selected and
    cancelled, tasks cancelled in all, selected tasks skipped as not active)."""
    tree, inactive = await cancel_tree(ops, ids)
    roots = [i for i in ids if i not in inactive]
    for task_id in roots:
        await ops.cancel(task_id, cascade=True)
    changed = 0
    for task_id in tree:
        after = await ops.get(task_id)
        changed += after is not None and after.status is TaskStatus.CANCELLED
    return len(roots), changed, len(inactive)
