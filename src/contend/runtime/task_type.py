"""A task type: a registered function with what its tasks carry (queue, retries, limits,
isolation), and the checks made of its arguments before anything is written."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from contend.domain.limits import Rate
from contend.domain.retry import RetryPolicy
from contend.domain.task import JSON, Requirements
from contend.errors import ConfigError, TaskError, shown
from contend.runtime.isolation import can_limit_memory, import_path


@dataclass(frozen=True)
class TaskType:
    """A registered task function with its defaults."""

    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None
    requirements: Requirements = field(default_factory=Requirements)
    priority: int = 0
    pass_context: bool = False
    mode: str = "race"
    isolation: str | None = None  # "process": run in a child process, killed to stop it
    memory_limit: int | None = None  # bytes of resident memory the child may use
    #: A pipeline stage's next stage: the run's output goes there, forward_batch a task.
    forward_to: str | None = None
    forward_batch: int = 0
    #: At most this many of its tasks of one limit key claimed or running at once; the key
    #: is *limit_key* formatted with the task's arguments (default: the type's name).
    concurrency_limit: int | None = None
    limit_key: str | None = None
    #: Its tasks of one limit key start at most at this rate, across all experts.
    rate_limit: Rate | None = None
    #: Claims share the slots of its queue fairly among its limit keys.
    fair: bool = False

    signature: inspect.Signature | None = field(default=None, compare=False, repr=False)

    def check_arguments(self, args: Sequence[JSON], kwargs: Mapping[str, JSON]) -> None:
        """Refuse, before anything is written, args and kwargs that do not fit the function's
        signature (they would fail every attempt at run time)."""
        sig = self.signature
        if sig is None:
            return
        if self.wants_parents:
            if "parents" in kwargs:
                raise TaskError(
                    f"task type {shown(self.name)} gets 'parents' from its dependencies' "
                    "results: do not pass it"
                )
            kwargs = {**kwargs, "parents": []}
        try:
            sig.bind(*((None,) if self.pass_context else ()), *args, **kwargs)
        except TypeError as exc:
            params = list(sig.parameters.values())[1 if self.pass_context else 0 :]
            bare = [p.replace(annotation=inspect.Parameter.empty) for p in params]
            shape = f"{self.name}({', '.join(str(p) for p in bare)})"
            raise TaskError(f"arguments do not fit task type {shape}: {exc}") from None

    @property
    def limited(self) -> bool:
        """Whether its tasks carry a limit key: a concurrency limit, a rate limit or fair share."""
        return self.concurrency_limit is not None or self.rate_limit is not None or self.fair

    def limit_key_of(self, args: Sequence[JSON], kwargs: Mapping[str, JSON]) -> str | None:
        """The limit key of a task of this type with these arguments (None: no limit)."""
        if not self.limited:
            return None
        template = self.limit_key or self.name
        if "{" not in template:
            return template
        values: dict[str, Any] = dict(kwargs)
        if self.signature is not None:
            try:
                bound = self.signature.bind(
                    *((None,) if self.pass_context else ()), *args, **kwargs
                )
            except TypeError:
                bound = None
            if bound is not None:
                bound.apply_defaults()
                values = dict(bound.arguments)
        try:
            return template.format_map(values)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise TaskError(
                f"limit key {template!r} of task type {shown(self.name)} cannot be made from "
                f"the task's arguments ({type(exc).__name__}: {exc})"
            ) from None

    # read for every run: worked out once (a frozen dataclass keeps a __dict__ for these)
    @cached_property
    def wants_parents(self) -> bool:
        """A parameter named ``parents``: it gets the results of the task's dependencies."""
        return self.signature is not None and "parents" in self.signature.parameters

    @cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def target(self) -> str:
        """The function's import path, ``module:qualname``."""
        return import_path(self.fn)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "k": 2**10, "m": 2**20, "g": 2**30})
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")


def memory_limit_of(name: str, limit: object, isolation: str | None) -> int | None:
    """A task type's ``memory_limit`` in bytes: an integer, or text such as ``"512MiB"``."""
    if limit is None:
        return None
    what = f"memory_limit of {shown(name)}"
    if isolation != "process":
        raise ConfigError(
            f"{what} needs isolation='process': only a task in a process of its own can be "
            "stopped when it uses too much memory"
        )
    if isinstance(limit, str):
        m = _SIZE.fullmatch(limit.lower())
        if m is None or m.group(2) not in _UNITS:
            raise ConfigError(
                f"{what} must be bytes or a size like '512MiB' or '2GB', got {shown(limit)}"
            )
        limit = int(float(m.group(1)) * _UNITS[m.group(2)])
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 16 * 2**20:
        raise ConfigError(f"{what} must be at least 16 MiB, got {shown(limit)}")
    if not can_limit_memory():
        raise ConfigError(f"{what}: this system does not let contend read a process's memory")
    return limit


def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some callables have none Python can read
        return None


def wants_context(fn: Callable[..., Any]) -> bool:
    params = list(inspect.signature(fn).parameters.values())
    return bool(params) and params[0].name == "ctx"
