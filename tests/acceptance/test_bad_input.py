"""Bad input through the real CLI: a clear error naming the problem, exit code 2, store unchanged."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from tests.acceptance.conftest import APP, run_cli

DEEP = "[" * 30_000 + "]" * 30_000  # Python's JSON reader gives up near 1,000 levels
HUGE = "q" * 100_000


def task_rows(db: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT id, state, fence FROM tasks ORDER BY id").fetchall()


@pytest.fixture
def seeded(tmp_path: Path) -> tuple[str, Path]:
    db = tmp_path / "seeded.db"
    url = f"sqlite:///{db}"
    done = run_cli("submit", APP, "echo", "--store", url, "--args", '["hello"]')
    assert done.returncode == 0, done.stderr
    return url, db


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", APP, "no_such_task"], "unknown task type 'no_such_task'"),
        (["submit", APP, "echo", "--args", "[1,"], "--args is not valid JSON"),
        (["submit", APP, "echo", "--args", '{"a": 1}'], "--args must be a JSON array"),
        (["submit", APP, "echo", "--kwargs", "[1]"], "--kwargs must be a JSON object"),
        (["submit", APP, "echo", "--priority", "1000000001"], "--priority must be between"),
        (["submit", APP, "echo", "--priority", "high"], "--priority must be an integer"),
        (["submit", APP, "echo", "--delay", "-5"], "--delay must be between 0"),
        (["submit", APP, "echo", "--delay", "nan"], "--delay must be between 0"),
        (["submit", "no_module_here:app", "echo"], "cannot import module 'no_module_here'"),
        (["submit", "tests.acceptance.sample_app:echo", "echo"], "is not a contend App"),
        (["submit", "just-a-name", "echo"], "MODULE:ATTRIBUTE"),
        (["expert", APP, "--concurrency", "-1"], "--concurrency must be between 1 and 10000"),
        (["expert", APP, "--concurrency", "100000"], "--concurrency must be between 1 and 10000"),
        (["expert", APP, "--lease", "0"], "--lease must be between 0.5"),
        (["expert", APP, "--capability", "mem_gb=lots"], "amount must be a number"),
        (["tasks", "list", "--limit", "0"], "--limit must be between 1"),
        (["expert", APP, "--fitness", "no_such_module:f"], "--fitness: cannot import module"),
        (["expert", APP, "--fitness", "tests.acceptance.sample_app:app"], "is not a function"),
        (["expert", APP, "--prefetch", "-2"], "--prefetch must be between 0 and 10000"),
        # text that is not valid Unicode: a lone surrogate escaped in JSON, or a byte that is
        # not UTF-8 in the command line (Python keeps it as the surrogate U+DCFF)
        (["submit", APP, "echo", "--args", '["\\ud800"]'], "args holds text that is not valid"),
        (["submit", APP, "echo", "--args", '["\udcff"]'], "from the byte 0xFF that is not UTF-8"),
        (["submit", APP, "echo", "--key", "k\udcff"], "idempotency key is not valid Unicode"),
        (["tasks", "show", "\udcff"], "argument id: ID is not valid Unicode"),
        (["submit", APP, "echo", "--args", DEEP], "--args nests arrays or objects more than 200"),
        (["submit", APP, "echo", "--kwargs", '{"a": [NaN]}'], "NaN is not a JSON number"),
        (["submit", APP, "echo", "--args", f"[{'9' * 5000}]"], "--args is not valid JSON"),
        (["submit", APP, "echo", "--queue", ""], "argument --queue: queue must be a non-empty"),
        (["submit", APP, "echo", "--queue", HUGE], "queue must be at most 200 characters"),
        (["expert", APP, "--queue", ""], "argument --queue/-q: queue must be a non-empty"),
        (["expert", APP, "--queue", HUGE], "argument --queue/-q: queue must be at most 200"),
        (["expert", APP, "--name", HUGE], "an expert name must be at most 200 characters"),
        (["tasks", "list", "--queue", ""], "argument --queue: queue must be a non-empty"),
        (["submit", "..relative:app", "echo"], "a module name cannot be relative"),
        (["submit", APP, "echo", "--batch", "-", "--priority", "3"], "cannot be combined"),
    ],
)
def test_bad_option_is_refused_and_changes_nothing(
    seeded: tuple[str, Path], argv: list[str], message: str
) -> None:
    url, db = seeded
    before = task_rows(db)
    done = run_cli(*argv, "--store", url)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr) < 2000  # a 100 KB value is echoed cut short
    assert task_rows(db) == before


@pytest.mark.parametrize("command", [["submit", APP, "echo"], ["status"], ["expert", APP]])
@pytest.mark.parametrize("url", ["", "  "])
def test_an_empty_store_is_refused_not_replaced(
    seeded: tuple[str, Path], command: list[str], url: str
) -> None:
    """``--store ''`` is refused, even where an app or $CONTEND_STORE would supply a store."""
    seeded_url, db = seeded
    before = task_rows(db)
    done = run_cli(*command, "--store", url, env={"CONTEND_STORE": seeded_url})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "argument --store: --store is empty" in done.stderr
    assert task_rows(db) == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"args": ["caf\xe9"]}', "bad.jsonl:2: not valid UTF-8 (byte 0xE9 at byte 15"),
        (b'{"args": ["\\ud800"]}', "bad.jsonl:2: args holds text that is not valid Unicode"),
        (b'{"args": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", "bad.jsonl:2: the line nests"),
        (b'{"args": [NaN]}', "bad.jsonl:2: the line is not valid JSON: NaN is not a JSON"),
        (b'{"queue": ""}', "bad.jsonl:2: queue must be a non-empty string"),
        (b'{"queue": "' + b"q" * 100_000 + b'"}', "bad.jsonl:2: queue must be at most 200"),
        (b'{"key": "a\\u0000b"}', "bad.jsonl:2: idempotency key holds a control character"),
    ],
)
def test_one_bad_line_among_good_ones_refuses_the_batch(
    seeded: tuple[str, Path], tmp_path: Path, line: bytes, message: str
) -> None:
    url, db = seeded
    before = task_rows(db)
    batch = tmp_path / "bad.jsonl"
    batch.write_bytes(b'{"args": [1]}\n' + line + b'\n{"args": [3]}\n')
    done = run_cli("submit", APP, "echo", "--store", url, "--batch", str(batch))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr) < 2000
    assert task_rows(db) == before


def test_oversized_payload_in_a_batch_refuses_the_whole_batch(
    seeded: tuple[str, Path], tmp_path: Path
) -> None:
    url, db = seeded
    before = task_rows(db)
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        json.dumps({"args": ["small"]})
        + "\n"
        + json.dumps({"args": ["x" * (1024 * 1024 + 10)]})
        + "\n"
    )
    done = run_cli("submit", APP, "echo", "--store", url, "--batch", str(batch))
    assert done.returncode == 2
    assert "batch.jsonl:2: args is" in done.stderr
    assert "the limit is 1048576 bytes" in done.stderr
    assert task_rows(db) == before


def test_batch_line_that_is_not_json(seeded: tuple[str, Path], tmp_path: Path) -> None:
    url, db = seeded
    before = task_rows(db)
    batch = tmp_path / "bad.jsonl"
    batch.write_text('{"args": [1]}\n{"args": [2\n')
    done = run_cli("submit", APP, "echo", "--store", url, "--batch", str(batch))
    assert done.returncode == 2
    assert "bad.jsonl:2: the line is not valid JSON" in done.stderr
    assert task_rows(db) == before


def test_batch_submits_every_line(seeded: tuple[str, Path], tmp_path: Path) -> None:
    url, db = seeded
    batch = tmp_path / "ok.jsonl"
    batch.write_text(
        '{"args": [1]}\n{"args": [2], "priority": 3, "key": "k2"}\n\n{"kwargs": {"value": 4}}\n'
    )
    done = run_cli("submit", APP, "echo", "--store", url, "--batch", str(batch))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 3
    again = run_cli("submit", APP, "echo", "--store", url, "--batch", str(batch))
    assert again.returncode == 0, again.stderr
    assert "submitted 0 task(s), 3 already present" in again.stderr  # a rerun adds nothing
    assert again.stdout == done.stdout  # the same tasks, in the file's order
    assert len(task_rows(db)) == 1 + 3


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://host/x.db", "has a host part"),
        ("sqlite:///", "names no file"),
        ("sqlite:///:memory:", "cannot be shared"),
        ("sqlite:///x.db?journal=off", "unknown option"),
        ("mysql://localhost/db", "unknown store URL"),
        ("not a url", "unknown store URL"),
        ("sqlite:///no/such/dir/x.db", "does not exist"),
    ],
)
def test_malformed_store_url(url: str, message: str) -> None:
    done = run_cli("status", "--store", url)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_file_that_is_not_a_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    done = run_cli("submit", APP, "echo", "--args", "[1]", "--store", f"sqlite:///{path}")
    assert done.returncode == 2
    assert "is not an SQLite database" in done.stderr
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_another_programs_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    done = run_cli("status", "--store", f"sqlite:///{path}")
    assert done.returncode == 2
    assert "not a contend store" in done.stderr
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_unknown_task_id(seeded: tuple[str, Path]) -> None:
    url, _ = seeded
    done = run_cli("tasks", "show", "nope", "--store", url)
    assert done.returncode == 2
    assert "no task with id 'nope'" in done.stderr


def test_listing_json_carries_the_promised_fields(seeded: tuple[str, Path]) -> None:
    url, _ = seeded
    done = run_cli("tasks", "list", "--json", "--store", url)
    assert done.returncode == 0, done.stderr
    (task,) = json.loads(done.stdout)
    for field in ("id", "type", "state", "attempts", "fence", "owner", "result", "error"):
        assert field in task
    assert task["state"] == "pending"


@pytest.mark.parametrize(
    "command", [["status"], ["status", "--json"], ["tasks", "list"], ["tasks", "show", "x"]]
)
def test_a_read_only_command_leaves_a_0_byte_file_alone(tmp_path: Path, command: list[str]) -> None:
    """A 0-byte file is no store yet: a command that only reads says so (exit 2) and does not
    make it one; a writer may."""
    path = tmp_path / "empty.db"
    path.touch()
    done = run_cli(*command, "--store", f"sqlite:///{path}")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "is empty: it is not (yet) a contend store" in done.stderr
    assert "Traceback" not in done.stderr
    assert path.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]  # no -wal, no -shm


def test_a_read_only_command_creates_no_file_and_a_writer_does(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    done = run_cli("status", "--store", f"sqlite:///{path}")
    assert done.returncode == 2, done.stderr
    assert "does not exist: it is not (yet) a contend store" in done.stderr
    assert not path.exists()
    path.touch()
    done = run_cli("submit", APP, "echo", "--args", "[1]", "--store", f"sqlite:///{path}")
    assert done.returncode == 0, done.stderr
    done = run_cli("tasks", "list", "--json", "--store", f"sqlite:///{path}")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == 1
