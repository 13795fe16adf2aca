"""The contract suite's state machine can fail: a careless store is caught."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from contend.domain.task import TaskState
from contend.store.memory import MemoryStore
from contend.testing.contract.stateful import StoreMachine

C, R = TaskState.CLAIMED, TaskState.RUNNING


def test_the_model_notices_a_store_that_ignores_fences() -> None:
    """The machine can fail: a store whose complete skips the fence check is caught."""

    original = MemoryStore._owned

    def careless(
        self: MemoryStore,
        expert: str,
        task_id: str,
        fence: int,
        now: float,
        states: Any = frozenset({C, R}),
    ) -> Any:
        row = self._tasks.get(task_id)
        return (
            row
            if row is not None and row.state in (C, R)
            else original(self, expert, task_id, fence, now, states)
        )

    MemoryStore._owned = careless  # type: ignore[method-assign]
    try:
        with pytest.raises(AssertionError):
            run_state_machine_as_test(
                StoreMachine,
                settings=settings(
                    max_examples=1000,  # it stops at the first failure, usually within 20
                    stateful_step_count=40,
                    deadline=None,
                    database=None,
                    derandomize=True,  # the same examples every run: no flaky pass
                    phases=[Phase.generate],  # no need to shrink: only that it fails counts
                    suppress_health_check=[HealthCheck.too_slow],
                ),
            )
    finally:
        MemoryStore._owned = original  # type: ignore[method-assign]
