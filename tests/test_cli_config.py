"""Configuration without code, through the real ``taskmill`` command: a
``taskmill.toml`` or ``[tool.taskmill]`` in the current directory, ``TASKMILL_*``
variables and options, in that order of precedence reversed; ``taskmill config``
showing each value's source; the log as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

from taskmill import TaskStatus

from tests.cli_support import CLI, enqueue, ok, task_of

pytest_plugins = ("tests.cli_fixtures",)


def test_taskmill_config_shows_each_value_and_where_it_came_from(cli: CLI, tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text(
        'concurrency = 3\nlease_seconds = "1m"\nshutdown_grace = 5\n[storage]\nbusy_timeout = 9\n'
    )
    env = {"TASKMILL_CONCURRENCY": "5", "TASKMILL_LEASE_SECONDS": "45"}

    document = json.loads(ok(cli("--log-level", "warning", "config", "--json", **env)))
    from_all = document["settings"]

    assert from_all["concurrency"] == {
        "value": 5,
        "source": "TASKMILL_CONCURRENCY",
        "env": "TASKMILL_CONCURRENCY",
    }
    assert from_all["lease_seconds"]["value"] == 45.0
    assert from_all["shutdown_grace"] == {
        "value": 5.0,
        "source": str(tmp_path / "taskmill.toml"),
        "env": "TASKMILL_SHUTDOWN_GRACE",
    }
    assert from_all["log_level"]["value"] == "WARNING"
    assert from_all["log_level"]["source"] == "command line"
    assert from_all["poll_interval"]["source"] == "default"
    assert from_all["storage.busy_timeout"]["value"] == 9
    assert from_all["url"]["value"] == "sqlite:///taskmill.db"
    assert document["config_file"] == str(tmp_path / "taskmill.toml")
    assert document["config_file_found"] == "taskmill.toml in the current directory"

    table = ok(cli("config", **env))
    assert f"configuration file: {tmp_path / 'taskmill.toml'}" in table
    row = next(line for line in table.splitlines() if line.startswith("concurrency "))
    assert row.split()[:3] == ["concurrency", "5", "TASKMILL_CONCURRENCY"]


def test_the_command_line_wins_over_the_environment_and_the_file(
    cli: CLI, url: str, tmp_path: Path
) -> None:
    (tmp_path / "taskmill.toml").write_text(f'url = "{url}"\nconcurrency = 3\n')
    enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    run = ("worker", "--until-idle", "--import", "cli_handlers")

    from_file = cli(*run)
    from_env = cli(*run, TASKMILL_CONCURRENCY="5")
    from_option = cli(*run, "--concurrency", "7", TASKMILL_CONCURRENCY="5")

    for process, concurrency in ((from_file, 3), (from_env, 5), (from_option, 7)):
        ok(process)
        assert f": concurrency {concurrency} (1 reserved" in process.stderr
    assert "note: using the default store" not in from_file.stderr


def test_a_worker_runs_the_handler_modules_the_configuration_file_imports(
    cli: CLI, url: str, tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f'[project]\nname = "app"\n\n[tool.taskmill]\nurl = "{url}"\nimports = ["cli_handlers"]\n'
        "idle_horizon = 0\n"
    )
    task_id = enqueue(cli, url, "test.add", "--params", '{"a": 2, "b": 2}')

    worker = cli("worker", "--until-idle")

    ok(worker)
    assert "photos/test.add, test.add, test.reject, test.wait_for_file\n" in worker.stderr
    assert task_of(url, task_id).result == {"sum": 4}


def test_a_bad_variable_stops_any_command_naming_it(cli: CLI, url: str) -> None:
    process = cli("--url", url, "worker", TASKMILL_CONCURRENCY="abc")
    assert process.returncode == 2
    assert process.stderr == (
        "error: TASKMILL_CONCURRENCY='abc' is not valid: expected a whole number, 1 or more, "
        "got 'abc'; fix or unset TASKMILL_CONCURRENCY\n"
    )


def test_a_bad_option_value_is_an_argument_error(cli: CLI, url: str) -> None:
    process = cli("--url", url, "worker", "--lease", "soon")
    assert process.returncode == 2
    assert "argument --lease: expected a number of seconds, more than 0" in process.stderr


def test_an_unknown_key_in_the_file_names_the_closest_setting(cli: CLI, tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text("shutdown_grce = 3\n")
    process = cli("ls")
    assert process.returncode == 2
    assert "unknown setting 'shutdown_grce' (did you mean 'shutdown_grace'?)" in process.stderr


def test_reserved_slots_that_leave_no_normal_slot_are_refused(cli: CLI, url: str) -> None:
    process = cli(
        "--url", url, "worker", "--import", "cli_handlers", "--concurrency", "2",
        TASKMILL_RESERVED_HIGH_PRIORITY_SLOTS="2",
    )  # fmt: skip
    assert process.returncode == 2
    assert (
        "reserved_high_priority_slots=2 (from TASKMILL_RESERVED_HIGH_PRIORITY_SLOTS) leaves no "
        "slot for normal-priority tasks with concurrency=2 (from command line)"
    ) in process.stderr


def test_reserved_zero_lets_two_slots_run_two_normal_tasks(cli: CLI, url: str) -> None:
    process = cli(
        "--url", url, "worker", "--until-idle", "--import", "cli_handlers",
        "--concurrency", "2", "--reserved-high", "0",
    )  # fmt: skip
    ok(process)
    assert ": concurrency 2, handlers:" in process.stderr  # nothing reserved


def test_json_log_format_makes_every_stderr_line_a_json_object(
    cli: CLI, url: str, tmp_path: Path
) -> None:
    typo = enqueue(cli, url, "test.ad")
    failing = enqueue(cli, url, "test.reject", "--params", '{"why": "bad"}')

    process = cli(
        "--url", url, "worker", "--until-idle", "--import", "cli_handlers",
        TASKMILL_LOG_FORMAT="json",
    )  # fmt: skip

    ok(process)
    records = [json.loads(line) for line in process.stderr.splitlines()]
    assert records, "the worker logged nothing"
    for record in records:
        assert set(record) >= {"time", "level", "logger", "message"}
        assert record["time"].endswith("+00:00")
    messages = [r["message"] for r in records]
    assert any(m.startswith("worker ") and "concurrency 10" in m for m in messages)
    failed = [r for r in records if "rejected: bad" in r["message"]]
    assert failed and failed[0]["level"] == "WARNING"
    unserved = [r for r in records if "no handler of this worker serves" in r["message"]]
    assert unserved and unserved[0]["level"] == "WARNING"
    assert task_of(url, failing).status is TaskStatus.FAILED
    assert task_of(url, typo).status is TaskStatus.PENDING


def test_log_level_warning_hides_the_info_lines(cli: CLI, url: str) -> None:
    enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    quiet = cli("--url", url, "--log-level", "warning", "worker", "--until-idle", "--import",
                "cli_handlers", TASKMILL_LOG_FORMAT="json")  # fmt: skip
    ok(quiet)
    assert quiet.stderr == ""
