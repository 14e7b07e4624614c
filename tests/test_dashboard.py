"""The dashboard (SPEC section 11) in a real headless Chromium, through a real uvicorn
server, on SQLite and PostgreSQL: sign-in, the live list and its progress bars, filters
and keyset pages, actions, app scoping and escaping."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page
from taskmill import Retry, TaskFilter, Taskmill, TaskStatus
from taskmill_http import create_app
from taskmill_http.dashboard import CONTENT_SECURITY_POLICY, SESSION_COOKIE

from tests.browser_support import sign_in
from tests.http_support import TOKENS, serve, wait_for
from tests.test_http_serve import TASKMILL, free_port

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "worker_process.py"

pytestmark = pytest.mark.timeout(120)
pytest_plugins = ("tests.browser_fixtures",)  # the browser and page fixtures


@pytest.fixture
async def taskmill(store_url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(store_url, plugins=False) as tm:
        yield tm


@pytest.fixture
async def base_url(taskmill: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(taskmill, TOKENS)) as url:
        yield url


@contextlib.asynccontextmanager
async def worker_process(url: str, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """tests/worker_process.py running against ``url`` until the block ends."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), "--url", url, "--log", str(log), cwd=ROOT
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def row_ids(page: Page) -> list[str]:
    return await page.eval_on_selector_all(
        "#tasks tbody tr[data-task-id]", "rows => rows.map(r => r.dataset.taskId)"
    )


async def test_signing_in_shows_the_tasks_and_a_worker_in_another_process_moves_the_bar(
    taskmill: Taskmill, base_url: str, page: Page, store_url: str, tmp_path: Path
):
    task = await taskmill.for_app("photos").enqueue("steps", {"steps": 24, "step_seconds": 0.25})
    await sign_in(page, base_url, "tok-photos", "/ui/tasks")
    row = page.locator(f'tr[data-task-id="{task.id}"]')
    assert await row.locator("[data-status]").inner_text() == "pending"
    await page.wait_for_selector("body[data-live=open]")
    await page.evaluate("window.__sameDocument = true")
    bar = row.locator("progress")

    seen: list[float] = []
    async with worker_process(store_url, tmp_path / "runs.log"):

        async def observe() -> None:
            value = float(await bar.evaluate("el => el.value"))
            if not seen or seen[-1] != value:
                seen.append(value)

        async def finished() -> bool:
            await observe()
            return await row.locator("[data-status]").inner_text() == "completed"

        await wait_for(finished, timeout=60)
        await observe()  # the status may have been painted after the bar was read
    assert await page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    assert seen[0] == 0 and seen[-1] == 100
    moving = [v for v in seen if 0 < v < 100]
    assert len(moving) >= 2, f"the bar jumped without moving: {seen}"
    assert moving == sorted(moving)
    assert (await taskmill.get(task.id)).status is TaskStatus.COMPLETED  # type: ignore[union-attr]


async def test_a_page_that_lost_its_stream_reconnects_and_misses_no_event(
    taskmill: Taskmill, page: Page
):
    app = create_app(taskmill, TOKENS)
    service = app.state.service
    resumed_from: list[str | None] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/ui/events":
            headers = dict(scope["headers"])
            resumed_from.append(headers.get(b"last-event-id", b"").decode() or None)
        await app(scope, receive, send)

    task = await taskmill.for_app("photos").enqueue("never-served")
    async with serve(recording) as base_url:
        try:
            await sign_in(page, base_url, "tok-photos", "/ui/tasks")
            await page.wait_for_selector("body[data-live=open]")
            # Offline: every reconnection attempt fails, then the stream itself ends.
            await page.route("**/ui/events*", lambda route: route.abort())
            await service.hub.close()
            await page.wait_for_selector("body[data-live=reconnecting]")
            await taskmill.cancel(task.id)  # committed while the page has no stream
            # The service reads on past the cancel: a stream that started afresh, not
            # from where the page stopped, would never see it.
            _, after_cancel = await taskmill.storage.read_events(None)
            await service.hub.start()
            await wait_for(lambda: not service.hub.position.task < after_cancel)
            resumed_from.clear()
            await page.unroute("**/ui/events*")
            row = page.locator(f'tr[data-task-id="{task.id}"] [data-status]')
            await wait_for(lambda: _is(row, "cancelled"))
            assert resumed_from and resumed_from[0] is not None
        finally:
            await page.close()  # its stream ends before the server stops


async def _is(locator: Any, text: str) -> bool:
    return await locator.inner_text() == text


async def test_filters_and_keyset_pages_give_the_right_rows(
    taskmill: Taskmill, base_url: str, page: Page
):
    # Batches share a creation instant: the pages have to walk through ties.
    alpha = await taskmill.for_app("photos").enqueue_many(
        [{"task_type": "alpha", "params": {"i": i}} for i in range(120)]
    )
    beta = await taskmill.for_app("music").enqueue_many(
        [{"task_type": "beta", "dedupe_key": f"beta-{i}"} for i in range(30)]
    )
    for task in alpha[:7]:
        await taskmill.cancel(task.id)
    await sign_in(page, base_url, "tok-admin", "/ui/tasks?task_type=alpha")

    walked: list[str] = []
    while True:
        ids = await row_ids(page)
        assert 0 < len(ids) <= 50
        walked.extend(ids)
        nxt = page.locator("#next-page")
        if not await nxt.count():
            break
        await nxt.click()
        await page.wait_for_load_state()
    newest_first = await taskmill.query(
        TaskFilter(task_types=("alpha",)), limit=500, newest_first=True
    )
    assert walked == [t.id for t in newest_first]
    assert len(walked) == 120

    await page.goto(f"{base_url}/ui/tasks?app_id=music")
    assert set(await row_ids(page)) == {t.id for t in beta}

    await page.goto(f"{base_url}/ui/tasks")
    await page.fill("#f-type", "alpha")
    await page.check("input[name=status][value=cancelled]")
    await page.click(".filters button[type=submit]")
    await page.wait_for_url(re.compile(r"status=cancelled"))
    assert set(await row_ids(page)) == {t.id for t in alpha[:7]}
    statuses = await page.eval_on_selector_all(
        "#tasks [data-status]", "els => els.map(e => e.textContent)"
    )
    assert set(statuses) == {"cancelled"}

    await page.goto(f"{base_url}/ui/tasks")
    await page.fill("#f-q", "beta-17")
    await page.press("#f-q", "Enter")
    await page.wait_for_url(re.compile(r"q=beta-17"))
    assert await row_ids(page) == [beta[17].id]
    await page.goto(f"{base_url}/ui/tasks?q={alpha[3].id}")
    assert await row_ids(page) == [alpha[3].id]
    # Text in a dedupe key (a substring, case-sensitive), within the other filters.
    await page.goto(f"{base_url}/ui/tasks?q=ta-2&task_type=beta")
    assert set(await row_ids(page)) == {t.id for i, t in enumerate(beta) if "ta-2" in f"beta-{i}"}
    await page.goto(f"{base_url}/ui/tasks?q=TA-2")
    assert await row_ids(page) == []


async def test_cancel_and_retry_from_the_page_change_the_stored_task(
    taskmill: Taskmill, base_url: str, page: Page
):
    parent = await taskmill.for_app("photos").enqueue("never-served")
    (child,) = await taskmill.batch_children(parent.id, [{"task_type": "never-served"}])
    await sign_in(page, base_url, "tok-photos", f"/ui/tasks/{parent.id}")
    assert await page.locator("#children tr[data-task-id]").count() == 1

    await page.click("form[action$='/cancel'] button")
    await page.wait_for_selector("text=Are you sure?")
    assert (await taskmill.get(parent.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]
    await page.click("form.confirm button[type=submit]")
    await page.wait_for_selector(".flash")
    assert (await taskmill.get(parent.id)).status is TaskStatus.CANCELLED  # type: ignore[union-attr]
    assert (await taskmill.get(child.id)).status is TaskStatus.CANCELLED  # type: ignore[union-attr]
    assert "cancelled" in await page.locator(".state [data-status]").inner_text()

    await page.click("form[action$='/retry'] button")
    await page.wait_for_selector(".flash")
    assert (await taskmill.get(parent.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]
    assert await page.locator(".state [data-status]").inner_text() == "pending"


async def test_a_manual_retry_shows_as_a_new_run_of_attempts(
    taskmill: Taskmill, base_url: str, page: Page
):
    async def failing(ctx: Any, params: dict[str, Any]) -> None:
        raise Retry(0, "still broken")  # no backoff: the worker runs until idle

    tm = taskmill.for_app("photos")
    taskmill.register("flaky", failing, app_id="photos", max_retries=1)
    task = await tm.enqueue("flaky")

    async def failed() -> bool:
        stored = await tm.get(task.id)
        return stored is not None and stored.status is TaskStatus.FAILED

    async def drain_until_failed() -> None:
        await taskmill.run_worker(until_idle=True, handle_signals=False)
        await wait_for(failed)

    await drain_until_failed()
    await sign_in(page, base_url, "tok-photos", f"/ui/tasks/{task.id}")
    assert await page.locator("#attempts .run-start").count() == 0  # one run: no runs shown
    await page.click("form[action$='/retry'] button")
    await page.wait_for_selector(".flash")
    await drain_until_failed()
    await page.reload()
    runs = await page.eval_on_selector_all(
        "#attempts li[data-run]:not(.run-start)",
        "items => items.map(i => [i.dataset.run, i.textContent.includes('attempt 1 ')])",
    )
    assert runs == [["1", True], ["1", False], ["2", True], ["2", False]]
    starts = await page.locator("#attempts .run-start").all_inner_texts()
    assert len(starts) == 2 and starts[1].startswith("Run 2: retried by hand")


async def test_suspend_resume_and_preempt_from_the_overview(
    taskmill: Taskmill, base_url: str, page: Page
):
    photos = taskmill.for_app("photos")
    doomed = await photos.enqueue("render", dedupe_key="frame-1")
    await taskmill.for_app("music").enqueue("mix")
    await sign_in(page, base_url, "tok-photos")

    # The type fields pick from the types the overview counts (the app's own only).
    options = "els => els.map(e => e.value)"
    assert await page.eval_on_selector_all("#known-types option", options) == ["render"]
    assert await page.get_attribute("#suspend-type", "list") == "known-types"
    assert await page.get_attribute("#preempt-type", "list") == "known-types"
    assert await page.locator("#known-apps").count() == 0  # an app token picks no app
    await page.fill("#suspend-type", "render")
    await page.click("form[action$='/suspend'] button")
    await page.click("form.confirm button[type=submit]")
    await page.wait_for_selector(".flash")
    assert [(s.app_id, s.task_type) for s in await taskmill.suspensions()] == [("photos", "render")]
    await page.click(".suspensions form[action$='/resume'] button")
    await page.wait_for_selector(".flash")
    assert await taskmill.suspensions() == []

    await page.fill("#preempt-type", "render")
    await page.fill("#preempt-key", "frame-1")
    await page.click("form[action$='/preempt'] button")
    await page.click("form.confirm button[type=submit]")
    await page.wait_for_selector(".flash")
    assert (await taskmill.get(doomed.id)).status is TaskStatus.CANCELLED  # type: ignore[union-attr]

    admin = await (await page.context.browser.new_context()).new_page()  # type: ignore[union-attr]
    await sign_in(admin, base_url, "tok-admin")
    assert await admin.eval_on_selector_all("#known-apps option", options) == ["music", "photos"]
    assert await admin.eval_on_selector_all("#known-types option", options) == ["mix", "render"]
    assert await admin.get_attribute("#suspend-app", "list") == "known-apps"
    await admin.context.close()


async def test_an_app_token_never_shows_another_apps_tasks_or_counts(
    taskmill: Taskmill, base_url: str, page: Page
):
    await taskmill.for_app("music").enqueue_many(
        [{"task_type": "musiconly", "params": {"secret": "tune"}} for _ in range(5)]
    )
    mine = await taskmill.for_app("photos").enqueue_many(
        [{"task_type": "resize"} for _ in range(3)]
    )
    foreign = (await taskmill.for_app("music").query(limit=1))[0]
    await sign_in(page, base_url, "tok-photos")
    overview = await page.inner_text("main")
    assert "musiconly" not in overview and "music" not in overview
    assert await page.inner_text("[data-count=total]") == "3"
    assert await page.inner_text("[data-count=pending]") == "3"

    await page.goto(f"{base_url}/ui/tasks")
    await page.wait_for_selector("body[data-live=open]")
    assert set(await row_ids(page)) == {t.id for t in mine}
    assert "musiconly" not in await page.inner_text("main")
    # Events go in commit order: a music event before this photos one would be seen first.
    await taskmill.for_app("music").enqueue("musiconly")
    await taskmill.for_app("photos").enqueue("resize")
    await page.wait_for_selector("#new-tasks:not([hidden])")
    assert await page.inner_text("[data-new-count]") == "1"
    assert await page.evaluate("document.body.dataset.eventsSeen") == "1"

    response = await page.goto(f"{base_url}/ui/tasks/{foreign.id}")
    assert response is not None and response.status == 404
    assert "tune" not in await page.content()
    response = await page.goto(f"{base_url}/ui/tasks?app_id=music")
    assert response is not None and response.status == 403


async def test_a_param_holding_a_script_is_shown_as_text_and_no_script_runs(
    taskmill: Taskmill, base_url: str, page: Page
):
    payload = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"
    task = await taskmill.for_app("photos").enqueue(
        "resize", {"caption": payload}, dedupe_key="<b>key</b>"
    )
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    await sign_in(page, base_url, "tok-photos", "/ui/tasks")
    assert await page.inner_text(f'tr[data-task-id="{task.id}"] .key') == "<b>key</b>"
    response = await page.goto(f"{base_url}/ui/tasks/{task.id}")
    assert response is not None
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert payload in await page.inner_text("#params")
    assert await page.locator("main script, main img, main b").count() == 0
    assert await page.evaluate("window.__pwned") is None
    assert dialogs == []


async def test_the_token_stays_out_of_urls_and_actions_need_the_csrf_token(
    taskmill: Taskmill, base_url: str, page: Page
):
    task = await taskmill.for_app("photos").enqueue("resize")
    await page.goto(f"{base_url}/ui/login")
    await page.fill("#token", "tok-wrong")
    await page.click("form.login button[type=submit]")
    await page.wait_for_selector("text=not known to this service")
    await sign_in(page, base_url, "tok-photos", "/ui/tasks")
    assert "tok-photos" not in page.url
    (cookie,) = [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "tok-photos" not in cookie["value"]

    forged = await page.request.post(
        f"{base_url}/ui/tasks/{task.id}/cancel",
        form={"confirmed": "yes", "cascade": "yes", "csrf": "guess"},
        max_redirects=0,
    )
    assert forged.status == 403
    assert (await taskmill.get(task.id)).status is TaskStatus.PENDING  # type: ignore[union-attr]

    await page.click("header form[action$='/logout'] button")
    await page.wait_for_url(re.compile(r"/ui/login"))
    async with httpx.AsyncClient() as client:
        stream = await client.get(f"{base_url}/ui/events")
        assert stream.status_code == 401


async def test_pages_read_on_a_narrow_window_by_keyboard_in_the_local_time_zone(
    browser: Browser, taskmill: Taskmill, base_url: str
):
    task = await taskmill.for_app("photos").enqueue("resize", {"long": "x" * 400})
    context = await browser.new_context(
        viewport={"width": 360, "height": 740}, timezone_id="Asia/Kolkata", locale="en-GB"
    )
    try:
        page = await context.new_page()
        await sign_in(page, base_url, "tok-photos", "/ui/tasks")
        for path in ("/ui/", "/ui/tasks", f"/ui/tasks/{task.id}"):
            await page.goto(base_url + path)
            overflow = await page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 1, f"{path} scrolls sideways by {overflow}px"
        # Times are shown in the browser's zone (UTC+05:30), the UTC value kept as title.
        stamp = page.locator("time").first
        iso = await stamp.get_attribute("datetime")
        shown = await stamp.inner_text()
        assert iso is not None and shown != iso
        expected = await page.evaluate("iso => new Date(iso).toLocaleString()", iso)
        assert shown == expected
        # Status is text as well as colour.
        assert await page.inner_text(".state [data-status]") == "pending"

        await page.goto(f"{base_url}/ui/tasks")
        await page.keyboard.press("Tab")
        assert await page.evaluate("document.activeElement.className") == "skip"
        await page.keyboard.press("/")
        assert await page.evaluate("document.activeElement.id") == "f-q"
        await page.evaluate("document.activeElement.blur()")
        await page.keyboard.press("j")
        await page.keyboard.press("Enter")
        await page.wait_for_url(re.compile(re.escape(f"/ui/tasks/{task.id}")))
    finally:
        await context.close()


async def test_the_dashboard_is_served_by_taskmill_serve(tmp_path: Path, store_url: str):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"tok-admin" = "*"\n')
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *TASKMILL,
        "serve",
        "--url",
        store_url,
        "--port",
        str(port),
        "--tokens",
        str(tokens),
        cwd=tmp_path,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def up() -> bool:
                try:
                    return (await client.get("/ui/login")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(up, timeout=30)
            login = await client.get("/ui/login")
            assert "Sign in" in login.text
            script = await client.get("/ui/static/dashboard.js")
            assert script.status_code == 200 and "EventSource" in script.text
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0


def test_the_screenshots_script_takes_the_overview_and_a_task_detail(tmp_path: Path):
    import subprocess

    script = ROOT / "docs" / "screenshots.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in ("dashboard-overview.png", "dashboard-task.png"):
        image = (tmp_path / name).read_bytes()
        assert image.startswith(b"\x89PNG") and len(image) > 10_000


async def _signed_in(
    client: httpx.AsyncClient, token: str, next_path: str = "/ui/"
) -> httpx.Response:
    form = await client.get("/ui/login")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None
    return await client.post(
        "/ui/login", data={"csrf": found.group(1), "token": token, "next": next_path}
    )


async def test_sign_in_goes_only_to_pages_of_the_dashboard(base_url: str):
    async with httpx.AsyncClient(base_url=base_url) as client:
        for target in ("https://evil.example/", "//evil.example/ui/", "/v1/tasks", "/ui\\x"):
            client.cookies.clear()
            answer = await _signed_in(client, "tok-photos", target)
            assert answer.status_code == 303
            assert answer.headers["location"] == "/ui/"
        answer = await _signed_in(client, "tok-photos", "/ui/tasks?status=failed")
        assert answer.headers["location"] == "/ui/tasks?status=failed"


async def test_a_tampered_session_or_a_bad_cursor_is_refused(base_url: str):
    async with httpx.AsyncClient(base_url=base_url) as client:
        await _signed_in(client, "tok-admin")
        assert (await client.get("/ui/tasks")).status_code == 200
        assert (await client.get("/ui/tasks?cursor=12.x")).status_code == 422
        assert (await client.get("/ui/tasks?status=done")).status_code == 422
        cookie = client.cookies[SESSION_COOKIE]
        client.cookies.set(
            SESSION_COOKIE, cookie[:-4] + ("AAAA" if cookie[-4:] != "AAAA" else "BBBB")
        )
        answer = await client.get("/ui/tasks")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/login")


async def test_every_dashboard_response_carries_the_security_headers(base_url: str):
    async with httpx.AsyncClient(base_url=base_url) as client:
        for path in ("/ui/login", "/ui/static/dashboard.js", "/ui/static/dashboard.css", "/ui/x"):
            answer = await client.get(path)
            assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["server-timing"].startswith("app;dur=")


def test_a_session_fingerprint_names_a_token_without_revealing_it():
    from taskmill_http import Caller, Tokens

    tokens = Tokens(TOKENS)
    fingerprint = tokens.fingerprint("tok-photos")
    assert fingerprint is not None and "tok-photos" not in fingerprint
    assert tokens.caller_by_fingerprint(fingerprint) == Caller("photos")
    assert tokens.fingerprint("tok-unknown") is None
    assert tokens.caller_by_fingerprint("zz-not-hex") is None
    assert tokens.caller_by_fingerprint(fingerprint[:-2] + "00") is None
    assert Tokens({"other": "*"}).caller_by_fingerprint(fingerprint) is None
