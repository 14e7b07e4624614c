"""The reduced chaos run in CI (issue 16 §1; the full run is ``bench/chaos.py``).

400 tasks, 3 real worker processes, one ``kill -9``'d every 1.5 s or so and replaced,
injected handler failures and timeouts, and, when the backend's restart variable holds
the command (CI sets it; never set it on a shared server), three server restarts. Then
:func:`bench.chaos.check`'s findings must be empty: every task terminal, none completed
twice, every attempt in the log (the killed ones as LOST), ``progress_summary`` equal
to a recount.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from chaos import ChaosConfig, restart_command, run_round

CHAOS_BACKENDS = {
    "sqlite": None,
    "postgres": "postgres_url",
    "mysql": "mysql_url",
    "mongo": "mongo_url",
}
"""Each backend of the chaos run, with the conftest fixture of its fresh store URL
(None: a SQLite file in the test's directory). A new backend is one entry."""


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", list(CHAOS_BACKENDS))
async def test_a_chaos_run_loses_nothing_and_completes_nothing_twice(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    fixture = CHAOS_BACKENDS[backend]
    url = (
        f"sqlite:///{tmp_path / 'chaos.db'}"
        if fixture is None
        else request.getfixturevalue(fixture)
    )
    config = ChaosConfig(
        url=str(url),
        tasks=400,
        concurrency=2,
        duration_scale=4,
        kill_interval=1.5,
        restart=restart_command(str(url)),
        deadline=180,
    )
    result = await run_round(config, tmp_path)
    assert result.problems == []
    # The chaos happened: workers were killed with tasks in hand, which were rescued.
    assert result.kills >= 3
    assert result.lost_attempts >= 1
    assert result.timed_out_attempts >= 1 and result.failed_attempts >= 1
    if config.restart:
        assert result.restarts == config.restarts
    assert result.statuses.get("completed", 0) + result.statuses.get("failed", 0) == 400
