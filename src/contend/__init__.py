"""contend: decentralized task scheduling by competition and claim.

Experts watch a shared store, contend for the tasks they can run, claim the winner's task
atomically under a lease and commit with a fencing token, so a stale owner never commits.
"""

from contend.domain.retry import RetryPolicy
from contend.domain.task import Capabilities, Requirements, Task, TaskState
from contend.errors import (
    ConfigError,
    ContendError,
    DependencyError,
    ExpertConflict,
    FencedOut,
    LeaseLost,
    MemoryLimitExceeded,
    MissingExtraError,
    NotLeader,
    PayloadError,
    SchemaError,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    TaskError,
    TaskFailed,
    TaskNotFound,
    TaskStopped,
    TransactionConflict,
    UnknownTaskType,
)
from contend.runtime.app import After, App, TaskHandle
from contend.runtime.config import ExpertConfig
from contend.runtime.context import TaskContext, current
from contend.runtime.expert import Expert
from contend.runtime.hooks import Hook
from contend.runtime.task_type import TaskType

__version__ = "0.1.0"

__all__ = [
    "After",
    "App",
    "Capabilities",
    "ConfigError",
    "ContendError",
    "DependencyError",
    "Expert",
    "ExpertConfig",
    "ExpertConflict",
    "FencedOut",
    "Hook",
    "LeaseLost",
    "MemoryLimitExceeded",
    "MissingExtraError",
    "NotLeader",
    "PayloadError",
    "Requirements",
    "RetryPolicy",
    "SchemaError",
    "StoreBusy",
    "StoreError",
    "StoreUnavailable",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskFailed",
    "TaskHandle",
    "TaskNotFound",
    "TaskState",
    "TaskStopped",
    "TaskType",
    "TransactionConflict",
    "UnknownTaskType",
    "__version__",
    "current",
]
