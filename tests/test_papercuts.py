"""A newcomer's papercuts (issue 29), each reproduced: what the ``taskmill`` command
says when a variable is misspelt, a cancel names no task type, a table is printed, a
worker cannot be stopped by SIGINT, and a store cannot be reached or opened."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

from tests.cli_support import HANDLERS, SCRIPT, cli_env, enqueue, ok

pytest_plugins = ("tests.cli_fixtures",)  # the cli and url fixtures


# -- a misspelt TASKMILL_* variable -----------------------------------------------------


def test_a_misspelt_taskmill_variable_is_warned_about_with_the_setting_it_meant(cli):
    process = cli("config", TASKMILL_CONCURENCY="3")
    ok(process)
    assert (
        "warning: TASKMILL_CONCURENCY is not a taskmill setting and is ignored "
        "(did you mean TASKMILL_CONCURRENCY?)"
    ) in process.stderr


def test_variables_of_plugins_the_test_suite_and_proxied_handlers_are_not_warned_about(cli):
    process = cli(
        "config",
        TASKMILL_PROMETHEUS_PORT="9464",  # a plugin's own
        TASKMILL_TEST_MONGO_URL="mongodb://127.0.0.1:1/x",  # the test suite's
        TASKMILL_REQUIRE_BACKENDS="postgres",
        TASKMILL_APP_ID="photos",  # what a proxied handler's process is given
        TASKMILL_STORAGE_BUSY_TIMEOUT="5",  # a storage option
    )
    ok(process)
    assert "warning" not in process.stderr


# -- cancel --type with a typo ------------------------------------------------------


def test_cancel_of_a_misspelt_task_type_says_which_type_was_meant(cli, url):
    enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 2}')
    process = cli("--url", url, "cancel", "--type", "test.ad", "--import", "cli_handlers")
    assert ok(process) == "cancelled 0 tasks (user)\n"
    assert "did you mean 'test.add'?" in process.stderr


def test_cancel_of_a_served_task_type_with_nothing_active_gives_no_hint(cli, url):
    enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 2}')
    ok(cli("--url", url, "cancel", "--type", "test.add", "--import", "cli_handlers"))
    process = cli("--url", url, "cancel", "--type", "test.add", "--import", "cli_handlers")
    assert ok(process) == "cancelled 0 tasks (user)\n"
    assert "did you mean" not in process.stderr


# -- how tables are printed ---------------------------------------------------------


def test_config_prints_a_long_url_on_one_line_and_says_once_that_there_is_no_file(cli):
    long_url = "postgresql://taskmill:secret@db-primary.example.internal:5432/taskmill_production"
    shown = ok(cli("--url", long_url, "config"))
    redacted_url = long_url.replace(":secret@", ":***@")
    assert any(line.split()[:2] == ["url", redacted_url] for line in shown.splitlines()), shown
    first = shown.splitlines()[0]
    assert first.startswith("configuration file: none (no --config, no $TASKMILL_CONFIG"), first


def test_show_and_config_end_no_line_with_spaces(cli, url):
    task_id = enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 2}')
    for args in (("show", task_id), ("config",), ("ls",)):
        printed = ok(cli("--url", url, *args))
        padded = [line for line in printed.splitlines() if line != line.rstrip()]
        assert not padded, f"taskmill {args[0]} pads {len(padded)} lines: {padded[:2]}"


# -- a worker started with SIGINT ignored -------------------------------------------


def _ignore_sigint() -> None:  # runs in the child before exec, as `sh -c 'cmd &'` does
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_worker_that_inherits_sigint_ignored_says_so_at_start(tmp_path, url):
    (tmp_path / "cli_handlers.py").write_text(HANDLERS)
    worker = subprocess.run(
        [str(SCRIPT), "--url", url, "worker", "--import", "cli_handlers", "--until-idle"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=cli_env(tmp_path),
        preexec_fn=_ignore_sigint,
        check=False,
    )
    ok(worker)
    lines = [line for line in worker.stderr.splitlines() if "SIGINT is ignored" in line]
    assert len(lines) == 1, worker.stderr
    assert "stop it with SIGTERM" in lines[0]


def test_a_worker_started_normally_says_nothing_about_sigint(cli, url):
    worker = cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle")
    assert "SIGINT" not in ok(worker) + worker.stderr


# -- an unreachable MongoDB ---------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_mongodb_is_one_line_without_the_password_within_the_url_timeout(cli):
    url = f"mongodb://app:s3cret@127.0.0.1:{_closed_port()}/app?serverSelectionTimeoutMS=500"
    started = time.monotonic()
    process = cli("--url", url, "ls")
    elapsed = time.monotonic() - started
    assert process.returncode == 2, process.stderr
    errors = [line for line in process.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, process.stderr
    assert "mongodb://app:***@127.0.0.1" in errors[0]
    assert "no server answered within 0.5 s" in errors[0]
    assert "s3cret" not in process.stderr
    assert "TopologyDescription" not in process.stderr
    assert len(errors[0]) < 400, errors[0]
    assert elapsed < 8, f"took {elapsed:.1f} s with serverSelectionTimeoutMS=500"


# -- a storage option's typo, a missing PostgreSQL database ---------------------------


def test_a_storage_option_typo_names_the_file_it_came_from(cli, tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.taskmill]\nurl = "postgresql://taskmill@127.0.0.1:1/taskmill"\n'
        "storage = {pool_max_sise = 3}\n"
    )
    process = cli("ls")
    assert process.returncode == 2, process.stderr
    assert f"pool_max_sise from {tmp_path / 'pyproject.toml'}" in process.stderr
    assert "unknown postgresql:// option(s): pool_max_sise" in process.stderr


def test_a_missing_postgresql_database_says_how_to_create_it(cli, postgres_url):
    parts = urlsplit(postgres_url)
    missing = f"taskmill_missing_{uuid.uuid4().hex[:8]}"
    url = urlunsplit(parts._replace(path=f"/{missing}", query=""))
    process = cli("--url", url, "ls")
    assert process.returncode == 2, process.stderr
    assert f'database "{missing}" does not exist; create it with: createdb' in process.stderr
    assert f"-U {parts.username} {missing}" in process.stderr
    assert f":{parts.password}@" not in process.stderr


REPRO_EVENTS_BREAK = """
import asyncio, sys
from taskmill import Taskmill

async def main(url):
    async with Taskmill(url, plugins=False, auto_migrate=True) as tm:
        async def later():
            await asyncio.sleep(0.3)
            await tm.enqueue("x", {})
        enqueuing = asyncio.create_task(later())
        async for event in tm.events():
            print("event", event.kind.value, flush=True)
            break  # the documented way to stop
        await enqueuing

asyncio.run(main(sys.argv[1]))
print("done", flush=True)
"""


def test_breaking_out_of_events_on_mongodb_leaves_no_pending_task_behind(mongo_url: str, tmp_path):
    """Issue 29's report: leaving ``async for ev in tm.events()`` and then ``async
    with tm`` printed pymongo's ``Task was destroyed but it is pending!``. Not
    reproduced here (the nx-27017 stand-in, PyMongo's async API); this keeps it so."""
    script = tmp_path / "events_break.py"
    script.write_text(REPRO_EVENTS_BREAK)
    done = subprocess.run(
        [sys.executable, "-X", "dev", str(script), mongo_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["event", "enqueued", "done"]
    assert "Task was destroyed" not in done.stderr, done.stderr[-2000:]
    assert "never awaited" not in done.stderr, done.stderr[-2000:]
