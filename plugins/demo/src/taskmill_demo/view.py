"""What ``taskmill demo`` shows: the live view while the worker runs (an overall bar,
then one row per running task) and the summary per task type afterwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import attrs
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from taskmill import Attempt, ProgressSummary, Task, TaskFilter, Taskmill, TaskStatus, Worker
from taskmill.cli import pct, priority_name, short

REFRESH_SECONDS = 0.25
"""How often the live view reads the store again."""


async def run_with_live_view(
    tm: Taskmill, worker: Worker[Taskmill], run_filter: TaskFilter, console: Console
) -> float:
    """Run ``worker`` until idle (or a signal) while a live display, refreshed from the
    store a few times a second, shows the tasks ``run_filter`` selects. Returns the
    seconds it ran."""
    started = time.monotonic()
    running_filter = attrs.evolve(run_filter, statuses=(TaskStatus.RUNNING,))
    with Live(console=console, auto_refresh=False, transient=False) as live:

        async def refresh(*, final: bool = False) -> None:
            running = await tm.query(running_filter, limit=worker.concurrency * 2)
            summary = await tm.progress_summary(run_filter)
            elapsed = time.monotonic() - started
            live.update(live_view(summary, running, elapsed, final=final), refresh=True)

        async def keep_refreshing() -> None:
            while True:
                await refresh()
                await asyncio.sleep(REFRESH_SECONDS)

        refresher = asyncio.create_task(keep_refreshing())
        try:
            await worker.run_until_idle()
        finally:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)
        await refresh(final=True)
    if not console.is_terminal:
        console.line()  # on a pipe, Live leaves its last frame unterminated
    console.line()
    return time.monotonic() - started


def live_view(
    summary: ProgressSummary, running: Sequence[Task], elapsed: float, *, final: bool = False
) -> RenderableType:
    """The live display: an overall bar, then one row per running task (``final``: the
    last frame, drawn after the worker stopped)."""
    overall = Table.grid(padding=(0, 1))
    overall.add_row(
        ProgressBar(total=max(summary.total, 1), completed=summary.finished, width=40),
        Text(f"{summary.finished}/{summary.total} done", style="bold"),
        Text(f"{summary.completed} completed", style="green"),
        Text(f"{summary.failed} failed", style="red"),
        Text(f"{summary.running} running", style="cyan"),
        Text(f"{summary.pending} pending", style="yellow"),
        Text(f"{elapsed:.1f}s", style="dim"),
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("task", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("priority", no_wrap=True)
    table.add_column("attempt", justify="right")
    table.add_column("progress", no_wrap=True)
    table.add_column("%", justify="right")
    table.add_column("message", no_wrap=True, overflow="ellipsis", max_width=44)
    for task in sorted(running, key=lambda t: (t.started_at or t.created_at, t.id)):
        progress = task.progress
        table.add_row(
            short(task.id),
            Text(task.task_type),
            priority_name(task.priority),
            str(task.attempts),
            # No total yet (the handler has not reported): an empty bar, not a guess.
            ProgressBar(
                total=progress.total or 1,
                completed=progress.done if progress.total else 0,
                width=24,
            ),
            pct(task),
            Text(progress.message or ""),
        )
    if not running:
        if summary.finished == summary.total:
            state = "all tasks finished"
        elif final:
            state = f"stopped with {summary.total - summary.finished} tasks unfinished"
        else:
            state = "waiting for retries to come due"
        return Group(overall, Text(state, style="dim"))
    return Group(overall, table)


@attrs.frozen
class TypeTally:
    """What the demo summary says about one task type."""

    task_type: str
    tasks: int
    completed: int
    failed: int
    unfinished: int
    retries: int
    mean_attempt_seconds: float | None


def tallies(
    task_types: Sequence[str], tasks: Sequence[Task], logs: Sequence[Sequence[Attempt]]
) -> list[TypeTally]:
    """Per task type of the run, in the order given: outcomes, retries and mean attempt
    time.

    ``logs`` holds each task's attempt log, in the order of ``tasks``.
    """
    found = []
    for task_type in task_types:
        mine = [(t, log) for t, log in zip(tasks, logs, strict=True) if t.task_type == task_type]
        if not mine:
            continue
        times = [a.elapsed_ms / 1000 for _, log in mine for a in log]
        found.append(
            TypeTally(
                task_type=task_type,
                tasks=len(mine),
                completed=sum(t.status is TaskStatus.COMPLETED for t, _ in mine),
                failed=sum(t.status is TaskStatus.FAILED for t, _ in mine),
                unfinished=sum(t.status.active for t, _ in mine),
                retries=sum(max(0, t.attempts - 1) for t, _ in mine),
                mean_attempt_seconds=sum(times) / len(times) if times else None,
            )
        )
    return found


def summary(tallied: Sequence[TypeTally], elapsed: float) -> Table:
    """The table printed after the run: one row per task type, totals in the footer."""
    table = Table(
        title=f"summary ({elapsed:.1f}s)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        show_footer=True,
    )
    table.add_column("type", footer="total", no_wrap=True)
    for name, total in (
        ("tasks", sum(t.tasks for t in tallied)),
        ("completed", sum(t.completed for t in tallied)),
        ("failed", sum(t.failed for t in tallied)),
        ("retries", sum(t.retries for t in tallied)),
    ):
        table.add_column(name, footer=str(total), justify="right")
    table.add_column("mean attempt", justify="right")
    for tally in tallied:
        mean = tally.mean_attempt_seconds
        table.add_row(
            Text(tally.task_type),
            str(tally.tasks),
            str(tally.completed),
            Text(str(tally.failed), style="red" if tally.failed else ""),
            str(tally.retries),
            "-" if mean is None else f"{mean:.2f}s",
        )
    return table
