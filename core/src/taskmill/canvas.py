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

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from taskmill.errors import Fail, InvalidTaskSpec
from taskmill.headers import HEADERS_KEY
from taskmill.model import JSON, CancelReason, Task, TaskSpec
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
    "serve_builtins",
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
        check_one_app(specs)
    return apps.pop() if apps else None


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


def check_one_app(specs: Sequence[TaskSpec]) -> None:
    """:raises InvalidTaskSpec: ``specs`` name more than one app (field ``app_id``)."""
    apps = {spec.app_id for spec in specs}
    if len(apps) > 1:
        raise InvalidTaskSpec(
            "the tasks of a chain, group or chord belong to one app (a task can only "
            f"depend on tasks of its own app); got apps {sorted(map(repr, apps))}",
            field="app_id",
        )


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
