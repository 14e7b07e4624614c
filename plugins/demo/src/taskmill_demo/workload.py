"""The tasks ``taskmill demo`` enqueues: every handler's, with mixed priorities."""

from __future__ import annotations

import random
from typing import Any

from taskmill import Priority, TaskSpec

from taskmill_demo.handlers import APP_ID, BAD_RECORD_EMAIL, FETCH, OCR, SCAN, THUMBNAIL, VALIDATE

# One round of the workload; longer workloads repeat it, shorter ones take its start,
# so that even a handful of tasks covers every handler.
_ROUND: tuple[str, ...] = (
    THUMBNAIL,
    FETCH,
    VALIDATE,
    OCR,
    THUMBNAIL,
    SCAN,
    FETCH,
    THUMBNAIL,
    VALIDATE,
    OCR,
)


def workload(count: int, *, user_id: str, seed: int | None = None) -> list[TaskSpec]:
    """``count`` demo tasks of every type, for the ``media`` app, with mixed priorities,
    stamped with ``user_id``.

    The first ``validate`` task gets the bad record (it will fail without retry) and the
    first ``fetch`` task hits the flaky server at least once (it will be
    retried); everything else is randomised by ``seed``.
    """
    if count < 1:
        raise ValueError(f"the demo needs at least one task, got {count}")
    rng = random.Random(seed)
    specs: list[TaskSpec] = []
    seen: dict[str, int] = {}
    for i in range(count):
        task_type = _ROUND[i % len(_ROUND)]
        nth = seen.get(task_type, 0)
        seen[task_type] = nth + 1
        params, priority = _task(task_type, nth, rng)
        specs.append(
            TaskSpec(
                task_type=task_type,
                params=params,
                app_id=APP_ID,
                priority=priority,
                user_id=user_id,
            )
        )
    return specs


def _task(task_type: str, nth: int, rng: random.Random) -> tuple[dict[str, Any], int]:
    """Params and priority of the ``nth`` task of ``task_type`` in a workload."""
    if task_type == THUMBNAIL:
        # Someone is looking at an upload page: most thumbnails are user actions.
        priority = Priority.USER_ACTION if rng.random() < 0.7 else Priority.NORMAL
        return {
            "image": f"IMG_{4000 + nth:04d}.jpg",
            "size": rng.choice([128, 256, 512]),
            "steps": rng.randint(4, 8),
            "seconds_per_step": round(rng.uniform(0.15, 0.3), 3),
        }, priority
    if task_type == FETCH:
        flaky = 1 if nth == 0 else rng.choice([0, 0, 1, 2])
        return {
            "url": f"https://feeds.example.com/{rng.choice(['news', 'blog', 'jobs'])}/{nth}.xml",
            "flaky_attempts": flaky,
            "seconds": round(rng.uniform(0.5, 1.2), 3),
        }, Priority.NORMAL
    if task_type == VALIDATE:
        email = BAD_RECORD_EMAIL if nth == 0 else f"user{nth}@example.com"
        record = {
            "id": 1000 + nth,
            "name": f"User {nth}",
            "email": email,
            "country": rng.choice(["DE", "FR", "JP", "BR"]),
            "age": rng.randint(18, 90),
        }
        return {"record": record, "seconds_per_field": 0.15}, Priority.NORMAL
    if task_type == OCR:
        priority = Priority.URGENT if nth == 0 else Priority.NORMAL
        return {
            "document": f"scan-{nth:03d}.pdf",
            "pages": rng.randint(3, 7),
            "seconds_per_page": round(rng.uniform(0.4, 0.7), 3),
        }, priority
    if task_type == SCAN:
        return {
            "folder": f"/archive/{2020 + nth}",
            "files": rng.randint(60, 120),
            "suffixes": [".jpg", ".png", ".txt"],
            "match": ".jpg",
            "seconds_per_file": 0.03,
        }, Priority.BACKGROUND
    raise ValueError(f"not a demo task type: {task_type!r}")
