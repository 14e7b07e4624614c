"""How commands print: tables (rich) for a person, JSON for a program, and the small
formats both share (short ids, ages, percentages, priorities by name).

Tables go to a stdout :func:`console` that is wide on a pipe, so that rows do not
wrap. Plugin commands may use these too, to print like taskmill's own commands: the
ones :mod:`taskmill.cli` exports (plugins import them from there).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO, cast
from urllib.parse import urlsplit, urlunsplit

import attrs
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from taskmill.model import (
    Attempt,
    Priority,
    Progress,
    ProgressSummary,
    Task,
    TaskStatus,
    attempt_runs,
)
from taskmill.plugins import BrokenPlugin, PluginInfo
from taskmill.settable import text
from taskmill.settings import DEFAULT, HOST_APP, SETTING_NAMES, setting_doc, setting_form
from taskmill.workers import WorkerStatus


def console() -> Console:
    """A stdout console for tables: wide on a pipe or file, so that rows do not wrap,
    and with no trailing spaces (rich pads every cell, the last one too)."""
    out = Console(file=cast(TextIO, _TrimmedLines(sys.stdout)), highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 160
    return out


_TRAILING_SPACES = re.compile(r"[ \t]+(?=\n|$)")


class _TrimmedLines(io.TextIOBase):
    """A text stream that writes to ``target`` without the spaces that end lines."""

    def __init__(self, target: TextIO) -> None:
        self._target = target

    def write(self, text: str) -> int:
        self._target.write(_TRAILING_SPACES.sub("", text))
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()

    def fileno(self) -> int:
        return self._target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._target, "encoding", None) or "utf-8"


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout."""
    print(json.dumps(value, indent=2, ensure_ascii=False))


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# -- small formats ------------------------------------------------------------------


def short(task_id: str) -> str:
    """A task id as ``ls`` prints it (and every command accepts it back)."""
    return task_id[:8]


def priority_name(priority: int) -> str:
    """``user_action`` for 1000, the number itself for a priority with no name."""
    try:
        return Priority(priority).name.lower()
    except ValueError:
        return str(priority)


def age(moment: datetime | None, now: datetime) -> str:
    """How long before ``now`` ``moment`` was, like ``12s``, ``5m``, ``1.5h``."""
    if moment is None:
        return "-"
    return seconds((now - moment).total_seconds())


def seconds(value: float) -> str:
    """A duration in seconds, shortened to s, m, h or d."""
    value = max(0.0, value)
    if value < 60:
        return f"{value:.0f}s" if value >= 10 else f"{value:.1f}s"
    if value < 3600:
        return f"{value / 60:.0f}m"
    if value < 86400:
        return f"{value / 3600:.1f}h"
    return f"{value / 86400:.1f}d"


def pct(task: Task) -> str:
    """The task's progress in percent; ``-`` while it has reported no total."""
    value = task.progress.pct
    if value is None:
        return "100%" if task.status is TaskStatus.COMPLETED else "-"
    return f"{value:.0f}%"


def truncate(text: str | None, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def when(moment: datetime | None) -> str:
    """A timestamp to the millisecond."""
    if moment is None:
        return "-"
    return moment.isoformat(sep=" ", timespec="milliseconds")


_STATUS_STYLE = {
    TaskStatus.PENDING: "yellow",
    TaskStatus.RUNNING: "cyan",
    TaskStatus.COMPLETED: "green",
    TaskStatus.FAILED: "bold red",
    TaskStatus.CANCELLED: "magenta",
}


def status_text(status: TaskStatus) -> Text:
    """The status, in its colour."""
    return Text(status.value, style=_STATUS_STYLE[status])


def _table(**options: Any) -> Table:
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, **options)


# -- tasks --------------------------------------------------------------------------


def task_list(tasks: Sequence[Task], now: datetime, *, title: str | None = None) -> Table:
    """``taskmill ls`` (and the children ``taskmill show`` lists): one task per row."""
    table = _table() if title is None else _table(title=title, title_justify="left")
    for name, justify in (
        ("id", "left"),
        ("type", "left"),
        ("app", "left"),
        ("status", "left"),
        ("priority", "right"),
        ("attempts", "right"),
        ("progress", "right"),
        ("age", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("error", overflow="ellipsis", no_wrap=True, max_width=60)
    for task in tasks:
        table.add_row(
            short(task.id),
            Text(task.task_type),
            Text(task.app_id or "-"),
            status_text(task.status),
            priority_name(task.priority),
            f"{task.attempts}/{task.max_retries + 1}",
            pct(task),
            age(task.created_at, now),
            Text(truncate((task.error or "").split("\n", 1)[0], 60), style="red"),
        )
    return table


def task_fields(task: Task) -> Table:
    """``taskmill show``: every field of ``task``, one per row."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False, show_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for field in attrs.fields(Task):
        table.add_row(field.name, _field_text(field.name, getattr(task, field.name)))
    return table


def _field_text(name: str, value: Any) -> Text:
    if name == "status":
        return status_text(value)
    if name == "priority":
        named = priority_name(value)
        return Text(str(value) if named == str(value) else f"{value} ({named})")
    if name == "progress" and value == Progress():
        return Text("-", style="dim")
    if name == "progress":
        done = value.pct
        total = "?" if value.total is None else f"{value.total:g}"
        shown = f"{value.done:g}/{total}" + ("" if done is None else f" ({done:.0f}%)")
        return Text(shown + (f" {value.message}" if value.message else ""))
    if isinstance(value, datetime):
        return Text(when(value))
    if name in ("params", "data") or (name == "result" and value is not None):
        return Text(json.dumps(value, ensure_ascii=False))
    if value is None:
        return Text("-", style="dim")
    if hasattr(value, "value"):  # enums
        return Text(str(value.value))
    return Text(str(value))


def attempt_log(attempts: Sequence[Attempt]) -> Table:
    """``taskmill show``: the task's attempts, oldest first; with a ``run`` column once
    a manual retry started the numbers again (:func:`~taskmill.model.attempt_runs`)."""
    runs = attempt_runs(attempts)
    several = bool(runs) and runs[-1] > 1
    table = _table(title="attempts", title_justify="left")
    if several:
        table.add_column("run", justify="right")
    table.add_column("#", justify="right")
    table.add_column("outcome")
    table.add_column("started")
    table.add_column("elapsed", justify="right")
    table.add_column("worker", no_wrap=True)
    table.add_column("error", overflow="fold")
    for attempt, run in zip(attempts, runs, strict=True):
        table.add_row(
            *([str(run)] if several else []),
            str(attempt.number),
            attempt.outcome.value,
            when(attempt.started_at),
            f"{attempt.elapsed_ms:.0f} ms",
            Text(attempt.worker_id),
            Text(attempt.error or "", style="red"),
        )
    return table


def summary_table(summaries: Sequence[tuple[str, ProgressSummary]]) -> Table:
    """``taskmill stats``: one row of counts per named scope."""
    table = _table()
    table.add_column("tasks", no_wrap=True)
    for name in ("total", "pending", "running", "completed", "failed", "cancelled", "done"):
        table.add_column(name, justify="right")
    for name, s in summaries:
        table.add_row(
            Text(name),
            str(s.total),
            str(s.pending),
            str(s.running),
            str(s.completed),
            str(s.failed),
            str(s.cancelled),
            f"{s.pct:.0f}%",
        )
    return table


def schedule_table(rows: Sequence[dict[str, Any]]) -> Table:
    """``taskmill schedules``: one row per schedule (see :func:`schedule_row`)."""
    table = _table()
    for name in ("schedule", "app", "task type", "when", "time zone", "catch up"):
        table.add_column(name, no_wrap=True)
    table.add_column("next fire (UTC)", no_wrap=True)
    table.add_column("last fire (UTC)", no_wrap=True)
    for row in rows:
        last = row["last_fire"]
        if last is None:
            last_text = "-"
        else:
            status = row["last_fire_status"]
            last_text = f"{last} ({status if status is not None else 'not stored'})"
        table.add_row(
            Text(row["name"]),
            Text(row["app_id"] or HOST_APP),
            Text(row["task_type"]),
            Text(row["when"]),
            Text(row["timezone"]),
            Text(row["catch_up"]),
            Text(row["next_fire"]),
            Text(last_text),
        )
    return table


# -- workers ------------------------------------------------------------------------


def served_types(worker: WorkerStatus) -> list[str]:
    """The task types a worker serves, as ``app/type`` for an app's handler."""
    return [
        h.task_type if h.app_id is None else f"{h.app_id}/{h.task_type}"
        for h in worker.record.handlers
    ]


def worker_table(workers: Sequence[WorkerStatus], now: datetime) -> Table:
    """``taskmill workers``: one registered worker per row, live ones first."""
    table = _table()
    for name, justify in (
        ("worker", "left"),
        ("host", "left"),
        ("pid", "right"),
        ("version", "left"),
        ("started", "right"),
        ("heartbeat", "right"),
        ("state", "left"),
        ("busy", "right"),
        ("queued", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("task types", overflow="fold")
    for worker in workers:
        record = worker.record
        table.add_row(
            Text(record.id),
            Text(record.host),
            str(record.pid),
            Text(record.version),
            f"{age(record.started_at, now)} ago",
            f"{age(worker.heartbeat_at, now)} ago",
            Text("alive", style="green") if worker.alive else Text("dead", style="bold red"),
            f"{record.busy}/{record.concurrency}",
            str(record.queued),
            Text(", ".join(served_types(worker)) or "-"),
        )
    return table


def worker_document(worker: WorkerStatus, now: datetime) -> dict[str, Any]:
    """``taskmill workers --json``: one registered worker."""
    record = worker.record
    return {
        "id": record.id,
        "alive": worker.alive,
        "host": record.host,
        "pid": record.pid,
        "version": record.version,
        "started_at": record.started_at.isoformat(),
        "heartbeat_at": worker.heartbeat_at.isoformat(),
        "heartbeat_age_seconds": round(max(0.0, (now - worker.heartbeat_at).total_seconds()), 3),
        "lease_seconds": record.lease_seconds,
        "concurrency": record.concurrency,
        "busy": record.busy,
        "running": list(record.running),
        "queued": record.queued,
        "processed": record.processed,
        "handlers": [attrs.asdict(h) for h in record.handlers],
    }


# -- plugins and settings -----------------------------------------------------------


def plugin_table(plugins: Sequence[PluginInfo]) -> Table:
    """``taskmill plugins``: the loaded plugins."""
    table = _table()
    for name in ("plugin", "distribution", "version", "handlers", "hooks"):
        table.add_column(name, no_wrap=name != "hooks")
    for plugin in plugins:
        handlers = [
            h.task_type if h.app_id is None else f"{h.app_id}/{h.task_type}"
            for h in plugin.handlers
        ]
        table.add_row(
            Text(plugin.name),
            Text(plugin.distribution or "(added in code)"),
            Text(plugin.version or "-"),
            Text("\n".join(handlers) or "-"),
            Text(", ".join(h.removeprefix("taskmill_") for h in plugin.hooks)),
        )
    return table


def broken_table(broken: Sequence[BrokenPlugin]) -> Table:
    """``taskmill plugins``: the plugins that failed to load, with why."""
    table = _table(title="failed to load", title_justify="left")
    for name in ("plugin", "distribution", "version", "error"):
        table.add_column(name, no_wrap=name != "error", overflow="fold")
    for plugin in broken:
        table.add_row(
            Text(plugin.name),
            Text(plugin.distribution or "-"),
            Text(plugin.version or "-"),
            Text(plugin.error, style="red"),
        )
    return table


def plugin_document(plugin: PluginInfo) -> dict[str, Any]:
    """``taskmill plugins --json``: one loaded plugin."""
    return {
        "name": plugin.name,
        "distribution": plugin.distribution,
        "version": plugin.version,
        "hooks": list(plugin.hooks),
        "handlers": [
            {
                "app_id": h.app_id,
                "task_type": h.task_type,
                "max_retries": h.max_retries,
                "timeout": h.timeout,
                "concurrency": h.concurrency,
            }
            for h in plugin.handlers
        ],
    }


def settings_table(rows: Sequence[tuple[str, Any, str]]) -> Table:
    """``taskmill config``: each setting's ``(name, value, source)``, with its meaning."""
    table = _table()
    table.add_column("setting", no_wrap=True)
    # A value (a URL, a path) is not broken mid-word: the meaning wraps instead.
    table.add_column("value", no_wrap=True)
    table.add_column("from", no_wrap=True)
    table.add_column("meaning", min_width=20)
    for name, value, source in rows:
        table.add_row(
            Text(name),
            Text(_setting_text(name, value)),
            Text(source, style="dim" if source == DEFAULT else "bold"),
            Text(setting_doc(name) if name in SETTING_NAMES else "storage option", style="dim"),
        )
    return table


_STORAGE_OPTION = text()
"""How a storage option's value is shown (the backend, not taskmill, reads it)."""


def _setting_text(name: str, value: Any) -> str:
    form = setting_form(name) if name in SETTING_NAMES else _STORAGE_OPTION
    return form.show(value)
