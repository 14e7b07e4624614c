"""Settings (:mod:`taskmill.settings`): where each value comes from, in which order,
how a bad one is reported, and that every worker option has a setting that reaches the
``Worker`` — plus docs/configuration.md naming every setting and variable."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import attrs
import pytest
from taskmill import ConfigurationError, InvalidURL, RetryPolicy, Taskmill, WorkerOptions
from taskmill.settings import (
    COMMAND_LINE,
    DEFAULT,
    ENV_VARS,
    SETTING_NAMES,
    Settings,
    find_config_file,
    load_settings,
    parse_setting,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_defaults_apply_when_nothing_is_set(tmp_path: Path) -> None:
    settings = load_settings(environ={}, cwd=tmp_path)
    assert settings == Settings()
    assert settings.config_file is None
    assert {settings.source(name) for name in SETTING_NAMES} == {DEFAULT}


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "taskmill.toml").write_text(
        'concurrency = 3\nlease_seconds = 40\nshutdown_grace = "2m"\nlog_format = "json"\n'
    )
    environ = {"TASKMILL_CONCURRENCY": "5", "TASKMILL_LEASE_SECONDS": "50"}

    settings = load_settings({"concurrency": 7}, environ=environ, cwd=tmp_path)

    assert settings.concurrency == 7
    assert settings.lease_seconds == 50.0
    assert settings.shutdown_grace == 120.0
    assert settings.log_format == "json"
    assert settings.poll_interval == 1.0
    assert settings.source("concurrency") == COMMAND_LINE
    assert settings.source("lease_seconds") == "TASKMILL_LEASE_SECONDS"
    assert settings.source("shutdown_grace") == str(tmp_path / "taskmill.toml")
    assert settings.source("poll_interval") == DEFAULT


def test_an_empty_variable_counts_as_unset(tmp_path: Path) -> None:
    settings = load_settings(environ={"TASKMILL_CONCURRENCY": " "}, cwd=tmp_path)
    assert settings.concurrency == 10 and settings.source("concurrency") == DEFAULT


def test_pyproject_tool_taskmill_is_read_when_there_is_no_taskmill_toml(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\n\n[tool.taskmill]\nurl = "memory://"\nimports = ["a.tasks"]\n'
        "\n[tool.taskmill.storage]\nbusy_timeout = 5\n"
    )
    settings = load_settings(environ={}, cwd=tmp_path)
    assert settings.url == "memory://"
    assert settings.imports == ("a.tasks",)
    assert settings.storage_options == {"busy_timeout": 5}
    assert settings.config_file == tmp_path / "pyproject.toml"

    (tmp_path / "taskmill.toml").write_text('url = "sqlite:///x.db"\n')
    assert load_settings(environ={}, cwd=tmp_path).url == "sqlite:///x.db"


def test_a_pyproject_without_tool_taskmill_is_not_a_configuration_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\n')
    path, how = find_config_file(environ={}, cwd=tmp_path)
    assert path is None
    assert "no taskmill.toml or pyproject.toml with [tool.taskmill]" in how


def test_config_option_and_taskmill_config_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("concurrency = 2\n")
    (tmp_path / "b.toml").write_text("concurrency = 4\n")
    (tmp_path / "taskmill.toml").write_text("concurrency = 6\n")
    by_env = {"TASKMILL_CONFIG": "b.toml"}
    assert load_settings(environ=by_env, cwd=tmp_path).concurrency == 4
    assert load_settings(config_file="a.toml", environ=by_env, cwd=tmp_path).concurrency == 2


def test_a_named_configuration_file_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"TASKMILL_CONFIG names the configuration"):
        load_settings(environ={"TASKMILL_CONFIG": "missing.toml"}, cwd=tmp_path)
    with pytest.raises(ConfigurationError, match=r"--config names .* which does not exist"):
        load_settings(config_file="missing.toml", environ={}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("TASKMILL_CONCURRENCY", "abc", "a whole number, 1 or more"),
        ("TASKMILL_CONCURRENCY", "0", "a whole number, 1 or more"),
        ("TASKMILL_LEASE_SECONDS", "soon", "a number of seconds, more than 0"),
        ("TASKMILL_LEASE_SECONDS", "0", "a number of seconds, more than 0"),
        ("TASKMILL_SHUTDOWN_GRACE", "-1", "a number of seconds, 0 or more"),
        ("TASKMILL_RESERVED_HIGH_PRIORITY_SLOTS", "x", "a whole number, 0 or more, or 'auto'"),
        ("TASKMILL_AUTO_MIGRATE", "maybe", "true or false"),
        ("TASKMILL_LOG_LEVEL", "loud", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("TASKMILL_LOG_FORMAT", "xml", "one of plain, json"),
        ("TASKMILL_RETRY_JITTER", "2", "a number from 0 to 1"),
        ("TASKMILL_POLL_INTERVAL", "inf", "a number of seconds"),
    ],
)
def test_a_bad_variable_is_an_error_naming_it_and_what_it_expects(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(environ={variable: value}, cwd=tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{variable}={value!r} is not valid: expected {expected}")
    assert message.endswith(f"fix or unset {variable}")


def test_a_bad_file_value_names_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text('concurrency = "many"\n')
    with pytest.raises(ConfigurationError) as caught:
        load_settings(environ={}, cwd=tmp_path)
    assert str(caught.value) == (
        f"{tmp_path / 'taskmill.toml'}: concurrency = 'many' is not valid: expected a "
        "whole number, 1 or more"
    )


def test_an_unknown_file_key_names_the_closest_setting(tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text("concurency = 4\n")
    with pytest.raises(ConfigurationError, match=r"unknown setting 'concurency' \(did you mean"):
        load_settings(environ={}, cwd=tmp_path)


def test_invalid_toml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text("concurrency = = 4\n")
    with pytest.raises(ConfigurationError, match=r"taskmill.toml is not valid TOML"):
        load_settings(environ={}, cwd=tmp_path)


def test_file_keys_may_use_dashes_and_seconds_may_have_units(tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text(
        'shutdown-grace = "90s"\nlease-seconds = "2m"\nidle_horizon = 1.5\n'
        'cleanup_older_than = "7d"\nrescue_interval = "auto"\n'
    )
    settings = load_settings(environ={}, cwd=tmp_path)
    assert settings.shutdown_grace == 90.0
    assert settings.lease_seconds == 120.0
    assert settings.idle_horizon == 1.5
    assert settings.cleanup_older_than == 7 * 86400.0
    assert settings.rescue_interval is None


def test_lists_come_comma_separated_from_variables_and_as_arrays_from_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "taskmill.toml").write_text('app_ids = ["photos", "-"]\nenable_plugins = []\n')
    environ = {"TASKMILL_TASK_TYPES": "resize, encode,,resize", "TASKMILL_IMPORTS": "a.b"}
    settings = load_settings(environ=environ, cwd=tmp_path)
    assert settings.task_types == ("resize", "encode")
    assert settings.imports == ("a.b",)
    assert settings.app_ids == ("photos", None)  # "-" is the host's own handlers
    assert settings.enable_plugins == ()  # an empty list: no plugin at all


def test_reserved_slots_that_leave_no_normal_slot_are_refused_naming_both_sources(
    tmp_path: Path,
) -> None:
    (tmp_path / "taskmill.toml").write_text("concurrency = 2\n")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(
            {"reserved_high_priority_slots": 2},
            environ={},
            cwd=tmp_path,
        )
    assert str(caught.value) == (
        "reserved_high_priority_slots=2 (from command line) leaves no slot for "
        f"normal-priority tasks with concurrency=2 (from {tmp_path / 'taskmill.toml'}): "
        "reserve at most 1, or raise the concurrency"
    )


def test_storage_options_come_from_the_storage_table_and_storage_variables(
    tmp_path: Path,
) -> None:
    (tmp_path / "taskmill.toml").write_text("[storage]\nbusy_timeout = 5\nsynchronous = 'FULL'\n")
    environ = {"TASKMILL_STORAGE_BUSY_TIMEOUT": "7"}
    settings = load_settings(environ=environ, cwd=tmp_path)
    assert settings.storage_options == {"busy_timeout": "7", "synchronous": "FULL"}
    assert settings.source("storage.busy_timeout") == "TASKMILL_STORAGE_BUSY_TIMEOUT"
    assert settings.source("storage.synchronous") == str(tmp_path / "taskmill.toml")


def test_storage_options_reach_the_backend_which_checks_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    good = load_settings({"url": url}, environ={"TASKMILL_STORAGE_BUSY_TIMEOUT": "7"}, cwd=tmp_path)
    tm = Taskmill(good.url, plugins=False, **good.taskmill_options())
    assert tm.storage.busy_timeout == 7.0  # type: ignore[attr-defined]

    bad = load_settings({"url": url}, environ={"TASKMILL_STORAGE_POOL_SIZE": "3"}, cwd=tmp_path)
    with pytest.raises(InvalidURL, match=r"unknown sqlite:// option\(s\): pool_size"):
        Taskmill(bad.url, plugins=False, **bad.taskmill_options())


def test_worker_options_build_a_worker_with_every_setting(tmp_path: Path) -> None:
    environ = {
        "TASKMILL_CONCURRENCY": "4",
        "TASKMILL_RESERVED_HIGH_PRIORITY_SLOTS": "2",
        "TASKMILL_WORKER_ID": "w-1",
        "TASKMILL_LEASE_SECONDS": "12",
        "TASKMILL_SHUTDOWN_GRACE": "3",
        "TASKMILL_POLL_INTERVAL": "2",
        "TASKMILL_MIN_POLL_INTERVAL": "0.2",
        "TASKMILL_CANCEL_CHECK_INTERVAL": "0.7",
        "TASKMILL_PROGRESS_INTERVAL": "0.9",
        "TASKMILL_IDLE_HORIZON": "5",
        "TASKMILL_RESCUE_INTERVAL": "6",
        "TASKMILL_EVENT_RETENTION": "10m",
        "TASKMILL_CLEANUP_OLDER_THAN": "1d",
        "TASKMILL_CLEANUP_INTERVAL": "60",
        "TASKMILL_RETRY_BASE": "1",
        "TASKMILL_RETRY_FACTOR": "3",
        "TASKMILL_RETRY_MAXIMUM": "30",
        "TASKMILL_RETRY_JITTER": "0.1",
        "TASKMILL_TASK_TYPES": "a,b",
        "TASKMILL_APP_IDS": "photos,-",
    }
    settings = load_settings(environ=environ, cwd=tmp_path)
    worker = Taskmill("memory://", plugins=False).worker(**settings.worker_options())

    assert worker.concurrency == 4
    assert worker.reserved_high_priority_slots == 2
    assert worker.worker_id == "w-1"
    assert worker.lease_seconds == 12.0
    assert worker.shutdown_grace == 3.0
    assert worker.poll_interval == 2.0
    assert worker.min_poll_interval == 0.2
    assert worker.cancel_check_interval == 0.7
    assert worker.progress_interval == 0.9
    assert worker.idle_horizon == 5.0
    assert worker.rescue_interval == 6.0
    assert worker.event_retention == timedelta(minutes=10)
    assert worker.cleanup_older_than == timedelta(days=1)
    assert worker.cleanup_interval == 60.0
    assert worker.retry_policy == RetryPolicy(base=1.0, factor=3.0, maximum=30.0, jitter=0.1)
    assert worker.task_types == frozenset({"a", "b"})
    assert worker.app_ids == frozenset({"photos", None})


def test_every_worker_option_has_a_setting_and_the_defaults_agree() -> None:
    """A new worker option must get a setting (or be named here as code-only)."""
    code_only = {"handle_signals"}
    fields = {f.name: f for f in attrs.fields(WorkerOptions)}
    options = Settings().worker_options()
    assert set(fields) - code_only == set(options)
    for name, field in fields.items():
        if name in code_only or name == "retry_policy":
            continue
        assert options[name] == field.default, name
    assert options["retry_policy"] == RetryPolicy()


def test_every_setting_has_one_variable_and_parses_what_it_prints(tmp_path: Path) -> None:
    assert set(ENV_VARS) == set(SETTING_NAMES)
    assert all(v == f"TASKMILL_{k.upper()}" for k, v in ENV_VARS.items())
    assert parse_setting("app_ids", "-,photos") == (None, "photos")


def test_docs_configuration_lists_every_setting_with_its_variable() -> None:
    text = DOCS.read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| `(TASKMILL_\w+)` \|", text, flags=re.MULTILINE))
    assert rows == dict(ENV_VARS)
    assert "TASKMILL_STORAGE_<OPTION>" in text
