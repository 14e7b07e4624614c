"""The handler-host allow-list (issue 28 item 6): an app token cannot make workers POST
to internal addresses.

Through the real service (uvicorn), a real receiver (a second uvicorn server on
loopback) and real workers: registration refuses a URL whose host is outside the list
(422 ``handler_host_not_allowed`` naming the setting), and the worker that POSTs checks
again at every request, resolving a name itself, checking every address, and connecting
to the address it checked (DNS rebinding). A scripted resolver stands in for DNS where a
name must resolve differently over time (no test can change what the system's resolver
answers); everything else is real. Redirects are not followed. The setting is read from
``--handler-hosts``, ``$TASKMILL_HANDLER_HOSTS`` and the tokens file's ``[service]``
table, and ``taskmill serve`` applies it (a real process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import taskmill_http.plugin
from taskmill import Taskmill, TaskStatus
from taskmill.errors import ConfigurationError
from taskmill.storage import HandlerRegistration
from taskmill_http import HandlerHosts, create_app, stored_handlers
from taskmill_http.allowlist import DEFAULT_HANDLER_HOSTS
from taskmill_http.settings import ServiceSettings

from tests.http_support import TOKENS, loopback_socket, serve, wait_for
from tests.receiver_fixtures import Receiver

pytestmark = pytest.mark.timeout(90)

PHOTOS = {"Authorization": "Bearer tok-photos"}
TASKMILL = [sys.executable, "-c", "import sys; from taskmill.cli import main; sys.exit(main())"]


# -- the pieces ---------------------------------------------------------------------------


class ScriptedResolver:
    """A resolver whose answers a test decides, in order (the last one repeats); a name
    it has no answer for does not resolve, as an unknown name does not."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = {name: list(seq) for name, seq in answers.items()}
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        found = self.answers.get(host)
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return found.pop(0) if len(found) > 1 else found[0]


@contextlib.asynccontextmanager
async def service(
    tmp_path: Path, hosts: HandlerHosts | list[str] | None = None
) -> AsyncIterator[tuple[Taskmill, httpx.AsyncClient]]:
    """The service on a SQLite store of its own, and a client of it."""
    async with Taskmill(f"sqlite:///{tmp_path / 'tasks.db'}", plugins=False) as tm:
        app = create_app(tm, TOKENS, handler_hosts=hosts)
        async with serve(app) as base, httpx.AsyncClient(base_url=base, timeout=10) as http:
            yield tm, http


@contextlib.asynccontextmanager
async def running_worker(tm: Taskmill) -> AsyncIterator[None]:
    worker = tm.worker(
        concurrency=2, reserved_high_priority_slots=0, handle_signals=False, poll_interval=0.05
    )
    running = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        await worker.stop(grace=0)
        await running


async def register(http: httpx.AsyncClient, url: str, task_type: str = "job") -> httpx.Response:
    return await http.put(
        f"/v1/handlers/{task_type}", json={"url": url, "max_retries": 0}, headers=PHOTOS
    )


async def run_one(tm: Taskmill, task_type: str = "job") -> Any:
    """Enqueue a task of ``task_type`` for photos and wait for its end."""
    await wait_for(lambda: tm.registry.lookup("photos", task_type) is not None)
    task = await tm.for_app("photos").enqueue(task_type, {"n": 1})
    return await tm.wait(task.id, timeout=20)


# -- the list itself ----------------------------------------------------------------------


def test_the_default_is_loopback_only():
    hosts = HandlerHosts()
    assert hosts.entries == DEFAULT_HANDLER_HOSTS == ("127.0.0.0/8", "::1", "localhost")
    assert hosts.allows_address("127.0.0.1") and hosts.allows_address("127.255.0.9")
    assert hosts.allows_address("::1") and hosts.allows_name("localhost")
    for outside in ("10.0.0.1", "169.254.169.254", "0.0.0.0", "::", "fe80::1", "192.168.1.1"):
        assert not hosts.allows_address(outside), outside
    # An IPv4 address written as IPv6 is the IPv4 address.
    assert not hosts.allows_address("::ffff:169.254.169.254")
    assert hosts.allows_address("::ffff:127.0.0.1")
    assert not hosts.allows_name("localhost.example.com") and not hosts.allows_name("metadata")


def test_entries_are_names_wildcards_addresses_and_networks():
    hosts = HandlerHosts(["thumbs.internal", "*.svc.example", "10.1.2.3", "fd00::/8", "::1"])
    assert hosts.allows_name("thumbs.internal") and hosts.allows_name("THUMBS.internal.")
    assert hosts.allows_name("a.svc.example") and hosts.allows_name("b.a.svc.example")
    assert not hosts.allows_name("svc.example") and not hosts.allows_name("evil-svc.example")
    assert hosts.allows_address("10.1.2.3") and not hosts.allows_address("10.1.2.4")
    assert hosts.allows_address("fd12::7") and not hosts.allows_address("fe80::1")
    anything = HandlerHosts(["*"])
    assert anything.allows_name("anything.at.all") and anything.allows_address("169.254.169.254")
    for bad in ("10.0.0.1/8", "not a host", "*.", "http://x", "300.1.1.1"):
        with pytest.raises(ValueError, match="handler_hosts entry"):
            HandlerHosts([bad])


async def test_a_name_off_the_list_is_allowed_only_when_every_address_it_resolves_to_is():
    resolver = ScriptedResolver(
        {"inside.test": [["127.0.0.1", "::1"]], "split.test": [["127.0.0.1", "10.0.0.7"]]}
    )
    hosts = HandlerHosts(resolver=resolver)
    route = await hosts.route("inside.test", 80)
    assert route.host == "inside.test" and route.addresses == ("127.0.0.1", "::1")
    with pytest.raises(ValueError, match=r"10\.0\.0\.7.*handler_hosts"):
        await hosts.route("split.test", 80)
    with pytest.raises(OSError, match="not known"):
        await hosts.route("unknown.test", 80)
    # A listed name or an address is not resolved at all.
    assert (await hosts.route("localhost", 80)).addresses == ()
    assert (await hosts.route("127.0.0.1", 80)).addresses == ()
    assert resolver.calls == ["inside.test", "split.test", "unknown.test"]


# -- registration ---------------------------------------------------------------------------


async def test_registration_refuses_a_host_outside_the_default_list_naming_the_setting(
    tmp_path: Path, receiver: Receiver
):
    async with service(tmp_path) as (tm, http):
        for url in (
            f"http://127.0.0.1:{receiver.port}/run",
            f"http://localhost:{receiver.port}/run",
            f"http://[::1]:{receiver.port}/run",
        ):
            assert (await register(http, url)).status_code == 200, url
        for url in (
            "http://10.0.0.1/run",
            "http://169.254.169.254/latest/meta-data/",
            "http://0.0.0.0:9000/run",
            "http://[::ffff:a9fe:a9fe]/",
            "https://192.168.1.20:8443/hook",
        ):
            refused = await register(http, url)
            assert refused.status_code == 422, (url, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "handler_host_not_allowed" and error["field"] == "url"
            message = error["message"]
            assert "handler_hosts" in message and "--handler-hosts" in message
            assert "TASKMILL_HANDLER_HOSTS" in message and "127.0.0.0/8" in message
        # Nothing refused was stored.
        urls = [r.url for r in await tm.storage.handler_registrations()]
        assert all("127.0.0.1" in u or "localhost" in u or "[::1]" in u for u in urls)


async def test_registration_resolves_a_name_off_the_list_and_checks_every_address(
    tmp_path: Path,
):
    resolver = ScriptedResolver(
        {
            "sidecar.test": [["127.0.0.1"]],
            "metadata.test": [["169.254.169.254"]],
            "mixed.test": [["127.0.0.1", "10.9.9.9"]],
        }
    )
    async with service(tmp_path, HandlerHosts(resolver=resolver)) as (_, http):
        assert (await register(http, "http://sidecar.test:9000/run")).status_code == 200
        for name, address in (("metadata.test", "169.254.169.254"), ("mixed.test", "10.9.9.9")):
            refused = await register(http, f"http://{name}/run")
            assert refused.status_code == 422
            assert address in refused.json()["error"]["message"]
        # A name the service cannot resolve is left to the workers, which resolve it
        # where they run, at every request.
        assert (await register(http, "http://only-workers-know.test/run")).status_code == 200


async def test_a_configured_list_takes_its_networks_and_wildcards(tmp_path: Path):
    hosts = HandlerHosts(["10.0.0.0/8", "*.render.example"], resolver=ScriptedResolver({}))
    async with service(tmp_path, hosts) as (_, http):
        assert (await register(http, "http://10.20.30.40:81/x")).status_code == 200
        assert (await register(http, "https://gpu-1.render.example/x")).status_code == 200
        for url in ("http://127.0.0.1/x", "http://11.0.0.1/x"):
            refused = await register(http, url)
            assert refused.json()["error"]["code"] == "handler_host_not_allowed", url


async def test_a_url_that_clients_could_read_two_ways_is_refused_by_its_shape(tmp_path: Path):
    async with service(tmp_path) as (_, http):
        for url in (
            "http://evil.test@127.0.0.1/run",  # user info: which host is it?
            "http://127.0.0.1\\@evil.test/run",
            "ftp://127.0.0.1/run",
            "HTTP://127.0.0.1/run",
            "http://127.0.0.1 /run",
            "http://1.2.3/run",
            "http://[::::]/run",
            "http://127.0.0.1:65536/run",
        ):
            refused = await register(http, url)
            assert refused.status_code == 422, url
            assert refused.json()["error"] == {**refused.json()["error"], "field": "url"}
            assert refused.json()["error"]["code"] == "invalid_body", url


# -- at every call, in the worker ---------------------------------------------------------------


async def test_the_worker_connects_to_the_address_it_checked_not_to_a_new_answer(
    tmp_path: Path, receiver: Receiver
):
    # receiver.test resolves nowhere but here: reaching the receiver proves the request
    # went to the checked address. A second lookup would get a forbidden address.
    resolver = ScriptedResolver({"receiver.test": [["127.0.0.1"], ["169.254.169.254"]]})
    url = f"http://receiver.test:{receiver.port}/run"
    async with service(tmp_path, HandlerHosts(resolver=resolver)) as (tm, http):
        assert (await register(http, url)).status_code == 200
        resolver.answers["receiver.test"] = [["127.0.0.1"], ["169.254.169.254"]]
        calls_before = len(resolver.calls)
        async with running_worker(tm):
            done = await run_one(tm)
        assert done.status is TaskStatus.COMPLETED, done.error
        assert done.result == {"ran": done.id}
        (seen,) = receiver.requests
        assert seen["host"] == f"receiver.test:{receiver.port}"  # the name, not the address
        assert len(resolver.calls) == calls_before + 1  # resolved once for the request


async def test_a_name_that_rebinds_to_a_forbidden_address_is_not_called(
    tmp_path: Path, receiver: Receiver
):
    resolver = ScriptedResolver({"rebind.test": [["127.0.0.1"]]})
    url = f"http://rebind.test:{receiver.port}/run"
    async with service(tmp_path, HandlerHosts(resolver=resolver)) as (tm, http):
        assert (await register(http, url)).status_code == 200  # allowed when registered
        for answer in (["169.254.169.254"], ["127.0.0.1", "10.0.0.5"]):
            resolver.answers["rebind.test"] = [answer]
            async with running_worker(tm):
                failed = await run_one(tm)
            assert failed.status is TaskStatus.FAILED
            assert failed.error is not None and "not sent" in failed.error
            assert answer[-1] in failed.error and "handler_hosts" in failed.error
        assert receiver.requests == []


async def test_a_worker_elsewhere_checks_with_its_own_list_from_the_environment(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
):
    store = f"sqlite:///{tmp_path / 'tasks.db'}"
    monkeypatch.setattr(taskmill_http.plugin.plugin, "refresh_interval", 0.1)
    monkeypatch.setenv("TASKMILL_HANDLER_HOSTS", "::1, 10.255.255.0/24")
    async with Taskmill(store, plugins=False) as admin:
        # Stored without the service's check (an older release, or a service with a
        # wider list): the worker's own list decides.
        for task_type, url in (
            ("loopback", f"http://127.0.0.1:{receiver.port}/run"),
            ("listed", f"http://[::1]:{receiver.port}/run"),
        ):
            await admin.storage.put_handler_registration(
                HandlerRegistration(task_type=task_type, url=url, app_id="photos", max_retries=0)
            )
        worker_tm = Taskmill(store)
        worker_tm.load_plugins(enable=["http"])  # found through its installed entry point
        async with worker_tm, running_worker(worker_tm):
            assert stored_handlers(worker_tm).hosts.entries == ("::1", "10.255.255.0/24")
            refused = await run_one(worker_tm, "loopback")
            assert refused.status is TaskStatus.FAILED and refused.error is not None
            assert "127.0.0.1" in refused.error and "TASKMILL_HANDLER_HOSTS" in refused.error
            assert receiver.requests == []
            served = await run_one(worker_tm, "listed")
        # The IPv6 receiver may not listen on ::1 (it listens on 127.0.0.1): then the
        # request was sent and refused by the network, not by the list.
        assert served.error is None or "not sent" not in served.error


async def test_a_redirect_is_not_followed(tmp_path: Path, receiver: Receiver):
    async with service(tmp_path) as (tm, http):
        assert (await register(http, f"{receiver.base}/moved")).status_code == 200
        async with running_worker(tm):
            failed = await run_one(tm)
    assert failed.status is TaskStatus.FAILED and failed.error is not None
    assert "302" in failed.error and "not followed" in failed.error
    assert "169.254.169.254" in failed.error
    assert len(receiver.requests) == 1  # the redirect's target was never asked


# -- the setting ------------------------------------------------------------------------------


def test_the_setting_comes_from_the_flag_the_variable_the_tokens_file_or_the_default(
    tmp_path: Path,
):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[tokens]\n"t" = "photos"\n\n[service]\nhandler-hosts = ["10.0.0.0/8", "*.corp"]\n'
    )
    assert ServiceSettings.load(environ={}).handler_hosts == DEFAULT_HANDLER_HOSTS
    from_file = ServiceSettings.load(tokens_file=tokens, environ={})
    assert from_file.handler_hosts == ("10.0.0.0/8", "*.corp")
    assert from_file.source("handler_hosts") == f"{tokens} [service]"
    environ = {"TASKMILL_HANDLER_HOSTS": "192.168.0.0/16,localhost"}
    from_env = ServiceSettings.load(tokens_file=tokens, environ=environ)
    assert from_env.handler_hosts == ("192.168.0.0/16", "localhost")
    args = argparse.Namespace(handler_hosts=["127.0.0.1", "::1"])
    from_flag = ServiceSettings.load(args=args, tokens_file=tokens, environ=environ)
    assert from_flag.handler_hosts == ("127.0.0.1", "::1")
    assert from_flag.source("handler_hosts") == "--handler-hosts"
    hosts = from_flag.handler_host_list()
    assert hosts.entries == ("127.0.0.1", "::1") and hosts.source == "--handler-hosts"


def test_a_bad_setting_is_a_configuration_error_naming_where_it_came_from(tmp_path: Path):
    bad = ServiceSettings.load(environ={"TASKMILL_HANDLER_HOSTS": "10.0.0.1/8"})
    with pytest.raises(ConfigurationError, match="TASKMILL_HANDLER_HOSTS"):
        bad.handler_host_list()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"t" = "photos"\n\n[service]\nhandler_host = ["x"]\n')
    with pytest.raises(ConfigurationError, match="did you mean 'handler_hosts'"):
        ServiceSettings.load(tokens_file=tokens, environ={})
    tokens.write_text('[tokens]\n"t" = "photos"\n\n[service]\nhandler_hosts = 7\n')
    with pytest.raises(ConfigurationError, match="handler_hosts = 7"):
        ServiceSettings.load(tokens_file=tokens, environ={})


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``taskmill serve --handler-hosts 10.0.0.0/8`` as a real process; its base URL."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"tok-photos" = "photos"\n\n[service]\nhandler_hosts = ["::1"]\n')
    sock = loopback_socket()
    port = sock.getsockname()[1]
    sock.close()
    process = subprocess.Popen(
        [
            *TASKMILL,
            "serve",
            "--url",
            f"sqlite:///{tmp_path / 't.db'}",
            "--port",
            str(port),
            "--tokens",
            str(tokens),
            "--handler-hosts",
            "10.0.0.0/8",
        ],
        env={k: v for k, v in os.environ.items() if k != "TASKMILL_HANDLER_HOSTS"},
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{port}"
    try:
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
        yield base
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        assert process.stderr is not None
        assert "handler hosts: 10.0.0.0/8" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def test_taskmill_serve_applies_the_flag_over_the_tokens_file(served: str):
    def put(url: str) -> httpx.Response:
        return httpx.put(f"{served}/v1/handlers/t", json={"url": url}, headers=PHOTOS)

    assert put("http://10.1.2.3:8000/run").status_code == 200
    refused = put("http://[::1]:8000/run")  # the file's list, overridden by the flag
    assert refused.status_code == 422
    assert "--handler-hosts: 10.0.0.0/8" in refused.json()["error"]["message"]


def test_serve_help_lists_the_flag():
    helped = subprocess.run(
        [*TASKMILL, "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0
    assert "--handler-hosts" in helped.stdout and "TASKMILL_HANDLER_HOSTS" in helped.stdout
