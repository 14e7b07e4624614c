"""The dashboard's task list: its filters, as a URL's query string, and keyset pages.

Pages run newest first, in the store's own insertion order. A page's cursor is the id of
its last task, and the next page is the tasks after that task's place in the order
(``query(after=...)``): a page costs no OFFSET into the whole list, every task shows on
exactly one page, and tasks enqueued meanwhile do not shift the pages a reader is
walking (they show on the first page).
"""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

import attrs
from starlette.requests import Request
from taskmill.model import Task, TaskFilter, TaskStatus
from taskmill.operations import TaskOperations

from taskmill_http import requests as rq
from taskmill_http.errors import ServiceError
from taskmill_http.tokens import Caller

PAGE_SIZE = 50
"""Rows on one page of the task list."""
HOST_APP = "-"
"""How the list's ``app_id`` names the host's own tasks (no app), as ``taskmill ls``
does."""
HOST_SCAN_BATCH = 500
"""Tasks read per round when the list shows the host's tasks only (the store has no
"no app" filter: the list reads every app's tasks in order and keeps the host's)."""
HOST_SCAN_ROUNDS = 10
"""Rounds one page of the host's tasks reads at most; a page that found fewer rows
than it holds then links on from where it stopped."""


def _field(request: Request, name: str) -> str | None:
    """A field of the filter form: None when left empty (a form sends every field).

    :raises ServiceError: 422 for a value too long or holding a NUL.
    """
    value = request.query_params.get(name, "").strip() or None
    rq.check_identifier(name, value)
    return value


@attrs.frozen
class ListQuery:
    """What the task list shows: its filters and where the page starts."""

    app_id: str | None = None
    task_type: str | None = None
    statuses: tuple[TaskStatus, ...] = ()
    text: str | None = None
    """Text in the task id or the dedupe key (an exact id shows that task alone)."""
    parent_id: str | None = None
    cursor: str | None = None
    """The id of the last task of the previous page."""
    host_only: bool = False
    """Only the host's own tasks (``app_id`` None): ``app_id=-`` in the URL, admin only."""

    @classmethod
    def from_request(cls, request: Request, caller: Caller) -> ListQuery:
        """The list's query string, checked against the caller's app.

        :raises ServiceError: 403 when an app token names another app, 422 for a value
            the list cannot take.
        """
        app_id = _field(request, "app_id")
        rq.ensure_own_app(caller.app_id, app_id)
        host_only = app_id == HOST_APP
        if host_only:
            app_id = None
        cursor = _field(request, "cursor")
        if cursor is not None:
            try:
                uuid.UUID(cursor)
            except ValueError:
                raise ServiceError(422, "invalid_query", "cursor is not a task id") from None
        return cls(
            app_id=app_id,
            task_type=_field(request, "task_type"),
            statuses=rq.query_statuses(request) or (),
            text=_field(request, "q"),
            parent_id=_field(request, "parent_id"),
            cursor=cursor,
            host_only=host_only,
        )

    def task_filter(self) -> TaskFilter:
        """The filter of this list, without its position."""
        return TaskFilter(
            app_id=self.app_id,
            task_types=None if self.task_type is None else (self.task_type,),
            statuses=self.statuses or None,
            parent_id=self.parent_id,
            text=self.text,
        )

    def event_filter(self) -> TaskFilter:
        """What the live updates of this list need: its app and type, every status
        (a row whose task leaves a filtered status still changes on the page)."""
        return TaskFilter(
            app_id=self.app_id,
            task_types=None if self.task_type is None else (self.task_type,),
        )

    def query_string(self, *, cursor: str | None = None) -> str:
        """This list's filters (at ``cursor``) as a query string, for links."""
        pairs: list[tuple[str, str]] = []
        if self.app_id is not None:
            pairs.append(("app_id", self.app_id))
        if self.host_only:
            pairs.append(("app_id", HOST_APP))
        if self.task_type is not None:
            pairs.append(("task_type", self.task_type))
        pairs.extend(("status", s.value) for s in self.statuses)
        if self.text is not None:
            pairs.append(("q", self.text))
        if self.parent_id is not None:
            pairs.append(("parent_id", self.parent_id))
        if cursor is not None:
            pairs.append(("cursor", cursor))
        return urlencode(pairs)

    def matches(self, task: Task) -> bool:
        """``task`` is one this list shows (its position aside)."""
        return self.task_filter().matches(task) and not (self.host_only and task.app_id is not None)

    @property
    def filtered(self) -> bool:
        """True when any filter is set."""
        return bool(
            self.app_id
            or self.host_only
            or self.task_type
            or self.statuses
            or self.text
            or self.parent_id
        )


@attrs.frozen
class TaskPage:
    """One page of the list and where the next one starts (None on the last)."""

    tasks: list[Task]
    next_cursor: str | None


async def list_page(ops: TaskOperations, query: ListQuery, size: int = PAGE_SIZE) -> TaskPage:
    """The page ``query`` asks for, read through ``ops`` (so scoped to its app).

    A text that is an exact task id shows that task alone (when the other filters select
    it); otherwise the text selects the tasks whose id or dedupe key contains it.
    """
    if query.text is not None and query.cursor is None:
        found = await ops.get(query.text)
        if found is not None and query.matches(found):
            return TaskPage([found], None)
    if query.host_only:
        return await _host_page(ops, query, size)
    rows = await ops.query(
        query.task_filter(), limit=size + 1, newest_first=True, after=query.cursor
    )
    page = rows[:size]
    if len(rows) <= size:
        return TaskPage(page, None)
    return TaskPage(page, page[-1].id)


async def _host_page(ops: TaskOperations, query: ListQuery, size: int) -> TaskPage:
    """A page of the host's own tasks: every app's tasks read in the list's order, the
    host's kept, for at most :data:`HOST_SCAN_ROUNDS` rounds."""
    kept: list[Task] = []
    after = query.cursor
    for _ in range(HOST_SCAN_ROUNDS):
        rows = await ops.query(
            query.task_filter(), limit=HOST_SCAN_BATCH, newest_first=True, after=after
        )
        for task in rows:
            if task.app_id is None:
                kept.append(task)
                if len(kept) > size:
                    return TaskPage(kept[:size], kept[size - 1].id)
        if len(rows) < HOST_SCAN_BATCH:
            return TaskPage(kept, None)
        after = rows[-1].id
    # Scanned as far as one page may: the next page goes on from the last task read.
    return TaskPage(kept, after)
