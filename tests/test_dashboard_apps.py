"""The dashboard's app picker (admin tokens) and its "by task type and app" table, in a
real headless Chromium through a real uvicorn server, on SQLite and PostgreSQL
(docs/dashboard.md)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Page
from taskmill import Taskmill
from taskmill_http import create_app
from taskmill_http.dashboard import listing

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


async def row_ids(page: Page) -> set[str]:
    found = await page.eval_on_selector_all(
        "#tasks tbody tr[data-task-id]", "rows => rows.map(r => r.dataset.taskId)"
    )
    return set(found)


async def stored(tm: Taskmill) -> dict[str, list[str]]:
    """Tasks of two apps and of the host (none of them served)."""
    photos, music = tm.for_app("photos"), tm.for_app("music")
    made = {
        "photos": [(await photos.enqueue("encode")).id for _ in range(2)],
        "music": [(await music.enqueue("encode")).id],
        "host": [(await tm.enqueue("encode")).id],
    }
    made["photos"].append((await photos.enqueue("resize")).id)
    return made


async def test_an_admin_picks_an_app_or_the_host_from_the_apps_that_exist(
    taskmill: Taskmill, base_url: str, page: Page
):
    made = await stored(taskmill)
    await sign_in(page, base_url, "tok-admin", "/ui/tasks")
    options = await page.eval_on_selector_all(
        "#f-app option", "os => os.map(o => [o.value, o.textContent.trim()])"
    )
    assert options == [
        ["", "all"],
        ["-", "host (no app)"],
        ["music", "music"],
        ["photos", "photos"],
    ]
    assert await row_ids(page) == {i for ids in made.values() for i in ids}

    await page.select_option("#f-app", "photos")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url(re.compile(r"app_id=photos"))
    assert await row_ids(page) == set(made["photos"])
    assert await page.eval_on_selector("#f-app", "s => s.value") == "photos"

    await page.select_option("#f-app", "-")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url(re.compile(r"app_id=-"))
    assert await row_ids(page) == set(made["host"])
    assert await page.eval_on_selector("#f-app", "s => s.value") == "-"

    await page.select_option("#f-app", "")
    await page.click("form.filters button[type=submit]")
    await page.wait_for_url(re.compile(r"/ui/tasks\?(?!.*app_id=\w)"))
    assert len(await row_ids(page)) == 5


async def test_the_host_list_pages_past_many_app_tasks(
    taskmill: Taskmill, base_url: str, page: Page, monkeypatch: pytest.MonkeyPatch
):
    # Rounds of 3 tasks, 2 rounds a page: the first page reads 6 app tasks, keeps none
    # and links on from where it stopped.
    monkeypatch.setattr(listing, "HOST_SCAN_BATCH", 3)
    monkeypatch.setattr(listing, "HOST_SCAN_ROUNDS", 2)
    host = [(await taskmill.enqueue("encode")).id for _ in range(3)]
    for _ in range(7):
        await taskmill.for_app("photos").enqueue("encode")
    await sign_in(page, base_url, "tok-admin", "/ui/tasks?app_id=-")
    seen: list[str] = []
    pages = 0
    for _ in range(10):
        pages += 1
        seen.extend(await row_ids(page))
        if not await page.locator("#next-page").count():
            break
        async with page.expect_navigation():
            await page.click("#next-page")
    assert sorted(seen) == sorted(host)
    assert pages >= 2


async def test_the_overview_splits_task_types_by_app(taskmill: Taskmill, base_url: str, page: Page):
    await stored(taskmill)
    await sign_in(page, base_url, "tok-admin", "/ui/")
    rows = await page.eval_on_selector_all(
        "#by-type-app tbody tr",
        "rows => rows.map(r => [r.dataset.type, r.dataset.app,"
        " r.querySelector('td[data-label=Total]').textContent.trim()])",
    )
    assert rows == [
        ["encode", "music", "1"],
        ["encode", "photos", "2"],
        ["encode", "-", "1"],
        ["resize", "photos", "1"],
    ]
    await page.click('#by-type-app tr[data-app="-"] th[scope=row] a')
    await page.wait_for_url(re.compile(r"app_id=-"))
    assert len(await row_ids(page)) == 1


async def test_an_app_token_has_no_picker_and_cannot_ask_for_the_host(
    taskmill: Taskmill, base_url: str, page: Page
):
    made = await stored(taskmill)
    await sign_in(page, base_url, "tok-photos", "/ui/tasks")
    assert await page.locator("#f-app").count() == 0
    assert await row_ids(page) == set(made["photos"])
    response = await page.goto(base_url + "/ui/tasks?app_id=-")
    assert response is not None and response.status == 403
    await page.goto(base_url + "/ui/")
    assert await page.locator("#by-type-app").count() == 0
