"""The ``Taskmill`` a command works on: built from the command's settings, with the
installed plugins and the handler modules loaded, and opened.

Commands that only read never create a store: :func:`open_taskmill` with
``reads=True`` refuses a store that does not exist and says how to pick one. Plugin
commands build theirs with :func:`new_taskmill` and :func:`load_plugins` (exported by
:mod:`taskmill.cli`), so that they name the default store and honour the plugin
settings like taskmill's own commands.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import AsyncIterator, Iterable

from taskmill.app import Taskmill
from taskmill.cli.messages import note
from taskmill.cli.rendering import redacted
from taskmill.discovery import DEFAULT_URL
from taskmill.errors import InvalidURL, StorageUnavailable, TaskmillError, TaskNotFound
from taskmill.model import Task
from taskmill.settings import COMMAND_LINE, DEFAULT, ENV_VARS, Settings

CONFIG_FILE_HINT = "taskmill.toml"


def new_taskmill(settings: Settings, *, plugins: bool = True) -> Taskmill:
    """The ``Taskmill`` the settings describe (not open, no plugins loaded yet); when
    no setting names a store, says on stderr that it uses the default one."""
    try:
        tm = Taskmill(settings.url, plugins=plugins, **settings.taskmill_options())
    except InvalidURL as exc:
        given = [
            f"{option} from {settings.source(f'storage.{option}')}"
            for option in settings.storage_options
        ]
        if not given:
            raise
        raise InvalidURL(f"storage options {'; '.join(given)}: {exc}") from None
    for schedule in settings.schedules:
        tm.add_schedule(schedule)
    if settings.source("url") == DEFAULT:
        default_file = os.path.abspath(DEFAULT_URL.removeprefix("sqlite:///"))
        note(
            f"using the default store {DEFAULT_URL} ({default_file}): no --url, "
            "$TASKMILL_URL or url setting names one"
        )
    return tm


def load_plugins(tm: Taskmill, settings: Settings, *, strict: bool) -> None:
    """Load the plugins the settings allow; ``strict`` False leaves out a plugin that
    cannot be loaded, with a warning, instead of failing the command.

    :raises PluginError: (``strict`` only) a plugin cannot be loaded.
    """
    tm.load_plugins(
        strict=strict,
        enable=settings.enable_plugins,
        disable=settings.disable_plugins,
        enable_from=origin(settings, "enable_plugins"),
        disable_from=origin(settings, "disable_plugins"),
    )


def origin(settings: Settings, name: str) -> str:
    """How messages name where setting ``name`` came from (``TASKMILL_DISABLE_PLUGINS``,
    ``disable_plugins in /path/taskmill.toml``, ...)."""
    source = settings.source(name)
    if source == DEFAULT:
        return f"the default {name}"
    if source == COMMAND_LINE:
        return f"the command line's {name}"
    if source == ENV_VARS.get(name):
        return source
    return f"{name} in {source}"


def load_handlers(tm: Taskmill, modules: Iterable[str]) -> None:
    """Register each module's handlers, through its ``register(tm)``.

    :raises TaskmillError: a module cannot be imported or has no ``register``.
    """
    # Like `python -m`, find modules in the current directory.
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise TaskmillError(f"cannot import handler module {name!r}: {exc}") from None
        register = getattr(module, "register", None)
        if not callable(register):
            raise TaskmillError(
                f"handler module {name!r} has no register(tm) function; define "
                "`def register(tm: taskmill.Taskmill) -> None` that registers its handlers"
            )
        register(tm)


@contextlib.asynccontextmanager
async def open_taskmill(
    settings: Settings,
    command: str,
    *,
    reads: bool,
    handlers: bool = False,
    strict_plugins: bool = True,
) -> AsyncIterator[Taskmill]:
    """The open ``Taskmill`` of a command, closed afterwards.

    :param reads: the command only works on tasks already stored: a store that does not
        exist is an error that says how to pick one, never created empty.
    :param handlers: import the handler modules of the ``imports`` setting.
    :param strict_plugins: a plugin that cannot be loaded fails the command (False:
        it is left out with a warning).
    :raises StorageUnavailable: (``reads``) there is no store at the URL.
    """
    tm = new_taskmill(settings)
    if handlers:
        load_handlers(tm, settings.imports)
    load_plugins(tm, settings, strict=strict_plugins)
    if reads and not await tm.storage.exists():
        raise StorageUnavailable(_no_store(tm, settings, command))
    async with tm:
        yield tm


def _no_store(tm: Taskmill, settings: Settings, command: str) -> str:
    source = settings.source("url")
    if source == DEFAULT:
        where = f"{DEFAULT_URL} ({os.path.abspath(DEFAULT_URL.removeprefix('sqlite:///'))})"
    else:
        where = f"{redacted(tm.url)} (from {'--url' if source == COMMAND_LINE else source})"
    return (
        f"there is no taskmill store at {where}; `taskmill {command}` only reads and does "
        "not create one. Pick the store with --url URL, $TASKMILL_URL or the url setting "
        f"of {CONFIG_FILE_HINT} (`taskmill config` shows the settings), or create this "
        "one with `taskmill migrate`"
    )


async def find_task(tm: Taskmill, ref: str) -> Task:
    """The task whose id is ``ref``, or whose id starts with ``ref`` (as ``ls`` prints).

    :raises TaskNotFound: no task matches.
    :raises TaskmillError: the prefix matches several tasks.
    """
    task = await tm.get(ref)
    if task is not None:
        return task
    if len(ref) < 36:
        matches: list[Task] = []
        page_size, offset = 1000, 0
        while True:
            page = await tm.query(limit=page_size, offset=offset, newest_first=True)
            matches.extend(t for t in page if t.id.startswith(ref))
            if len(page) < page_size:
                break
            offset += page_size
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise TaskmillError(
                f"task id prefix {ref!r} matches {len(matches)} tasks "
                f"({', '.join(t.id for t in matches[:3])}, ...); give more of the id"
            )
    raise TaskNotFound(f"no task with id {ref!r}")
