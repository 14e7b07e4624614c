"""taskmill: durable background tasks with a backend-agnostic core."""

from taskmill.app import Taskmill
from taskmill.backoff import RetryPolicy
from taskmill.context import Context
from taskmill.errors import (
    BackendNotInstalled,
    Cancelled,
    Fail,
    HandlerConflict,
    InvalidParams,
    InvalidTaskSpec,
    InvalidTransition,
    InvalidURL,
    Retry,
    SchemaVersionError,
    StorageUnavailable,
    TaskmillError,
    TaskNotFound,
    WaitTimeout,
)
from taskmill.model import (
    Attempt,
    AttemptOutcome,
    CancelReason,
    Priority,
    Progress,
    ProgressSummary,
    Task,
    TaskFilter,
    TaskSpec,
    TaskStatus,
)
from taskmill.registry import Handler, HandlerRegistry
from taskmill.storage import TaskStorage
from taskmill.worker import Worker

__all__ = [
    "Attempt",
    "AttemptOutcome",
    "BackendNotInstalled",
    "CancelReason",
    "Cancelled",
    "Context",
    "Fail",
    "Handler",
    "HandlerConflict",
    "HandlerRegistry",
    "InvalidParams",
    "InvalidTaskSpec",
    "InvalidTransition",
    "InvalidURL",
    "Priority",
    "Progress",
    "ProgressSummary",
    "Retry",
    "RetryPolicy",
    "SchemaVersionError",
    "StorageUnavailable",
    "Task",
    "TaskFilter",
    "TaskNotFound",
    "TaskSpec",
    "TaskStatus",
    "TaskStorage",
    "Taskmill",
    "TaskmillError",
    "WaitTimeout",
    "Worker",
]
