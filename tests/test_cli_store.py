"""Which store a ``taskmill`` command uses: it says so when it falls back to the
default, commands that read never create one, and a URL that is wrong gets an error
that says what was meant (a bare path, a refused PostgreSQL password)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.cli_support import CLI, ok
from tests.conftest import require_postgres

pytest_plugins = ("tests.cli_fixtures",)

DEFAULT_NOTE = "note: using the default store sqlite:///taskmill.db"

READ_COMMANDS = [
    ["ls"],
    ["show", "0123abcd"],
    ["stats"],
    ["suspensions"],
    ["retry", "0123abcd"],
    ["cancel", "0123abcd"],
    ["resume"],
    ["cleanup", "--older-than", "1d"],
]


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_a_read_command_never_creates_the_default_store_and_says_how_to_pick_one(
    cli: CLI, tmp_path: Path, command: list[str]
) -> None:
    process = cli(*command)

    assert process.returncode == 2, process.stderr
    assert DEFAULT_NOTE in process.stderr
    assert (
        f"error: there is no taskmill store at sqlite:///taskmill.db "
        f"({tmp_path / 'taskmill.db'}); `taskmill {command[0]}` only reads"
    ) in process.stderr
    assert "--url URL, $TASKMILL_URL or the url setting" in process.stderr
    assert "`taskmill migrate`" in process.stderr
    assert "Traceback" not in process.stderr
    assert not (tmp_path / "taskmill.db").exists()


def test_a_read_command_on_a_missing_store_names_where_its_url_came_from(
    cli: CLI, url: str, tmp_path: Path
) -> None:
    from_option = cli("--url", url, "ls")
    from_env = cli("ls", TASKMILL_URL=url)

    assert from_option.returncode == from_env.returncode == 2
    assert f"no taskmill store at {url} (from --url)" in from_option.stderr
    assert f"no taskmill store at {url} (from TASKMILL_URL)" in from_env.stderr
    assert DEFAULT_NOTE not in from_option.stderr + from_env.stderr
    assert not (tmp_path / "t.db").exists()


def test_commands_that_write_create_the_default_store_and_say_which_it_is(
    cli: CLI, tmp_path: Path
) -> None:
    enqueued = cli("enqueue", "test.add", "--import", "cli_handlers")
    ok(enqueued)
    assert DEFAULT_NOTE in enqueued.stderr
    assert str(tmp_path / "taskmill.db") in enqueued.stderr
    assert (tmp_path / "taskmill.db").exists()

    listed = cli("ls", "--json")
    assert enqueued.stdout.strip() in ok(listed)
    assert DEFAULT_NOTE in listed.stderr  # every command says it, not only the first


def test_a_named_store_is_used_without_a_note(cli: CLI, url: str) -> None:
    enqueued = cli("--url", url, "enqueue", "test.add", "--import", "cli_handlers")
    ok(enqueued)
    assert "note:" not in enqueued.stderr


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("tasks.db", "sqlite:///tasks.db"),
        ("data/tasks.sqlite3", "sqlite:///data/tasks.sqlite3"),
        ("/srv/app/tasks.db", "sqlite:////srv/app/tasks.db"),
    ],
)
def test_a_bare_path_as_url_gets_did_you_mean_sqlite(
    cli: CLI, tmp_path: Path, given: str, meant: str
) -> None:
    process = cli("--url", given, "ls")

    assert process.returncode == 2
    assert f"error: not a storage URL: {given!r}; did you mean {meant}?" in process.stderr
    assert not list(tmp_path.glob("*.db"))


def test_a_bare_path_in_taskmill_url_gets_the_same_hint(cli: CLI) -> None:
    process = cli("enqueue", "x", TASKMILL_URL="tasks.db")
    assert process.returncode == 2
    assert "did you mean sqlite:///tasks.db?" in process.stderr


def test_a_host_and_port_is_not_mistaken_for_a_path(cli: CLI) -> None:
    process = cli("--url", "localhost:5432", "ls")
    assert process.returncode == 2
    assert "not a storage URL: 'localhost:5432'; expected scheme://" in process.stderr
    assert "did you mean" not in process.stderr


def _with_password(url: str, password: str | None) -> str:
    parts = urlsplit(url)
    user = parts.username or "taskmill"
    secret = "" if password is None else f":{password}"
    host = parts.hostname or "127.0.0.1"
    return urlunsplit(parts._replace(netloc=f"{user}{secret}@{host}:{parts.port or 5432}"))


def test_a_refused_postgresql_password_in_the_url_says_where_passwords_come_from(
    cli: CLI,
) -> None:
    url = _with_password(require_postgres(), "certainly-not-the-password")

    process = cli("--url", url, "ls")

    assert process.returncode == 2
    assert "password authentication failed" in process.stderr
    assert "the password in the URL was refused" in process.stderr
    assert "$PGPASSWORD" in process.stderr and "~/.pgpass" in process.stderr
    assert "certainly-not-the-password" not in process.stderr


def test_a_refused_pgpassword_is_named_as_the_source(cli: CLI, tmp_path: Path) -> None:
    url = _with_password(require_postgres(), None)

    from_env = cli("--url", url, "ls", PGPASSWORD="certainly-not-the-password")
    without = cli("--url", url, "ls", PGPASSFILE=str(tmp_path / "no-such-pgpass"))

    assert from_env.returncode == without.returncode == 2
    assert "the password in $PGPASSWORD was refused" in from_env.stderr
    assert "the URL has no password and $PGPASSWORD is unset" in without.stderr
    assert "~/.pgpass" in without.stderr
