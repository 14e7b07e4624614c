"""taskmill-otel: OpenTelemetry traces and metrics for taskmill, from its hooks.

Installed, the plugin records, in every process that loads plugins, through the
OpenTelemetry API (configure the SDK and its exporters in the application; without an
SDK every call is a no-op and no header is stored):

- ``send <task_type>`` (PRODUCER): a task enqueued, from just before it is checked to
  the return of the storage call. Its context is stored with the task, under the
  reserved params key ``taskmill.headers`` (``taskmill_task_headers``), in every store.
- ``claim <task_type>`` (CLIENT, ``messaging.operation.type=receive``): from the claim
  (``task.started_at``) to the start of the handler.
- ``process <task_type>`` (CONSUMER): the handler's run, around it
  (``taskmill_handler_context``), in the trace the task was enqueued in; status ERROR
  with the exception recorded when the attempt failed. A task the handler enqueues is
  enqueued in this span's context, so it continues the trace.
- ``settle <task_type>`` (CLIENT): from the handler's end to the stored outcome
  (``taskmill_task_finished``), with ``taskmill.outcome``.

Metrics: ``messaging.client.sent.messages``, ``messaging.client.consumed.messages``,
``taskmill.attempts.finished`` (by ``taskmill.outcome``), ``messaging.process.duration``,
``messaging.client.operation.duration`` (send, claim, settle) and
``taskmill.queue.duration`` (from the task's due time to its claim). docs/otel.md has
the tables and the design.

**Inactive until OpenTelemetry is set up.** Installed but with no SDK configured (the
global tracer and meter providers still the API's defaults, or OpenTelemetry not even
imported), every hook returns at once and nothing is stored with tasks: a worker pays
only the hook calls (measured in docs/otel.md), not the no-op spans. Whether a recording
provider is set is checked at the first hook call and again at most every
:data:`RECHECK_SECONDS` while none is, so an application that configures the SDK after
taskmill loaded its plugins is picked up; providers passed in code always count.
OpenTelemetry is imported only once it is set up (``opentelemetry`` already imported
by the application), so a process that does not use it does not pay its import.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Final

from taskmill import AttemptOutcome, Context, Task, TaskSpec, hookimpl

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from opentelemetry.metrics import MeterProvider
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import TracerProvider

    from taskmill_otel._telemetry import Telemetry

__all__ = ["OtelInstrumentation", "instrumentation"]

RECHECK_SECONDS: Final = 5.0
"""While no recording provider is set, how often a hook looks again."""
_DEFAULT_PROVIDERS: Final = frozenset(
    {"ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider", "NoOpMeterProvider"}
)
"""The API's own providers: what the globals are until an SDK (or another
implementation) is installed."""

DEFAULT_PENDING_TIMEOUT = 300.0
DEFAULT_MAX_PENDING = 10_000


class OtelInstrumentation:
    """The plugin: taskmill's hooks turned into OpenTelemetry spans and metrics.

    The installed entry point is the module's :data:`instrumentation`, on the global
    tracer and meter providers and the global propagator (W3C trace context and
    baggage unless configured otherwise), looked up when a hook first runs: set the
    providers up before the first enqueue or worker start. To pass providers in code
    instead, skip the entry point (``TASKMILL_DISABLE_PLUGINS=otel``) and add your own:
    ``Taskmill(plugins=[OtelInstrumentation(tracer_provider=..., meter_provider=...)])``.

    :param tracer_provider: where the spans go (default: the global one).
    :param meter_provider: where the metrics go (default: the global one).
    :param propagator: how the trace context is written into a task's headers and read
        back (default: the global text-map propagator).
    :param pending_timeout: seconds a ``send`` span waits for its task's
        ``taskmill_task_enqueued`` (the storage call's return) before it is ended as
        unconfirmed (the enqueue failed).
    :param max_pending: the most ``send`` spans waiting at once; past it the oldest is
        ended as unconfirmed.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        propagator: TextMapPropagator | None = None,
        pending_timeout: float = DEFAULT_PENDING_TIMEOUT,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.propagator = propagator
        self.pending_timeout = pending_timeout
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._telemetry: Telemetry | None = None
        self._explicit = tracer_provider is not None or meter_provider is not None
        self._active = self._explicit
        self._checked_at = -RECHECK_SECONDS

    def _live(self) -> Telemetry | None:
        """The telemetry when OpenTelemetry is set up (see the module docstring), else
        None: the hooks then do nothing."""
        if self._active:
            return self.telemetry
        now = time.monotonic()
        if now - self._checked_at < RECHECK_SECONDS:
            return None
        self._checked_at = now
        if not _configured():
            return None
        self._active = True
        return self.telemetry

    @property
    def telemetry(self) -> Telemetry:
        """The tracer, meter and instruments, made (and OpenTelemetry imported) on
        first use."""
        telemetry = self._telemetry
        if telemetry is None:
            with self._lock:
                telemetry = self._telemetry
                if telemetry is None:
                    from taskmill_otel._telemetry import Telemetry

                    telemetry = self._telemetry = Telemetry(
                        tracer_provider=self.tracer_provider,
                        meter_provider=self.meter_provider,
                        propagator=self.propagator,
                        pending_timeout=self.pending_timeout,
                        max_pending=self.max_pending,
                    )
        return telemetry

    # -- the enqueuing process -------------------------------------------------------

    @hookimpl
    def taskmill_task_headers(self, spec: TaskSpec, task_id: str) -> dict[str, str] | None:
        """Start the task's ``send`` span and return its context as headers."""
        telemetry = self._live()
        return None if telemetry is None else telemetry.sending(spec, task_id)

    @hookimpl
    def taskmill_task_enqueued(self, task: Task) -> None:
        """End the task's ``send`` span and count it."""
        telemetry = self._live()
        if telemetry is not None:
            telemetry.sent(task)

    # -- the worker -------------------------------------------------------------------

    @hookimpl
    def taskmill_task_started(self, task: Task, worker_id: str) -> None:
        """Record the ``claim`` span and the queue latency."""
        telemetry = self._live()
        if telemetry is not None:
            telemetry.started(task, worker_id)

    @hookimpl
    def taskmill_handler_context(
        self, task: Task, ctx: Context
    ) -> AbstractContextManager[Any] | None:
        """The ``process`` span around the handler, current while it runs."""
        telemetry = self._live()
        return None if telemetry is None else telemetry.processing(task)

    @hookimpl
    def taskmill_task_finished(
        self, task: Task, outcome: AttemptOutcome, elapsed_ms: float, error: str | None
    ) -> None:
        """End the ``settle`` span with the outcome and count the attempt."""
        telemetry = self._live()
        if telemetry is not None:
            telemetry.finished(task, outcome, error)

    @hookimpl
    def taskmill_task_detached(self, task: Task) -> None:
        """The attempt was handed over: its outcome is settled elsewhere."""
        telemetry = self._live()
        if telemetry is not None:
            telemetry.detached(task)


def _configured() -> bool:
    """Whether a recording tracer or meter provider is installed globally (without
    importing OpenTelemetry when the application has not)."""
    if "opentelemetry" not in sys.modules:
        return False
    from opentelemetry import metrics, trace

    providers = (trace.get_tracer_provider(), metrics.get_meter_provider())
    return any(type(provider).__name__ not in _DEFAULT_PROVIDERS for provider in providers)


instrumentation = OtelInstrumentation()
"""The plugin the ``otel`` entry point loads: the global providers and propagator."""
