"""Every error contend raises on purpose derives from :class:`ContendError`.

The tree::

    ContendError
    ├── ConfigError              bad URL, option or setting (raised before any store write)
    │   └── MissingExtraError    an optional backend's package is not installed
    ├── TaskError                a bad task or submission; the store is left unchanged
    │   ├── UnknownTaskType
    │   ├── PayloadError         args/result/checkpoint not JSON, or over the size limit
    │   ├── DependencyError      unknown dependency or a cycle
    │   └── TaskNotFound
    ├── StoreError               the store failed or holds something unexpected
    │   ├── StoreBusy            could not get the write lock in time
    │   ├── SchemaError          the file or database is not a contend store, or its version differs
    │   └── InvalidTransition    the operation does not apply to the task's current state
    ├── FencedOut                an owner write carried a stale fence or a lapsed lease
    ├── NotLeader                an assignment from a leader whose term is over (central queues)
    ├── TransactionConflict      a task's transaction did not commit (its own compare failed, or
    │                            the database refused a conflict); nothing was written: run it again
    ├── LeaseLost                an expert's lease lapsed; it must stop every task it holds
    ├── TaskStopped              ``ctx.check()`` in a run that must stop (lease lost, timeout, cancel)
    ├── MemoryLimitExceeded      a task run in its own process went over its ``memory_limit``
    ├── ExpertConflict           an expert id is live elsewhere
    └── TaskFailed               raised by ``handle.result()`` for a task that ended badly
"""

from __future__ import annotations

import re

#: How many characters of a user's value an error message echoes (see :func:`shown`).
ECHO_LIMIT = 80


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """*text*, cut after *limit* characters with its full length said."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """A user's value as an error message echoes it: its ``repr``, cut after *limit*
    characters with the full length said, so a 100 KB name does not fill the screen."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}… ({len(value):,} characters)"
    try:
        return clip(repr(value), limit)
    except ValueError:  # an int of more than 4,300 digits refuses to become text
        return f"an {type(value).__name__} too large to show"


_SECRET_PARAM = re.compile(r"(?i)([?&][^=&#]*(?:pass|secret|token|key)[^=&#]*=)[^&#]*")
_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:@/?#]*:)[^@/?#]*@", re.IGNORECASE)


def shown_url(url: str) -> str:
    """A store URL as a log line or message shows it: its password, in the user part or in the
    query (``password=``, ``sslpassword=``, a token …), replaced by ``***``."""
    return clip(_SECRET_PARAM.sub(r"\1***", _PASSWORD.sub(r"\1***@", url)), 200)


class ContendError(Exception):
    """Root of every error raised by contend."""


class ConfigError(ContendError, ValueError):
    """A URL, option or setting is malformed; nothing was written."""


class MissingExtraError(ConfigError, ImportError):
    """An optional backend needs a package that is not installed."""

    def __init__(self, feature: str, extra: str, package: str) -> None:
        super().__init__(f"{feature} needs the {package!r} package: {install_line(extra)}")
        self.extra = extra
        self.package = package


def install_line(extra: str) -> str:
    """The pip command that installs what contend's *extra* needs, read from contend's own
    package metadata: it works wherever contend came from (a checkout, a wheel, an index).
    ``pip install 'contend[extra]'`` only where the metadata does not say (not installed)."""
    from importlib import metadata

    try:
        requires = metadata.requires("contend") or []
    except metadata.PackageNotFoundError:
        requires = []
    wanted = []
    for line in requires:
        spec, _, marker = line.partition(";")
        if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            wanted.append(f"'{spec.strip()}'")
    if not wanted:
        return f"pip install 'contend[{extra}]'"
    return f"pip install {' '.join(wanted)} (contend's {extra!r} extra)"


class TaskError(ContendError, ValueError):
    """A task or submission is invalid; the store is unchanged."""


class UnknownTaskType(TaskError):
    def __init__(self, name: str, known: list[str] | None = None) -> None:
        hint = f" (registered: {', '.join(sorted(known))})" if known else ""
        super().__init__(f"unknown task type {shown(name)}{hint}")
        self.name = name


class PayloadError(TaskError):
    """A payload is not JSON-serialisable or exceeds the size limit."""


class DependencyError(TaskError):
    """A dependency is unknown or would form a cycle."""


class TaskNotFound(TaskError, LookupError):
    def __init__(self, task_id: str, hint: str = "") -> None:
        super().__init__(f"no task with id {shown(task_id)}" + (f"; {hint}" if hint else ""))
        self.task_id = task_id


class StoreError(ContendError):
    """The store failed, or holds data contend does not understand."""


class StoreBusy(StoreError):
    """The store's write lock could not be had before the deadline."""


class StoreUnavailable(StoreError):
    """The store could not be reached (down, restarting, cut off), or did not answer in time:
    the same call may well go through later."""


class SchemaError(StoreError):
    """The target is not a contend store, or its schema version is not this one's."""


class InvalidTransition(StoreError):
    """The operation does not apply to the task in its current state."""

    def __init__(self, task_id: str, state: str, operation: str) -> None:
        super().__init__(f"cannot {operation} task {task_id}: it is {state}")
        self.task_id = task_id
        self.state = state
        self.operation = operation


class FencedOut(ContendError):
    """An owner write was refused: its fence is not the task's current one, or its lease lapsed.

    The task has been (or may be) claimed by another expert; the write did not land.
    """

    def __init__(self, task_id: str, fence: int, detail: str = "", *, reason: str = "") -> None:
        more = f": {detail}" if detail else ""
        super().__init__(f"task {task_id}: write with fence {fence} refused{more}")
        self.task_id = task_id
        self.fence = fence
        #: A code for why (``contend.domain.transitions.Refusal``): gone, stale_fence, not_owner,
        #: not_owned, task_lease, expert_lease, raced.
        self.reason = reason
        self.detail = detail


class NotLeader(ContendError):
    """A ``central`` queue's assignment was refused: the sender does not lead *name* at *term*
    (someone else took over, its leadership lapsed, or its session ended). Nothing was
    assigned; the sender must stop assigning and try to lead again."""

    def __init__(self, name: str, term: int, detail: str = "", *, reason: str = "") -> None:
        more = f": {detail}" if detail else ""
        super().__init__(f"leadership {name!r}: assignment at term {term} refused{more}")
        self.name = name
        self.term = term
        #: A code for why (``contend.domain.dispatch.Refusal``): no_leader, stale_term,
        #: not_holder, lapsed.
        self.reason = reason
        self.detail = detail


class TransactionConflict(ContendError):
    """A task's own transaction (``ctx.transaction()``) was rolled back, not because the task
    lost its claim but because what it read changed before it committed: a compare the task
    added failed (etcd, the memory store), or the database refused the commit as a serialization
    conflict or deadlock (PostgreSQL). Nothing of it was written and the task still holds its
    claim: run the block again, as ``ctx.transact()`` does."""


class LeaseLost(ContendError):
    """The expert's lease lapsed before it could renew it; it must stop every task it holds."""


class TaskStopped(ContendError):
    """Raised by ``ctx.check()`` inside a run that must stop: its expert lost the lease, it
    timed out, it was cancelled or taken over. Nothing the run returns will be committed; let
    it propagate (do not swallow it in a broad ``except Exception``)."""


class MemoryLimitExceeded(ContendError):
    """A task with ``isolation="process"`` and a ``memory_limit`` used more memory than that:
    its process was killed and the attempt failed (not retried: the same input would need the
    same memory)."""

    def __init__(self, task_type: str, used: int, limit: int) -> None:
        mib = 1024 * 1024
        super().__init__(
            f"task type {task_type!r} used {used / mib:.0f} MiB of memory, over its "
            f"memory_limit of {limit / mib:.0f} MiB: its process was killed (raise the limit, "
            "then `contend tasks retry ID`)"
        )
        self.task_type, self.used, self.limit = task_type, used, limit


class ExpertConflict(ContendError):
    """An expert with this id holds a live lease elsewhere."""


class TaskFailed(ContendError):
    """The awaited task ended in a state other than succeeded."""

    def __init__(self, task_id: str, state: str, error: object) -> None:
        if isinstance(error, dict) and "message" in error:
            detail = f"{error.get('type', 'Error')}: {error['message']}"
        else:
            detail = str(error)
        super().__init__(f"task {task_id} ended {state}: {detail}")
        self.task_id = task_id
        self.state = state
        self.error = error
