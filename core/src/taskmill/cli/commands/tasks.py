"""The commands on single tasks: ``enqueue``, ``ls``, ``show``, ``retry``, ``cancel``."""

from __future__ import annotations

import argparse

from taskmill.cli import arguments
from taskmill.cli.arguments import AddCommand, add_handler_options
from taskmill.cli.messages import EXIT_OK, note, warn
from taskmill.cli.rendering import attempt_log, console, print_json, task_fields, task_list
from taskmill.cli.session import find_task, open_taskmill
from taskmill.errors import TaskmillError
from taskmill.model import CancelReason, Priority, TaskFilter, TaskStatus, attempt_runs
from taskmill.operations import handler_hint, unserved_type_message
from taskmill.registry import HandlerRegistry
from taskmill.serialization import to_dict
from taskmill.settings import Settings
from taskmill.storage import utcnow

_TASK_ID_HELP = "a task id or a unique prefix of one"


def add_commands(add: AddCommand) -> None:
    """Add ``enqueue``, ``ls``, ``show``, ``retry`` and ``cancel``."""
    cmd = add("enqueue", enqueue, "Enqueue a task and print its id.")
    cmd.add_argument("task_type", metavar="TASK_TYPE")
    cmd.add_argument(
        "--params",
        type=arguments.json_object,
        default=None,
        metavar="JSON",
        help="the task's parameters, a JSON object",
    )
    cmd.add_argument(
        "--priority",
        type=arguments.priority,
        default=Priority.NORMAL,
        metavar="N|NAME",
        help=f"an int or one of {', '.join(p.name.lower() for p in Priority)} (default normal)",
    )
    cmd.add_argument("--app-id", default=None, help="the app that owns the task")
    cmd.add_argument(
        "--dedupe-key", default=None, help="make the task an alias of an active task with this key"
    )
    cmd.add_argument(
        "--delay",
        type=arguments.non_negative_float,
        default=None,
        metavar="SECONDS",
        help="run no earlier than this many seconds from now",
    )
    cmd.add_argument(
        "--max-retries",
        type=arguments.non_negative_int,
        default=None,
        metavar="N",
        help="retries after the first attempt (default: the handler's, else 3)",
    )
    cmd.add_argument("--user-id", default=None, help="who asked for the task")
    cmd.add_argument("--json", action="store_true", help="print the task as JSON")
    add_handler_options(
        cmd,
        purpose="so that the task gets its handler's max_retries and no warning says "
        "that no handler serves it",
    )

    cmd = add("ls", ls, "List tasks, newest first.")
    cmd.add_argument(
        "--status",
        dest="statuses",
        action="extend",
        nargs="+",
        type=arguments.status,
        metavar="S",
        help=f"only these statuses ({', '.join(s.value for s in TaskStatus)})",
    )
    cmd.add_argument(
        "--type",
        dest="task_types",
        action="extend",
        nargs="+",
        metavar="T",
        help="only these task types",
    )
    cmd.add_argument("--app-id", default=None, help="only this app's tasks")
    cmd.add_argument("--user-id", default=None, help="only tasks this user asked for")
    cmd.add_argument(
        "--limit",
        type=arguments.positive_int,
        default=50,
        metavar="N",
        help="show at most N tasks (default 50)",
    )
    cmd.add_argument("--json", action="store_true", help="print the tasks as JSON")

    cmd = add("show", show, "Show every field of a task and its attempt log.")
    cmd.add_argument("task_id", metavar="TASK_ID", help=_TASK_ID_HELP)
    cmd.add_argument("--json", action="store_true", help="print the task as JSON")

    cmd = add("retry", retry, "Put a failed or cancelled task back to pending.")
    cmd.add_argument("task_id", metavar="TASK_ID", help=_TASK_ID_HELP)

    cmd = add("cancel", cancel, "Cancel a task (and its children), or every task of a type.")
    cmd.add_argument("task_id", nargs="?", metavar="TASK_ID", help=_TASK_ID_HELP)
    cmd.add_argument(
        "--type",
        dest="task_types",
        action="extend",
        nargs="+",
        metavar="T",
        help="instead of one task: every active task of these types",
    )
    cmd.add_argument("--app-id", default=None, help="with --type: only this app's tasks")
    cmd.add_argument(
        "--reason",
        choices=[r.value for r in CancelReason],
        default=CancelReason.USER.value,
        help="user/preempted end the task; suspended/shutdown put a running task back "
        "to pending (default user)",
    )
    cmd.add_argument("--no-cascade", action="store_true", help="leave the task's children alone")
    add_handler_options(
        cmd, purpose="so that a --type no handler serves is checked against their task types"
    )


async def enqueue(args: argparse.Namespace, settings: Settings) -> int:
    """Store one task; print its id (or, with ``--json``, the task)."""
    async with open_taskmill(settings, "enqueue", reads=False, handlers=True) as tm:
        task = await tm.enqueue(
            args.task_type,
            args.params,
            app_id=args.app_id,
            priority=args.priority,
            dedupe_key=args.dedupe_key,
            delay=args.delay,
            max_retries=args.max_retries,
            user_id=args.user_id,
        )
        if tm.registry.lookup(task.app_id, task.task_type) is None:
            warn(
                f"{unserved_type_message(tm.registry, task.app_id, task.task_type)}. The "
                "task is stored and stays pending until a worker with a handler for it "
                "runs (handlers come from installed plugins, --import modules or the "
                "imports setting)"
            )
    if args.json:
        print_json(to_dict(task))
    else:
        print(task.id)
    if task.alias_of is not None:
        note(
            f"an active task holds dedupe key {task.dedupe_key!r}; this task is "
            f"an alias of {task.alias_of} and takes its outcome"
        )
    return EXIT_OK


async def ls(args: argparse.Namespace, settings: Settings) -> int:
    """List the selected tasks, newest first."""
    selection = TaskFilter(
        app_id=args.app_id, task_types=args.task_types, statuses=args.statuses, user_id=args.user_id
    )
    async with open_taskmill(settings, "ls", reads=True, strict_plugins=False) as tm:
        tasks = await tm.query(selection, limit=args.limit, newest_first=True)
    if args.json:
        print_json([to_dict(t) for t in tasks])
        return EXIT_OK
    out = console()
    if tasks:
        out.print(task_list(tasks, utcnow()))
    else:
        out.print("no tasks")
    return EXIT_OK


CHILDREN_SHOWN = 20
"""``taskmill show`` lists at most this many of a task's children (the oldest)."""


async def show(args: argparse.Namespace, settings: Settings) -> int:
    """Print every field of one task, its attempt log and its first children (a chain's,
    group's or chord's tasks are children of its root: docs/canvas.md)."""
    async with open_taskmill(settings, "show", reads=True, strict_plugins=False) as tm:
        task = await find_task(tm, args.task_id)
        attempts = await tm.attempts(task.id)
        children = await tm.query(TaskFilter(parent_id=task.id), limit=CHILDREN_SHOWN)
        total = len(children)
        if total == CHILDREN_SHOWN:
            total = (await tm.progress_summary(TaskFilter(parent_id=task.id))).total
    if args.json:
        print_json(
            {
                "task": to_dict(task),
                "attempts": [
                    dict(to_dict(a), elapsed_ms=a.elapsed_ms, run=run)
                    for a, run in zip(attempts, attempt_runs(attempts), strict=True)
                ],
                "children": [to_dict(c) for c in children],
                "children_total": total,
            }
        )
        return EXIT_OK
    out = console()
    out.print(task_fields(task))
    if attempts:
        out.print(attempt_log(attempts))
    else:
        out.print("no attempts yet")
    if children:
        shown = f"the first {len(children)} of {total}" if total > len(children) else total
        out.print(task_list(children, utcnow(), title=f"children ({shown})"))
    return EXIT_OK


async def retry(args: argparse.Namespace, settings: Settings) -> int:
    """Put one failed or cancelled task back to pending."""
    async with open_taskmill(settings, "retry", reads=True) as tm:
        task = await find_task(tm, args.task_id)
        task = await tm.retry(task.id)
    print(f"{task.id} {task.status.value}")
    return EXIT_OK


async def cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel one task, or every active task of the given types."""
    reason = CancelReason(args.reason)
    cascade = not args.no_cascade
    if (args.task_id is None) == (not args.task_types):
        raise TaskmillError("give a TASK_ID or --type (not both)")
    async with open_taskmill(settings, "cancel", reads=True, handlers=True) as tm:
        if args.task_id is not None:
            task = await find_task(tm, args.task_id)
            task = await tm.cancel(task.id, reason=reason, cascade=cascade)
            print(f"{task.id} {task.status.value}")
            return EXIT_OK
        changed = await tm.cancel_by_filter(
            TaskFilter(task_types=tuple(args.task_types), app_id=args.app_id),
            reason=reason,
            cascade=cascade,
        )
    print(f"cancelled {changed} tasks ({reason.value})")
    if not changed:
        for task_type in dict.fromkeys(args.task_types):
            if _served(tm.registry, args.app_id, task_type):
                continue
            if hint := handler_hint(tm.registry, args.app_id, task_type):
                warn(f"no handler registered here serves task type {task_type!r}; {hint}")
    return EXIT_OK


def _served(registry: HandlerRegistry, app_id: str | None, task_type: str) -> bool:
    """A handler serves ``task_type``: ``app_id``'s or the host's, or, with no app
    named, any app's."""
    if app_id is None:
        return any(h.task_type == task_type for h in registry)
    return registry.lookup(app_id, task_type) is not None
