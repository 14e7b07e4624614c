"""taskmill: durable background tasks with a backend-agnostic core."""

from taskmill.app import Taskmill
from taskmill.backoff import RetryPolicy
from taskmill.canvas import Chain, Chord, Group
from taskmill.context import Context, Deferred
from taskmill.errors import (
    BackendNotInstalled,
    Cancelled,
    ConfigurationError,
    Detached,
    DuplicateTaskId,
    Fail,
    HandlerConflict,
    InvalidCursor,
    InvalidHandler,
    InvalidParams,
    InvalidTaskSpec,
    InvalidTransition,
    InvalidURL,
    PluginError,
    ProxyError,
    Retry,
    SchemaVersionError,
    StorageUnavailable,
    TaskmillError,
    TaskNotFound,
    UnknownTaskType,
    WaitTimeout,
)
from taskmill.hookspecs import headers_of, hookimpl
from taskmill.limits import InvalidLimit
from taskmill.model import (
    Attempt,
    AttemptOutcome,
    CancelReason,
    EventKind,
    Priority,
    Progress,
    ProgressSummary,
    SuspensionScope,
    Task,
    TaskEvent,
    TaskFilter,
    TaskSpec,
    TaskStatus,
)
from taskmill.operations import AppTasks
from taskmill.plugins import PluginInfo
from taskmill.proxy import ProxyHandler, SubprocessHandler
from taskmill.registry import BatchOptions, Handler, HandlerRegistrar, HandlerRegistry
from taskmill.storage import TaskStorage
from taskmill.worker import Worker
from taskmill.worker_host import WorkerHost
from taskmill.worker_options import WorkerArgs, WorkerOptions

__all__ = [
    "AppTasks",
    "Attempt",
    "AttemptOutcome",
    "BackendNotInstalled",
    "BatchOptions",
    "CancelReason",
    "Cancelled",
    "Chain",
    "Chord",
    "ConfigurationError",
    "Context",
    "Deferred",
    "Detached",
    "DuplicateTaskId",
    "EventKind",
    "Fail",
    "Group",
    "Handler",
    "HandlerConflict",
    "HandlerRegistrar",
    "HandlerRegistry",
    "InvalidCursor",
    "InvalidHandler",
    "InvalidLimit",
    "InvalidParams",
    "InvalidTaskSpec",
    "InvalidTransition",
    "InvalidURL",
    "PluginError",
    "PluginInfo",
    "Priority",
    "Progress",
    "ProgressSummary",
    "ProxyError",
    "ProxyHandler",
    "Retry",
    "RetryPolicy",
    "SchemaVersionError",
    "StorageUnavailable",
    "SubprocessHandler",
    "SuspensionScope",
    "Task",
    "TaskEvent",
    "TaskFilter",
    "TaskNotFound",
    "TaskSpec",
    "TaskStatus",
    "TaskStorage",
    "Taskmill",
    "TaskmillError",
    "UnknownTaskType",
    "WaitTimeout",
    "Worker",
    "WorkerArgs",
    "WorkerHost",
    "WorkerOptions",
    "headers_of",
    "hookimpl",
]
