"""The MongoDB server the taskmill-mongo tests use.

``$TASKMILL_TEST_MONGO_URL`` names one (a real replica set, say
``mongodb://127.0.0.1:27017/taskmill?replicaSet=rs0``). When it is unset, the test
session starts its own nx-27017 (a MongoDB wire-protocol server from PyPI, a dev
dependency) on a free loopback port with a temporary data directory, and stops it, by the
pid it started, when the session ends. Each test gets a database of its own (the URL's
path replaced), dropped afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_started: dict[str, object] = {}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def start_nx() -> str:
    """Start nx-27017 (once per session) and return its base URL; raises RuntimeError
    saying why it could not start."""
    if "url" in _started:
        return str(_started["url"])
    exe = shutil.which("nx-27017") or str(Path(sys.executable).with_name("nx-27017"))
    if not Path(exe).exists():
        raise RuntimeError("nx-27017 is not installed (it is in the root dev dependency group)")
    data = Path(tempfile.mkdtemp(prefix="taskmill-nx-"))
    port = _free_port()
    process = subprocess.Popen(
        [
            exe,
            "--data-dir",
            str(data / "db"),
            "--host",
            "127.0.0.1",
            "-p",
            str(port),
            "--log-file",
            str(data / "log"),
            "--pid-file",
            str(data / "pid"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    if not _wait_listening(port, 30):
        process.kill()
        raise RuntimeError(f"nx-27017 did not listen on 127.0.0.1:{port} within 30 s")
    # nx-27017 runs the transactions of all clients on one SQLite connection, so
    # concurrent ones are not isolated from each other: serialize them (serializeWrites).
    url = f"mongodb://127.0.0.1:{port}/taskmill?directConnection=true&serializeWrites=true"
    _started.update(url=url, process=process, data=data)
    return url


def stop_nx() -> None:
    """Stop the nx-27017 this session started, by its pid."""
    process = _started.pop("process", None)
    data = _started.pop("data", None)
    _started.pop("url", None)
    if isinstance(process, subprocess.Popen):
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    if isinstance(data, Path):
        shutil.rmtree(data, ignore_errors=True)


def base_url() -> str:
    """The server's URL: ``$TASKMILL_TEST_MONGO_URL``, or a started nx-27017's."""
    return os.environ.get("TASKMILL_TEST_MONGO_URL") or start_nx()


def url_for(database: str, base: str | None = None) -> str:
    """``base`` (the test server's URL) with its database replaced by ``database``."""
    parts = urlsplit(base or base_url())
    return urlunsplit(parts._replace(path=f"/{database}"))


def new_database_name() -> str:
    return f"tm_test_{uuid.uuid4().hex[:12]}"


def driver_url() -> str:
    """The server's URL for a raw PyMongo client (taskmill's own query options removed)."""
    from taskmill_mongo.options import parse_url

    return parse_url(base_url(), {}).driver_url
