"""taskmill: durable background tasks with a backend-agnostic core."""
from taskmill.errors import (
    BackendNotInstalled,
    Cancelled,
    Fail,
    InvalidParams,
    InvalidTransition,
    InvalidURL,
    Retry,
    SchemaVersionError,
    StorageUnavailable,
    TaskmillError,
    TaskNotFound,
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
from taskmill.storage import TaskStorage
