"""The contract suite's state machine can fail: a careless store is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from contend.domain.task import TaskState
from contend.domain.transitions import completed
from contend.store.memory import MemoryStore
from contend.store.port import Completion
from contend.testing.contract import transactions
from contend.testing.contract.stateful import StoreMachine
from tests.contract.backends import memory_harness

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


@pytest.mark.parametrize(
    "test",
    [
        transactions.test_a_transaction_that_outlives_its_lease_is_rolled_back_whole,
        transactions.test_a_transaction_whose_task_was_taken_over_is_rolled_back_whole,
    ],
)
async def test_the_transaction_contract_notices_a_commit_that_checks_no_fence(
    tmp_path: Path, test: Any
) -> None:
    """A memory store whose transactions commit without checking the claim (River's
    ``JobCompleteTx``, in effect) fails the contract's stale-owner tests."""
    original = MemoryStore._commit_values

    def careless(
        self: MemoryStore, expert: str, completion: Completion, reads: Any, writes: Any
    ) -> None:
        for key, text in writes.items():
            self._values[key] = (text, 1)
        row = self._tasks[completion.task_id]
        self._apply(completion.task_id, row, completed(expert, completion.result_json), 0.0)

    MemoryStore._commit_values = careless  # type: ignore[method-assign]
    try:
        async with memory_harness(tmp_path) as h:
            with pytest.raises(AssertionError):
                await test(h)
    finally:
        MemoryStore._commit_values = original  # type: ignore[method-assign]
