"""The commands that describe the installation and the store without changing them:
``plugins``, ``stats``, ``workers``, ``schedules`` and ``config``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import attrs
from rich.text import Text

from taskmill.app import Taskmill
from taskmill.canvas import serve_builtins
from taskmill.cli.arguments import AddCommand, add_handler_options
from taskmill.cli.messages import EXIT_OK
from taskmill.cli.rendering import (
    broken_table,
    console,
    plugin_document,
    plugin_table,
    print_json,
    redacted,
    schedule_table,
    settings_table,
    summary_table,
    worker_document,
    worker_table,
)
from taskmill.cli.session import (
    load_handlers,
    load_plugins,
    new_taskmill,
    open_taskmill,
    origin,
)
from taskmill.cli.unserved import report_unserved, report_unserved_by_workers
from taskmill.discovery import DEFAULT_URL
from taskmill.errors import TaskmillError
from taskmill.model import TaskFilter
from taskmill.plugins import ENTRY_POINT_GROUP
from taskmill.serialization import to_dict
from taskmill.settings import ENV_VARS, Settings, find_config_file
from taskmill.storage import utcnow


def add_commands(add: AddCommand) -> None:
    """Add ``plugins``, ``stats``, ``workers``, ``schedules`` and ``config``."""
    cmd = add(
        "plugins",
        plugins,
        "List the installed plugins: distribution, version, hooks and the handlers each "
        "registered; then the plugins that are disabled or failed to load.",
    )
    cmd.add_argument("--json", action="store_true", help="print the list as JSON")

    cmd = add("stats", stats, "Count tasks by status.")
    cmd.add_argument(
        "--type",
        dest="task_types",
        action="extend",
        nargs="+",
        metavar="T",
        help="one row per task type given",
    )
    cmd.add_argument("--app-id", default=None, help="only this app's tasks")
    cmd.add_argument("--user-id", default=None, help="only tasks this user asked for")
    cmd.add_argument("--json", action="store_true", help="print the counts as JSON")
    add_handler_options(cmd, purpose="to count pending tasks no handler serves")

    cmd = add(
        "workers",
        workers,
        "List the workers registered in the store, from every process and host: id, "
        "host, pid, version, start, last heartbeat, alive or dead, slots busy of total, "
        "local queue and the task types each one runs.",
    )
    cmd.add_argument("--json", action="store_true", help="print the workers as JSON")

    cmd = add(
        "schedules",
        schedules,
        "List the periodic tasks (from code, plugins and the configuration file) with "
        "their next fire times and, when the store has it, the last fire's task status.",
    )
    cmd.add_argument("--json", action="store_true", help="print the schedules as JSON")
    add_handler_options(cmd, purpose="to find the schedules registered in code")

    cmd = add(
        "config",
        config,
        "Print the effective settings and where each came from (command line, "
        "environment variable, configuration file or default).",
    )
    cmd.add_argument("--json", action="store_true", help="print the settings as JSON")


async def plugins(args: argparse.Namespace, settings: Settings) -> int:
    """List the loaded plugins, then those disabled, left out or broken."""
    # The plugins do not depend on the storage: list them without touching it.
    tm = Taskmill("memory://")
    load_plugins(tm, settings, strict=False)
    loaded = list(tm.plugins)
    listed = tm.plugins
    if args.json:
        print_json(
            {
                "plugins": [plugin_document(p) for p in loaded],
                "disabled": list(listed.disabled),
                "not_enabled": list(listed.not_enabled),
                "broken": [attrs.asdict(b) for b in listed.broken],
                "unmatched": list(listed.unmatched),
            }
        )
        return EXIT_OK
    out = console()
    if loaded:
        out.print(plugin_table(loaded))
    elif not listed.broken:
        out.print(f"no plugins loaded (entry-point group {ENTRY_POINT_GROUP})")
    if listed.broken:
        out.print(broken_table(listed.broken))
    if listed.disabled:
        out.print(
            f"disabled by {origin(settings, 'disable_plugins')}: {', '.join(listed.disabled)}"
        )
    if listed.not_enabled:
        out.print(
            f"not enabled by {origin(settings, 'enable_plugins')}: {', '.join(listed.not_enabled)}"
        )
    return EXIT_OK


async def stats(args: argparse.Namespace, settings: Settings) -> int:
    """Count tasks by status: one row per ``--type``, and a total."""
    base = TaskFilter(app_id=args.app_id, user_id=args.user_id)
    scopes: list[tuple[str, TaskFilter]] = [
        (task_type, attrs.evolve(base, task_types=(task_type,)))
        for task_type in dict.fromkeys(args.task_types or ())
    ]
    if len(scopes) != 1:
        scopes.append(
            ("all" if not scopes else "total", attrs.evolve(base, task_types=args.task_types))
        )
    async with open_taskmill(
        settings, "stats", reads=True, handlers=True, strict_plugins=False
    ) as tm:
        summaries = [(name, await tm.progress_summary(scope)) for name, scope in scopes]
        if args.json:
            print_json({name: dict(to_dict(s), pct=s.pct) for name, s in summaries})
        else:
            console().print(summary_table(summaries))
        sys.stdout.flush()
        serve_builtins(tm.registry)  # every worker serves group roots: not unserved
        await report_unserved(
            tm,
            list(tm.registry),
            attrs.evolve(base, task_types=args.task_types),
            "loaded here",
        )
        await report_unserved_by_workers(tm, attrs.evolve(base, task_types=args.task_types))
    return EXIT_OK


async def workers(args: argparse.Namespace, settings: Settings) -> int:
    """List the registered workers, live ones first (docs/workers.md)."""
    async with open_taskmill(settings, "workers", reads=True, strict_plugins=False) as tm:
        if not tm.storage.capabilities.worker_registry:
            raise TaskmillError(
                f"the store at {redacted(tm.url)} ({type(tm.storage).__name__}) keeps no "
                "worker registry (capability worker_registry), so `taskmill workers` cannot "
                "list its workers; they still run (docs/workers.md)"
            )
        found = await tm.workers()
    now = utcnow()
    if args.json:
        print_json({"workers": [worker_document(w, now) for w in found]})
    elif found:
        console().print(worker_table(found, now))
    else:
        console().print("no workers registered: no worker is running on this store")
    return EXIT_OK


async def schedules(args: argparse.Namespace, settings: Settings) -> int:
    """List every schedule, its next fire and its last fire (with its task's status
    when the store holds it)."""
    tm = new_taskmill(settings)
    load_handlers(tm, settings.imports)
    load_plugins(tm, settings, strict=False)
    now = utcnow()
    rows: list[dict[str, Any]] = []
    known = await tm.storage.exists()
    if known:
        await tm.open()
    try:
        for schedule in tm.schedules:
            last = schedule.last_fire(now)
            status = None
            if last is not None and known:
                task = await tm.get(schedule.fire_id(last))
                status = None if task is None else task.status.value
            rows.append(
                {
                    "name": schedule.name,
                    "app_id": schedule.app_id,
                    "task_type": schedule.task_type,
                    "when": schedule.expression,
                    "timezone": schedule.timezone,
                    "catch_up": schedule.catch_up,
                    "next_fire": schedule.next_fire(now).isoformat(),
                    "last_fire": None if last is None else last.isoformat(),
                    "last_fire_task_id": None if last is None else schedule.fire_id(last),
                    "last_fire_status": status,
                }
            )
    finally:
        if known:
            await tm.close()
    if args.json:
        print_json({"schedules": rows})
    elif rows:
        console().print(schedule_table(rows))
    else:
        console().print(
            "no schedules: add them with @tm.periodic(...) in a module of the imports"
            " setting, a plugin's taskmill_register_schedules, or [schedules.<name>]"
            " tables in the configuration file"
        )
    return EXIT_OK


async def config(args: argparse.Namespace, settings: Settings) -> int:
    """Print every setting, its value and where it came from."""
    path, how = find_config_file(args.config)
    rows = [
        (name, DEFAULT_URL if name == "url" and value is None else value, source)
        for name, value, source in settings.as_rows()
    ]
    rows = [
        (name, redacted(value) if name == "url" else value, source) for name, value, source in rows
    ]
    if args.json:
        print_json(
            {
                "config_file": None if path is None else str(path),
                "config_file_found": how,
                "settings": {
                    name: {
                        "value": list(value) if isinstance(value, tuple) else value,
                        "source": source,
                        "env": ENV_VARS.get(name),
                    }
                    for name, value, source in rows
                },
            }
        )
        return EXIT_OK
    out = console()
    found = how.removeprefix("none: ") if path is None else how
    out.print(Text(f"configuration file: {path or 'none'} ({found})"))
    out.print(settings_table(rows))
    return EXIT_OK
