"""The commands on the store as a whole: ``suspend``, ``resume``, ``suspensions``,
``cleanup`` and ``migrate``."""

from __future__ import annotations

import argparse

from taskmill.cli import arguments
from taskmill.cli.arguments import AddCommand
from taskmill.cli.messages import EXIT_ERROR, EXIT_OK, error
from taskmill.cli.rendering import redacted
from taskmill.cli.session import new_taskmill, open_taskmill
from taskmill.settings import Settings


def add_commands(add: AddCommand) -> None:
    """Add ``suspend``, ``resume``, ``suspensions``, ``cleanup`` and ``migrate``."""
    for name, command, summary in (
        ("suspend", suspend, "Stop every worker from starting tasks of a scope."),
        ("resume", resume, "Lift a suspension stored by `taskmill suspend`."),
    ):
        cmd = add(name, command, summary)
        cmd.add_argument(
            "task_type", nargs="?", metavar="TASK_TYPE", help="the task type (default: all)"
        )
        cmd.add_argument("--app-id", default=None, help="only this app's tasks")

    add("suspensions", suspensions, "List the stored suspensions.")

    cmd = add("cleanup", cleanup, "Delete finished tasks older than a given age.")
    cmd.add_argument(
        "--older-than",
        type=arguments.duration,
        required=True,
        metavar="AGE",
        help="e.g. 3600, 90s, 30m, 12h, 7d",
    )
    cmd.add_argument(
        "--include-failed", action="store_true", help="delete failed (dead-letter) tasks too"
    )

    add("migrate", migrate, "Bring the database schema up to date; print its version.")


def _scope_text(task_type: str | None, app_id: str | None) -> str:
    what = f"task type {task_type!r}" if task_type else "all task types"
    return what + (f" of app {app_id!r}" if app_id else "")


async def suspend(args: argparse.Namespace, settings: Settings) -> int:
    """Store a suspension; running tasks of its scope go back to pending."""
    async with open_taskmill(settings, "suspend", reads=False) as tm:
        interrupted = await tm.suspend(args.task_type, app_id=args.app_id)
    print(
        f"suspended {_scope_text(args.task_type, args.app_id)}; "
        f"{interrupted} running tasks sent back to pending"
    )
    return EXIT_OK


async def resume(args: argparse.Namespace, settings: Settings) -> int:
    """Lift a stored suspension; exit status 2 when there is none of that scope."""
    async with open_taskmill(settings, "resume", reads=True) as tm:
        existed = await tm.resume(args.task_type, app_id=args.app_id)
    scope = _scope_text(args.task_type, args.app_id)
    if not existed:
        error(f"no suspension of {scope} is stored (see `taskmill suspensions`)")
        return EXIT_ERROR
    print(f"resumed {scope}")
    return EXIT_OK


async def suspensions(args: argparse.Namespace, settings: Settings) -> int:
    """List the stored suspensions."""
    async with open_taskmill(settings, "suspensions", reads=True, strict_plugins=False) as tm:
        scopes = await tm.suspensions()
    for scope in scopes:
        print(_scope_text(scope.task_type, scope.app_id))
    if not scopes:
        print("no suspensions")
    return EXIT_OK


async def cleanup(args: argparse.Namespace, settings: Settings) -> int:
    """Delete finished tasks older than ``--older-than``."""
    async with open_taskmill(settings, "cleanup", reads=True) as tm:
        deleted = await tm.cleanup(args.older_than, include_failed=args.include_failed)
    print(f"deleted {deleted} tasks")
    return EXIT_OK


async def migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Bring the schema up to date and print its version."""
    # Not through open(): it refuses the older schema this command is there to upgrade.
    tm = new_taskmill(settings, plugins=False)
    try:
        version = await tm.storage.migrate()
    finally:
        await tm.storage.close()
    print(f"schema version {version} ({redacted(tm.url)})")
    return EXIT_OK
