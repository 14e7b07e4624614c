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

The worker settings are not declared here: each is a field of
:class:`~taskmill.worker_options.WorkerOptions` or
:class:`~taskmill.backoff.RetryPolicy` whose metadata makes it settable
(:mod:`taskmill.settable`), and :class:`Settings` gets one field per such option
(:data:`WORKER_SETTINGS`).

The Python API reads none of this by itself (only ``$TASKMILL_URL`` and the plugin
lists): code that wants the same settings calls :func:`load_settings` and passes
:meth:`Settings.taskmill_options` and :meth:`Settings.worker_options` on.
"""

from __future__ import annotations

import difflib
import inspect
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import attrs

from taskmill.app import DEFAULT_MAX_PARAMS_BYTES, DEFAULT_MAX_RETRIES
from taskmill.errors import ConfigurationError
from taskmill.periodic import Schedule, schedule_from_config
from taskmill.settable import HOST_APP as HOST_APP
from taskmill.settable import (
    SETTABLE,
    Settable,
    TextForm,
    boolean,
    choice,
    names,
    option_values,
    settable,
    settings_of,
    text,
    variable_name,
    whole,
)
from taskmill.settable import parse_seconds as parse_seconds
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

DEFAULT: Final = "default"
COMMAND_LINE: Final = "command line"

WORKER_SETTINGS: Final = settings_of(WorkerOptions)
"""The settings of a worker's options, in field order: one per settable field of
:class:`~taskmill.worker_options.WorkerOptions`, and ``retry_<field>`` per field of
:class:`~taskmill.backoff.RetryPolicy`. ``handle_signals`` is set in code only."""

_GROUP: Final = "taskmill.group"


def _meta(group: str, declared: dict[str, Any]) -> dict[str, Any]:
    """The metadata of a setting of :class:`Settings`: its declaration and its group."""
    return {**declared, _GROUP: group}


_S = TypeVar("_S", bound=type)


def _with_worker_settings(cls: _S) -> _S:
    """Give ``cls`` (before attrs makes it a class of fields) one field per worker
    setting, after its ``processes`` field and with the option's default."""
    fields: dict[str, Any] = {}
    for name, annotation in inspect.get_annotations(cls).items():
        fields[name] = annotation
        if name == "processes":
            for setting in WORKER_SETTINGS:
                fields[setting.name] = "Any"
                meta = _meta("worker", {SETTABLE: setting.declared})
                setattr(cls, setting.name, attrs.field(default=setting.default, metadata=meta))
    if "processes" not in fields:
        raise TypeError(f"{cls.__name__} has no processes field to put the worker settings after")
    cls.__annotations__ = fields
    return cls


# -- the settings -------------------------------------------------------------------


@attrs.frozen
@_with_worker_settings
class Settings:
    """The effective settings of one ``taskmill`` command (see the module docstring
    for where they come from). Build it with :func:`load_settings`.

    Besides the fields below, every worker setting (:data:`WORKER_SETTINGS`:
    ``concurrency``, ``lease_seconds``, ``retry_base``, ...) is a field, after
    ``processes``, holding the option's value as a file or variable gives it
    (seconds for a ``timedelta``, a tuple for a set).
    """

    # storage
    url: str | None = attrs.field(
        default=None,
        metadata=_meta(
            "storage",
            settable("storage URL; unset: sqlite:///taskmill.db in the current directory", text()),
        ),
    )
    auto_migrate: bool = attrs.field(
        default=False,
        metadata=_meta(
            "storage",
            settable("migrate an older schema when opening instead of refusing", boolean()),
        ),
    )
    max_params_bytes: int = attrs.field(
        default=DEFAULT_MAX_PARAMS_BYTES,
        metadata=_meta("storage", settable("largest accepted task params, as JSON", whole(1))),
    )
    default_max_retries: int = attrs.field(
        default=DEFAULT_MAX_RETRIES,
        metadata=_meta(
            "storage",
            settable("retries of tasks whose handler and enqueue call do not say", whole(0)),
        ),
    )
    storage_options: Mapping[str, Any] = attrs.field(factory=dict)
    """Options of the backend the URL names (``[storage]`` in the file,
    ``TASKMILL_STORAGE_<OPTION>`` in the environment); docs/backends.md lists them."""

    # worker: `processes` is the command's own; the worker settings follow it
    processes: int = attrs.field(
        default=1,
        metadata=_meta(
            "worker",
            settable(
                "worker processes `taskmill worker` runs, each with concurrency slots, under "
                "a supervisor that forwards SIGINT/SIGTERM and restarts a process that dies",
                whole(1),
                "N",
            ),
        ),
    )

    # handlers and plugins
    imports: tuple[str, ...] = attrs.field(
        default=(),
        metadata=_meta(
            "handlers",
            settable(
                "handler modules to import; each has register(tm) (worker, enqueue, stats)",
                names(),
            ),
        ),
    )
    enable_plugins: tuple[str, ...] | None = attrs.field(
        default=None,
        metadata=_meta(
            "handlers",
            settable("load only these installed plugins; unset: all; [] in a file: none", names()),
        ),
    )
    disable_plugins: tuple[str, ...] = attrs.field(
        default=(),
        metadata=_meta("handlers", settable("installed plugins not to load", names())),
    )

    # logging
    log_level: str = attrs.field(
        default="INFO",
        metadata=_meta(
            "logging", settable("level of taskmill's log", choice(LOG_LEVELS, upper=True))
        ),
    )
    log_format: LogFormat = attrs.field(
        default="plain",
        metadata=_meta(
            "logging",
            settable(
                "plain lines, or json: one JSON object per line (time, level, logger, message)",
                choice(LOG_FORMATS),
            ),
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

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            """The worker settings, fields that mypy does not see."""

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
        """Keyword arguments for ``tm.worker(**options)``: every option of
        :data:`WORKER_SETTINGS`, seconds as a ``timedelta`` where the option takes one,
        the ``retry_*`` settings as one ``RetryPolicy``."""
        values = {setting.name: getattr(self, setting.name) for setting in WORKER_SETTINGS}
        return option_values(WORKER_SETTINGS, values)

    def as_rows(self) -> list[tuple[str, Any, str]]:
        """``(name, value, source)`` of every setting, in definition order, then one
        row per storage option (``storage.<option>``)."""
        rows = [(name, getattr(self, name), self.source(name)) for name in SETTING_NAMES]
        for option, value in self.storage_options.items():
            rows.append((f"storage.{option}", value, self.source(f"storage.{option}")))
        return rows


SETTING_NAMES: Final[tuple[str, ...]] = tuple(
    f.name for f in attrs.fields(Settings) if SETTABLE in f.metadata
)
"""Every setting, in definition order (``storage_options`` aside)."""

ENV_VARS: Final[Mapping[str, str]] = {name: variable_name(name) for name in SETTING_NAMES}
"""The environment variable of every setting (``TASKMILL_`` and its name in capitals).
An empty variable counts as unset."""


ENV_PREFIX: Final = "TASKMILL_"
OWN_ENV_VARS: Final[frozenset[str]] = frozenset(
    {
        # set by taskmill for a proxied handler's process (taskmill.proxy)
        "TASKMILL_TASK_ID",
        "TASKMILL_TASK_TYPE",
        "TASKMILL_APP_ID",
        "TASKMILL_ATTEMPT",
        # read by taskmill's own test suite and benchmarks
        "TASKMILL_REQUIRE_BACKENDS",
        "TASKMILL_HYPOTHESIS_PROFILE",
        "TASKMILL_FUZZ_EXAMPLES",
        "TASKMILL_STOP_STRESS_ROUNDS",
        "TASKMILL_CHAOS_LOG",
    }
)
"""``TASKMILL_*`` variables that are not settings but are not typos either; with every
``TASKMILL_TEST_*`` variable (the test suite's servers), :func:`misspelt_variables`
never names them."""


def misspelt_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each ``TASKMILL_*`` variable of ``environ`` (default
    ``os.environ``) that is no setting's but close to one's name, with the name it
    probably meant. Other unknown ``TASKMILL_*`` variables are left alone: plugins
    read variables of their own (``TASKMILL_PROMETHEUS_PORT``), which the settings do
    not know; so are :data:`OWN_ENV_VARS` and ``TASKMILL_TEST_*``."""
    environ = os.environ if environ is None else environ
    known = [*ENV_VARS.values(), CONFIG_ENV]
    warnings = []
    for variable in sorted(environ):
        if (
            not variable.startswith(ENV_PREFIX)
            or variable in known
            or variable in OWN_ENV_VARS
            or variable.startswith((STORAGE_ENV_PREFIX, f"{ENV_PREFIX}TEST_"))
        ):
            continue
        close = difflib.get_close_matches(variable, known, n=1, cutoff=0.85)
        if close:
            warnings.append(
                f"{variable} is not a taskmill setting and is ignored (did you mean "
                f"{close[0]}?); `taskmill config` lists the settings"
            )
    return warnings


def _field(name: str) -> attrs.Attribute[Any]:
    field: attrs.Attribute[Any] = getattr(attrs.fields(Settings), name)
    return field


def declaration(name: str) -> Settable:
    """How setting ``name`` is declared: its help, text form, flag metavar and aliases."""
    declared: Settable = _field(name).metadata[SETTABLE]
    return declared


def setting_form(name: str) -> TextForm:
    """How setting ``name`` is read from text and from a file value."""
    return declaration(name).form


def setting_kind(name: str) -> str:
    """What setting ``name`` expects, as messages and docs say it."""
    return setting_form(name).expected


def setting_doc(name: str) -> str:
    """What setting ``name`` means."""
    return declaration(name).help


def setting_group(name: str) -> str:
    """The group setting ``name`` belongs to: storage, worker, handlers or logging."""
    group: str = _field(name).metadata[_GROUP]
    return group


def parse_setting(name: str, text: str) -> Any:
    """Setting ``name`` from the text a command-line option or variable holds.

    :raises ValueError: the text is not what the setting expects (the message says what
        it expects).
    """
    form = setting_form(name)
    try:
        return form.from_text(text)
    except (ValueError, IndexError):
        raise ValueError(f"expected {form.expected}, got {text!r}") from None


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
            form = setting_form(key)
            try:
                values[key] = form.from_value(value)
            except (ValueError, IndexError):
                raise ConfigurationError(
                    f"{where}: {raw_key} = {value!r} is not valid: expected {form.expected}"
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
