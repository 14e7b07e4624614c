"""The ``taskmill`` command line, run as the installed console script in a subprocess
against a real SQLite file, its output checked against what the database holds."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from datetime import timedelta
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from taskmill import Task, TaskFilter, TaskStatus
from taskmill.discovery import KNOWN_PACKAGES

from tests.cli_support import SCRIPT, cli_env, enqueue, ok, stored, task_of, wait_until

pytest_plugins = ("tests.cli_fixtures",)  # the cli and url fixtures

# The demo's handlers come from the installed taskmill-demo plugin, found the way the
# CLI finds it: through its entry point.
(_DEMO_ENTRY_POINT,) = entry_points(group="taskmill.plugins", name="demo")
DEMO = _DEMO_ENTRY_POINT.load()
assert _DEMO_ENTRY_POINT.dist is not None
DEMO_VERSION = _DEMO_ENTRY_POINT.dist.version

_env = cli_env
_ok = ok
_stored = stored
_task = task_of
_enqueue = enqueue


def _field(show_output: str, name: str) -> str:
    match = re.search(rf"^\s*{name}\s+(.*?)\s*$", show_output, re.MULTILINE)
    assert match, f"no {name} line in:\n{show_output}"
    return match.group(1)


# -- enqueue, ls, show, worker ------------------------------------------------------


def test_an_enqueued_task_is_listed_shown_run_by_a_worker_and_shown_completed(cli, url):
    task_id = _enqueue(
        cli,
        url,
        "test.add",
        "--params",
        '{"a": 2, "b": 3}',
        "--priority",
        "user_action",
        "--user-id",
        "alice",
    )

    listing = _ok(cli("--url", url, "ls"))
    row = next(line for line in listing.splitlines() if task_id[:8] in line)
    assert row.split()[:6] == [task_id[:8], "test.add", "-", "pending", "user_action", "0/4"]

    shown = _ok(cli("--url", url, "show", task_id))
    assert _field(shown, "id") == task_id
    assert _field(shown, "task_type") == "test.add"
    assert _field(shown, "status") == "pending"
    assert _field(shown, "priority") == "1000 (user_action)"
    assert json.loads(_field(shown, "params")) == {"a": 2, "b": 3}
    assert _field(shown, "user_id") == "alice"
    assert "no attempts yet" in shown

    worker = cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle")
    _ok(worker)
    assert worker.stdout == ""  # a worker reports on stderr only
    assert "stopped after 1 attempt\n" in worker.stderr

    shown = _ok(cli("--url", url, "show", task_id))
    assert _field(shown, "status") == "completed"
    assert json.loads(_field(shown, "result")) == {"sum": 5}
    assert _field(shown, "progress") == "1/1 (100%) added"
    attempts = re.split(r"^attempts *$", shown, flags=re.MULTILINE)[1]
    assert re.search(r"^\s*1\s+completed\s", attempts, re.MULTILINE), attempts

    stored = _task(url, task_id)
    assert stored.status is TaskStatus.COMPLETED
    assert stored.result == {"sum": 5}


def test_show_json_holds_the_stored_task_and_its_attempt_log(cli, url):
    task_id = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    _ok(cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle"))

    document = json.loads(_ok(cli("--url", url, "show", task_id, "--json")))

    stored = _task(url, task_id)
    assert document["task"]["id"] == stored.id
    assert document["task"]["status"] == "completed"
    assert document["task"]["result"] == {"sum": 2}
    assert stored.finished_at is not None
    assert document["task"]["finished_at"] == stored.finished_at.isoformat()
    (attempt,) = document["attempts"]
    assert attempt["number"] == 1
    assert attempt["outcome"] == "completed"
    assert attempt["elapsed_ms"] >= 0


def test_show_prints_the_traceback_excerpt_of_a_failed_attempt_and_ls_its_first_line(
    cli, url, tmp_path
):
    (tmp_path / "crash_handlers.py").write_text(
        "def parse(row):\n"
        "    return int(row)\n"
        "\n"
        "def register(tm):\n"
        "    @tm.handler('crash', max_retries=0)\n"
        "    async def crash(ctx, params):\n"
        "        return parse(params['row'])\n"
    )
    task_id = _enqueue(cli, url, "crash", "--params", '{"row": "x"}', "--import", "crash_handlers")
    _ok(cli("--url", url, "worker", "--import", "crash_handlers", "--until-idle"))

    shown = _ok(cli("--url", url, "show", task_id, "--json"))
    (attempt,) = json.loads(shown)["attempts"]
    assert attempt["error"].startswith("ValueError: invalid literal for int()")
    assert "Traceback (most recent call last):" in attempt["error"]
    assert "crash_handlers.py" in attempt["error"] and "return int(row)" in attempt["error"]
    text = _ok(cli("--url", url, "show", task_id, COLUMNS="200"))
    assert "Traceback (most recent call last):" in text and "in parse" in text
    listing = _ok(cli("--url", url, "ls"))
    assert "ValueError: invalid literal" in listing and "Traceback" not in listing


def test_show_marks_the_run_a_manual_retry_started(cli, url, tmp_path):
    (tmp_path / "flaky_handlers.py").write_text(
        "def register(tm):\n"
        "    @tm.handler('flaky', max_retries=1)\n"
        "    async def flaky(ctx, params):\n"
        "        raise RuntimeError('no')\n"
    )
    task_id = _enqueue(cli, url, "flaky", "--import", "flaky_handlers")
    _ok(cli("--url", url, "worker", "--import", "flaky_handlers", "--until-idle"))
    wait_until(lambda: _task(url, task_id).status is TaskStatus.FAILED, "the first run failed")
    _ok(cli("--url", url, "retry", task_id))
    _ok(cli("--url", url, "worker", "--import", "flaky_handlers", "--until-idle"))
    wait_until(lambda: _task(url, task_id).status is TaskStatus.FAILED, "the second run failed")

    document = json.loads(_ok(cli("--url", url, "show", task_id, "--json")))
    assert [(a["run"], a["number"]) for a in document["attempts"]] == [
        (1, 1),
        (1, 2),
        (2, 1),
        (2, 2),
    ]
    text = _ok(cli("--url", url, "show", task_id, COLUMNS="200"))
    assert re.search(r"^\s*run\s+#\s+outcome", text, re.MULTILINE), text
    assert re.search(r"^\s*2\s+1\s+failed", text, re.MULTILINE), text


def test_show_and_retry_accept_the_short_id_that_ls_prints(cli, url):
    task_id = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    shown = _ok(cli("--url", url, "show", task_id[:8]))
    assert _field(shown, "id") == task_id


def test_enqueue_json_prints_the_task_as_stored(cli, url):
    printed = json.loads(
        _ok(
            cli(
                "--url",
                url,
                "enqueue",
                "test.add",
                "--json",
                "--params",
                '{"a": 1, "b": 2}',
                "--priority",
                "7",
                "--app-id",
                "photos",
                "--dedupe-key",
                "k1",
                "--max-retries",
                "0",
                "--delay",
                "3600",
            )
        )
    )
    stored = _task(url, printed["id"])
    assert printed["params"] == stored.params == {"a": 1, "b": 2}
    assert printed["priority"] == stored.priority == 7
    assert printed["app_id"] == stored.app_id == "photos"
    assert printed["dedupe_key"] == stored.dedupe_key == "k1"
    assert printed["max_retries"] == stored.max_retries == 0
    assert printed["run_at"] == stored.run_at.isoformat()
    assert stored.run_at > stored.created_at + timedelta(minutes=59)


def test_enqueue_with_an_active_dedupe_key_reports_the_alias(cli, url):
    leader = _enqueue(cli, url, "test.add", "--dedupe-key", "same")
    alias = cli("--url", url, "enqueue", "test.add", "--dedupe-key", "same")
    _ok(alias)
    assert alias.stdout.strip() != leader
    assert f"alias of {leader}" in alias.stderr
    assert _task(url, alias.stdout.strip()).alias_of == leader


def test_enqueue_takes_max_retries_from_the_handler_an_installed_plugin_registered(cli, url):
    fetch = ("--url", url, "enqueue", "fetch", "--app-id", DEMO.APP_ID, "--json")
    with_plugin = json.loads(_ok(cli(*fetch)))
    without_plugin = json.loads(_ok(cli(*fetch, TASKMILL_DISABLE_PLUGINS="demo")))
    assert with_plugin["max_retries"] == DEMO.FETCH_MAX_RETRIES != 3
    assert without_plugin["max_retries"] == 3


def test_worker_until_idle_leaves_a_task_that_is_due_later_pending(cli, url):
    later = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}', "--delay", "3600")
    now = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    _ok(cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle"))
    assert _task(url, now).status is TaskStatus.COMPLETED
    assert _task(url, later).status is TaskStatus.PENDING


def test_ls_filters_by_status_type_and_user_and_lists_newest_first(cli, url):
    first = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    rejected = _enqueue(
        cli, url, "test.reject", "--params", '{"why": "bad input"}', "--user-id", "bob"
    )
    waiting = _enqueue(cli, url, "other.type")
    _ok(cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle"))

    def ids(*args: str) -> list[str]:
        return [t["id"] for t in json.loads(_ok(cli("--url", url, "ls", "--json", *args)))]

    assert ids() == [waiting, rejected, first]
    assert ids("--status", "failed") == [rejected]
    assert ids("--status", "completed", "pending") == [waiting, first]
    assert ids("--type", "test.add", "--type", "other.type") == [waiting, first]
    assert ids("--user-id", "bob") == [rejected]
    assert ids("--limit", "1") == [waiting]

    table = _ok(cli("--url", url, "ls", "--status", "failed"))
    row = next(line for line in table.splitlines() if rejected[:8] in line)
    assert "failed" in row
    assert "rejected: bad input" in row
    assert first[:8] not in table


def test_ls_of_an_empty_store_says_so(cli, url):
    _ok(cli("--url", url, "migrate"))
    assert _ok(cli("--url", url, "ls")).strip() == "no tasks"


# -- retry, cleanup, stats, migrate -------------------------------------------------


def test_retry_puts_a_failed_task_back_to_pending_and_a_worker_runs_it_again(cli, url):
    task_id = _enqueue(cli, url, "test.reject", "--params", '{"why": "nope"}')
    _ok(cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle"))
    shown = _ok(cli("--url", url, "show", task_id))
    assert _field(shown, "status") == "failed"
    assert _field(shown, "error") == "rejected: nope"

    assert _ok(cli("--url", url, "retry", task_id)).strip() == f"{task_id} pending"
    redriven = _task(url, task_id)
    assert redriven.status is TaskStatus.PENDING
    assert redriven.attempts == 0
    assert redriven.error is None

    _ok(cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle"))
    assert _task(url, task_id).status is TaskStatus.FAILED
    attempts = _stored(url, lambda tm: tm.attempts(task_id))
    assert [a.outcome.value for a in attempts] == ["failed", "failed"]


def test_retry_of_a_task_that_has_not_failed_is_an_error(cli, url):
    task_id = _enqueue(cli, url, "test.add")
    process = cli("--url", url, "retry", task_id)
    assert process.returncode == 2
    assert process.stderr.startswith("error: ")
    assert "Traceback" not in process.stderr
    assert _task(url, task_id).status is TaskStatus.PENDING


@pytest.mark.parametrize("command", ["show", "retry"])
def test_an_unknown_task_id_exits_1_naming_it(cli, url, command):
    _enqueue(cli, url, "test.add")
    missing = str(uuid.uuid4())
    process = cli("--url", url, command, missing)
    assert process.returncode == 1
    assert process.stderr.strip() == f"error: no task with id {missing!r}"
    assert process.stdout == ""


def test_cleanup_deletes_finished_tasks_older_than_the_age_given(cli, url):
    done = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    failed = _enqueue(cli, url, "test.reject")
    pending = _enqueue(cli, url, "other.type")
    _ok(cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle"))

    assert _ok(cli("--url", url, "cleanup", "--older-than", "1h")).strip() == ("deleted 0 tasks")
    assert _ok(cli("--url", url, "cleanup", "--older-than", "0")).strip() == ("deleted 1 tasks")
    remaining = {t.id for t in _stored(url, lambda tm: tm.query(TaskFilter()))}
    assert remaining == {failed, pending}
    assert done not in remaining


def test_stats_counts_tasks_by_status(cli, url):
    for a in range(3):
        _enqueue(cli, url, "test.add", "--params", json.dumps({"a": a, "b": 1}))
    _enqueue(cli, url, "test.reject")
    _enqueue(cli, url, "other.type")
    _ok(cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle"))

    counts = json.loads(_ok(cli("--url", url, "stats", "--json")))
    assert {k: counts["all"][k] for k in ("total", "pending", "completed", "failed")} == {
        "total": 5,
        "pending": 1,
        "completed": 3,
        "failed": 1,
    }
    assert counts["all"]["pct"] == 80.0

    table = _ok(cli("--url", url, "stats", "--type", "test.add", "test.reject"))
    rows = {
        line.split()[0]: line.split()[1:]
        for line in table.splitlines()
        if line.strip().startswith(("test.", "total"))
    }
    # columns: total pending running completed failed cancelled done
    assert rows["test.add"] == ["3", "0", "0", "3", "0", "0", "100%"]
    assert rows["test.reject"] == ["1", "0", "0", "0", "1", "0", "100%"]
    assert rows["total"] == ["4", "0", "0", "3", "1", "0", "100%"]


def test_migrate_prints_the_schema_version_and_is_idempotent(cli, url):
    from taskmill.backends.sqlite import latest_version

    first = _ok(cli("--url", url, "migrate"))
    assert first.strip() == f"schema version {latest_version()} ({url})"
    again = _ok(cli("--url", url, "migrate"))
    assert again == first
    # The migrated database is one the API opens and uses.
    task_id = _enqueue(cli, url, "test.add")
    assert _task(url, task_id).status is TaskStatus.PENDING


# -- URLs and bad input -------------------------------------------------------------


def test_the_url_comes_from_the_environment_and_defaults_to_taskmill_db(cli, url, tmp_path):
    from_env = _ok(cli("enqueue", "test.add", TASKMILL_URL=url)).strip()
    assert _task(url, from_env).task_type == "test.add"

    default = _ok(cli("enqueue", "test.add")).strip()
    default_url = f"sqlite:///{tmp_path / 'taskmill.db'}"
    assert (tmp_path / "taskmill.db").exists()
    assert _task(default_url, default).task_type == "test.add"


def test_url_is_accepted_after_the_command_too(cli, url):
    task_id = _enqueue(cli, url, "test.add")
    listed = json.loads(_ok(cli("ls", "--json", "--url", url)))
    assert [t["id"] for t in listed] == [task_id]


def test_bad_params_json_exits_2_with_a_message_and_stores_nothing(cli, url, tmp_path):
    process = cli("--url", url, "enqueue", "test.add", "--params", '{"a": 1,')
    assert process.returncode == 2
    assert "argument --params: not valid JSON" in process.stderr
    assert "Traceback" not in process.stderr
    assert not (tmp_path / "t.db").exists()


def test_params_that_are_not_a_json_object_exit_2(cli, url):
    process = cli("--url", url, "enqueue", "test.add", "--params", "[1, 2]")
    assert process.returncode == 2
    assert "must be a JSON object" in process.stderr


def test_a_bad_priority_exits_2_listing_the_names(cli, url):
    process = cli("--url", url, "enqueue", "test.add", "--priority", "soon")
    assert process.returncode == 2
    assert "background, normal, user_action, urgent" in process.stderr


def test_an_unknown_url_scheme_exits_2_naming_the_scheme(cli):
    process = cli("--url", "nosuchdb://somewhere/x", "ls")
    assert process.returncode == 2
    assert process.stderr.startswith("error: unknown storage URL scheme 'nosuchdb'")
    assert "Traceback" not in process.stderr


def test_a_backend_that_is_not_installed_exits_2_naming_the_package(tmp_path: Path):
    # Every first-party backend is installed in the workspace, so the CLI runs from a
    # virtual environment that holds the core distribution only.
    uv = shutil.which("uv")
    assert uv is not None, "uv (which runs this suite) is not on PATH"
    venv = tmp_path / "core-only"
    subprocess.run([uv, "venv", "-q", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    core = Path(__file__).resolve().parents[1] / "core"
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(python), str(core)], check=True, timeout=300
    )
    for scheme in ("postgresql", "mysql", "mongodb"):
        process = subprocess.run(
            [str(venv / "bin" / "taskmill"), "--url", f"{scheme}://localhost/tasks", "ls"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert process.returncode == 2, process.stderr
        assert f"pip install {KNOWN_PACKAGES[scheme]}" in process.stderr
        assert "Traceback" not in process.stderr


def test_a_worker_without_handlers_exits_2(cli, url):
    process = cli("--url", url, "worker", "--until-idle", TASKMILL_DISABLE_PLUGINS="demo")
    assert process.returncode == 2
    assert "no handlers to run" in process.stderr


def test_a_handler_module_that_cannot_be_imported_exits_2(cli, url):
    process = cli("--url", url, "worker", "--import", "no_such_module_here")
    assert process.returncode == 2
    assert "cannot import handler module 'no_such_module_here'" in process.stderr


def test_a_handler_module_without_register_exits_2(cli, url, tmp_path):
    (tmp_path / "not_handlers.py").write_text("X = 1\n")
    process = cli("--url", url, "worker", "--import", "not_handlers")
    assert process.returncode == 2
    assert "has no register(tm) function" in process.stderr


# -- signals ------------------------------------------------------------------------


_wait_until = wait_until


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_stops_gracefully_on_a_signal_letting_its_task_finish(cli, url, tmp_path, sig):
    release = tmp_path / "release"
    task_id = _enqueue(
        cli, url, "test.wait_for_file", "--params", json.dumps({"path": str(release)})
    )
    worker = subprocess.Popen(
        [str(SCRIPT), "--url", url, "worker", "--import", "cli_handlers", "--shutdown-grace", "30"],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until(
            lambda: _task(url, task_id).status is TaskStatus.RUNNING, "the worker to claim the task"
        )
        worker.send_signal(sig)
        # The handler is still running: the worker waits for it instead of exiting.
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(timeout=0.5)
        release.touch()
        _, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert "stopping gracefully" in stderr
    assert "stopped after 1 attempt\n" in stderr
    assert _task(url, task_id).status is TaskStatus.COMPLETED


def _start_worker(url: str, tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """A ``taskmill worker`` process whose stderr goes to a file (returned), so that a
    test can wait for what it logs."""
    log = tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [str(SCRIPT), "--url", url, "worker", "--import", "cli_handlers", *args],
            cwd=tmp_path,
            env=_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    return process, log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_whose_grace_runs_out_releases_its_task_and_exits_0(cli, url, tmp_path, sig):
    never = tmp_path / "never"
    task_id = _enqueue(cli, url, "test.wait_for_file", "--params", json.dumps({"path": str(never)}))
    worker, log = _start_worker(url, tmp_path, "--shutdown-grace", "0.2")
    try:
        _wait_until(
            lambda: _task(url, task_id).status is TaskStatus.RUNNING, "the worker to claim the task"
        )
        worker.send_signal(sig)
        returncode = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    stderr = log.read_text()
    assert returncode == 0, stderr
    assert "interrupting 1 tasks still running" in stderr
    released = _task(url, task_id)
    assert released.status is TaskStatus.PENDING
    assert released.attempts == 0  # given back, not spent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_forces_the_stop_and_exits_128_plus_the_signal(cli, url, tmp_path, sig):
    never = tmp_path / "never"
    task_id = _enqueue(cli, url, "test.wait_for_file", "--params", json.dumps({"path": str(never)}))
    worker, log = _start_worker(url, tmp_path, "--shutdown-grace", "60")
    try:
        _wait_until(
            lambda: _task(url, task_id).status is TaskStatus.RUNNING, "the worker to claim the task"
        )
        worker.send_signal(sig)
        _wait_until(lambda: "stopping gracefully" in log.read_text(), "the first signal's log")
        worker.send_signal(sig)
        returncode = worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    stderr = log.read_text()
    assert returncode == 128 + sig, stderr
    assert f"{sig.name} received again: stopping now" in stderr
    assert _task(url, task_id).status is not TaskStatus.COMPLETED


def test_ctrl_c_interrupts_any_other_command_with_status_130(tmp_path):
    """``taskmill ls`` against a server that accepts the connection and never answers
    waits for it; Ctrl-C (SIGINT) ends it with status 130."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(30)
    port = server.getsockname()[1]
    url = f"postgresql://nobody:secret@127.0.0.1:{port}/db?connect_timeout=120"
    process = subprocess.Popen(
        [str(SCRIPT), "--url", url, "ls"],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        connection, _ = server.accept()  # the command is waiting for the server now
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        connection.close()
    finally:
        server.close()
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert stderr.strip().endswith("error: interrupted")
    assert "Traceback" not in stderr


def test_worker_help_mentions_plugins_and_what_the_reserved_slot_means(cli):
    text = " ".join(_ok(cli("worker", "--help")).split())
    assert "installed plugins" in text
    assert "--concurrency 2 runs one normal-priority task at a time" in text
    assert "--task-type TYPE" in text and "--app-id APP" in text
    assert "exit status 128 + the signal's number" in text


# -- task types no handler serves ----------------------------------------------------


def test_enqueueing_a_type_no_handler_serves_warns_with_close_matches_and_stores_it(cli, url):
    process = cli("--url", url, "enqueue", "test.ad", "--import", "cli_handlers")
    task_id = _ok(process).strip()

    assert "warning: no handler registered here serves task type 'test.ad'" in process.stderr
    assert "did you mean 'test.add'?" in process.stderr
    assert "stays pending until a worker with a handler for it runs" in process.stderr
    assert _task(url, task_id).status is TaskStatus.PENDING

    served = cli("--url", url, "enqueue", "test.add", "--import", "cli_handlers")
    _ok(served)
    assert "warning" not in served.stderr


def test_enqueueing_a_type_served_only_for_another_app_names_that_app(cli, url):
    process = cli("--url", url, "enqueue", "fetch", "--json")  # the demo plugin's, of app media
    _ok(process)
    assert f"it has handlers for app {DEMO.APP_ID!r} only" in process.stderr


def test_worker_until_idle_reports_pending_tasks_no_handler_of_it_serves(cli, url):
    typo = _enqueue(cli, url, "test.ad")
    done = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 2}')

    process = cli("--url", url, "worker", "--import", "cli_handlers", "--until-idle")

    _ok(process)
    assert _task(url, done).status is TaskStatus.COMPLETED
    assert _task(url, typo).status is TaskStatus.PENDING
    assert (
        "warning: 1 pending task of types no handler of this worker serves: "
        "'test.ad' (1 task; did you mean 'test.add'?)"
    ) in process.stderr


def test_stats_reports_pending_tasks_no_loaded_handler_serves(cli, url):
    _enqueue(cli, url, "test.add")
    _enqueue(cli, url, "tset.reject")
    _enqueue(cli, url, "tset.reject")

    process = cli("--url", url, "stats", "--json", "--import", "cli_handlers")

    assert json.loads(_ok(process))["all"]["pending"] == 3
    assert (
        "2 pending tasks of types no handler loaded here serves: "
        "'tset.reject' (2 tasks; did you mean 'test.reject'?)"
    ) in process.stderr
    only_served = cli("--url", url, "stats", "--type", "test.add", "--import", "cli_handlers")
    _ok(only_served)
    assert "warning" not in only_served.stderr


def test_worker_task_type_filter_claims_only_that_type(cli, url):
    add = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    reject = _enqueue(cli, url, "test.reject")

    process = cli(
        "--url",
        url,
        "worker",
        "--import",
        "cli_handlers",
        "--until-idle",
        "--task-type",
        "test.add",
    )

    _ok(process)
    assert _task(url, add).status is TaskStatus.COMPLETED
    assert _task(url, reject).status is TaskStatus.PENDING
    assert "handlers: photos/test.add, test.add\n" in process.stderr
    assert "'test.reject' (1 task)" in process.stderr


def test_worker_app_id_filter_claims_only_with_that_apps_handlers(cli, url):
    host = _enqueue(cli, url, "test.add", "--params", '{"a": 1, "b": 1}')
    photos = _enqueue(cli, url, "test.add", "--app-id", "photos")

    by_app = cli(
        "--url", url, "worker", "--import", "cli_handlers", "--until-idle", "--app-id", "photos"
    )
    _ok(by_app)
    assert _task(url, photos).result == {"app": "photos"}
    assert _task(url, host).status is TaskStatus.PENDING

    by_host = cli(
        "--url", url, "worker", "--import", "cli_handlers", "--until-idle", "--app-id", "-"
    )
    _ok(by_host)
    assert _task(url, host).result == {"sum": 2}


def test_a_worker_filter_that_matches_no_handler_is_an_error_listing_the_handlers(cli, url):
    process = cli("--url", url, "worker", "--import", "cli_handlers", "--task-type", "nope")
    assert process.returncode == 2
    assert "no handler matches the worker's filters (task types: nope; apps: any)" in process.stderr
    assert "test.add" in process.stderr


# -- the demo -----------------------------------------------------------------------


def _demo_run(output: str) -> tuple[str, dict[str, list[int]]]:
    """The run id and, per task type, [tasks, completed, failed, retries] the demo
    printed in its summary."""
    run = re.search(r"^taskmill demo (demo-[0-9a-f]{8}):", output, re.MULTILINE)
    assert run, output
    rows = {}
    summary = output.split("summary (", 1)[1].split("list this run's tasks", 1)[0]
    for line in summary.splitlines():
        cells = line.split()
        if cells and (cells[0] in DEMO.TASK_TYPES or cells[0] == "total"):
            rows[cells[0]] = [int(c) for c in cells[1:5]]
    return run.group(1), rows


def _stored_run(url: str, run: str) -> tuple[list[Task], dict[str, list[int]]]:
    tasks = _stored(url, lambda tm: tm.query(TaskFilter(user_id=run), limit=1000))
    rows: dict[str, list[int]] = {}
    for task in tasks:
        row = rows.setdefault(task.task_type, [0, 0, 0, 0])
        row[0] += 1
        row[1] += task.status is TaskStatus.COMPLETED
        row[2] += task.status is TaskStatus.FAILED
        row[3] += max(0, task.attempts - 1)
    rows["total"] = [sum(r[i] for r in rows.values()) for i in range(4)]
    return tasks, rows


def test_demo_runs_every_handler_and_its_summary_matches_the_database(cli, url):
    output = _ok(cli("--url", url, "demo", "--tasks", "12", timeout=120))

    run, printed = _demo_run(output)
    tasks, stored = _stored_run(url, run)
    assert len(tasks) == 12
    assert {t.app_id for t in tasks} == {DEMO.APP_ID}
    assert printed == stored
    assert set(printed) == {*DEMO.TASK_TYPES, "total"}
    # Everything finished; only the bad record is a dead letter; flaky fetches retried.
    assert printed["total"][1:3] == [11, 1]
    (dead,) = [t for t in tasks if t.status is TaskStatus.FAILED]
    assert dead.task_type == DEMO.VALIDATE
    assert dead.params["record"]["email"] == DEMO.BAD_RECORD_EMAIL
    assert dead.attempts == 1
    assert printed[DEMO.FETCH][3] >= 1
    assert f"taskmill --url {url} retry {dead.id[:8]}" in output
    assert "12/12 done" in output


def test_demo_run_twice_on_one_database_counts_only_its_own_tasks(cli, url):
    first, _ = _demo_run(_ok(cli("--url", url, "demo", "--tasks", "5", timeout=120)))
    output = _ok(cli("--url", url, "demo", "--tasks", "5", "--concurrency", "3", timeout=120))
    second, printed = _demo_run(output)

    assert second != first
    _, stored = _stored_run(url, second)
    assert printed == stored
    assert printed["total"][0] == 5
    total = _stored(url, lambda tm: tm.progress_summary())
    assert (total.total, total.pending, total.running) == (10, 0, 0)


def test_demo_honours_taskmill_url_from_the_environment(cli, url, tmp_path):
    output = _ok(cli("demo", "--tasks", "3", TASKMILL_URL=url, timeout=120))
    run, printed = _demo_run(output)
    assert printed["total"][0] == 3
    assert not (tmp_path / "taskmill.db").exists()
    assert len(_stored_run(url, run)[0]) == 3


def test_demo_without_the_demo_plugin_says_what_to_do_and_creates_no_database(cli, url, tmp_path):
    process = cli("--url", url, "demo", "--tasks", "3", TASKMILL_DISABLE_PLUGINS="demo")
    assert process.returncode == 2
    assert process.stderr.startswith("error: taskmill demo runs the tasks of the taskmill-demo")
    assert "TASKMILL_DISABLE_PLUGINS disables" in process.stderr
    assert not (tmp_path / "t.db").exists()


# -- plugins ------------------------------------------------------------------------


def test_plugins_lists_the_installed_plugins_with_their_distributions_and_handlers(cli):
    document = json.loads(_ok(cli("plugins", "--json")))
    plugins = {p["name"]: p for p in document["plugins"]}
    assert document["disabled"] == document["broken"] == []
    demo = plugins["demo"]
    assert (demo["distribution"], demo["version"]) == (
        "taskmill-demo",
        DEMO_VERSION,
    )
    assert [(h["app_id"], h["task_type"]) for h in demo["handlers"]] == [
        (DEMO.APP_ID, t) for t in DEMO.TASK_TYPES
    ]
    assert {h["task_type"]: h["max_retries"] for h in demo["handlers"]}[DEMO.FETCH] == (
        DEMO.FETCH_MAX_RETRIES
    )
    assert "taskmill_register_handlers" in demo["hooks"]
    assert plugins["prometheus"]["distribution"] == "taskmill-prometheus"
    assert plugins["prometheus"]["handlers"] == []
    assert "taskmill_task_finished" in plugins["prometheus"]["hooks"]

    table = _ok(cli("plugins"))
    row = next(line for line in table.splitlines() if line.startswith("demo "))
    assert row.split()[:4] == [
        "demo",
        "taskmill-demo",
        DEMO_VERSION,
        "media/scan",
    ]
    assert "media/validate" in table


def test_plugins_names_the_plugins_taskmill_disable_plugins_skips(cli):
    installed = sorted({ep.name for ep in entry_points(group="taskmill.plugins")})
    document = json.loads(
        _ok(cli("plugins", "--json", TASKMILL_DISABLE_PLUGINS=", ".join(installed)))
    )
    assert document == {
        "plugins": [],
        "disabled": installed,
        "not_enabled": [],
        "broken": [],
        "unmatched": [],
    }
    table = _ok(cli("plugins", TASKMILL_DISABLE_PLUGINS="demo"))
    assert "disabled by TASKMILL_DISABLE_PLUGINS: demo" in table
    assert "taskmill-demo" not in table


def test_the_module_runs_as_python_dash_m(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "taskmill.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
        check=False,
    )
    assert process.returncode == 0
    for command in (
        "demo",
        "worker",
        "enqueue",
        "ls",
        "show",
        "retry",
        "cleanup",
        "migrate",
        "stats",
        "plugins",
    ):
        assert command in process.stdout
