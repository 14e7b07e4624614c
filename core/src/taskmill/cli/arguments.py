"""The pieces commands are declared with: the type of a command, the argument types
that check a value as argparse reads it, and the options several commands share.

Plugin commands (``taskmill_register_commands``) may use the argument types too, so
that their options read and fail like taskmill's own (``--tasks 0``: "must be at least
1, got 0"); they import them from :mod:`taskmill.cli`, which exports them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, Protocol

from taskmill.model import Priority, TaskStatus
from taskmill.settable import flag_name
from taskmill.settings import ENV_VARS, Settings, declaration, parse_seconds, parse_setting

Command = Callable[[argparse.Namespace, Settings], Coroutine[Any, Any, int]]
"""What a command runs: ``async def command(args, settings) -> exit status``."""


class AddCommand(Protocol):
    """How a group of commands adds one command to the command line."""

    def __call__(
        self, name: str, command: Command, summary: str, description: str = ""
    ) -> argparse.ArgumentParser:
        """Add ``name`` running ``command``; returns its parser, for its options."""
        ...


# -- options several commands share ----------------------------------------------


def setting_type(name: str) -> Callable[[str], Any]:
    """An argparse ``type`` that reads setting ``name`` like its variable is read."""

    def parse(text: str) -> Any:
        try:
            return parse_setting(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_setting(cmd: argparse.ArgumentParser, name: str) -> None:
    """Add the flag of setting ``name`` (``--lease-seconds`` for ``lease_seconds``) and
    its older spellings (``--lease``), which read a value as its variable does. Unset:
    None, so that the variable, the file or the default decides. A list's flag may be
    repeated, and each value may be comma-separated."""
    declared = declaration(name)
    form = declared.form
    flag = flag_name(name)
    default = getattr(Settings(), name)
    shown = "" if default is None and form.none is None else f" (default {form.show(default)})"
    many = "; comma-separated, repeatable" if form.many else ""
    metavar = f"{declared.metavar}[,{declared.metavar}...]" if form.many else declared.metavar
    kind: dict[str, Any] = {
        "dest": name,
        "type": setting_type(name),
        "default": None,
        "action": "extend" if form.many else "store",
    }
    if form.switch:
        kind.update(nargs="?", const=True)
    cmd.add_argument(
        flag, metavar=metavar, help=f"{declared.help}{shown}{many}; also {ENV_VARS[name]}", **kind
    )
    for alias in declared.aliases:
        cmd.add_argument(alias, metavar=declared.metavar, help=f"the same as {flag}", **kind)


def add_handler_options(cmd: argparse.ArgumentParser, purpose: str = "") -> None:
    """Add ``--import MODULE``: handler modules to load before the command runs."""
    suffix = f", {purpose}" if purpose else ""
    cmd.add_argument(
        "--import",
        dest="imports",
        action="extend",
        nargs="+",
        default=None,
        metavar="MODULE",
        help=f"import MODULE and call its register(tm) to register handlers{suffix}; "
        "repeatable (default: the imports setting)",
    )


# -- argument types ---------------------------------------------------------------


def positive_int(text: str) -> int:
    """An int of at least 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An int of 0 or more."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def non_negative_float(text: str) -> float:
    """A finite number of 0 or more."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (task params)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"task params must be a JSON object like '{{\"key\": 1}}', got {text!r}"
        )
    return value


def priority(text: str) -> int:
    """An int, or the name of a :class:`~taskmill.Priority` (any case, ``-`` for ``_``)."""
    name = text.strip().upper().replace("-", "_")
    if name in Priority.__members__:
        return Priority[name]
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a priority: {text!r}; give an int or one of "
            f"{', '.join(p.name.lower() for p in Priority)}"
        ) from None


def status(text: str) -> TaskStatus:
    """A :class:`~taskmill.TaskStatus` value (any case)."""
    try:
        return TaskStatus(text.lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a status: {text!r}; one of {', '.join(s.value for s in TaskStatus)}"
        ) from None


def duration(text: str) -> timedelta:
    """Seconds, or a number with s, m, h, d or w."""
    try:
        seconds = parse_seconds(text)
    except (ValueError, IndexError):
        seconds = -1.0
    if seconds < 0:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r}; use seconds or a number with s, m, h, d or w"
        )
    return timedelta(seconds=seconds)
