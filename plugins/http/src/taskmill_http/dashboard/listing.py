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

    @classmethod
    def from_request(cls, request: Request, caller: Caller) -> ListQuery:
        """The list's query string, checked against the caller's app.

        :raises ServiceError: 403 when an app token names another app, 422 for a value
            the list cannot take.
        """
        app_id = _field(request, "app_id")
        rq.ensure_own_app(caller.app_id, app_id)
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

    @property
    def filtered(self) -> bool:
        """True when any filter is set."""
        return bool(self.app_id or self.task_type or self.statuses or self.text or self.parent_id)


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
        if found is not None and query.task_filter().matches(found):
            return TaskPage([found], None)
    rows = await ops.query(
        query.task_filter(), limit=size + 1, newest_first=True, after=query.cursor
    )
    page = rows[:size]
    if len(rows) <= size:
        return TaskPage(page, None)
    return TaskPage(page, page[-1].id)
