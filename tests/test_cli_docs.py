"""The docs say what the code does: docs/cli.md documents every option of every
command, the exit statuses in README.md and docs/cli.md are the ones the command
returns (tested in test_cli.py), and docs/backends/sqlite.md states the SQLite schema
that a fresh database gets."""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
from pathlib import Path

import pytest
from taskmill import Taskmill
from taskmill.backends.sqlite import latest_version
from taskmill.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
CLI_DOCS = (ROOT / "docs" / "cli.md").read_text()
README = (ROOT / "README.md").read_text()
SQLITE_DOCS = (ROOT / "docs" / "backends" / "sqlite.md").read_text()
GLOBAL = {"--url", "--config", "--log-level", "--log-format", "-h", "--help"}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _section(name: str) -> str:
    match = re.search(rf"^## {name}\n(.*?)(?=^## |\Z)", CLI_DOCS, flags=re.MULTILINE | re.DOTALL)
    assert match, f"docs/cli.md has no section for {name}"
    return match.group(1)


@pytest.mark.parametrize("name", sorted(_commands()))
def test_docs_cli_documents_every_option_of_every_command(name: str) -> None:
    section = _section(name)
    options = {
        option
        for action in _commands()[name]._actions
        for option in action.option_strings
        if option not in GLOBAL
    }
    missing = sorted(o for o in options if f"`{o}" not in section)
    assert not missing, f"docs/cli.md, section {name}, does not document {missing}"


def test_docs_cli_documents_the_global_options() -> None:
    for option in GLOBAL - {"-h", "--help"}:
        assert f"| `{option} " in CLI_DOCS, option


@pytest.mark.parametrize("text", [README, CLI_DOCS], ids=["README.md", "docs/cli.md"])
def test_the_documented_exit_statuses_are_the_commands(text: str) -> None:
    flat = " ".join(text.split())
    assert "130 when Ctrl-C" in flat or "`130` when Ctrl-C" in flat
    assert "128 + the signal's number" in flat or "128 +` the signal's number" in flat
    assert re.search(r"worker.{0,40}exits `?0`? after a graceful stop", flat)
    assert "130 when interrupted" not in flat  # the old claim, also made for a worker


def test_backends_md_states_the_sqlite_schema_a_fresh_database_gets(tmp_path: Path) -> None:
    sqlite_section = SQLITE_DOCS
    (stated,) = re.findall(r"The current version is (\d+)", sqlite_section)
    assert int(stated) == latest_version()

    path = tmp_path / "fresh.db"

    async def create() -> None:
        async with Taskmill(f"sqlite:///{path}", plugins=False):
            pass

    asyncio.run(create())
    with sqlite3.connect(path) as conn:
        tables = {
            row[0]
            for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not row[0].startswith("sqlite_")
        }
    schema_lines = sqlite_section.split("## Schema and migrations", 1)[1].split("- `open()`", 1)[0]
    named = set(re.findall(r"`([a-z_]\w*)`", schema_lines)) - {"schema_version"}
    assert named == tables
