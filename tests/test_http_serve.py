"""``taskmill serve``: the command taskmill-http adds through the
``taskmill_register_commands`` hook, run as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from taskmill.plugins import CommandRegistrar

from tests.http_support import loopback_socket

pytestmark = pytest.mark.timeout(60)

TASKMILL = [sys.executable, "-c", "import sys; from taskmill.cli import main; sys.exit(main())"]


def free_port() -> int:
    sock = loopback_socket()
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def test_serve_is_a_command_of_the_installed_plugin():
    help_text = subprocess.run(
        [*TASKMILL, "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "serve" in help_text
    disabled = subprocess.run(
        [*TASKMILL, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TASKMILL_DISABLE_PLUGINS": "http"},
    ).stdout
    assert "serve" not in disabled


def test_serve_needs_a_tokens_file(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "TASKMILL_TOKENS_FILE"}
    result = subprocess.run(
        [*TASKMILL, "serve", "--url", f"sqlite:///{tmp_path / 't.db'}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "needs a tokens file" in result.stderr
    (tmp_path / "bad.toml").write_text("tokens = 3\n")
    bad = subprocess.run(
        [*TASKMILL, "serve", "--tokens", str(tmp_path / "bad.toml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "[tokens] table" in bad.stderr


def test_serve_serves_the_store_with_the_tokens_and_stops_on_sigterm(tmp_path: Path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"s3cret-photos" = "photos"\n')
    port = free_port()
    process = subprocess.Popen(
        [*TASKMILL, "serve", "--url", f"sqlite:///{tmp_path / 't.db'}", "--port", str(port)],
        env={**os.environ, "TASKMILL_TOKENS_FILE": str(tokens)},
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{base}/openapi.json").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "taskmill serve did not start"
            time.sleep(0.05)
        headers = {"Authorization": "Bearer s3cret-photos"}
        made = httpx.post(f"{base}/v1/tasks", json={"task_type": "t"}, headers=headers)
        assert made.status_code == 201 and made.json()["app_id"] == "photos"
        assert (
            httpx.get(f"{base}/v1/tasks", headers={"Authorization": "Bearer x"}).status_code == 401
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        assert process.stderr is not None
        log = process.stderr.read()
        assert f"http://127.0.0.1:{port}" in log and "s3cret" not in log
        assert "on uvloop" in log  # installed with taskmill-http outside Windows
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def test_a_command_name_that_is_taken_is_refused():
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()

    def add(name: str, run: object, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary)

    commands = CommandRegistrar(add, "plugin 'x'")
    commands.add("serve", lambda a, s: None, "one")  # type: ignore[arg-type,return-value]
    with pytest.raises(Exception, match="serve"):
        commands.add("serve", lambda a, s: None, "two")  # type: ignore[arg-type,return-value]
    assert commands.names == ["serve"]


def test_a_command_may_name_the_event_loop_it_runs_on():
    import argparse
    import asyncio

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()

    def add(name: str, run: object, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary)

    commands = CommandRegistrar(add, "plugin 'x'")
    commands.add("fast", lambda a, s: None, "one", loop_factory=asyncio.new_event_loop)  # type: ignore[arg-type,return-value]
    commands.add("plain", lambda a, s: None, "two")  # type: ignore[arg-type,return-value]
    assert parser.parse_args(["fast"]).loop_factory is asyncio.new_event_loop
    assert getattr(parser.parse_args(["plain"]), "loop_factory", None) is None
