"""Every case of the bad-input table in docs/reliability.md, run for real: each gets its
expected exit code (or exception) and message, changes nothing, and its row in the doc is the
row it produces now, so the doc cannot drift from what contend does. After a change of
behaviour or of the cases, rewrite the table with ``scripts/bad-input-table.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.bad_input_table import (
    CASES,
    DOC,
    Case,
    Env,
    doc_rows,
    prepare,
    problems,
    row,
    run_case,
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield prepare(Path(tmp_path_factory.mktemp("bad-input")))


def test_the_table_has_enough_kinds_and_a_row_for_each() -> None:
    assert len(CASES) >= 25
    assert len({c.kind for c in CASES}) == len(CASES), "two cases share a description"
    assert {c.via for c in CASES} == {"CLI", "Python"}
    rows = doc_rows(DOC.read_text())
    assert len(rows) == len(CASES), "run scripts/bad-input-table.py to rewrite the table"


@pytest.mark.parametrize(("number", "case"), list(enumerate(CASES, 1)), ids=[c.kind for c in CASES])
def test_a_case_behaves_as_its_row_says(env: Env, number: int, case: Case) -> None:
    outcome = run_case(env, case)
    assert not problems(env, case, outcome), (problems(env, case, outcome), outcome.output[-3000:])
    rows = doc_rows(DOC.read_text())
    produced = row(number, case, outcome)
    assert number <= len(rows) and rows[number - 1] == produced, (
        f"docs/reliability.md row {number} is not what the case gives now:\n{produced}\n"
        "run scripts/bad-input-table.py to rewrite the table"
    )
