"""The PostgreSQL store applies every part of a decided outcome (no database needed)."""

from __future__ import annotations

from contend.domain.transitions import Attempts, Outcome
from contend.store.postgres.apply import ATTEMPTS_SQL, OUTCOME_FIELDS


def test_every_field_of_an_outcome_reaches_the_statement() -> None:
    """A field the domain adds to Outcome must be written by this store, not dropped."""
    assert set(OUTCOME_FIELDS) == set(Outcome._fields)


def test_every_attempts_change_has_its_sql() -> None:
    assert set(ATTEMPTS_SQL) == set(Attempts)
