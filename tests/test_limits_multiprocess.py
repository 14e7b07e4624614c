"""Global limits across three real worker processes, on SQLite, PostgreSQL and MongoDB: the
observed start rate of a rate-limited type and the most tasks of a globally capped type
running at once, against the bounds docs/rate-limits.md states.

The workers are ``tests/worker_process.py``: ``rated`` (``rate_limit="20/s"``) and
``capped`` (``global_concurrency=3``, each run sleeping) log a wall-clock time per start
(and end), so the test sees every start in every process on one clock. On MongoDB (nx-27017, a slow
stand-in in CI) the run is smaller: the bounds are the same.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from taskmill import Taskmill
from taskmill.testing import wait_until

from tests.test_multiprocess_sqlite import Cluster, wait_exit

pytestmark = pytest.mark.slow

RATE = 20
"""Starts per second of ``rated`` (the workers are started with ``--rate-limit 20/s``)."""
MAX_RUNNING = 3
"""The workers' ``--global-concurrency``."""
SLACK = 3
"""Starts allowed above the bound in a window: a start is logged a moment after its
claim, so windows measured on the log may look a little shorter than on the store."""


SIZES = {"sqlite": (100, 30), "postgres": (100, 30), "mongo": (60, 12)}
"""Per backend: how many ``rated`` and ``capped`` tasks the run starts."""


@pytest.fixture(params=list(SIZES))
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        url = str(request.getfixturevalue(f"{request.param}_url"))
    c = Cluster(url, tmp_path / "runs.log")
    yield c
    c.close()


def most_in_any_window(starts: list[float]) -> float:
    """The largest excess of starts over ``RATE + RATE * T`` in any window of T seconds
    (<= 0 when the bound holds everywhere)."""
    starts = sorted(starts)
    worst = float("-inf")
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            allowed = RATE + RATE * (starts[j] - first)
            worst = max(worst, (j - i + 1) - allowed)
    return worst


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


async def test_three_processes_share_a_rate_limit_and_a_global_cap(
    cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    n_rated, n_capped = SIZES[request.node.callspec.params["cluster"]]
    async with Taskmill(cluster.url, plugins=False) as tm:
        await tm.enqueue_many([{"task_type": "rated"} for _ in range(n_rated)])
        await tm.enqueue_many(
            [{"task_type": "capped", "params": {"sleep": 0.1}} for _ in range(n_capped)]
        )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        cluster.start(
            "--concurrency",
            "4",
            "--barrier",
            str(barrier),
            "--parties",
            "3",
            "--rate-limit",
            f"{RATE}/s",
            "--global-concurrency",
            str(MAX_RUNNING),
        )
        for _ in range(3)
    ]

    async def all_ran() -> bool:
        return (
            len(cluster.lines("rated")) >= n_rated and len(cluster.lines("capped-end")) >= n_capped
        )

    await wait_until(all_ran, timeout=120, interval=0.2)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        await asyncio.to_thread(wait_exit, proc, 60)

    rated = cluster.lines("rated")
    assert len({row[0] for row in rated}) == n_rated == len(rated)
    starts = [float(row[2]) for row in rated]
    assert most_in_any_window(starts) <= SLACK
    span = max(starts) - min(starts)
    # n starts at 20/s after a burst of 20 take at least (n - 20) / 20 s (4 s for 100).
    assert span >= (n_rated - RATE) / RATE * 0.9, span
    assert len({row[1] for row in rated}) >= 2, "the limit was shared, not one process's"

    begun = {row[0]: float(row[2]) for row in cluster.lines("capped-start")}
    ended = {row[0]: float(row[2]) for row in cluster.lines("capped-end")}
    assert len(ended) == n_capped
    peak = most_at_once([(begun[t], ended[t]) for t in ended])
    assert 1 <= peak <= MAX_RUNNING
    print(
        f"\n{cluster.url.split(':')[0]}: {len(starts)} starts in {span:.2f} s "
        f"({(len(starts) - 1) / span:.1f}/s, limit {RATE}/s), peak running {peak}"
    )
