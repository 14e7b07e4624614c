"""taskmill-shelf: a taskmill store kept in one file, the worked example of
docs/backend-authoring.md.

``shelf:///path/to/tasks.shelf`` names the file. Every operation locks the file
(``flock`` on a lock file beside it), reads the store's state when another process
changed it, runs the operation with the rules of taskmill's reference store
(:class:`taskmill.backends.memory.MemoryStorage`, which interprets the core's lifecycle
kernel), and, when the operation changed anything, writes the state back to a new file
that replaces the old one atomically. So several processes share one store and a
crash never leaves half an operation behind.

It is an example, not a production store: every write rewrites the whole file, so it
suits a few thousand tasks; the lock is taken with a blocking call on the event loop;
and it has no push notifications (workers poll).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self
from urllib.parse import unquote, urlsplit

from taskmill.backends.memory import MemoryStorage
from taskmill.errors import InvalidURL, SchemaVersionError, StorageUnavailable
from taskmill.storage import StorageCapabilities

__all__ = ["FORMAT", "ShelfStorage"]

FORMAT = 1
"""The version of the file's layout; a file of another version is refused."""

_READS = frozenset(
    {
        "get",
        "query",
        "summary",
        "attempts",
        "next_run_at",
        "watch_leases",
        "suspensions",
        "read_events",
        "handler_registrations",
        "deleted_task",
        "workers",
    }
)
"""Operations that change nothing: they read the state and write no file."""

_WRITES = frozenset(
    {
        "enqueue",
        "claim_batch",
        "finish_batch",
        "renew_leases",
        "save_progress",
        "rescue_expired",
        "retry",
        "cleanup",
        "cancel",
        "suspend",
        "resume",
        "prune_events",
        "put_handler_registration",
        "delete_handler_registration",
        "put_worker",
        "remove_worker",
        "prune_workers",
    }
)

_OWN = frozenset({"url", "_open", "path", "_depth", "_version", "_lock_file"})
"""Attributes of the object itself, not of the store's state."""


def _locked(name: str, write: bool) -> Callable[..., Any]:
    """MemoryStorage's operation ``name``, run with the file locked and the state
    loaded (and saved afterwards when ``write``)."""
    operation = getattr(MemoryStorage, name)

    @functools.wraps(operation)
    async def run(self: ShelfStorage, *args: Any, **kwargs: Any) -> Any:
        with self._transaction(write=write):
            return await operation(self, *args, **kwargs)

    return run


class ShelfStorage(MemoryStorage):
    """A store in one file, shared by every process that opens it."""

    capabilities = StorageCapabilities(
        durable=True,
        shared_between_processes=True,
        notifications=False,
        transactions_across_records=True,
        commit_ordered_cursors=True,
        handler_registrations=True,
        worker_registry=True,
    )

    def __init__(self, url: str, path: Path) -> None:
        super().__init__(url)
        self.path = path
        self._depth = 0
        self._version: int | None = None
        self._lock_file: int | None = None

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """``shelf:///absolute/path``; it takes no options.

        :raises InvalidURL: no path, or options given.
        """
        parts = urlsplit(url)
        if options or parts.query:
            raise InvalidURL(f"shelf:// takes no options, got: {url}")
        if parts.netloc or not parts.path or parts.path == "/":
            raise InvalidURL(f"expected shelf:///path/to/file, got {url!r}")
        return cls(url, Path(unquote(parts.path)))

    async def exists(self) -> bool:
        return self.path.exists()

    async def open(self, *, auto_migrate: bool = False) -> None:
        """Open (and, the first time, create) the file.

        :raises StorageUnavailable: its directory does not exist or cannot be written.
        :raises SchemaVersionError: the file has another layout version.
        """
        try:
            self._lock_file = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageUnavailable(f"cannot open {self.path}.lock: {exc}") from exc
        await super().open(auto_migrate=auto_migrate)
        with self._transaction(write=not self.path.exists()):
            pass

    async def close(self) -> None:
        await super().close()
        if self._lock_file is not None:
            os.close(self._lock_file)
            self._lock_file = None
            self._version = None

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[None]:
        """Hold the file's lock with the newest state loaded; save it on success when
        ``write``. Nested calls (an operation that calls another) share the outer one."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._check_open()  # StorageUnavailable when closed
        assert self._lock_file is not None
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        self._depth = 1
        try:
            self._load()
            yield
            if write:
                self._save()
        except BaseException:
            self._version = None  # an operation that failed halfway: read the file again
            raise
        finally:
            self._depth = 0
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def _state(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in _OWN}

    def _generation(self) -> int:
        """How many times the state was saved, kept in the lock file (0: never)."""
        assert self._lock_file is not None
        text = os.pread(self._lock_file, 20, 0).strip()
        return int(text) if text else 0

    def _load(self) -> None:
        version = self._generation()
        if version == self._version or not self.path.exists():
            return  # nobody wrote since this object last read or wrote it
        with self.path.open("rb") as file:
            layout, state = pickle.load(file)
        if layout != FORMAT:
            raise SchemaVersionError(
                f"{self.path} has layout {layout}, this taskmill-shelf reads {FORMAT}"
            )
        vars(self).update(state)
        self._version = version

    def _save(self) -> None:
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "wb") as file:
                pickle.dump((FORMAT, self._state()), file, protocol=pickle.HIGHEST_PROTOCOL)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        assert self._lock_file is not None
        self._version = self._generation() + 1
        os.pwrite(self._lock_file, str(self._version).encode().ljust(20), 0)


for _name in _READS | _WRITES:
    setattr(ShelfStorage, _name, _locked(_name, write=_name in _WRITES))
