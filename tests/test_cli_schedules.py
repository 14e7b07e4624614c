"""``taskmill schedules``: the schedules of code and of the configuration file, their
next fire, and the last fire's task status once a worker has fired it."""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import datetime
from pathlib import Path

from tests.cli_support import SCRIPT, cli_env, ok

pytest_plugins = ("tests.cli_fixtures",)  # the cli and url fixtures

JOBS = """
from datetime import timedelta

def register(tm):
    @tm.periodic(every=timedelta(seconds=1), catch_up="skip", params={"n": 1})
    async def beat(ctx, params):
        return params["n"]
"""

CONFIG = """
[schedules.nightly]
task_type = "report"
cron = "30 2 * * *"
timezone = "Europe/Berlin"
catch_up = "all"
catch_up_window = 7200
"""


def test_schedules_lists_code_and_file_schedules_without_creating_a_store(
    cli, url: str, tmp_path: Path
) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "taskmill.toml").write_text(CONFIG)
    doc = json.loads(ok(cli("--url", url, "schedules", "--json", "--import", "jobs")))
    rows = {row["name"]: row for row in doc["schedules"]}
    assert set(rows) == {"beat", "nightly"}
    nightly = rows["nightly"]
    assert nightly["when"] == "30 2 * * *" and nightly["timezone"] == "Europe/Berlin"
    assert datetime.fromisoformat(nightly["next_fire"]).astimezone().minute == 30
    assert nightly["last_fire_status"] is None
    assert rows["beat"]["when"] == "every 1s" and rows["beat"]["catch_up"] == "skip"
    assert not (tmp_path / "t.db").exists()
    table = ok(cli("--url", url, "schedules", "--import", "jobs"))
    assert "nightly" in table and "Europe/Berlin" in table and "every 1s" in table


def test_schedules_shows_the_last_fire_a_worker_enqueued(cli, url: str, tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    worker = subprocess.Popen(
        [str(SCRIPT), "--url", url, "worker", "--import", "jobs"],
        cwd=tmp_path,
        env=cli_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        status = None
        for _ in range(120):  # a fire every second; give a loaded machine a minute
            (row,) = json.loads(ok(cli("--url", url, "schedules", "--json", "--import", "jobs")))[
                "schedules"
            ]
            status = row["last_fire_status"]
            if status == "completed":
                break
            subprocess.run(["sleep", "0.5"], check=True)
        assert status == "completed", row
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)


def test_a_bad_schedule_in_the_file_is_a_configuration_error(cli, url: str, tmp_path: Path) -> None:
    (tmp_path / "taskmill.toml").write_text('[schedules.x]\ntask_type = "t"\ncron = "* * *"\n')
    process = cli("--url", url, "schedules")
    assert process.returncode == 2, process
    assert "taskmill.toml: schedule 'x': bad cron expression" in process.stderr
