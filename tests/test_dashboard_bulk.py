"""The dashboard's bulk actions, "Retry all N" on a list of failed tasks and "Cancel N
selected", with their counted confirmations, in a real headless Chromium through a real
uvicorn server, on SQLite and PostgreSQL (docs/dashboard.md)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from playwright.async_api import Page
from taskmill import Context, Taskmill, TaskStatus
from taskmill_http import create_app

from tests.browser_support import sign_in
from tests.http_support import TOKENS, serve

pytestmark = pytest.mark.timeout(120)
pytest_plugins = ("tests.browser_fixtures",)  # the browser and page fixtures


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def taskmill(url: str) -> AsyncIterator[Taskmill]:
    async with Taskmill(url, plugins=False) as tm:
        yield tm


@pytest.fixture
async def base_url(taskmill: Taskmill) -> AsyncIterator[str]:
    async with serve(create_app(taskmill, TOKENS)) as found:
        yield found


async def fail_all(url: str) -> None:
    """Run every pending ``boom`` task to FAILED, in a Taskmill of its own (the service's
    knows no handler, so nothing it shows runs)."""
    async with Taskmill(url, plugins=False) as worker_tm:

        @worker_tm.handler("boom", max_retries=0)
        async def boom(ctx: Context, params: dict) -> None:
            raise RuntimeError("boom")

        await worker_tm.worker(concurrency=4, handle_signals=False).run_until_idle()


async def status_of(tm: Taskmill, task_id: str) -> TaskStatus:
    task = await tm.get(task_id)
    assert task is not None
    return task.status


async def test_retry_all_counts_first_and_says_what_was_refused(
    taskmill: Taskmill, base_url: str, page: Page, url: str
):
    photos = taskmill.for_app("photos")
    plain = [(await photos.enqueue("boom")).id for _ in range(2)]
    keyed = (await photos.enqueue("boom", dedupe_key="k")).id
    other_app = (await taskmill.for_app("music").enqueue("boom")).id
    await fail_all(url)
    # A new leader holds the key now: the old keyed task cannot come back.
    leader = (await photos.enqueue("boom", dedupe_key="k")).id
    cancelled = (await photos.enqueue("boom")).id
    await photos.cancel(cancelled)

    await sign_in(page, base_url, "tok-photos", "/ui/tasks?status=failed")
    button = page.locator("#retry-all button")
    assert (await button.inner_text()).strip() == "Retry all 3…"
    await button.click()
    question = (await page.locator(".question").inner_text()).strip()
    assert question.startswith("Retry 3 failed tasks of this list?")
    await page.click("form.confirm button[type=submit]")
    await page.wait_for_url(re.compile(r"/ui/tasks\?status=failed$"))
    flash = (await page.locator(".flash").inner_text()).strip()
    assert flash == ("Retried 2 tasks; refused 1 (1: another task is active for its dedupe key).")
    for task_id in plain:
        assert await status_of(taskmill, task_id) is TaskStatus.PENDING
    assert await status_of(taskmill, keyed) is TaskStatus.FAILED
    assert await status_of(taskmill, leader) is TaskStatus.PENDING
    assert await status_of(taskmill, other_app) is TaskStatus.FAILED  # another app's
    assert await status_of(taskmill, cancelled) is TaskStatus.CANCELLED  # not in the filter

    # Failed and cancelled together: the one keyed task (refused again) and the cancelled.
    await page.goto(base_url + "/ui/tasks?status=failed&status=cancelled")
    assert (await button.inner_text()).strip() == "Retry all 2…"
    await button.click()
    await page.click("form.confirm button[type=submit]")
    await page.wait_for_selector(".flash")
    assert (await page.locator(".flash").inner_text()).startswith("Retried 1 tasks; refused 1")
    assert await status_of(taskmill, cancelled) is TaskStatus.PENDING

    # No "Retry all" on a list that is not only failed or cancelled tasks.
    await page.goto(base_url + "/ui/tasks?status=failed&status=pending")
    assert await page.locator("#retry-all").count() == 0


async def test_retry_all_is_confirmed_and_csrf_checked(
    taskmill: Taskmill, base_url: str, page: Page, url: str
):
    task = await taskmill.for_app("photos").enqueue("boom")
    await fail_all(url)
    await sign_in(page, base_url, "tok-photos", "/ui/tasks?status=failed")
    await page.click("#retry-all button")
    await page.click("form.confirm a")  # "No, go back"
    await page.wait_for_url(re.compile(r"/ui/tasks\?status=failed$"))
    assert await status_of(taskmill, task.id) is TaskStatus.FAILED
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    async with httpx.AsyncClient(base_url=base_url, cookies=cookies) as client:
        forged = await client.post(
            "/ui/tasks/retry-all",
            data={"confirmed": "yes", "filter": "status=failed", "csrf": "guess"},
        )
    assert forged.status_code == 403
    assert await status_of(taskmill, task.id) is TaskStatus.FAILED


async def test_cancel_selected_counts_children_and_leaves_the_rest(
    taskmill: Taskmill, base_url: str, page: Page
):
    photos = taskmill.for_app("photos")
    parent = await photos.enqueue("never")
    children = [(await photos.enqueue("never", parent_id=parent.id)).id for _ in range(2)]
    alone = await photos.enqueue("never")
    kept = await photos.enqueue("never")
    other_app = await taskmill.for_app("music").enqueue("never")

    await sign_in(page, base_url, "tok-photos", "/ui/tasks")
    assert await page.locator(f'tr[data-task-id="{other_app.id}"]').count() == 0
    button = page.locator("#cancel-selected")
    assert (await button.inner_text()).strip() == "Cancel 0 selected…"
    assert await button.is_disabled()
    for task in (parent, alone):
        await page.check(f'tr[data-task-id="{task.id}"] input[data-select]')
    assert (await button.inner_text()).strip() == "Cancel 2 selected…"
    await button.click()
    question = (await page.locator(".question").inner_text()).strip()
    assert question == (
        "Cancel 2 selected tasks? With their active children and aliases, "
        "4 tasks will be cancelled."
    )
    await page.click("form.confirm button[type=submit]")
    await page.wait_for_selector(".flash")
    flash = (await page.locator(".flash").inner_text()).strip()
    assert flash == "Cancelled 4 tasks (2 selected, with their children and aliases)."
    for task_id in (parent.id, alone.id, *children):
        assert await status_of(taskmill, task_id) is TaskStatus.CANCELLED
    assert await status_of(taskmill, kept.id) is TaskStatus.PENDING
    assert await status_of(taskmill, other_app.id) is TaskStatus.PENDING


async def test_cancel_selected_refuses_another_apps_task(
    taskmill: Taskmill, base_url: str, page: Page
):
    mine = await taskmill.for_app("photos").enqueue("never")
    theirs = await taskmill.for_app("music").enqueue("never")
    await sign_in(page, base_url, "tok-photos", "/ui/tasks")
    csrf = await page.locator("#bulk-cancel input[name=csrf]").get_attribute("value")
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    async with httpx.AsyncClient(base_url=base_url, cookies=cookies) as client:
        answer = await client.post(
            "/ui/tasks/cancel-selected",
            content=urlencode(
                [
                    ("confirmed", "yes"),
                    ("csrf", csrf or ""),
                    ("back", "/ui/tasks"),
                    ("task_id", mine.id),
                    ("task_id", theirs.id),
                ]
            ),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
    assert answer.status_code == 303
    assert await status_of(taskmill, mine.id) is TaskStatus.CANCELLED
    assert await status_of(taskmill, theirs.id) is TaskStatus.PENDING
