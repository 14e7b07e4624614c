"""``WorkerHost``: what a worker uses of the :class:`~taskmill.Taskmill` that built it.

Declared in :mod:`taskmill.hosts` with the other host interfaces (what each part of the
core uses of the object that owns it); importable from here, and as
``taskmill.WorkerHost``.
"""

from __future__ import annotations

from taskmill.hosts import WorkerHost

__all__ = ["WorkerHost"]
