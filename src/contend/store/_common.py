"""Checks shared by backends, written once."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from contend.domain.auction import check_grace
from contend.domain.task import TaskSpec, find_cycle
from contend.errors import ConfigError, DependencyError, ExpertConflict, LeaseLost, TaskError
from contend.store.port import Promises, Submitted


def check_batch_dependencies(
    specs: Sequence[TaskSpec], exists: Callable[[Iterable[str]], set[str]]
) -> None:
    """Refuse unknown dependencies and cycles before anything is written.

    *exists* returns which of the given ids are already in the store.
    """
    batch = {s.id: s for s in specs}
    if len(batch) != len(specs):
        raise TaskError("a batch names the same task id twice")
    outside = {d for s in specs for d in s.depends_on if d not in batch}
    missing = outside - exists(outside) if outside else set()
    if missing:
        raise DependencyError(f"unknown dependencies: {', '.join(sorted(missing))}")
    cycle = find_cycle({s.id: s.depends_on for s in specs if s.depends_on})
    if cycle:
        raise DependencyError(f"dependency cycle: {' -> '.join(cycle)}")


def check_ttl(lease_ttl: float) -> float:
    if not isinstance(lease_ttl, int | float) or not math.isfinite(lease_ttl) or lease_ttl <= 0:
        raise ConfigError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}")
    return float(lease_ttl)


def check_retry_delay(delay: float | None) -> None:
    """A failure's retry delay is None (final) or a finite, non-negative number of seconds."""
    if delay is None:
        return
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or delay < 0
    ):
        raise ConfigError(
            f"retry_delay must be None or a non-negative number of seconds, got {delay!r}"
        )


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigError(f"limit must be a non-negative integer, got {limit!r}")
    return limit


def check_bid(score: float, window: float, grace: float) -> tuple[float, float, float]:
    if not isinstance(score, int | float) or not math.isfinite(score) or not 0 <= score <= 1:
        raise ConfigError(f"a bid must be a score in [0, 1], got {score!r}")
    if not isinstance(window, int | float) or not math.isfinite(window) or not 0 <= window <= 3600:
        raise ConfigError(f"an auction window must be between 0 and 3600 s, got {window!r}")
    return float(score), float(window), check_grace(grace)


def sort_out(
    specs: Sequence[TaskSpec],
    known: Collection[str],
    taken: Mapping[str, str],
    landed: Collection[str] = (),
) -> tuple[list[TaskSpec], list[Submitted]]:
    """What each spec of a submission comes to, the idempotency rule written once: a spec whose
    id is stored (sent again after a lost reply) or whose key is taken — in the store (*taken*:
    key -> id) or earlier in the same batch — answers with that task and writes nothing; the
    others are new. Returns the specs to write and the answer for every spec, in order.
    *landed*: ids this call already wrote (a backend that writes a batch in parts) — new, but
    not to be written again."""
    fresh: list[TaskSpec] = []
    out: list[Submitted] = []
    keys = dict(taken)
    for spec in specs:
        if spec.id in known:
            out.append(Submitted(spec.id, False))
        elif spec.key is not None and spec.key in keys:
            out.append(Submitted(keys[spec.key], False))
        else:
            if spec.key is not None:
                keys[spec.key] = spec.id
            if spec.id not in landed:
                fresh.append(spec)
            out.append(Submitted(spec.id, True))
    return fresh, out


def session_not_live(expert: str, session: str) -> LeaseLost:
    """The refusal of a call under a session that has ended or lapsed."""
    return LeaseLost(f"expert {expert}: session {session} is not live")


def live_elsewhere(expert: str, host: str, pid: int) -> ExpertConflict:
    """The refusal of a registration whose expert id holds a live session."""
    return ExpertConflict(
        f"expert id {expert!r} is live elsewhere (host {host or '?'}, pid {pid}); "
        "pick another --name or stop that expert"
    )


P = ParamSpec("P")
R = TypeVar("R")
D = TypeVar("D")


def bind(
    fn: Callable[Concatenate[D, P], Coroutine[Any, Any, R]], first: D
) -> Callable[P, Coroutine[Any, Any, R]]:
    """A port operation of a backend's facade: the part's function *fn* with its first argument
    (the backend's database or connection) given, its other parameters as they are."""

    def operation(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        return fn(first, *args, **kwargs)

    operation.__name__ = operation.__qualname__ = fn.__name__
    operation.__doc__ = fn.__doc__
    return operation


def refuse_limits(
    specs: Sequence[TaskSpec], backend: str, promises: Promises | None = None
) -> None:
    """For a backend that does not keep some kind of limit yet: refuse, before anything is
    written, a submission with a task that has one (``Promises.concurrency_limits``,
    ``rate_limits``, ``fair_share``; *promises* None: it keeps none)."""
    keeps = promises or Promises()
    for spec in specs:
        if spec.limit_key is None:
            continue
        missing = (
            "concurrency limits"
            if spec.concurrency_limit is not None and not keeps.concurrency_limits
            else "rate limits"
            if spec.rate_limit is not None and not keeps.rate_limits
            else "fair share"
            if spec.fair and not keeps.fair_share
            else None
        )
        if missing is not None:
            raise ConfigError(
                f"the {backend} store does not keep {missing} yet (task type "
                f"{spec.type!r}, limit key {spec.limit_key!r}); use SQLite, or submit "
                "without it"
            )
