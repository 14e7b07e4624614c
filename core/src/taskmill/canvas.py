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
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from taskmill.errors import Fail, InvalidParams, InvalidTaskSpec
from taskmill.headers import HEADERS_KEY
from taskmill.lifecycle import check_dependencies
from taskmill.model import JSON, CancelReason, Task, TaskSpec
from taskmill.serialization import dumps, loads
from taskmill.storage import NewTask

if TYPE_CHECKING:
    from taskmill.context import Context
    from taskmill.registry import HandlerRegistry

__all__ = [
    "CANVAS_KEY",
    "DEFAULT_INPUT",
    "ERRBACK_INPUT",
    "GROUP_RESULTS",
    "GROUP_TYPE",
    "MAX_DEPTH",
    "MAX_TASKS",
    "Canvas",
    "CanvasPlan",
    "CanvasSpec",
    "Chain",
    "ChainSpec",
    "Chord",
    "ChordSpec",
    "Group",
    "GroupSpec",
    "chain",
    "chord",
    "errback_id",
    "group",
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
ERRBACK_INPUT: Final = "failure"
"""The params key an errback (``link_error``) gets the failure in: ``{"task_id",
"task_type", "status", "error", "root", "root_status"}``."""
MAX_DEPTH: Final = 8
"""How deep canvases nest: a canvas is 1 deep, a group in a chain 2."""
MAX_TASKS: Final = 100_000
"""The most tasks one canvas stores (its group roots and errback included)."""
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
    errback: str | None = attrs.field(default=None, kw_only=True)
    """The errback's id (``link_error``), when the canvas was stored with one by
    :meth:`CanvasSpec.apply`; else None."""

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


# -- descriptions: canvases not stored yet, to nest ----------------------------------


class CanvasClient(Protocol):
    """What :meth:`CanvasSpec.apply` uses: ``tm``, or an app-bound ``tm.for_app(...)``."""

    async def chain(
        self, *links: TaskSpec | Mapping[str, Any], pass_result: bool | str = False
    ) -> Chain:
        """Store a chain (``TaskOperations.chain``)."""


@attrs.frozen(repr=False)
class CanvasSpec(TaskSpec):
    """A chain, group or chord described, not stored: what :func:`chain`, :func:`group`
    and :func:`chord` return (Celery's unstarted signatures). It goes wherever a task of a
    canvas goes, so canvases nest: ``tm.chain(a, group([b, c]), d)``; ``await
    description.apply(tm)`` stores it on its own.

    It is a :class:`~taskmill.model.TaskSpec` only so that ``tm.chain``, ``tm.group`` and
    ``tm.chord`` take it; its task fields are not a task's (``app_id`` is its tasks'
    app). Enqueued as a plain task (``tm.enqueue_many``), it fails saying so.
    """

    link_error: TaskSpec | None = attrs.field(default=None, kw_only=True)
    """The errback: a task stored with the canvas that runs only when the canvas fails
    (docs/canvas.md#link_error-run-a-task-when-a-canvas-fails)."""

    @property
    def kind(self) -> str:
        """``"chain"``, ``"group"`` or ``"chord"``."""
        raise NotImplementedError

    def _parts(self) -> list[TaskSpec]:
        raise NotImplementedError

    def __repr__(self) -> str:
        inner = ", ".join(map(_short, self._parts()))
        extra = f", link_error={_short(self.link_error)}" if self.link_error else ""
        return f"{self.kind}({inner}{extra})"

    async def apply(self, tm: CanvasClient) -> Canvas:
        """Store this canvas with ``tm`` (``tm.chain(self)``: a chain of one step is
        that step) and return its handle: a :class:`Chain`, :class:`Group` or
        :class:`Chord`, whose ``errback`` is the errback's id when there is one.

        :raises InvalidTaskSpec: see ``tm.chain``; nothing is stored.
        """
        raise NotImplementedError

    async def _stored(self, tm: CanvasClient) -> tuple[Chain, str | None]:
        stored = await tm.chain(self)
        return stored, errback_id(stored.id) if self.link_error is not None else None


@attrs.frozen(repr=False)
class ChainSpec(CanvasSpec):
    """A chain described (:func:`chain`)."""

    steps: tuple[TaskSpec, ...] = attrs.field(kw_only=True)
    pass_result: bool | str = attrs.field(default=False, kw_only=True)

    @property
    def kind(self) -> str:
        """``"chain"``."""
        return "chain"

    def _parts(self) -> list[TaskSpec]:
        return list(self.steps)

    async def apply(self, tm: CanvasClient) -> Chain:
        """Store the chain (see :meth:`CanvasSpec.apply`); its handle."""
        stored, errback = await self._stored(tm)
        return attrs.evolve(stored, errback=errback)


@attrs.frozen(repr=False)
class GroupSpec(CanvasSpec):
    """A group described (:func:`group`)."""

    members: tuple[TaskSpec, ...] = attrs.field(kw_only=True)

    @property
    def kind(self) -> str:
        """``"group"``."""
        return "group"

    def _parts(self) -> list[TaskSpec]:
        return list(self.members)

    async def apply(self, tm: CanvasClient) -> Group:
        """Store the group (see :meth:`CanvasSpec.apply`); its handle."""
        stored, errback = await self._stored(tm)
        return Group(stored.id, ops=stored._ops, members=stored.links, errback=errback)


@attrs.frozen(repr=False)
class ChordSpec(CanvasSpec):
    """A chord described (:func:`chord`)."""

    header: tuple[TaskSpec, ...] = attrs.field(kw_only=True)
    callback: TaskSpec = attrs.field(kw_only=True)
    pass_result: bool | str = attrs.field(default=True, kw_only=True)

    @property
    def kind(self) -> str:
        """``"chord"``."""
        return "chord"

    def _parts(self) -> list[TaskSpec]:
        return [*self.header, self.callback]

    async def apply(self, tm: CanvasClient) -> Chord:
        """Store the chord (see :meth:`CanvasSpec.apply`); its handle."""
        stored, errback = await self._stored(tm)
        return Chord(stored.id, ops=stored._ops, members=stored.links, errback=errback)


def _short(spec: TaskSpec | None) -> str:
    if isinstance(spec, CanvasSpec):
        return repr(spec)
    return repr(None if spec is None else spec.task_type)


def chain(
    *steps: TaskSpec | Mapping[str, Any],
    pass_result: bool | str = False,
    link_error: TaskSpec | Mapping[str, Any] | None = None,
) -> ChainSpec:
    """A chain, described: as ``tm.chain(*steps, pass_result=...)`` stores it, where a
    step may itself be a chain, a group or a chord (described). Nested in a chain with
    ``pass_result``, it gets the previous step's result in its first step; its own
    result is its last step's.

    :param link_error: the errback, a task that runs when the chain fails (only on the
        outermost canvas).
    :raises InvalidTaskSpec: no step, or a value that is not a spec.
    """
    parts = _described(steps, "a chain")
    input_name(pass_result)
    return ChainSpec(
        GROUP_TYPE,
        _description("chain"),
        _app_of(parts),
        steps=tuple(parts),
        pass_result=pass_result,
        link_error=_errback(link_error),
    )


def group(
    members: Iterable[TaskSpec | Mapping[str, Any]],
    *,
    link_error: TaskSpec | Mapping[str, Any] | None = None,
) -> GroupSpec:
    """A group, described: as ``tm.group(members)`` stores it; a member may be a chain,
    a group or a chord (described). Its result is the list of its members' results.
    Nested in a chain with ``pass_result``, each member gets the previous step's
    result.

    :raises InvalidTaskSpec: see :func:`chain`.
    """
    if isinstance(members, TaskSpec | Mapping):
        raise InvalidTaskSpec("give the tasks of a group as a list of specs")
    parts = _described(members, "a group")
    return GroupSpec(
        GROUP_TYPE,
        _description("group"),
        _app_of(parts),
        members=tuple(parts),
        link_error=_errback(link_error),
    )


def chord(
    header: Iterable[TaskSpec | Mapping[str, Any]],
    callback: TaskSpec | Mapping[str, Any],
    *,
    pass_result: bool | str = True,
    link_error: TaskSpec | Mapping[str, Any] | None = None,
) -> ChordSpec:
    """A chord, described: as ``tm.chord(header, callback)`` stores it; a header member
    may be a chain, a group or a chord (described), the callback is one task. Nested in
    a chain with ``pass_result``, each header member gets the previous step's result.

    :raises InvalidTaskSpec: see :func:`chain`.
    """
    if isinstance(header, TaskSpec | Mapping):
        raise InvalidTaskSpec("give the tasks of a chord's header as a list of specs")
    parts = _described(header, "a chord's header")
    (last,) = _described([callback], "a chord's callback")
    input_name(pass_result)
    return ChordSpec(
        GROUP_TYPE,
        _description("chord"),
        _app_of([*parts, last]),
        header=tuple(parts),
        callback=last,
        pass_result=pass_result,
        link_error=_errback(link_error),
    )


def _description(kind: str) -> dict[str, JSON]:
    """The params of a description: a worker that runs one enqueued as a task fails it."""
    return {CANVAS_KEY: {"description": kind}}


def _described(values: Iterable[TaskSpec | Mapping[str, Any]], what: str) -> list[TaskSpec]:
    specs = [TaskSpec.from_value(value) for value in values]
    if not specs:
        raise InvalidTaskSpec(f"{what} needs at least one task")
    return specs


def _errback(value: TaskSpec | Mapping[str, Any] | None) -> TaskSpec | None:
    if value is None:
        return None
    spec = TaskSpec.from_value(value)
    if isinstance(spec, CanvasSpec):
        raise InvalidTaskSpec(
            "link_error is one task, not a chain, group or chord (its handler can start one)",
            field="link_error",
        )
    return spec


def _app_of(specs: Sequence[TaskSpec]) -> str | None:
    """The app of a description's tasks (so that an app-bound client stamps it, or
    refuses another app's): the one app they name, else None."""
    apps = {spec.app_id for spec in specs} - {None}
    if len(apps) > 1:
        _one_app(specs)
    return apps.pop() if apps else None


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


def errback_id(root_id: str) -> str:
    """The id of the errback (``link_error``) of the canvas whose root is ``root_id``."""
    return str(uuid.uuid5(uuid.UUID(root_id), "link_error"))


def input_name(pass_result: bool | str) -> str | None:
    """The params key ``pass_result`` passes a task's input in (None: no input).

    :raises InvalidTaskSpec: not a bool or a non-empty key other than the reserved ones.
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
    if pass_result == HEADERS_KEY:
        raise InvalidTaskSpec(
            f"params key {HEADERS_KEY!r} is reserved for the headers plugins store with a "
            "task: pass the result in another key",
            field="pass_result",
        )
    return pass_result


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
    _one_app([*specs, callback])
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
        _one_app([spec for spec, _ in leaves])
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
