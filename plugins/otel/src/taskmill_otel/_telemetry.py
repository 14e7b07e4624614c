"""The OpenTelemetry side of taskmill-otel: spans, metrics and propagation.

Imported by :class:`taskmill_otel.OtelInstrumentation` when a hook first needs it.
Every hook of the plugin lands in one method of :class:`Telemetry`; the state they
share is the ``send`` spans waiting for their task to be stored (by task id) and the
attempts running in this process (by task id, oldest first).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Final

import attrs
from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context as OtelContext
from opentelemetry.metrics import MeterProvider
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue
from taskmill import AttemptOutcome, Cancelled, Detached, Task, TaskSpec, headers_of
from taskmill.model import Priority

SYSTEM: Final = "taskmill"
"""The ``messaging.system`` of every span and metric."""
SCOPE: Final = "taskmill_otel"
"""The instrumentation scope's name."""

# The messaging semantic conventions' operation types, and taskmill's operation names.
SEND: Final = "send"
CLAIM: Final = "claim"
RECEIVE: Final = "receive"
PROCESS: Final = "process"
SETTLE: Final = "settle"

FAILED_OUTCOMES: Final = frozenset(
    {AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT, AttemptOutcome.LOST}
)
"""The outcomes whose ``settle`` span has status ERROR."""

DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    30.0, 60.0, 300.0, 600.0,
)  # fmt: skip
"""The messaging conventions' advised buckets, extended for long tasks."""

Attributes = dict[str, AttributeValue]


def _version() -> str:
    try:
        return version("taskmill-otel")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _error_type(exc: BaseException) -> str:
    """The exception's class as ``error.type`` names it: fully qualified."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _first_line(text: str | None) -> str | None:
    return None if text is None else text.split("\n", 1)[0][:500]


@attrs.define
class _Pending:
    """A ``send`` span waiting for its task to be stored."""

    span: Span
    started: float
    """``time.monotonic()`` at its start."""
    metric: Attributes
    headers: dict[str, str] = attrs.field(factory=dict)
    """What :meth:`Telemetry.sending` returned for it (the task's stored headers)."""


@attrs.define
class _Run:
    """One attempt running in this process, from ``taskmill_task_started`` to
    ``taskmill_task_finished`` (or ``taskmill_task_detached``)."""

    parent: OtelContext
    """The context stored with the task (its ``send`` span), or an empty one."""
    attributes: Attributes
    metric: Attributes
    process: Span | None = None
    process_started: float = 0.0
    settle: Span | None = None
    settle_started: float = 0.0
    finished: bool = False
    """``taskmill_task_finished`` came while the handler still ran (the task was
    taken from the worker): the ``process`` span is ended without a ``settle``."""


class Telemetry:
    """The tracer, the meter and its instruments, and what the hooks share."""

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        propagator: TextMapPropagator | None,
        pending_timeout: float,
        max_pending: int,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, _version(), tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, _version(), meter_provider=meter_provider)
        self._propagator = propagator
        self.pending_timeout = pending_timeout
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._pending: collections.OrderedDict[str, _Pending] = collections.OrderedDict()
        self._runs: dict[str, collections.deque[_Run]] = {}
        self.sent_messages = meter.create_counter(
            "messaging.client.sent.messages",
            unit="{message}",
            description="Tasks enqueued by this process.",
        )
        self.consumed_messages = meter.create_counter(
            "messaging.client.consumed.messages",
            unit="{message}",
            description="Attempts started by the workers of this process (one per claim).",
        )
        self.attempts_finished = meter.create_counter(
            "taskmill.attempts.finished",
            unit="{attempt}",
            description="Attempts whose outcome was stored, by taskmill.outcome.",
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="How long handlers ran.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="How long taskmill's send, claim and settle operations took.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.queue_duration = meter.create_histogram(
            "taskmill.queue.duration",
            unit="s",
            description="How long tasks waited, from due (enqueued, or run_at) to claimed.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )

    @property
    def propagator(self) -> TextMapPropagator:
        """The configured propagator, else the global one (read at each use)."""
        return self._propagator or propagate.get_global_textmap()

    # -- attributes ----------------------------------------------------------------------

    @staticmethod
    def metric_attributes(
        task_type: str, app_id: str | None, operation: str, operation_type: str | None = None
    ) -> Attributes:
        attributes: Attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.destination.name": task_type,
        }
        if operation_type is not None:
            attributes["messaging.operation.type"] = operation_type
        if app_id is not None:
            attributes["taskmill.app_id"] = app_id
        return attributes

    @staticmethod
    def span_attributes(
        task_id: str,
        task_type: str,
        app_id: str | None,
        parent_id: str | None,
        priority: int,
    ) -> Attributes:
        attributes: Attributes = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": task_type,
            "messaging.message.id": task_id,
            "taskmill.priority": priority,
        }
        if app_id is not None:
            attributes["taskmill.app_id"] = app_id
        if parent_id is not None:
            attributes["taskmill.parent_id"] = parent_id
        return attributes

    @staticmethod
    def _operation(attributes: Attributes, operation: str, operation_type: str) -> Attributes:
        return {
            **attributes,
            "messaging.operation.name": operation,
            "messaging.operation.type": operation_type,
        }

    # -- enqueueing --------------------------------------------------------------------

    def sending(self, spec: TaskSpec, task_id: str) -> dict[str, str] | None:
        """``taskmill_task_headers``: start the task's ``send`` span (a child of the
        current span) and return its context as the task's headers. A task resolved
        again before it is stored (a canvas's planner may) keeps its one span."""
        with self._lock:
            waiting = self._pending.get(task_id)
        if waiting is not None:
            return dict(waiting.headers) or None
        attributes = self._operation(
            self.span_attributes(
                task_id,
                spec.task_type,
                spec.app_id,
                spec.parent_id,
                spec.priority if isinstance(spec.priority, int) else Priority.NORMAL,
            ),
            SEND,
            SEND,
        )
        parent = None
        incoming = getattr(spec, "headers", None)
        if incoming and not trace.get_current_span().get_span_context().is_valid:
            # No trace in this process: continue the caller's (the HTTP service passes
            # the request's traceparent in the spec's headers).
            parent = self.propagator.extract(incoming)
        span = self.tracer.start_span(
            f"{SEND} {spec.task_type}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
        )
        headers: dict[str, str] = {}
        self.propagator.inject(headers, context=trace.set_span_in_context(span))
        pending = _Pending(
            span,
            time.monotonic(),
            self.metric_attributes(spec.task_type, spec.app_id, SEND, SEND),
            headers,
        )
        with self._lock:
            previous = self._pending.pop(task_id, None)
            self._pending[task_id] = pending
            expired = self._expired(pending.started)
        if previous is not None:
            expired.append(previous)
        for one in expired:
            self._unconfirmed(one)
        return headers or None

    def _expired(self, now: float) -> list[_Pending]:
        """Take the ``send`` spans waiting too long, or past ``max_pending``."""
        expired = []
        while self._pending:
            task_id, oldest = next(iter(self._pending.items()))
            if len(self._pending) <= self.max_pending and (
                now - oldest.started < self.pending_timeout
            ):
                break
            del self._pending[task_id]
            expired.append(oldest)
        return expired

    @staticmethod
    def _unconfirmed(pending: _Pending) -> None:
        pending.span.set_status(
            Status(StatusCode.ERROR, "the task was not confirmed stored (the enqueue failed?)")
        )
        pending.span.set_attribute("error.type", "taskmill.unconfirmed")
        pending.span.end()

    def sent(self, task: Task) -> None:
        """``taskmill_task_enqueued``: end the task's ``send`` span and count it."""
        with self._lock:
            pending = self._pending.pop(task.id, None)
        if pending is None:
            # Not enqueued through the hook (a group's root task): counted only.
            self.sent_messages.add(
                1, self.metric_attributes(task.task_type, task.app_id, SEND, SEND)
            )
            return
        if task.alias_of is not None:
            pending.span.set_attribute("taskmill.alias_of", task.alias_of)
        pending.span.end()
        self.sent_messages.add(1, pending.metric)
        self.operation_duration.record(time.monotonic() - pending.started, pending.metric)

    # -- running -----------------------------------------------------------------------

    def started(self, task: Task, worker_id: str) -> None:
        """``taskmill_task_started``: the ``claim`` span, from the claim to now, and the
        queue latency."""
        now_ns = time.time_ns()
        parent = self.propagator.extract(headers_of(task), context=OtelContext())
        attributes = self.span_attributes(
            task.id, task.task_type, task.app_id, task.parent_id, task.priority
        )
        attributes["taskmill.attempt"] = task.attempts
        attributes["taskmill.worker_id"] = worker_id
        run = _Run(
            parent=parent,
            attributes=attributes,
            metric=self.metric_attributes(task.task_type, task.app_id, PROCESS, PROCESS),
        )
        claimed_ns = now_ns if task.started_at is None else _ns(task.started_at.timestamp())
        claimed_ns = min(claimed_ns, now_ns)  # the store's clock may run ahead of ours
        claim = self.tracer.start_span(
            f"{CLAIM} {task.task_type}",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=self._operation(attributes, CLAIM, RECEIVE),
            start_time=claimed_ns,
        )
        claim.end(end_time=now_ns)
        with self._lock:
            self._runs.setdefault(task.id, collections.deque()).append(run)
        self.consumed_messages.add(
            1, self.metric_attributes(task.task_type, task.app_id, PROCESS, PROCESS)
        )
        self.operation_duration.record(
            (now_ns - claimed_ns) / 1e9,
            self.metric_attributes(task.task_type, task.app_id, CLAIM, RECEIVE),
        )
        if task.started_at is not None:
            waited = (task.started_at - task.run_at).total_seconds()
            self.queue_duration.record(
                max(0.0, waited), self.metric_attributes(task.task_type, task.app_id, CLAIM)
            )

    def _current_run(self, task: Task) -> _Run | None:
        with self._lock:
            runs = self._runs.get(task.id)
            return runs[-1] if runs else None

    def _pop_run(self, task: Task) -> _Run | None:
        """The oldest attempt of ``task`` running here (a lost attempt is reported
        before the one that took it over)."""
        with self._lock:
            runs = self._runs.get(task.id)
            if not runs:
                return None
            run = runs.popleft()
            if not runs:
                del self._runs[task.id]
            return run

    def processing(self, task: Task) -> AbstractContextManager[None]:
        """``taskmill_handler_context``: the ``process`` span, current around the
        handler."""
        run = self._current_run(task)
        if run is None:  # started without taskmill_task_started (not expected)
            self.started(task, task.worker_id or "")
            run = self._current_run(task)
            assert run is not None
        return self._process(task, run)

    @contextmanager
    def _process(self, task: Task, run: _Run) -> Iterator[None]:
        span = self.tracer.start_span(
            f"{PROCESS} {task.task_type}",
            context=run.parent,
            kind=SpanKind.CONSUMER,
            attributes=self._operation(run.attributes, PROCESS, PROCESS),
        )
        run.process, run.process_started = span, time.monotonic()
        token = otel_context.attach(trace.set_span_in_context(span, run.parent))
        try:
            yield
        except BaseException as exc:
            self._ended(task, run, span, exc)
            raise
        else:
            self._ended(task, run, span, None)
        finally:
            otel_context.detach(token)

    def _ended(self, task: Task, run: _Run, span: Span, exc: BaseException | None) -> None:
        """The handler returned or raised: end the ``process`` span, and start the
        ``settle`` one unless the outcome is settled elsewhere or already was."""
        metric = run.metric
        detached = isinstance(exc, Detached)
        if detached:
            span.set_attribute("taskmill.detached", True)
        elif isinstance(exc, Exception) and not isinstance(exc, Cancelled):
            # A failed attempt (also Retry, Fail, and TimeoutError for a timeout). A
            # cancellation, suspension or shutdown is not an error of the handler: the
            # settle span's taskmill.outcome says what it was.
            error_type = _error_type(exc)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
            span.set_attribute("error.type", error_type)
            metric = {**metric, "error.type": error_type}
        elif exc is not None:
            span.set_attribute("taskmill.interrupted", True)
        end = time.monotonic()
        span.end()
        self.process_duration.record(end - run.process_started, metric)
        if detached or run.finished:
            return
        run.settle = self.tracer.start_span(
            f"{SETTLE} {task.task_type}",
            context=trace.set_span_in_context(span, run.parent),
            kind=SpanKind.CLIENT,
            attributes=self._operation(run.attributes, SETTLE, SETTLE),
        )
        run.settle_started = end

    def finished(self, task: Task, outcome: AttemptOutcome, error: str | None) -> None:
        """``taskmill_task_finished``: end the ``settle`` span with the outcome, and
        count the attempt."""
        metric = self.metric_attributes(task.task_type, task.app_id, SETTLE, SETTLE)
        self.attempts_finished.add(1, {**metric, "taskmill.outcome": outcome.value})
        run = self._pop_run(task)
        if run is None:
            # Settled without a start here: a detached attempt reported to this process
            # (the taskmill-http service). A settle span in the task's trace.
            parent = self.propagator.extract(headers_of(task), context=OtelContext())
            attributes = self.span_attributes(
                task.id, task.task_type, task.app_id, task.parent_id, task.priority
            )
            attributes["taskmill.attempt"] = task.attempts
            span = self.tracer.start_span(
                f"{SETTLE} {task.task_type}",
                context=parent,
                kind=SpanKind.CLIENT,
                attributes=self._operation(attributes, SETTLE, SETTLE),
            )
            self._settled(span, outcome, error)
            return
        if run.settle is None:
            # The task was taken from the worker while its handler ran: the process
            # span (ended when the handler returns) carries the outcome.
            run.finished = True
            if run.process is not None:
                run.process.set_attribute("taskmill.outcome", outcome.value)
            return
        self._settled(run.settle, outcome, error)
        self.operation_duration.record(time.monotonic() - run.settle_started, metric)

    @staticmethod
    def _settled(span: Span, outcome: AttemptOutcome, error: str | None) -> None:
        span.set_attribute("taskmill.outcome", outcome.value)
        if outcome in FAILED_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR, _first_line(error)))
            span.set_attribute("error.type", outcome.value)
        span.end()

    def detached(self, task: Task) -> None:
        """``taskmill_task_detached``: forget the attempt (its ``process`` span ended
        with ``taskmill.detached``)."""
        self._pop_run(task)

    def running(self) -> int:
        """Attempts this process tracks (for tests)."""
        with self._lock:
            return sum(len(runs) for runs in self._runs.values())

    def pending(self) -> int:
        """``send`` spans waiting for their task to be stored (for tests)."""
        with self._lock:
            return len(self._pending)
