"""The reserved params key under which a task keeps the headers plugins give it
(``taskmill_task_headers``, :mod:`taskmill.hookspecs`).

A leaf module (it imports nothing of taskmill), so that the enqueue path and the worker
can name the key without importing :mod:`taskmill.hookspecs`, whose type-only imports
reach the worker. :func:`taskmill.headers_of` reads the headers.
"""

from __future__ import annotations

from typing import Final

HEADERS_KEY: Final = "taskmill.headers"
"""The params key under which a task stores the headers ``taskmill_task_headers`` gave
it: a JSON object of strings, kept with the task in every store. Reserved: an enqueue
whose params use it is refused (:class:`~taskmill.InvalidTaskSpec`). A handler's
``params`` argument never holds it; ``ctx.task.params`` (what a batch handler reads)
does."""
