"""Every worker option is declared once, as a field of ``WorkerOptions`` (or of
``RetryPolicy``, for the ``retry_*`` settings), and can be set four ways under one name
with one default: by keyword argument (``lease_seconds=``), by configuration file key
(``lease_seconds``), by variable (``TASKMILL_LEASE_SECONDS``) and by flag of
``taskmill worker`` (``--lease-seconds``). The options are enumerated from the fields,
so a new option that lacks one of the four fails here."""

from __future__ import annotations

import argparse
import json
import pickle
import types
import typing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from taskmill import RetryPolicy, Taskmill, WorkerArgs, WorkerOptions
from taskmill.cli import build_parser
from taskmill.cli.parser import command_line_settings
from taskmill.settings import (
    COMMAND_LINE,
    DEFAULT,
    ENV_VARS,
    HOST_APP,
    SETTING_NAMES,
    Settings,
    declaration,
    load_settings,
)

from tests.cli_support import CLI

pytest_plugins = ("tests.cli_fixtures",)

CODE_ONLY = {
    "handle_signals": "`taskmill worker` always takes SIGTERM/SIGINT (its exit statuses "
    "depend on it); `taskmill serve --worker` turns it off in code",
}
"""Options only code sets, and why."""

PARTS = {"retry_policy": (RetryPolicy, "retry_")}
"""Options whose value is built from settings: each field of the class is the setting
``prefix + field``."""


@attrs.frozen
class Option:
    """One worker option as the four sources set it."""

    name: str
    """The keyword argument, file key and setting (``retry_base`` for a part)."""
    field: str
    """The ``WorkerOptions`` field it sets."""
    part: str | None
    """The field of that field's value it sets (``RetryPolicy.base``), if any."""
    default: Any
    sample: Any
    """A value other than the default, valid alone and with every other sample."""

    @property
    def variable(self) -> str:
        return f"TASKMILL_{self.name.upper()}"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def keyword(self, value: Any) -> dict[str, Any]:
        """The keyword arguments of ``WorkerOptions`` that set it to ``value``."""
        if self.part is None:
            return {self.field: value}
        cls, _ = PARTS[self.field]
        return {self.field: cls(**{self.part: value})}

    def of(self, options: WorkerOptions) -> Any:
        """Its value in ``options`` (a part of None is the part of the class's default)."""
        value = getattr(options, self.field)
        if self.part is None:
            return value
        cls, _ = PARTS[self.field]
        return getattr(value or cls(), self.part)


def _sample(hint: Any, default: Any) -> Any:
    """A value of type ``hint`` other than ``default``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [m for m in typing.get_args(hint) if m is not type(None)]
    if typing.get_origin(hint) is frozenset:
        (items,) = typing.get_args(hint)
        return frozenset({"a", "b"}) if items is str else frozenset({"photos", None})
    samples: dict[Any, Callable[[Any], Any]] = {
        bool: lambda d: not d,
        int: lambda d: 2 if d is None else d + 1,
        float: lambda d: 1.5 if d is None else d + 0.5,
        timedelta: lambda d: timedelta(days=1) if d is None else d + timedelta(minutes=1),
        str: lambda d: "sample-worker",
    }
    assert hint in samples, f"no sample value for an option of type {hint}: add one here"
    return samples[hint](default)


def _options() -> list[Option]:
    found = []
    hints = typing.get_type_hints(WorkerOptions)
    for field in attrs.fields(WorkerOptions):
        if field.name in CODE_ONLY:
            continue
        if field.name in PARTS:
            cls, prefix = PARTS[field.name]
            part_hints = typing.get_type_hints(cls)
            for part in attrs.fields(cls):
                sample = _sample(part_hints[part.name], part.default)
                found.append(
                    Option(prefix + part.name, field.name, part.name, part.default, sample)
                )
            continue
        sample = _sample(hints[field.name], field.default)
        found.append(Option(field.name, field.name, None, field.default, sample))
    return found


def _every_sample() -> WorkerOptions:
    """The options with every sample at once."""
    kwargs: dict[str, Any] = {}
    for option in OPTIONS:
        if option.part is None:
            kwargs[option.field] = option.sample
        else:
            kwargs.setdefault(option.field, {})[option.part] = option.sample
    for field, (cls, _) in PARTS.items():
        kwargs[field] = cls(**kwargs[field])
    return WorkerOptions(**kwargs)


OPTIONS = _options()


def _text(value: Any) -> str:
    """``value`` as a variable or a flag gives it."""
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    if isinstance(value, frozenset):
        return ",".join(sorted(HOST_APP if v is None else v for v in value))
    return str(value)


def _toml(value: Any) -> str:
    """``value`` as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, timedelta):
        return repr(value.total_seconds())
    if isinstance(value, frozenset):
        return json.dumps(sorted(HOST_APP if v is None else v for v in value))
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _resolved(settings: Settings) -> WorkerOptions:
    return WorkerOptions(**settings.worker_options())


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.fixture(scope="module")
def worker_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    worker: argparse.ArgumentParser = commands.choices["worker"]
    return worker


def test_the_options_are_every_field_but_the_code_only_ones() -> None:
    names = {f.name for f in attrs.fields(WorkerOptions)}
    assert set(CODE_ONLY) <= names
    assert not set(CODE_ONLY) & set(SETTING_NAMES)
    assert {o.field for o in OPTIONS} | set(CODE_ONLY) == names


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_a_worker_option_is_a_keyword_argument_with_its_default(option: Option) -> None:
    assert option.field in WorkerArgs.__annotations__
    built = WorkerOptions(**option.keyword(option.sample))
    assert option.of(built) == option.sample
    worker = Taskmill("memory://", plugins=False).worker(**option.keyword(option.sample))
    assert worker.options == built
    assert option.of(WorkerOptions()) == option.default


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_a_worker_option_is_a_file_key_a_variable_and_a_flag_of_its_name(
    option: Option, tmp_path: Path, parser: argparse.ArgumentParser
) -> None:
    name = option.name
    assert name in SETTING_NAMES
    assert ENV_VARS[name] == option.variable

    (tmp_path / "taskmill.toml").write_text(f"{name} = {_toml(option.sample)}\n")
    from_file = load_settings(environ={}, cwd=tmp_path)
    assert option.of(_resolved(from_file)) == option.sample
    assert from_file.source(name) == str(tmp_path / "taskmill.toml")
    (tmp_path / "taskmill.toml").unlink()

    from_variable = load_settings(environ={option.variable: _text(option.sample)}, cwd=tmp_path)
    assert option.of(_resolved(from_variable)) == option.sample
    assert from_variable.source(name) == option.variable

    for flag in (option.flag, *declaration(name).aliases):
        args = parser.parse_args(["worker", f"{flag}={_text(option.sample)}"])
        from_flag = load_settings(command_line_settings(args), environ={}, cwd=tmp_path)
        assert option.of(_resolved(from_flag)) == option.sample, flag
        assert from_flag.source(name) == COMMAND_LINE


@pytest.mark.parametrize("option", OPTIONS, ids=lambda o: o.name)
def test_a_worker_option_not_set_anywhere_has_the_keyword_arguments_default(
    option: Option, tmp_path: Path, worker_parser: argparse.ArgumentParser
) -> None:
    settings = load_settings(environ={}, cwd=tmp_path)
    assert settings.source(option.name) == DEFAULT
    assert option.of(_resolved(settings)) == option.default
    (action,) = [a for a in worker_parser._actions if option.flag in a.option_strings]
    assert action.dest == option.name
    assert action.default is None  # unset: the variable, the file or the default decide


# -- through the real command --------------------------------------------------------

PROBE = '''
"""Handlers `a` and `b`, and a plugin that records the options a worker runs with."""
import pickle

import taskmill


class Recorder:
    @taskmill.hookimpl
    def taskmill_worker_started(self, worker):
        with open("options.pickle", "wb") as file:
            pickle.dump(worker.options, file)


def register(tm):
    @tm.handler("a")
    async def a(ctx, params):
        return None

    @tm.handler("b")
    async def b(ctx, params):
        return None

    tm.add_plugin(Recorder(), name="option-probe")
'''


def _every_source(source: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The flags and variables that set every option to its sample by ``source``."""
    if source == "file":
        lines = [f"{o.name} = {_toml(o.sample)}" for o in OPTIONS]
        (tmp_path / "taskmill.toml").write_text("\n".join(lines) + "\n")
    if source == "variable":
        return [], {o.variable: _text(o.sample) for o in OPTIONS}
    if source == "flag":
        # FLAG=VALUE: a value may start with a dash (app_ids "-,photos")
        return [f"{o.flag}={_text(o.sample)}" for o in OPTIONS], {}
    return [], {}


@pytest.mark.parametrize("source", ["default", "file", "variable", "flag"])
def test_the_worker_runs_with_the_options_each_source_sets(
    source: str, cli: CLI, url: str, tmp_path: Path
) -> None:
    (tmp_path / "option_probe.py").write_text(PROBE)
    flags, variables = _every_source(source, tmp_path)

    process = cli(
        "--url", url, "worker", "--until-idle", "--import", "option_probe", *flags, **variables
    )

    assert process.returncode == 0, process.stderr
    with (tmp_path / "options.pickle").open("rb") as file:
        ran_with = pickle.load(file)
    if source == "default":
        assert ran_with == WorkerOptions(retry_policy=RetryPolicy())
    else:
        assert ran_with == _every_sample()


@pytest.mark.parametrize("source", ["default", "file", "variable"])
def test_taskmill_config_shows_every_worker_setting_and_where_it_came_from(
    source: str, cli: CLI, tmp_path: Path
) -> None:
    _, variables = _every_source(source, tmp_path)
    expected_source = {
        "default": lambda o: DEFAULT,
        "file": lambda o: str(tmp_path / "taskmill.toml"),
        "variable": lambda o: o.variable,
    }[source]

    process = cli("config", "--json", **variables)

    assert process.returncode == 0, process.stderr
    shown = json.loads(process.stdout)["settings"]
    settings = Settings() if source == "default" else load_settings(environ=variables, cwd=tmp_path)
    for option in OPTIONS:
        value = getattr(settings, option.name)
        assert shown[option.name] == {
            "value": list(value) if isinstance(value, tuple) else value,
            "source": expected_source(option),
            "env": option.variable,
        }, option.name


def test_every_sample_differs_from_the_default() -> None:
    for option in OPTIONS:
        assert option.sample != option.default, option.name
