"""Settings: every storage, worker, plugin and logging option of the ``taskmill``
command, from the command line, ``TASKMILL_*`` environment variables and a
configuration file.

Precedence, highest first: the command line, the environment, the configuration file,
the defaults. :func:`load_settings` merges them into one frozen :class:`Settings`
that remembers where each value came from (``taskmill config`` prints that).

The configuration file is the first of:

1. the file ``--config PATH`` names, else the one ``$TASKMILL_CONFIG`` names (it must
   exist);
2. ``taskmill.toml`` in the current directory, settings at its top level;
3. ``pyproject.toml`` in the current directory, when it has a ``[tool.taskmill]``
   table.

Only the current directory is looked at, not its parents: a command run elsewhere does
not pick up a project's settings by accident. Storage options (those of the backend the
URL names, such as ``pool_max_size``) go in a ``storage`` table of the file, or in
``TASKMILL_STORAGE_<OPTION>`` variables, and reach the backend as keyword options.

The Python API reads none of this by itself (only ``$TASKMILL_URL`` and the plugin
lists): code that wants the same settings calls :func:`load_settings` and passes
:meth:`Settings.taskmill_options` and :meth:`Settings.worker_options` on.

Why one long module: most of it is the table of settings (each field's kind, default,
help and section), the one table the command line, the environment, the file and
`taskmill config` are generated from.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from taskmill.app import DEFAULT_MAX_PARAMS_BYTES, DEFAULT_MAX_RETRIES
from taskmill.backoff import RetryPolicy
from taskmill.errors import ConfigurationError
from taskmill.periodic import Schedule, schedule_from_config
from taskmill.worker_options import WorkerOptions

LogFormat = Literal["plain", "json"]
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS: Final = ("plain", "json")

CONFIG_ENV: Final = "TASKMILL_CONFIG"
"""Names the configuration file when ``--config`` does not."""
CONFIG_FILE: Final = "taskmill.toml"
PYPROJECT: Final = "pyproject.toml"
STORAGE_ENV_PREFIX: Final = "TASKMILL_STORAGE_"
"""``TASKMILL_STORAGE_POOL_MAX_SIZE=20`` is the storage option ``pool_max_size``."""
HOST_APP: Final = "-"
"""How ``app_ids`` names the host's own tasks (``app_id`` None), as ``taskmill ls``
prints them."""

DEFAULT: Final = "default"
COMMAND_LINE: Final = "command line"

_WORKER_DEFAULTS: Final[dict[str, Any]] = {f.name: f.default for f in attrs.fields(WorkerOptions)}
_RETRY_DEFAULTS: Final = RetryPolicy()


# -- value kinds ----------------------------------------------------------------------


@attrs.frozen
class _Kind:
    """How one setting is read from text (environment, command line) and from a TOML
    value, and what it expects (for messages)."""

    expected: str
    from_text: Callable[[str], Any]
    from_value: Callable[[object], Any]


_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_seconds(text: str) -> float:
    """Seconds from ``"90"``, ``"1.5"``, ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"`` or
    ``"2w"``.

    :raises ValueError: anything else, or a value that is not finite.
    """
    text = text.strip()
    number, unit = (text[:-1], text[-1].lower()) if text[-1:].isalpha() else (text, "s")
    if unit not in _UNITS:
        raise ValueError(text)
    value = float(number) * _UNITS[unit]
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _number_value(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(value)
    return float(value)


def _number(minimum: float, *, exclusive: bool, seconds: bool) -> _Kind:
    """A finite number above ``minimum``; with ``seconds``, units are allowed too."""
    bound = f"more than {minimum:g}" if exclusive else f"{minimum:g} or more"
    parse = parse_seconds if seconds else float

    def check(value: float) -> float:
        if not math.isfinite(value) or value < minimum or (exclusive and value == minimum):
            raise ValueError(value)
        return value

    def from_value(value: object) -> float:
        if isinstance(value, str):
            return check(parse(value))
        return check(_number_value(value))

    expected = (
        f"a number of seconds, {bound} (or with a unit: 90s, 5m, 2h, 1d)"
        if seconds
        else f"a number, {bound}"
    )
    return _Kind(
        expected=expected, from_text=lambda text: check(parse(text)), from_value=from_value
    )


def _seconds(minimum: float, *, exclusive: bool) -> _Kind:
    return _number(minimum, exclusive=exclusive, seconds=True)


def _whole(minimum: int) -> _Kind:
    def check(value: int) -> int:
        if value < minimum:
            raise ValueError(value)
        return value

    def from_value(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(value)
        return check(value)

    return _Kind(
        expected=f"a whole number, {minimum} or more",
        from_text=lambda text: check(int(text.strip())),
        from_value=from_value,
    )


def _fraction() -> _Kind:
    def check(value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(value)
        return value

    return _Kind(
        expected="a number from 0 to 1",
        from_text=lambda text: check(float(text)),
        from_value=lambda value: check(_number_value(value)),
    )


def _optional(kind: _Kind, word: str) -> _Kind:
    """``kind``, or None spelled ``word`` (and, in a file, ``false``)."""

    def from_text(text: str) -> Any:
        return None if text.strip().lower() == word else kind.from_text(text)

    def from_value(value: object) -> Any:
        if value is False or (isinstance(value, str) and value.strip().lower() == word):
            return None
        return kind.from_value(value)

    return _Kind(
        expected=f"{kind.expected}, or {word!r}", from_text=from_text, from_value=from_value
    )


def _names(*, host: bool = False) -> _Kind:
    def clean(items: list[str]) -> tuple[Any, ...]:
        names = tuple(dict.fromkeys(item.strip() for item in items if item.strip()))
        return tuple(None if host and n == HOST_APP else n for n in names)

    def from_value(value: object) -> tuple[Any, ...]:
        if isinstance(value, str):
            return clean(value.split(","))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return clean(value)
        raise ValueError(value)

    suffix = f" ({HOST_APP!r} for the host's own tasks)" if host else ""
    return _Kind(
        expected=f"a list of names{suffix}: comma-separated in a variable, an array in a file",
        from_text=lambda text: clean(text.split(",")),
        from_value=from_value,
    )


def _choice(choices: tuple[str, ...], *, upper: bool = False) -> _Kind:
    def pick(text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in choices:
            raise ValueError(text)
        return value

    def from_value(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(value)
        return pick(value)

    return _Kind(expected=f"one of {', '.join(choices)}", from_text=pick, from_value=from_value)


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def _boolean() -> _Kind:
    def from_text(text: str) -> bool:
        word = text.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise ValueError(text)

    def from_value(value: object) -> bool:
        if not isinstance(value, bool):
            raise ValueError(value)
        return value

    return _Kind(
        expected="true or false (1/0, yes/no, on/off)", from_text=from_text, from_value=from_value
    )


def _text() -> _Kind:
    def from_text(text: str) -> str:
        if not text.strip():
            raise ValueError(text)
        return text.strip()

    def from_value(value: object) -> str:
        if not isinstance(value, str):
            raise ValueError(value)
        return from_text(value)

    return _Kind(expected="a non-empty string", from_text=from_text, from_value=from_value)


_KIND: Final = "taskmill.kind"
_DOC: Final = "taskmill.doc"
_GROUP: Final = "taskmill.group"


def _meta(kind: _Kind, group: str, doc: str) -> dict[str, Any]:
    """The metadata of a setting's field: how it is read, its group, what it means."""
    return {_KIND: kind, _DOC: doc, _GROUP: group}


# -- the settings -------------------------------------------------------------------


@attrs.frozen
class Settings:
    """The effective settings of one ``taskmill`` command (see the module docstring
    for where they come from). Build it with :func:`load_settings`."""

    # storage
    url: str | None = attrs.field(
        default=None,
        metadata=_meta(
            _text(), "storage", "storage URL; unset: sqlite:///taskmill.db in the current directory"
        ),
    )
    auto_migrate: bool = attrs.field(
        default=False,
        metadata=_meta(
            _boolean(), "storage", "migrate an older schema when opening instead of refusing"
        ),
    )
    max_params_bytes: int = attrs.field(
        default=DEFAULT_MAX_PARAMS_BYTES,
        metadata=_meta(_whole(1), "storage", "largest accepted task params, as JSON"),
    )
    default_max_retries: int = attrs.field(
        default=DEFAULT_MAX_RETRIES,
        metadata=_meta(
            _whole(0), "storage", "retries of tasks whose handler and enqueue call do not say"
        ),
    )
    storage_options: Mapping[str, Any] = attrs.field(factory=dict)
    """Options of the backend the URL names (``[storage]`` in the file,
    ``TASKMILL_STORAGE_<OPTION>`` in the environment); docs/backends.md lists them."""

    # worker
    concurrency: int = attrs.field(
        default=_WORKER_DEFAULTS["concurrency"],
        metadata=_meta(_whole(1), "worker", "task slots of a worker"),
    )
    processes: int = attrs.field(
        default=1,
        metadata=_meta(
            _whole(1),
            "worker",
            "worker processes `taskmill worker` runs, under a supervisor that restarts "
            "crashed ones (docs/cli.md)",
        ),
    )
    reserved_high_priority_slots: int | None = attrs.field(
        default=_WORKER_DEFAULTS["reserved_high_priority_slots"],
        metadata=_meta(
            _optional(_whole(0), "auto"),
            "worker",
            "slots only tasks of priority >= USER_ACTION may take; auto: 1 when concurrency "
            "> 1, else 0 (so concurrency 2 runs one normal task at a time)",
        ),
    )
    worker_id: str | None = attrs.field(
        default=None,
        metadata=_meta(_text(), "worker", "the worker's id in the store; unset: host:pid:random"),
    )
    lease_seconds: float = attrs.field(
        default=_WORKER_DEFAULTS["lease_seconds"],
        metadata=_meta(
            _seconds(0, exclusive=True),
            "worker",
            "lease length: a crashed worker's tasks run again after it",
        ),
    )
    shutdown_grace: float = attrs.field(
        default=_WORKER_DEFAULTS["shutdown_grace"],
        metadata=_meta(
            _seconds(0, exclusive=False),
            "worker",
            "on SIGTERM/SIGINT, how long running tasks may finish before they go back to pending",
        ),
    )
    poll_interval: float = attrs.field(
        default=_WORKER_DEFAULTS["poll_interval"],
        metadata=_meta(
            _seconds(0, exclusive=True), "worker", "longest wait between polls of an idle worker"
        ),
    )
    min_poll_interval: float = attrs.field(
        default=_WORKER_DEFAULTS["min_poll_interval"],
        metadata=_meta(
            _seconds(0, exclusive=True), "worker", "shortest wait between polls (right after work)"
        ),
    )
    cancel_check_interval: float = attrs.field(
        default=_WORKER_DEFAULTS["cancel_check_interval"],
        metadata=_meta(
            _seconds(0, exclusive=True),
            "worker",
            "how often a worker checks its running tasks for cancel requests",
        ),
    )
    progress_interval: float = attrs.field(
        default=_WORKER_DEFAULTS["progress_interval"],
        metadata=_meta(
            _seconds(0, exclusive=False), "worker", "how often coalesced progress is written"
        ),
    )
    idle_horizon: float = attrs.field(
        default=_WORKER_DEFAULTS["idle_horizon"],
        metadata=_meta(
            _seconds(0, exclusive=False),
            "worker",
            "--until-idle: stop when no task is due within this many seconds",
        ),
    )
    rescue_interval: float | None = attrs.field(
        default=_WORKER_DEFAULTS["rescue_interval"],
        metadata=_meta(
            _optional(_seconds(0, exclusive=True), "auto"),
            "worker",
            "how often expired leases are rescued; auto: a third of the lease",
        ),
    )
    event_retention: float = attrs.field(
        default=_WORKER_DEFAULTS["event_retention"].total_seconds(),
        metadata=_meta(
            _seconds(0, exclusive=True),
            "worker",
            "seconds events are kept before a worker prunes them",
        ),
    )
    cleanup_older_than: float | None = attrs.field(
        default=None,
        metadata=_meta(
            _optional(_seconds(0, exclusive=False), "off"),
            "worker",
            "delete finished tasks older than this, periodically; off: never",
        ),
    )
    cleanup_interval: float = attrs.field(
        default=_WORKER_DEFAULTS["cleanup_interval"],
        metadata=_meta(_seconds(0, exclusive=True), "worker", "how often that cleanup runs"),
    )
    prefetch: int = attrs.field(
        default=_WORKER_DEFAULTS["prefetch"],
        metadata=_meta(
            _whole(0), "worker", "tasks claimed ahead of the free slots into a local queue"
        ),
    )
    finish_window: float = attrs.field(
        default=_WORKER_DEFAULTS["finish_window"],
        metadata=_meta(
            _seconds(0, exclusive=False),
            "worker",
            "how long outcomes are gathered into one write",
        ),
    )
    retry_base: float = attrs.field(
        default=_RETRY_DEFAULTS.base,
        metadata=_meta(_seconds(0, exclusive=False), "worker", "backoff before the first retry"),
    )
    retry_factor: float = attrs.field(
        default=_RETRY_DEFAULTS.factor,
        metadata=_meta(
            _number(1, exclusive=False, seconds=False),
            "worker",
            "backoff growth per attempt (1 or more)",
        ),
    )
    retry_maximum: float = attrs.field(
        default=_RETRY_DEFAULTS.maximum,
        metadata=_meta(_seconds(0, exclusive=False), "worker", "longest backoff"),
    )
    retry_jitter: float = attrs.field(
        default=_RETRY_DEFAULTS.jitter,
        metadata=_meta(_fraction(), "worker", "backoff spread, a fraction (0 to 1)"),
    )
    task_types: tuple[str, ...] | None = attrs.field(
        default=None,
        metadata=_meta(
            _names(), "worker", "claim only these task types; unset: every type with a handler"
        ),
    )
    app_ids: tuple[str | None, ...] | None = attrs.field(
        default=None,
        metadata=_meta(
            _names(host=True),
            "worker",
            f"claim only handlers of these apps ({HOST_APP} is the host's own); unset: all",
        ),
    )

    # handlers and plugins
    imports: tuple[str, ...] = attrs.field(
        default=(),
        metadata=_meta(
            _names(),
            "handlers",
            "handler modules to import; each has register(tm) (worker, enqueue, stats)",
        ),
    )
    enable_plugins: tuple[str, ...] | None = attrs.field(
        default=None,
        metadata=_meta(
            _names(),
            "handlers",
            "load only these installed plugins; unset: all; [] in a file: none",
        ),
    )
    disable_plugins: tuple[str, ...] = attrs.field(
        default=(),
        metadata=_meta(_names(), "handlers", "installed plugins not to load"),
    )

    # logging
    log_level: str = attrs.field(
        default="INFO",
        metadata=_meta(_choice(LOG_LEVELS, upper=True), "logging", "level of taskmill's log"),
    )
    log_format: LogFormat = attrs.field(
        default="plain",
        metadata=_meta(
            _choice(LOG_FORMATS),
            "logging",
            "plain lines, or json: one JSON object per line (time, level, logger, message)",
        ),
    )

    sources: Mapping[str, str] = attrs.field(factory=dict, eq=False)
    """Where each setting's value came from: ``default``, ``command line``, an
    environment variable's name, or the configuration file's path."""
    schedules: tuple[Schedule, ...] = ()
    """Periodic tasks from the ``[schedules.<name>]`` tables of the file (fields as
    :class:`~taskmill.periodic.Schedule`'s, ``every`` and ``catch_up_window`` in
    seconds); docs/scheduling.md."""

    config_file: Path | None = None
    """The configuration file read, if any."""

    # -- what the settings feed ----------------------------------------------------

    def source(self, name: str) -> str:
        """Where setting ``name`` came from (``default`` when not recorded)."""
        return self.sources.get(name, DEFAULT)

    def taskmill_options(self) -> dict[str, Any]:
        """Keyword arguments for ``Taskmill(settings.url, **options)``: the core's
        options and the backend's storage options."""
        return {
            "max_params_bytes": self.max_params_bytes,
            "default_max_retries": self.default_max_retries,
            "auto_migrate": self.auto_migrate,
            **self.storage_options,
        }

    def worker_options(self) -> dict[str, Any]:
        """Keyword arguments for ``tm.worker(**options)``."""
        return {
            "concurrency": self.concurrency,
            "reserved_high_priority_slots": self.reserved_high_priority_slots,
            "worker_id": self.worker_id,
            "lease_seconds": self.lease_seconds,
            "shutdown_grace": self.shutdown_grace,
            "poll_interval": self.poll_interval,
            "min_poll_interval": self.min_poll_interval,
            "cancel_check_interval": self.cancel_check_interval,
            "progress_interval": self.progress_interval,
            "idle_horizon": self.idle_horizon,
            "rescue_interval": self.rescue_interval,
            "event_retention": timedelta(seconds=self.event_retention),
            "cleanup_older_than": (
                None
                if self.cleanup_older_than is None
                else timedelta(seconds=self.cleanup_older_than)
            ),
            "cleanup_interval": self.cleanup_interval,
            "prefetch": self.prefetch,
            "finish_window": self.finish_window,
            "retry_policy": RetryPolicy(
                base=self.retry_base,
                factor=self.retry_factor,
                maximum=self.retry_maximum,
                jitter=self.retry_jitter,
            ),
            "task_types": self.task_types,
            "app_ids": self.app_ids,
        }

    def as_rows(self) -> list[tuple[str, Any, str]]:
        """``(name, value, source)`` of every setting, in definition order, then one
        row per storage option (``storage.<option>``)."""
        rows = [(name, getattr(self, name), self.source(name)) for name in SETTING_NAMES]
        for option, value in self.storage_options.items():
            rows.append((f"storage.{option}", value, self.source(f"storage.{option}")))
        return rows


SETTING_NAMES: Final[tuple[str, ...]] = tuple(
    f.name for f in attrs.fields(Settings) if _KIND in f.metadata
)
"""Every setting with a value kind, in definition order (``storage_options`` aside)."""

ENV_VARS: Final[Mapping[str, str]] = {
    "url": "TASKMILL_URL",
    "auto_migrate": "TASKMILL_AUTO_MIGRATE",
    "max_params_bytes": "TASKMILL_MAX_PARAMS_BYTES",
    "default_max_retries": "TASKMILL_DEFAULT_MAX_RETRIES",
    "concurrency": "TASKMILL_CONCURRENCY",
    "processes": "TASKMILL_PROCESSES",
    "reserved_high_priority_slots": "TASKMILL_RESERVED_HIGH_PRIORITY_SLOTS",
    "worker_id": "TASKMILL_WORKER_ID",
    "lease_seconds": "TASKMILL_LEASE_SECONDS",
    "shutdown_grace": "TASKMILL_SHUTDOWN_GRACE",
    "poll_interval": "TASKMILL_POLL_INTERVAL",
    "min_poll_interval": "TASKMILL_MIN_POLL_INTERVAL",
    "cancel_check_interval": "TASKMILL_CANCEL_CHECK_INTERVAL",
    "progress_interval": "TASKMILL_PROGRESS_INTERVAL",
    "idle_horizon": "TASKMILL_IDLE_HORIZON",
    "rescue_interval": "TASKMILL_RESCUE_INTERVAL",
    "event_retention": "TASKMILL_EVENT_RETENTION",
    "cleanup_older_than": "TASKMILL_CLEANUP_OLDER_THAN",
    "cleanup_interval": "TASKMILL_CLEANUP_INTERVAL",
    "prefetch": "TASKMILL_PREFETCH",
    "finish_window": "TASKMILL_FINISH_WINDOW",
    "retry_base": "TASKMILL_RETRY_BASE",
    "retry_factor": "TASKMILL_RETRY_FACTOR",
    "retry_maximum": "TASKMILL_RETRY_MAXIMUM",
    "retry_jitter": "TASKMILL_RETRY_JITTER",
    "task_types": "TASKMILL_TASK_TYPES",
    "app_ids": "TASKMILL_APP_IDS",
    "imports": "TASKMILL_IMPORTS",
    "enable_plugins": "TASKMILL_ENABLE_PLUGINS",
    "disable_plugins": "TASKMILL_DISABLE_PLUGINS",
    "log_level": "TASKMILL_LOG_LEVEL",
    "log_format": "TASKMILL_LOG_FORMAT",
}
"""The environment variable of every setting (the one table of their names). An empty
variable counts as unset."""


def _field(name: str) -> attrs.Attribute[Any]:
    field: attrs.Attribute[Any] = getattr(attrs.fields(Settings), name)
    return field


def setting_kind(name: str) -> str:
    """What setting ``name`` expects, as messages and docs say it."""
    kind: _Kind = _field(name).metadata[_KIND]
    return kind.expected


def setting_doc(name: str) -> str:
    """What setting ``name`` means."""
    doc: str = _field(name).metadata[_DOC]
    return doc


def setting_group(name: str) -> str:
    """The group setting ``name`` belongs to: storage, worker, handlers or logging."""
    group: str = _field(name).metadata[_GROUP]
    return group


def parse_setting(name: str, text: str) -> Any:
    """Setting ``name`` from the text a command-line option or variable holds.

    :raises ValueError: the text is not what the setting expects (the message says what
        it expects).
    """
    kind: _Kind = _field(name).metadata[_KIND]
    try:
        return kind.from_text(text)
    except (ValueError, IndexError):
        raise ValueError(f"expected {kind.expected}, got {text!r}") from None


# -- loading ------------------------------------------------------------------------


def find_config_file(
    config_file: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[Path | None, str]:
    """The configuration file to read and how it was found (for messages): ``--config``
    (``config_file``), else ``$TASKMILL_CONFIG``, else ``taskmill.toml``, else a
    ``pyproject.toml`` with a ``[tool.taskmill]`` table, in ``cwd``.

    :raises ConfigurationError: the file ``--config`` or ``$TASKMILL_CONFIG`` names does
        not exist.
    """
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    named, how = (config_file, "--config") if config_file else (environ.get(CONFIG_ENV), CONFIG_ENV)
    if named:
        path = cwd / Path(named).expanduser()
        if not path.is_file():
            raise ConfigurationError(
                f"{how} names the configuration file {str(named)!r}, which does not exist "
                f"(looked for {path}); fix the path or unset {how}"
            )
        return path, f"named by {how}"
    local = cwd / CONFIG_FILE
    if local.is_file():
        return local, f"{CONFIG_FILE} in the current directory"
    pyproject = cwd / PYPROJECT
    if (
        pyproject.is_file()
        and "tool" in (table := _read_toml(pyproject))
        and (isinstance(table["tool"], dict) and "taskmill" in table["tool"])
    ):
        return pyproject, f"[tool.taskmill] of {PYPROJECT} in the current directory"
    return None, (
        f"none: no --config, no ${CONFIG_ENV}, and no {CONFIG_FILE} or {PYPROJECT} with "
        f"[tool.taskmill] in {cwd}"
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}; fix the file") from None
    except OSError as exc:
        raise ConfigurationError(f"cannot read the configuration file {path}: {exc}") from None


def _file_table(path: Path) -> dict[str, Any]:
    """The settings table of ``path``: ``[tool.taskmill]`` of a pyproject.toml, else
    the top level."""
    document = _read_toml(path)
    if path.name != PYPROJECT:
        return document
    tool = document.get("tool", {})
    table = tool.get("taskmill", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: [tool.taskmill] must be a table")
    return table


def _unknown_key(key: str, where: str) -> ConfigurationError:
    known = [*SETTING_NAMES, "storage"]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigurationError(
        f"{where}: unknown setting {key!r}{hint}; the settings are: {', '.join(known)} "
        "(see docs/configuration.md)"
    )


def load_settings(
    command_line: Mapping[str, Any] | None = None,
    *,
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """The effective settings: ``command_line`` over ``environ`` over the configuration
    file over the defaults.

    :param command_line: values already parsed (see :func:`parse_setting`) by setting
        name; None values count as not given. ``storage_options`` may hold a mapping.
    :param config_file: the path ``--config`` gave (see :func:`find_config_file`).
    :param environ: the environment (default ``os.environ``).
    :param cwd: where to look for the configuration file (default: the current
        directory).
    :raises ConfigurationError: a value cannot be used; the message names the variable,
        option or file key it came from and what it expects.
    """
    environ = os.environ if environ is None else environ
    path, _ = find_config_file(config_file, environ=environ, cwd=cwd)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    storage: dict[str, Any] = {}
    schedules: list[Schedule] = []
    if path is not None:
        where = f"{path} [tool.taskmill]" if path.name == PYPROJECT else str(path)
        for raw_key, value in _file_table(path).items():
            key = raw_key.replace("-", "_")
            if key == "storage":
                if not isinstance(value, dict):
                    raise ConfigurationError(
                        f"{where}: storage must be a table of storage options, e.g. "
                        "[storage] with pool_max_size = 20"
                    )
                for option, option_value in value.items():
                    storage[option] = option_value
                    sources[f"storage.{option}"] = str(path)
                continue
            if key == "schedules":
                schedules += _file_schedules(value, where)
                continue
            if key not in SETTING_NAMES:
                raise _unknown_key(raw_key, where)
            kind: _Kind = _field(key).metadata[_KIND]
            try:
                values[key] = kind.from_value(value)
            except (ValueError, IndexError):
                raise ConfigurationError(
                    f"{where}: {raw_key} = {value!r} is not valid: expected {kind.expected}"
                ) from None
            sources[key] = str(path)
    for name, variable in ENV_VARS.items():
        text = environ.get(variable, "")
        if not text.strip():
            continue
        try:
            values[name] = parse_setting(name, text)
        except ValueError as exc:
            raise ConfigurationError(
                f"{variable}={text!r} is not valid: {exc}; fix or unset {variable}"
            ) from None
        sources[name] = variable
    for variable, text in environ.items():
        if variable.startswith(STORAGE_ENV_PREFIX) and text.strip():
            option = variable[len(STORAGE_ENV_PREFIX) :].lower()
            storage[option] = text.strip()
            sources[f"storage.{option}"] = variable
    for name, value in (command_line or {}).items():
        if value is None:
            continue
        if name == "storage_options":
            for option, option_value in value.items():
                storage[option] = option_value
                sources[f"storage.{option}"] = COMMAND_LINE
            continue
        if name not in SETTING_NAMES:
            raise KeyError(f"not a setting: {name!r}")
        values[name] = value
        sources[name] = COMMAND_LINE
    settings = Settings(
        **values,
        storage_options=storage,
        schedules=tuple(schedules),
        sources=sources,
        config_file=path,
    )
    _check_consistent(settings)
    return settings


def _file_schedules(value: object, where: str) -> list[Schedule]:
    """The ``[schedules.<name>]`` tables of a configuration file."""
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{where}: schedules must be a table of schedules, e.g. [schedules.report]"
            ' with task_type = "report" and cron = "0 3 * * *"'
        )
    found: list[Schedule] = []
    for name, table in value.items():
        try:
            found.append(schedule_from_config(name, table))
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    return found


def _check_consistent(settings: Settings) -> None:
    """Refuse settings that are each valid but make no sense together."""
    reserved = settings.reserved_high_priority_slots
    if reserved is not None and reserved >= settings.concurrency:
        raise ConfigurationError(
            f"reserved_high_priority_slots={reserved} (from "
            f"{_source_text(settings, 'reserved_high_priority_slots')}) leaves no slot for "
            f"normal-priority tasks with concurrency={settings.concurrency} (from "
            f"{_source_text(settings, 'concurrency')}): reserve at most "
            f"{settings.concurrency - 1}, or raise the concurrency"
        )
    if settings.min_poll_interval > settings.poll_interval:
        raise ConfigurationError(
            f"min_poll_interval={settings.min_poll_interval:g} (from "
            f"{_source_text(settings, 'min_poll_interval')}) is longer than "
            f"poll_interval={settings.poll_interval:g} (from "
            f"{_source_text(settings, 'poll_interval')}); make it shorter"
        )


def _source_text(settings: Settings, name: str) -> str:
    source = settings.source(name)
    return "the default" if source == DEFAULT else source
