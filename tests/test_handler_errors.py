"""What a handler author sees when a handler is wrong or an attempt fails: a wrong
signature is refused at registration, and every failed attempt is logged the same way."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

import pytest
from taskmill import Context, Fail, InvalidHandler, Retry, Taskmill, TaskStatus


def test_a_handler_without_ctx_is_refused_at_registration_with_the_signature_to_use() -> None:
    tm = Taskmill("memory://", plugins=False)
    with pytest.raises(InvalidHandler) as caught:

        @tm.handler("resize")  # type: ignore[type-var]
        async def resize(params: dict[str, Any]) -> None: ...

    message = str(caught.value)
    assert "(ctx, params)" in message
    assert "resize(params: dict[str, Any])" in message
    assert "async def resize(ctx: Context, params: dict)" in message
    assert tm.registry.lookup(None, "resize") is None


@pytest.mark.parametrize(
    "bad",
    [
        lambda: None,
        lambda ctx, params, extra: None,
        lambda *, ctx, params: None,
    ],
    ids=["no-arguments", "a-third-required-argument", "keyword-only"],
)
def test_any_handler_that_cannot_be_called_with_ctx_and_params_is_refused(bad: Any) -> None:
    tm = Taskmill("memory://", plugins=False)
    with pytest.raises(InvalidHandler, match="must take two arguments"):
        tm.register("t", bad)


def test_a_non_callable_handler_is_refused() -> None:
    tm = Taskmill("memory://", plugins=False)
    with pytest.raises(InvalidHandler, match="must be a function"):
        tm.register("t", "not a function")  # type: ignore[arg-type]


def test_handlers_that_take_ctx_and_params_in_any_form_are_accepted() -> None:
    class Callable_:
        async def __call__(self, ctx: Context, params: dict[str, Any]) -> None: ...

    def with_options(ctx: Context, params: dict[str, Any], scale: int = 2) -> None: ...

    def bound(prefix: str, ctx: Context, params: dict[str, Any]) -> None: ...

    tm = Taskmill("memory://", plugins=False)
    tm.register("object", Callable_())
    tm.register("defaults", with_options)
    tm.register("varargs", cast(Callable[..., None], lambda *args: None))
    tm.register("partial", functools.partial(bound, "x"))
    assert len(tm.registry) == 4


async def _one_failed_attempt(
    caplog: pytest.LogCaptureFixture, handler: Any, *, timeout: float | None = None
) -> tuple[list[logging.LogRecord], TaskStatus]:
    async with Taskmill("memory://", plugins=False) as tm:
        tm.register("job", handler, max_retries=0, timeout=timeout)
        task = await tm.enqueue("job")
        with caplog.at_level(logging.WARNING, logger="taskmill.worker"):
            await tm.run_worker(until_idle=True, handle_signals=False)
        final = await tm.get(task.id)
    assert final is not None
    records = [r for r in caplog.records if r.name == "taskmill.worker" and task.id in r.message]
    return records, final.status


async def _raises(ctx: Context, params: dict[str, Any]) -> None:
    raise ValueError("boom")


async def _sleeps(ctx: Context, params: dict[str, Any]) -> None:
    await asyncio.sleep(30)


async def _not_json(ctx: Context, params: dict[str, Any]) -> object:
    return {"when": object()}


async def _asks_retry(ctx: Context, params: dict[str, Any]) -> None:
    raise Retry(message="upstream busy")


async def _fails(ctx: Context, params: dict[str, Any]) -> None:
    raise Fail("bad input")


@pytest.mark.parametrize(
    ("handler", "timeout", "what"),
    [
        (_raises, None, "ValueError: boom"),
        (_sleeps, 0.05, "timed out after 0.05 s"),
        (_not_json, None, "not JSON-serializable"),
        (_asks_retry, None, "upstream busy"),
        (_fails, None, "bad input"),
    ],
    ids=["exception", "timeout", "non-json-result", "retry", "fail"],
)
async def test_every_failed_attempt_is_logged_once_with_its_error_and_what_happens_next(
    caplog: pytest.LogCaptureFixture, handler: Any, timeout: float | None, what: str
) -> None:
    records, status = await _one_failed_attempt(caplog, handler, timeout=timeout)
    assert status is TaskStatus.FAILED
    assert len(records) == 1, [r.message for r in records]
    record = records[0]
    assert record.levelno == logging.WARNING
    assert "attempt 1 of 1" in record.message
    assert what in record.message
    assert "not retrying" in record.message
    # A traceback goes with an exception, not with a timeout or a deliberate Fail.
    assert (record.exc_info is not None) == (handler is _raises)


# -- the traceback excerpt ------------------------------------------------------------


def _parse_row(row: str) -> int:
    return int(row)  # the line the excerpt must point at


def _deep(n: int) -> int:
    return _parse_row("x") if n == 0 else _deep(n - 1)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_an_unexpected_exception_keeps_the_handlers_innermost_frames(
    backend_url: str, kind: str
) -> None:
    async with Taskmill(backend_url, plugins=False) as tm:
        if kind == "async":

            @tm.handler("parse", max_retries=0)
            async def parse(ctx: Context, params: dict[str, Any]) -> int:
                return _parse_row(params["row"])

        else:

            @tm.handler("parse", max_retries=0)
            def parse(ctx: Context, params: dict[str, Any]) -> int:  # type: ignore[misc]
                return _parse_row(params["row"])

        task = await tm.enqueue("parse", {"row": "abc"})
        await tm.run_worker(until_idle=True)
        done = await tm.get(task.id)
        (attempt,) = await tm.attempts(task.id)

    assert done is not None and done.error is not None and attempt.error is not None
    headline, excerpt = done.error.split("\n", 1)
    assert headline.startswith("ValueError: invalid literal for int()")
    assert excerpt.startswith("Traceback (most recent call last):")
    assert f'File "{__file__}"' in excerpt
    assert "in parse\n" in excerpt and "in _parse_row\n" in excerpt
    assert "return int(row)" in excerpt
    assert "taskmill/worker.py" not in excerpt and "asyncio" not in excerpt
    assert attempt.error == done.error


async def test_the_excerpt_is_bounded_to_the_innermost_frames() -> None:
    from taskmill.tracebacks import EXCERPT_FRAMES, EXCERPT_LIMIT

    async with Taskmill("memory://", plugins=False) as tm:

        @tm.handler("deep", max_retries=0)
        async def deep(ctx: Context, params: dict[str, Any]) -> int:
            return _deep(200)

        task = await tm.enqueue("deep")
        await tm.run_worker(until_idle=True)
        done = await tm.get(task.id)

    assert done is not None and done.error is not None
    excerpt = done.error.split("\n", 1)[1]
    assert len(excerpt) <= EXCERPT_LIMIT
    # The innermost frames only (Python folds the repeated ones into one line).
    assert 2 <= excerpt.count('  File "') <= EXCERPT_FRAMES
    assert "in deep\n" not in excerpt
    assert "in _deep\n" in excerpt and "return int(row)" in excerpt.splitlines()[-2]


@pytest.mark.parametrize(
    "handler",
    [_fails, _asks_retry, _sleeps, _not_json],
    ids=["fail", "retry", "timeout", "non-json-result"],
)
async def test_deliberate_failures_timeouts_and_results_keep_no_traceback(handler: Any) -> None:
    async with Taskmill("memory://", plugins=False) as tm:
        tm.register("t", handler, max_retries=0, timeout=0.05)
        task = await tm.enqueue("t")
        await tm.run_worker(until_idle=True)
        done = await tm.get(task.id)
    assert done is not None and done.error is not None
    assert "Traceback" not in done.error
