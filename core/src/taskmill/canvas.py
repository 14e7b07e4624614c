"""Chains, groups and chords (docs/canvas.md): compositions of tasks built only on the
durable primitives every store keeps (dependencies ``after=``, children ``parent_id``,
cancel with cascade), so they work on every backend without a change to any.

- A **chain** ``a -> b -> c`` is ``b`` after ``a`` and ``c`` after ``b``; its root, the
  id to wait on and to cancel, is its last link ``c``, and the earlier links are
  children of it.
- A **group** is its members, children of a root task of the reserved type
  ``taskmill.group`` that waits for every one of them (``after_policy="always"``) and
  returns their results in order. Every worker serves that type
  (:func:`serve_builtins`, called by ``Taskmill.worker``).
- A **chord** is a group whose root is the callback: it waits for the members and gets
  their results in order as its input.

A task's input (the previous link's result, the members' results) is not copied into
its params: its params hold a reference under the reserved key :data:`CANVAS_KEY`, and
the worker reads the referenced stored results each time an attempt starts
(:mod:`taskmill.canvas_inputs`), so a retry or a rescue after a crash gets the same
input.

A task can only depend on tasks already stored, so a canvas is stored in several calls
(the first layer, then each later layer, the root last). The first call is the canvas's
commit point: its first task also records, under :data:`CANVAS_KEY`, every task stored
after it. When the creating process dies before the last call, the worker that starts
that first task stores what is missing (the same ids, so what is there already is not
stored twice); when a later call fails with an error, the creator cancels what it
stored and raises.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from taskmill.errors import Fail, InvalidParams, InvalidTaskSpec
from taskmill.lifecycle import check_dependencies
from taskmill.model import JSON, CancelReason, Task, TaskSpec
from taskmill.serialization import dumps, loads
from taskmill.storage import NewTask
from taskmill.validation import PRIORITY_MAX, PRIORITY_MIN, check_int

if TYPE_CHECKING:
    from taskmill.context import Context
    from taskmill.registry import HandlerRegistry

__all__ = [
    "CANVAS_KEY",
    "DEFAULT_INPUT",
    "GROUP_RESULTS",
    "GROUP_TYPE",
    "Canvas",
    "CanvasPlan",
    "Chain",
    "Chord",
    "Group",
    "member_id",
    "plan_chain",
    "plan_chord",
    "plan_group",
    "serve_builtins",
    "store_plan",
    "task_of_record",
]

CANVAS_KEY: Final = "taskmill.canvas"
"""The reserved params key of a canvas task: where its input comes from (``input``),
and, on the first task of a canvas, the tasks stored after it (``root``, ``rest``).
The handler's ``params`` argument never holds it; ``ctx.task.params`` does."""
GROUP_TYPE: Final = "taskmill.group"
"""The task type of a group's root, served by every worker (:func:`serve_builtins`)."""
DEFAULT_INPUT: Final = "input"
"""The params key a task's input is passed in with ``pass_result=True``."""
GROUP_RESULTS: Final = "results"
"""The params key the group root's handler gets its members' results in."""
GROUP_MAX_RETRIES: Final = 3
"""Retries of a group's root: it fails at once when a member did not complete, so only
a store error while it reads the results spends them."""
BUILTIN_SOURCE: Final = "taskmill (canvas)"
"""How handler conflicts and listings name the registrant of the built-in handlers."""

NewTaskFactory = Callable[[TaskSpec, str], NewTask]
"""``Taskmill.new_task``: a spec checked and resolved into the task to store."""


def member_id(root_id: str, index: int) -> str:
    """The id of task ``index`` of the canvas whose root is ``root_id``: derived from
    the root's id (a UUID 5 in the root's namespace), so a record of the canvas names
    its members by their count alone."""
    return str(uuid.uuid5(uuid.UUID(root_id), str(index)))


# -- handles ------------------------------------------------------------------------


class CanvasOps(Protocol):
    """What a handle uses of the task operations that made it."""

    async def wait(self, task_id: str, *, timeout: float | None = None) -> Task:
        """The task once it is terminal (``TaskOperations.wait``)."""

    async def cancel(
        self, task_id: str, *, reason: CancelReason = CancelReason.USER, cascade: bool = True
    ) -> Task:
        """Cancel the task and, with ``cascade``, its descendants."""


@attrs.frozen
class Canvas:
    """What ``tm.chain``, ``tm.group`` and ``tm.chord`` return: the id of the canvas's
    root task, which ends last and holds the canvas's outcome."""

    id: str
    """The root task: wait on it for the outcome; cancel it to cancel every task of the
    canvas (they are its children)."""
    _ops: CanvasOps = attrs.field(repr=False, eq=False, kw_only=True, alias="ops")

    async def wait(self, *, timeout: float | None = None) -> Task:
        """The root task once it is terminal, as ``tm.wait(self.id)`` returns it.

        :raises WaitTimeout: still active after ``timeout`` seconds.
        """
        return await self._ops.wait(self.id, timeout=timeout)

    async def cancel(self, *, reason: CancelReason = CancelReason.USER) -> Task:
        """Cancel the root and every task of the canvas still active (``tm.cancel(
        self.id)``, which cascades to its children); returns the root's snapshot."""
        return await self._ops.cancel(self.id, reason=reason)


@attrs.frozen
class Chain(Canvas):
    """A chain: each link runs once the previous one has COMPLETED. ``id`` is the last
    link's: its result is the chain's."""

    links: tuple[str, ...] = attrs.field(kw_only=True)
    """Every link's id, in order (the last one is ``id``)."""


@attrs.frozen
class Group(Canvas):
    """A group: the members run independently; the root (``id``, type
    ``taskmill.group``) ends when they all have, COMPLETED with the list of their
    results in order, or FAILED naming those that did not complete."""

    members: tuple[str, ...] = attrs.field(kw_only=True)
    """The members' ids, in order (the order of the results)."""


@attrs.frozen
class Chord(Canvas):
    """A chord: a group whose root is the callback (``id``), which runs once every
    member has COMPLETED, with their results in order as its input."""

    members: tuple[str, ...] = attrs.field(kw_only=True)
    """The members' ids, in order (the order of the callback's input)."""

    @property
    def callback(self) -> str:
        """The callback's id (the chord's ``id``)."""
        return self.id


# -- planning -----------------------------------------------------------------------


@attrs.frozen
class CanvasPlan:
    """The tasks of a canvas, checked and resolved, in the calls that store them: the
    tasks of a call may only depend on tasks of earlier calls; the root comes last."""

    root: str
    members: tuple[str, ...]
    """The ids a handle lists (a chain's links, a group's or a chord's members)."""
    layers: tuple[tuple[NewTask, ...], ...]

    @property
    def ids(self) -> list[str]:
        """Every task's id."""
        return [task.id for layer in self.layers for task in layer]


def input_name(pass_result: bool | str) -> str | None:
    """The params key ``pass_result`` passes a task's input in (None: no input).

    :raises InvalidTaskSpec: not a bool or a non-empty key other than the reserved one.
    """
    if pass_result is True:
        return DEFAULT_INPUT
    if pass_result is False:
        return None
    if not isinstance(pass_result, str) or not pass_result or pass_result == CANVAS_KEY:
        raise InvalidTaskSpec(
            f"pass_result is True, False or the params key to pass the result in, not "
            f"{pass_result!r}",
            field="pass_result",
        )
    return pass_result


def plan_chain(
    specs: Sequence[TaskSpec], pass_result: bool | str, new_task: NewTaskFactory
) -> CanvasPlan:
    """A chain of ``specs``: link ``i`` after link ``i - 1``; with ``pass_result`` each
    link after the first takes the previous link's result as its input.

    :raises InvalidTaskSpec: no spec, a spec the canvas cannot take, or tasks of more
        than one app; and whatever ``new_task`` raises.
    """
    specs = _checked(specs, "a chain")
    into = input_name(pass_result)
    root = str(uuid.uuid4())
    ids = [member_id(root, i) for i in range(len(specs) - 1)] + [root]
    later: list[NewTask] = []
    for i in range(1, len(specs)):
        spec = specs[i]
        params = dict(spec.params or {})
        if into is not None:
            _check_free(params, into, i)
            params[CANVAS_KEY] = {"input": {"from": ids[i - 1], "into": into}}
        later.append(
            _resolved(
                new_task,
                spec,
                ids[i],
                params,
                parent_id=root if i < len(specs) - 1 else None,
                after=(ids[i - 1], *spec.after),
            )
        )
    first = _first(
        new_task,
        specs[0],
        ids[0],
        parent_id=root if later else None,
        root=root,
        rest=[_record(t) for t in later],
    )
    return CanvasPlan(root=root, members=tuple(ids), layers=((first,), *((t,) for t in later)))


def plan_group(specs: Sequence[TaskSpec], new_task: NewTaskFactory) -> CanvasPlan:
    """A group of ``specs`` under a root of type ``taskmill.group`` that waits for all
    of them and returns their results in order.

    :raises InvalidTaskSpec: see :func:`plan_chain`.
    """
    specs = _checked(specs, "a group")
    root = str(uuid.uuid4())
    ids = [member_id(root, i) for i in range(len(specs))]
    others = [
        _resolved(new_task, spec, ids[i], spec.params, parent_id=root, after=spec.after)
        for i, spec in enumerate(specs)
        if i > 0
    ]
    users = {spec.user_id for spec in specs}
    params: dict[str, JSON] = {
        CANVAS_KEY: {"input": {"children": len(specs), "into": GROUP_RESULTS}}
    }
    group = NewTask(
        id=root,
        task_type=GROUP_TYPE,
        params=params,
        params_json=dumps(params),
        app_id=specs[0].app_id,
        # Its most urgent member's priority: a USER_ACTION group is not starved.
        priority=max(
            [check_int("priority", specs[0].priority, PRIORITY_MIN, PRIORITY_MAX)]
            + [t.priority for t in others]
        ),
        max_retries=GROUP_MAX_RETRIES,
        user_id=users.pop() if len(users) == 1 else None,
        after=tuple(ids),
        after_always=True,
    )
    first = _first(
        new_task,
        specs[0],
        ids[0],
        parent_id=root,
        root=root,
        rest=[_record(group, children=len(specs))],
    )
    return CanvasPlan(root=root, members=tuple(ids), layers=((first, *others), (group,)))


def plan_chord(
    specs: Sequence[TaskSpec],
    callback: TaskSpec,
    pass_result: bool | str,
    new_task: NewTaskFactory,
) -> CanvasPlan:
    """A chord: ``specs`` as children of ``callback``, which runs once every one of
    them has COMPLETED (a failed or cancelled one cancels it) and, with
    ``pass_result``, takes their results in order as its input.

    :raises InvalidTaskSpec: see :func:`plan_chain`.
    """
    specs = _checked(specs, "a chord's header")
    (callback,) = _checked([callback], "a chord's callback")
    _one_app([*specs, callback])
    into = input_name(pass_result)
    root = str(uuid.uuid4())
    ids = [member_id(root, i) for i in range(len(specs))]
    params = dict(callback.params or {})
    if into is not None:
        _check_free(params, into, "the callback")
        params[CANVAS_KEY] = {"input": {"children": len(specs), "into": into}}
    last = _resolved(
        new_task, callback, root, params, parent_id=None, after=(*ids, *callback.after)
    )
    others = [
        _resolved(new_task, spec, ids[i], spec.params, parent_id=root, after=spec.after)
        for i, spec in enumerate(specs)
        if i > 0
    ]
    first = _first(
        new_task,
        specs[0],
        ids[0],
        parent_id=root,
        root=root,
        rest=[_record(last, children=len(specs))],
    )
    return CanvasPlan(root=root, members=tuple(ids), layers=((first, *others), (last,)))


_REFUSED = {
    "dedupe_key": "a dedupe key (an alias would take another task's outcome)",
    "parent_id": "a parent_id (the canvas makes its tasks children of its root)",
}


def _checked(specs: Sequence[TaskSpec], what: str) -> list[TaskSpec]:
    specs = list(specs)
    if not specs:
        raise InvalidTaskSpec(f"{what} needs at least one task")
    for spec in specs:
        for name, why in _REFUSED.items():
            if getattr(spec, name) is not None:
                raise InvalidTaskSpec(
                    f"a task of a chain, group or chord cannot have {why}; "
                    f"{spec.task_type!r} has {name}={getattr(spec, name)!r}",
                    field=name,
                )
        if spec.after_policy != "completed":
            raise InvalidTaskSpec(
                "a task of a chain, group or chord takes no after_policy: the canvas "
                "decides how its tasks wait for each other (docs/canvas.md)",
                field="after_policy",
            )
        if spec.params is not None and CANVAS_KEY in spec.params:
            raise InvalidTaskSpec(
                f"params key {CANVAS_KEY!r} is reserved for chains, groups and chords",
                field="params",
            )
    _one_app(specs)
    return specs


def _one_app(specs: Sequence[TaskSpec]) -> None:
    apps = {spec.app_id for spec in specs}
    if len(apps) > 1:
        raise InvalidTaskSpec(
            "the tasks of a chain, group or chord belong to one app (a task can only "
            f"depend on tasks of its own app); got apps {sorted(map(repr, apps))}",
            field="app_id",
        )


def _check_free(params: dict[str, JSON], into: str, which: int | str) -> None:
    if into in params:
        task = f"link {which}" if isinstance(which, int) else which
        raise InvalidTaskSpec(
            f"the params of {task} already have {into!r}, the key pass_result passes "
            "the input in; pass it in another key (pass_result='name')",
            field="params",
        )


def _resolved(
    new_task: NewTaskFactory,
    spec: TaskSpec,
    task_id: str,
    params: dict[str, JSON] | None,
    *,
    parent_id: str | None,
    after: tuple[str, ...],
) -> NewTask:
    return new_task(attrs.evolve(spec, params=params, parent_id=parent_id, after=after), task_id)


def _first(
    new_task: NewTaskFactory,
    spec: TaskSpec,
    task_id: str,
    *,
    parent_id: str | None,
    root: str,
    rest: list[dict[str, JSON]],
) -> NewTask:
    """The first task of a canvas, recording the ``rest`` of it (stored after it)."""
    params = dict(spec.params or {})
    if rest:
        params[CANVAS_KEY] = {"root": root, "rest": rest}
    try:
        return _resolved(new_task, spec, task_id, params, parent_id=parent_id, after=spec.after)
    except InvalidParams as exc:
        if not rest:
            raise
        raise InvalidTaskSpec(
            f"{exc} (the first task of a chain, group or chord also records the tasks "
            "stored after it in its params, under "
            f"{CANVAS_KEY!r}: split a canvas this large into smaller ones)",
            field="params",
        ) from None


# -- records of the tasks stored after the first ------------------------------------


def _record(task: NewTask, *, children: int = 0) -> dict[str, JSON]:
    """``task`` as the first task of its canvas records it; with ``children`` its
    dependencies on the first ``children`` members (derived from its id) are counted,
    not listed."""
    derived = {member_id(task.id, i) for i in range(children)}
    return {
        "id": task.id,
        "task_type": task.task_type,
        "params": loads(task.params_json),
        "app_id": task.app_id,
        "priority": task.priority,
        "max_retries": task.max_retries,
        "run_at": None if task.run_at is None else task.run_at.isoformat(),
        "parent_id": task.parent_id,
        "user_id": task.user_id,
        "after": [a for a in task.after if a not in derived],
        "after_children": children,
        "after_always": task.after_always,
    }


def task_of_record(record: Any) -> NewTask:
    """The task a record of :func:`_record` describes.

    :raises Fail: the record is malformed (not written by taskmill).
    """
    try:
        children = record["after_children"]
        params = record["params"]
        after = [member_id(record["id"], i) for i in range(children)] + list(record["after"])
        run_at = record["run_at"]
        return NewTask(
            id=record["id"],
            task_type=record["task_type"],
            params=params,
            params_json=dumps(params),
            app_id=record["app_id"],
            priority=int(record["priority"]),
            max_retries=int(record["max_retries"]),
            run_at=None if run_at is None else datetime.fromisoformat(run_at),
            parent_id=record["parent_id"],
            user_id=record["user_id"],
            after=tuple(after),
            after_always=bool(record["after_always"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Fail(f"params key {CANVAS_KEY!r} holds a malformed record: {exc!r}") from None


# -- storing ------------------------------------------------------------------------


async def store_plan(
    plan: CanvasPlan,
    *,
    get: Callable[[str], Awaitable[Task | None]],
    enqueue: Callable[[list[NewTask]], Awaitable[list[Task]]],
    rollback: Callable[[list[str]], Awaitable[object]],
) -> None:
    """Store ``plan``'s layers in order, one ``enqueue`` call each (all or none per
    call).

    Dependencies on tasks outside the plan (``after=`` in a spec) are checked first
    (``get`` reads a stored task), as the store checks them, so that a later call does
    not refuse one. When a call after the first fails all the same, ``rollback`` is
    given every id of the plan (to cancel what was stored) and the error is raised; a
    failing rollback is not raised over it.

    :raises InvalidTaskSpec: a dependency is not stored or is another app's task;
        nothing is stored.
    """
    tasks = [task for layer in plan.layers for task in layer]
    app_of = {task.id: task.app_id for task in tasks}
    for dependency in {a for task in tasks for a in task.after if a not in app_of}:
        found = await get(dependency)
        if found is not None:
            app_of[dependency] = found.app_id
    check_dependencies(tasks, app_of)
    for n, layer in enumerate(plan.layers):
        try:
            await enqueue(list(layer))
        except BaseException:
            if n:
                # When the store is gone for this too, the first task completes the
                # canvas once a worker starts it.
                with contextlib.suppress(Exception):
                    await rollback(plan.ids)
            raise


# -- the built-in handler -----------------------------------------------------------


async def collect_group(ctx: Context, params: dict[str, JSON]) -> JSON:
    """The handler of ``taskmill.group``: the group's result is its members' results,
    in order, read from the store when the attempt starts
    (:func:`taskmill.canvas_inputs.member_params`)."""
    if GROUP_RESULTS not in params:
        raise Fail(f"a {GROUP_TYPE!r} task is made by tm.group(...); this one has no members")
    return params[GROUP_RESULTS]


def serve_builtins(registry: HandlerRegistry) -> None:
    """Register the handler of ``taskmill.group`` in ``registry`` unless it has one
    (idempotent): ``Taskmill.worker`` calls it, so every worker serves group roots."""
    if (None, GROUP_TYPE) not in registry:
        registry.register(GROUP_TYPE, collect_group, source=BUILTIN_SOURCE)
