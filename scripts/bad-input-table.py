#!/usr/bin/env python3
"""Run every case of the bad-input table and rewrite it in docs/reliability.md.

    PYTHONPATH=src python scripts/bad-input-table.py

The cases live in tests/acceptance/bad_input_table.py; tests/acceptance/test_bad_input_table.py
runs the same cases and fails when a row of the doc is not what its case gives. Exits 1, with
the table left as it was, when a case does not behave as expected.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.acceptance.bad_input_table import (
    CASES,
    DOC,
    prepare,
    problems,
    rewrite,
    row,
    run_case,
)


def main() -> int:
    rows, failed = [], []
    with tempfile.TemporaryDirectory(prefix="contend-bad-input-") as tmp:
        env = prepare(Path(tmp))
        for number, case in enumerate(CASES, 1):
            outcome = run_case(env, case)
            found = problems(env, case, outcome)
            if found:
                failed.append(f"{number}. {case.kind}: {'; '.join(found)}\n   {outcome.message}")
            rows.append(row(number, case, outcome))
            print(f"{number:3} {'FAIL' if found else 'ok  '} {case.kind}", file=sys.stderr)
    if failed:
        print("\n".join(["cases that do not behave as expected:", *failed]), file=sys.stderr)
        return 1
    DOC.write_text(rewrite(DOC.read_text(), rows))
    print(f"wrote {len(rows)} rows to {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
