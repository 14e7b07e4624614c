"""Planning and storing a canvas (:mod:`taskmill.canvas`): its descriptions checked and
resolved into the tasks to store, in the calls that store them (:class:`CanvasPlan`,
:func:`plan_chain`, :func:`plan_group`, :func:`plan_chord`), the record of the tasks
stored after the first (:func:`task_of_record`, read back by the worker that completes a
half-stored canvas) and the calls themselves (:func:`store_plan`).

``TaskOperations.chain``, ``group`` and ``chord`` plan and store; the handles and
descriptions users hold are :mod:`taskmill.canvas`'s.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

import attrs

from taskmill.canvas import (
    CANVAS_KEY,
    ERRBACK_INPUT,
    GROUP_MAX_RETRIES,
    GROUP_RESULTS,
    GROUP_TYPE,
    MAX_DEPTH,
    MAX_TASKS,
    CanvasSpec,
    ChainSpec,
    ChordSpec,
    GroupSpec,
    NewTaskFactory,
    check_one_app,
    errback_id,
    input_name,
    member_id,
)
from taskmill.errors import Fail, InvalidParams, InvalidTaskSpec
from taskmill.lifecycle import check_dependencies
from taskmill.model import JSON, Task, TaskSpec
from taskmill.serialization import dumps, loads
from taskmill.storage import NewTask

__all__ = [
    "CanvasPlan",
    "plan_chain",
    "plan_chord",
    "plan_group",
    "store_plan",
    "task_of_record",
]


# -- planning -----------------------------------------------------------------------


@attrs.frozen
class CanvasPlan:
    """The tasks of a canvas, checked and resolved, in the calls that store them: the
    tasks of a call may only depend on tasks of earlier calls; the root comes last,
    followed only by the errback, if any."""

    root: str
    members: tuple[str, ...]
    """The ids a handle lists (a chain's links, a group's or a chord's members)."""
    layers: tuple[tuple[NewTask, ...], ...]
    errback: str | None = None
    """The errback's id (``link_error``), stored last."""

    @property
    def ids(self) -> list[str]:
        """Every task's id."""
        return [task.id for layer in self.layers for task in layer]


def plan_chain(
    specs: Sequence[TaskSpec], pass_result: bool | str, new_task: NewTaskFactory
) -> CanvasPlan:
    """A chain of ``specs``: step ``i`` after step ``i - 1``; with ``pass_result`` each
    step after the first takes the previous step's result as its input. A step may be
    a described chain, group or chord (:class:`CanvasSpec`); a chain of one such step
    is that canvas.

    :raises InvalidTaskSpec: no spec, a spec the canvas cannot take, tasks of more than
        one app, a canvas nested too deep or too large; and whatever ``new_task``
        raises.
    """
    specs = _checked(specs, "a chain")
    input_name(pass_result)
    if len(specs) == 1 and isinstance(specs[0], CanvasSpec):
        return _Planner(new_task).plan(specs[0])
    top = ChainSpec(GROUP_TYPE, None, specs[0].app_id, steps=tuple(specs), pass_result=pass_result)
    return _Planner(new_task).plan(top)


def plan_group(specs: Sequence[TaskSpec], new_task: NewTaskFactory) -> CanvasPlan:
    """A group of ``specs`` under a root of type ``taskmill.group`` that waits for all
    of them and returns their results in order.

    :raises InvalidTaskSpec: see :func:`plan_chain`.
    """
    specs = _checked(specs, "a group")
    return _Planner(new_task).plan(
        GroupSpec(GROUP_TYPE, None, specs[0].app_id, members=tuple(specs))
    )


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
    check_one_app([*specs, callback])
    input_name(pass_result)
    node = ChordSpec(
        GROUP_TYPE,
        None,
        specs[0].app_id,
        header=tuple(specs),
        callback=callback,
        pass_result=pass_result,
    )
    return _Planner(new_task).plan(node)


class _Planner:
    """Resolves a (possibly nested) canvas into its tasks.

    Every node (a task, a chain, a group, a chord) is given the id of its **exit** (the
    task whose result is the node's: a task itself, a chain's last step's exit, a
    group's root, a chord's callback), the parent of that exit, what its first tasks
    wait for and where they get their input. The tasks inside a node are descendants
    of its exit, so cancelling the outermost root cascades to all of them. Ids derive
    from the root's: a group's or chord's member ``i`` has the exit
    :func:`member_id` ``(root of it, i)``, which is how the root reads their results.
    """

    def __init__(self, new_task: NewTaskFactory) -> None:
        self.new_task = new_task
        self.tasks: list[NewTask] = []
        self.children: dict[str, int] = {}
        """Group roots and chord callbacks: how many derived members they wait for."""
        self.specs: dict[str, tuple[TaskSpec, dict[str, JSON] | None]] = {}
        """The spec and params each plain task was resolved from."""
        self.app: str | None = None
        self.serial = 0

    def plan(self, node: CanvasSpec) -> CanvasPlan:
        leaves = list(_leaves(node, node.app_id, 1))
        check_one_app([spec for spec, _ in leaves])
        self.app = leaves[0][0].app_id
        root = str(uuid.uuid4())
        members = self.node(node, root, parent_id=None, after=(), source=None, which=None)
        errback = None
        if node.link_error is not None:
            errback = self.errback(node.link_error, root)
        return self.layered(root, tuple(members), errback)

    # -- nodes

    def node(
        self,
        node: TaskSpec,
        exit_id: str,
        *,
        parent_id: str | None,
        after: tuple[str, ...],
        source: dict[str, JSON] | None,
        which: str | None,
    ) -> list[str]:
        """Add ``node``'s tasks; the ids of its steps or members (for a handle)."""
        if isinstance(node, ChainSpec):
            return self.chain(node, exit_id, parent_id=parent_id, after=after, source=source)
        if isinstance(node, GroupSpec):
            return self.group(node, exit_id, parent_id=parent_id, after=after, source=source)
        if isinstance(node, ChordSpec):
            return self.chord(node, exit_id, parent_id=parent_id, after=after, source=source)
        self.task(node, exit_id, parent_id=parent_id, after=after, source=source, which=which)
        return [exit_id]

    def chain(
        self,
        node: ChainSpec,
        exit_id: str,
        *,
        parent_id: str | None,
        after: tuple[str, ...],
        source: dict[str, JSON] | None,
    ) -> list[str]:
        into = input_name(node.pass_result)
        steps = node.steps
        serial, self.serial = self.serial, self.serial + 1
        plain_last = not isinstance(steps[-1], CanvasSpec)
        exits: list[str] = []
        for j, step in enumerate(steps):
            last = j == len(steps) - 1
            if last:
                step_id = exit_id
            elif plain_last:  # as before nesting: no other node derives ids from it
                step_id = member_id(exit_id, j)
            else:
                step_id = str(uuid.uuid5(uuid.UUID(exit_id), f"link {serial}.{j}"))
            if j == 0:
                step_after, step_source = after, source
            else:
                step_after = (exits[-1],)
                step_source = None if into is None else {"from": exits[-1], "into": into}
            self.node(
                step,
                step_id,
                parent_id=parent_id if last else exit_id,
                after=step_after,
                source=step_source,
                which=f"link {j}",
            )
            exits.append(step_id)
        return exits

    def group(
        self,
        node: GroupSpec,
        exit_id: str,
        *,
        parent_id: str | None,
        after: tuple[str, ...],
        source: dict[str, JSON] | None,
    ) -> list[str]:
        start = len(self.tasks)
        exits = self.members(node.members, exit_id, after=after, source=source)
        inside = self.tasks[start:]
        users = {t.user_id for t in inside}
        params: dict[str, JSON] = {
            CANVAS_KEY: {"input": {"children": len(exits), "into": GROUP_RESULTS}}
        }
        self.add(
            NewTask(
                id=exit_id,
                task_type=GROUP_TYPE,
                params=params,
                params_json=dumps(params),
                app_id=self.app,
                # Its most urgent task's priority: a USER_ACTION group is not starved.
                priority=max(t.priority for t in inside),
                max_retries=GROUP_MAX_RETRIES,
                parent_id=parent_id,
                user_id=users.pop() if len(users) == 1 else None,
                after=tuple(exits),
                after_always=True,
            ),
            children=len(exits),
        )
        return exits

    def chord(
        self,
        node: ChordSpec,
        exit_id: str,
        *,
        parent_id: str | None,
        after: tuple[str, ...],
        source: dict[str, JSON] | None,
    ) -> list[str]:
        into = input_name(node.pass_result)
        exits = self.members(node.header, exit_id, after=after, source=source)
        callback = node.callback
        if isinstance(callback, CanvasSpec):
            raise InvalidTaskSpec(
                "a chord's callback is one task, not a chain, group or chord; to run more "
                "after it, chain them: chain(chord(header, callback), more, ...)",
                field="callback",
            )
        params = dict(callback.params or {})
        if into is not None:
            _check_free(params, into, "the callback")
            params[CANVAS_KEY] = {"input": {"children": len(exits), "into": into}}
        self.add(
            self.resolved(callback, exit_id, params, parent_id, (*exits, *callback.after)),
            children=len(exits),
        )
        return exits

    def members(
        self,
        members: Sequence[TaskSpec],
        root: str,
        *,
        after: tuple[str, ...],
        source: dict[str, JSON] | None,
    ) -> list[str]:
        exits = [member_id(root, i) for i in range(len(members))]
        for i, member in enumerate(members):
            self.node(
                member, exits[i], parent_id=root, after=after, source=source, which=f"member {i}"
            )
        return exits

    def task(
        self,
        spec: TaskSpec,
        task_id: str,
        *,
        parent_id: str | None,
        after: tuple[str, ...],
        source: dict[str, JSON] | None,
        which: str | None,
    ) -> None:
        params = spec.params
        if source is not None:
            params = dict(spec.params or {})
            into = source["into"]
            assert isinstance(into, str)
            _check_free(params, into, which or spec.task_type)
            params[CANVAS_KEY] = {"input": source}
        self.add(self.resolved(spec, task_id, params, parent_id, (*after, *spec.after)))

    def errback(self, spec: TaskSpec, root: str) -> str:
        task_id = errback_id(root)
        params = dict(spec.params or {})
        _check_free(
            params,
            ERRBACK_INPUT,
            "the errback (link_error)",
            why="the key the errback gets the failure in",
        )
        params[CANVAS_KEY] = {"errback": {"of": root, "into": ERRBACK_INPUT}}
        task = self.resolved(spec, task_id, params, root, (root, *spec.after))
        self.add(attrs.evolve(task, after_always=True))
        return task_id

    def resolved(
        self,
        spec: TaskSpec,
        task_id: str,
        params: dict[str, JSON] | None,
        parent_id: str | None,
        after: tuple[str, ...],
    ) -> NewTask:
        if spec.app_id is None and self.app is not None:
            spec = attrs.evolve(spec, app_id=self.app)
        self.specs[task_id] = (spec, params)
        return _resolved(self.new_task, spec, task_id, params, parent_id=parent_id, after=after)

    def add(self, task: NewTask, *, children: int = 0) -> None:
        if len(self.tasks) >= MAX_TASKS:
            raise InvalidTaskSpec(
                f"a chain, group or chord holds at most {MAX_TASKS} tasks (its group roots "
                "and errback included): split it into canvases that start one another",
            )
        self.tasks.append(task)
        if children:
            self.children[task.id] = children

    # -- layers

    def layered(self, root: str, members: tuple[str, ...], errback: str | None) -> CanvasPlan:
        """The tasks in the calls that store them: a task's call comes after the calls
        of the tasks of the canvas it waits for (the tasks were added after those);
        the first task records every task stored after its call."""
        depth: dict[str, int] = {}
        for task in self.tasks:
            inner = [depth[a] for a in task.after if a in depth]
            depth[task.id] = 1 + max(inner) if inner else 0
        layers: list[list[NewTask]] = [[] for _ in range(max(depth.values()) + 1)]
        for task in self.tasks:
            layers[depth[task.id]].append(task)
        rest = [
            _record(t, children=self.children.get(t.id, 0)) for layer in layers[1:] for t in layer
        ]
        head = layers[0][0]
        spec, params = self.specs[head.id]
        layers[0][0] = _first(
            self.new_task,
            attrs.evolve(spec, params=params),
            head.id,
            parent_id=head.parent_id,
            last=layers[-1][-1].id,
            rest=rest,
        )
        return CanvasPlan(
            root=root,
            members=members,
            layers=tuple(tuple(layer) for layer in layers),
            errback=errback,
        )


def _leaves(node: TaskSpec, app_id: str | None, depth: int) -> Iterator[tuple[TaskSpec, int]]:
    """The plain tasks of ``node`` (with the app its description gives them), checked:
    the nesting depth, and what a task of a canvas cannot have."""
    if not isinstance(node, CanvasSpec):
        spec = (
            node if node.app_id is not None or app_id is None else attrs.evolve(node, app_id=app_id)
        )
        yield spec, depth
        return
    if depth > MAX_DEPTH:
        raise InvalidTaskSpec(
            f"chains, groups and chords nest at most {MAX_DEPTH} deep (a canvas in a canvas "
            "is 2 deep); this one nests deeper",
        )
    if depth > 1 and node.link_error is not None:
        raise InvalidTaskSpec(
            f"link_error belongs to the outermost canvas; this {node.kind} is nested in "
            "another: give the outermost one the errback",
            field="link_error",
        )
    app_id = node.app_id if node.app_id is not None else app_id
    parts = node._parts()
    if node.link_error is not None:
        parts.append(node.link_error)
    for part in _checked(parts, f"a {node.kind}", apps=False):
        yield from _leaves(part, app_id, depth + 1)


_REFUSED = {
    "dedupe_key": "a dedupe key (an alias would take another task's outcome)",
    "parent_id": "a parent_id (the canvas makes its tasks children of its root)",
}


def _checked(specs: Sequence[TaskSpec], what: str, *, apps: bool = True) -> list[TaskSpec]:
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
        if (
            not isinstance(spec, CanvasSpec)
            and spec.params is not None
            and CANVAS_KEY in spec.params
        ):
            raise InvalidTaskSpec(
                f"params key {CANVAS_KEY!r} is reserved for chains, groups and chords",
                field="params",
            )
    if apps:
        check_one_app(specs)
    return specs


def _check_free(
    params: dict[str, JSON],
    into: str,
    which: str,
    *,
    why: str = "the key pass_result passes the input in; pass it in another key "
    "(pass_result='name')",
) -> None:
    if into in params:
        raise InvalidTaskSpec(f"the params of {which} already have {into!r}, {why}", field="params")


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
    last: str,
    rest: list[dict[str, JSON]],
) -> NewTask:
    """The first task of a canvas, recording the ``rest`` of it (stored after it) and
    the task stored ``last`` (under ``root``: the root, or the errback after it)."""
    params = dict(spec.params or {})
    if rest:
        params[CANVAS_KEY] = {"root": last, "rest": rest}
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
