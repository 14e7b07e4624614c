"""The ``taskmill`` argument parser: the global options, taskmill's own commands, the
commands of the installed plugins, and what the command line gives the settings.

The global options (``--url``, ``--config``, ``--log-level``, ``--log-format``) are
accepted before the command and after it. Plugins add their commands through
``taskmill_register_commands``; a command that a first-party plugin adds
(:data:`PLUGIN_COMMANDS`) is explained when that plugin is not installed, disabled or
left out, instead of being just an invalid choice.
"""

from __future__ import annotations

import argparse
from typing import Any

import attrs

from taskmill.cli.arguments import AddCommand, Command, setting_type
from taskmill.cli.commands import control, inspection, tasks, worker
from taskmill.cli.session import origin
from taskmill.discovery import DEFAULT_URL
from taskmill.errors import TaskmillError
from taskmill.plugins import DISABLE_ENV, ENABLE_ENV, Plugins, add_plugin_commands
from taskmill.settings import (
    CONFIG_ENV,
    LOG_FORMATS,
    LOG_LEVELS,
    SETTING_NAMES,
    Settings,
)


@attrs.frozen
class PluginCommand:
    """A command that a first-party plugin adds to the command line."""

    plugin: str
    """The plugin's entry-point name (what ``TASKMILL_DISABLE_PLUGINS`` lists)."""
    distribution: str
    """The distribution to install for it."""
    role: str
    """What the command is to that plugin, as the message says it: ``taskmill demo
    <role> the taskmill-demo plugin``."""


PLUGIN_COMMANDS: dict[str, PluginCommand] = {
    "demo": PluginCommand("demo", "taskmill-demo", "runs the tasks of"),
    "serve": PluginCommand("http", "taskmill-http", "is a command of"),
}
"""The commands of taskmill's own plugins, by name, like the backends' packages in
:data:`taskmill.discovery.KNOWN_PACKAGES`: the core names them only to say what to
install."""


class UnknownCommand(TaskmillError):
    """The command is one a plugin adds, and that plugin is not loaded; the message
    says why and what to do."""


@attrs.frozen
class _PluginState:
    """Which plugins could add commands, and how messages name the lists that chose."""

    plugins: Plugins
    enable_from: str
    disable_from: str

    def explain(self, name: str) -> str | None:
        """Why command ``name`` is missing, when a known plugin would add it."""
        known = PLUGIN_COMMANDS.get(name)
        if known is None:
            return None
        plugin, plugins = known.plugin, self.plugins
        broken = [b for b in plugins.broken if b.name == plugin]
        if plugin in plugins.disabled:
            why = f"which {self.disable_from} disables; take {plugin!r} out of it"
        elif plugin in plugins.not_enabled:
            why = f"which {self.enable_from} leaves out; add {plugin!r} to it"
        elif broken:
            why = f"which cannot be loaded: {broken[0].error}"
        elif plugins.get(plugin) is not None:
            return None  # loaded, yet it added no such command: argparse says so
        else:
            why = f"which is not installed; install it with: pip install {known.distribution}"
        return f"taskmill {name} {known.role} the {known.distribution} plugin, {why}"


class _Parser(argparse.ArgumentParser):
    """The top-level parser; it explains a missing plugin command (see
    :class:`UnknownCommand`)."""

    plugin_state: _PluginState | None = None

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse checks the command name here, before it picks the command's parser.
        if (
            self.plugin_state is not None
            and isinstance(action, argparse._SubParsersAction)
            and isinstance(value, str)
            and value not in action.choices
        ):
            hint = self.plugin_state.explain(value)
            if hint is not None:
                raise UnknownCommand(hint)
        super()._check_value(action, value)


def build_parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    """The argument parser of every ``taskmill`` command.

    :param settings: whose ``enable_plugins`` and ``disable_plugins`` decide which
        installed plugins add their commands (default: ``$TASKMILL_ENABLE_PLUGINS`` and
        ``$TASKMILL_DISABLE_PLUGINS``), so that a plugin the command would not load
        adds no command either.

    ``parse_args`` raises :class:`UnknownCommand` for a command of
    :data:`PLUGIN_COMMANDS` whose plugin is not loaded.
    """
    parser = _Parser(
        prog="taskmill",
        description="Durable background tasks: run workers, enqueue and inspect tasks.",
        epilog=f"The storage URL comes from --url, else $TASKMILL_URL, else the url setting "
        f"of the configuration file, else {DEFAULT_URL}. `taskmill config` shows every "
        "setting and where it came from; docs/configuration.md describes them.",
    )
    _add_global_options(parser, default=None)
    # The global options are accepted after the command too; SUPPRESS keeps the ones
    # given before it otherwise.
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, default=argparse.SUPPRESS)
    commands = parser.add_subparsers(
        title="commands",
        metavar="COMMAND",
        required=True,
        parser_class=argparse.ArgumentParser,
    )

    def add(
        name: str, command: Command, summary: str, description: str = ""
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            parents=[common],
            help=summary,
            description=f"{summary} {description}".strip(),
        )
        sub.set_defaults(command=command)
        return sub

    group: AddCommand = add
    for module in (worker, tasks, control, inspection):
        module.add_commands(group)
    # taskmill_register_commands: `demo` (taskmill-demo), `serve` (taskmill-http), ...
    if settings is None:
        plugins = add_plugin_commands(add)
        parser.plugin_state = _PluginState(plugins, ENABLE_ENV, DISABLE_ENV)
    else:
        plugins = add_plugin_commands(
            add, enable=settings.enable_plugins, disable=settings.disable_plugins
        )
        parser.plugin_state = _PluginState(
            plugins, origin(settings, "enable_plugins"), origin(settings, "disable_plugins")
        )
    return parser


def _add_global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--url",
        default=default,
        help=f"storage URL (default: $TASKMILL_URL, else the configuration file's url, "
        f"else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--config",
        default=default,
        metavar="FILE",
        help=f"the configuration file (default: ${CONFIG_ENV}, else taskmill.toml, else "
        "[tool.taskmill] of pyproject.toml, in the current directory)",
    )
    parser.add_argument(
        "--log-level",
        dest="log_level",
        default=default,
        type=setting_type("log_level"),
        metavar="LEVEL",
        help=f"{'/'.join(LOG_LEVELS).lower()} (default info)",
    )
    parser.add_argument(
        "--log-format",
        dest="log_format",
        default=default,
        type=setting_type("log_format"),
        metavar="FORMAT",
        help=f"{' or '.join(LOG_FORMATS)}: one JSON object per line (default plain)",
    )


def config_file_option(argv: list[str]) -> str | None:
    """The ``--config FILE`` of ``argv``, read before the parser is built (the parser's
    plugin commands depend on the settings that file holds)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--config", default=None)
    known, _ = early.parse_known_args(argv)
    config: str | None = known.config
    return config


def command_line_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave (None: not given); a repeated list flag gives
    one tuple, without repeats."""
    given: dict[str, Any] = {}
    for name in SETTING_NAMES:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "task_types" and args.command is not worker.run_worker:
            continue  # ls/stats/cancel --type is a filter of that command, not a setting
        if isinstance(value, list):
            value = tuple(dict.fromkeys(value))
        given[name] = value
    return given
