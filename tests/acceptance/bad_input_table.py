"""The bad-input table of docs/reliability.md: every case, how to run it, and the markdown.

Each case is one kind of bad input given to the real ``contend`` CLI (in a subprocess) or to the
Python API, against an SQLite store seeded with a pending task, a running task and a live
expert. A case records the exit code (or the exception) and the message, and proves that nothing
changed: the store's tasks, their histories and its experts read the same before and after (or,
for a file that is not a contend store, its bytes; for a URL that names no store, the directory).

``tests/acceptance/test_bad_input_table.py`` runs every case, asserts its expectation and that
its row in docs/reliability.md is the one it produces; ``scripts/bad-input-table.py`` rewrites
the table from the same runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contend import After, App
from contend.domain.task import Capabilities, TaskSpec
from contend.runtime.config import ExpertConfig
from contend.store.port import ExpertInfo, Store
from contend.store.registry import open_store

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
APP = "tests.acceptance.sample_app:app"
START = "<!-- bad-input-table: start (scripts/bad-input-table.py writes this) -->"
END = "<!-- bad-input-table: end -->"

HUGE = "q" * 100_000
DEEP = "[" * 30_000 + "]" * 30_000
HOLDER = "holder"  # the live expert of the seeded store; it owns the running task


# -- the seeded store ----------------------------------------------------------------------------
@dataclass
class Env:
    """A work directory with a seeded store and the files the cases read."""

    dir: Path
    url: str
    pending: str = ""  # a pending task's id
    running: str = ""  # a running task's id, held by HOLDER under a one-hour lease

    def subst(self, text: str) -> str:
        """*text* with ``{store}``, ``{dir}``, ``{pending}`` and ``{running}`` filled in."""
        for name, value in (
            ("store", self.url),
            ("dir", str(self.dir)),
            ("pending", self.pending),
            ("running", self.running),
        ):
            text = text.replace("{" + name + "}", value)
        return text


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


BATCHES: dict[str, bytes] = {
    # three good lines around one bad line
    "utf8.jsonl": b'{"args": [1]}\n{"args": ["caf\xe9"]}\n{"args": [3]}\n',
    "notjson.jsonl": b'{"args": [1]}\n{"args": [2\n{"args": [3]}\n',
    "oversize.jsonl": b'{"args": [1]}\n{"args": ["' + b"x" * (1024 * 1024 + 10) + b'"]}\n',
    "deep.jsonl": b'{"args": [1]}\n{"args": ' + DEEP.encode() + b"}\n",
    "surrogate.jsonl": b'{"args": [1]}\n{"args": ["\\ud800"]}\n',
    "field.jsonl": b'{"args": [1]}\n{"args": [2], "priorty": 5}\n',
    "array.jsonl": b'{"args": [1]}\n[2]\n',
    "queue.jsonl": b'{"args": [1]}\n{"queue": ""}\n',
    "nan.jsonl": b'{"args": [1]}\n{"args": [NaN]}\n',
}


def prepare(workdir: Path) -> Env:
    """Write the files and seed the store the cases run against."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = Env(workdir, f"sqlite:///{workdir / 'store.db'}")
    for name, data in BATCHES.items():
        (workdir / name).write_bytes(data)
    (workdir / "broken_app.py").write_text("from contend import App\napp = App(\n  def\n")
    (workdir / "raising_app.py").write_text("import os\n\nSETTING = os.environ['CONFIG']\n")
    (workdir / "notes.db").write_text("these are my notes, not a database\n" * 50)
    (workdir / "empty.db").touch()
    with sqlite3.connect(workdir / "other.db") as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    asyncio.run(_seed(env))
    return env


async def _seed(env: Env) -> None:
    store = await open_store(env.url)
    try:
        info = ExpertInfo(id=HOLDER, queues=("default",), capacity=1, host="box", pid=1)
        session = await store.register_expert(info, 3600)
        (running,) = await store.submit([TaskSpec.build("slow", [60])])
        await store.claim(HOLDER, session, ["default"], Capabilities(), limit=1, lease_ttl=3600)
        (pending,) = await store.submit([TaskSpec.build("echo", ["hello"])])
        env.running, env.pending = running.id, pending.id
    finally:
        await store.close()


async def snapshot(url: str) -> str:
    """Everything a case could have changed, as one JSON text: every task with its history,
    every expert."""
    store = await open_store(url)
    try:
        tasks = [
            (await store.get(t.id, history=True)).to_json()
            for t in await store.list_tasks(limit=10_000)
        ]
        experts = [e.to_json() for e in await store.list_experts()]
    finally:
        await store.close()
    return json.dumps({"tasks": tasks, "experts": experts}, sort_keys=True)


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- the cases ---------------------------------------------------------------------------------
PythonCall = Callable[[Env, App], Awaitable[object]]


@dataclass(frozen=True)
class Case:
    """One kind of bad input. ``argv`` (after ``contend``; ``{store}``, ``{dir}``,
    ``{pending}`` and ``{running}`` are filled in) runs the CLI; ``call`` the Python API."""

    kind: str  # the row's description, markdown
    expect: str  # a part of the message
    code: int | str = 2  # the exit code, or the name of the exception the call raises
    argv: Sequence[str] = ()
    call: PythonCall | None = None
    proof: str = "store"  # "store", "file:NAME" or "dir"
    stdin: str | None = None

    @property
    def via(self) -> str:
        return "Python" if self.call is not None else "CLI"


def cli(kind: str, expect: str, *argv: str, code: int = 2, **more: Any) -> Case:
    return Case(kind, expect, code, argv, **more)


def py(kind: str, expect: str, error: str, call: PythonCall, **more: Any) -> Case:
    return Case(kind, expect, error, call=call, **more)


async def _submit(app: App, *args: Any, **options: Any) -> object:
    return await app.submit(*args, **options)


async def _submit_many_one_bad(env: Env, app: App) -> object:
    good = [app.build_spec("echo", [i]) for i in range(3)]
    bad = app.build_spec("echo", [4], depends_on=["no-such-task"])
    return await app.submit_many([*good, bad])


async def _store_call(env: Env, fn: Callable[[Store], Awaitable[object]]) -> object:
    store = await open_store(env.url)
    try:
        return await fn(store)
    finally:
        await store.close()


S = "--store"
STORE = "{store}"
SQL = "x' OR '1'='1"
DROP = "'; DROP TABLE tasks; --"

CASES: list[Case] = [
    # -- task types and payloads
    cli("unknown task type", "unknown task type 'no_such_task'", "submit", APP, "no_such_task", S, STORE),
    cli("`--args` that is not JSON", "--args is not valid JSON", "submit", APP, "echo", "--args", "[1,", S, STORE),
    cli("`--args` with `NaN`", "NaN is not a JSON number", "submit", APP, "echo", "--args", "[NaN]", S, STORE),
    cli("`--args` an object, not an array", "--args must be a JSON array", "submit", APP, "echo", "--args", '{"a": 1}', S, STORE),
    cli("`--kwargs` with a 5,000-digit integer", "--kwargs is not valid JSON", "submit", APP, "echo", "--kwargs", '{"n": ' + "9" * 5000 + "}", S, STORE),
    cli("`--args` nested 30,000 deep", "more than 200 levels deep", "submit", APP, "echo", "--args", DEEP, S, STORE),
    cli("`--args '[\"\\ud800\"]'`: a lone surrogate", "not valid Unicode", "submit", APP, "echo", "--args", '["\\ud800"]', S, STORE),
    cli("a byte that is not UTF-8 (0xFF) in `--args`", "from the byte 0xFF that is not UTF-8", "submit", APP, "echo", "--args", '["\udcff"]', S, STORE),
    cli("a byte that is not UTF-8 in a task id", "ID is not valid Unicode", "tasks", "show", "\udcff", S, STORE),
    cli("`--args` that do not fit the function", "arguments do not fit task type echo(value): too many positional arguments", "submit", APP, "echo", "--args", "[1, 2]", S, STORE),
    cli("`--kwargs` naming no parameter", "got an unexpected keyword argument 'valu'", "submit", APP, "echo", "--args", "[1]", "--kwargs", '{"valu": 1}', S, STORE),
    cli("`--args @FILE` with no such file", "--args: cannot read 'missing.json'", "submit", APP, "echo", "--args", "@missing.json", S, STORE),
    cli("`--requirements 5`", "--requirements must be a JSON array or object", "submit", APP, "echo", "--requirements", "5", S, STORE),
    cli("`--timeout 0`", "--timeout must be between 0.001", "submit", APP, "echo", "--timeout", "0", S, STORE),
    cli("`--depends-on` an unknown task", "unknown dependencies: nope", "submit", APP, "echo", "--args", "[1]", "--depends-on", "nope", S, STORE),
    cli("an app module with a syntax error", "SyntaxError: '(' was never closed (DIR/broken_app.py, line 2); fix it and run again", "submit", "broken_app:app", "echo", S, STORE),
    cli("an app module that raises when imported", "importing it raised KeyError: 'CONFIG' (DIR/raising_app.py, line 3)", "submit", "raising_app:app", "echo", S, STORE),
    # -- batch files: one bad line among good ones refuses the file
    cli("batch: a line that is not UTF-8", "utf8.jsonl:2: not valid UTF-8", "submit", APP, "echo", "--batch", "{dir}/utf8.jsonl", S, STORE),
    cli("batch: a line that is not JSON", "notjson.jsonl:2: the line is not valid JSON", "submit", APP, "echo", "--batch", "{dir}/notjson.jsonl", S, STORE),
    cli("batch: a line over the 1 MiB payload limit", "oversize.jsonl:2: args is 1048590 bytes", "submit", APP, "echo", "--batch", "{dir}/oversize.jsonl", S, STORE),
    cli("batch: a line nested 30,000 deep", "deep.jsonl:2: the line nests", "submit", APP, "echo", "--batch", "{dir}/deep.jsonl", S, STORE),
    cli("batch: a lone surrogate in a line", "surrogate.jsonl:2: args holds text that is not valid Unicode", "submit", APP, "echo", "--batch", "{dir}/surrogate.jsonl", S, STORE),
    cli("batch: a line with `NaN`", "nan.jsonl:2: the line is not valid JSON", "submit", APP, "echo", "--batch", "{dir}/nan.jsonl", S, STORE),
    cli("batch: an unknown field (a typo)", "field.jsonl:2: unknown field(s) ['priorty']", "submit", APP, "echo", "--batch", "{dir}/field.jsonl", S, STORE),
    cli("batch: a line that is not an object", "array.jsonl:2: each line must be a JSON object", "submit", APP, "echo", "--batch", "{dir}/array.jsonl", S, STORE),
    cli("batch: an empty queue in a line", "queue.jsonl:2: queue must be a non-empty string", "submit", APP, "echo", "--batch", "{dir}/queue.jsonl", S, STORE),
    cli("batch: no such file", "cannot read batch file", "submit", APP, "echo", "--batch", "{dir}/missing.jsonl", S, STORE),
    cli("batch: a dependency edge with `if_failed` not a choice", "-:1: if_failed must be one of fail, cancel, run, got 'skip'", "submit", APP, "echo", "--batch", "-", S, STORE, stdin='{"depends_on": [{"id": "x", "if_failed": "skip"}]}\n'),
    cli("`--batch` with `--priority` (ignored before)", "--priority cannot be combined with --batch", "submit", APP, "echo", "--batch", "-", "--priority", "3", S, STORE, stdin='{"args": [1]}\n'),
    # -- absurd options
    cli("`--priority` of a billion", "--priority must be between -1000000 and 1000000", "submit", APP, "echo", "--priority", "1000000001", S, STORE),
    cli("`--priority high`", "--priority must be an integer", "submit", APP, "echo", "--priority", "high", S, STORE),
    cli("`--delay nan`", "--delay must be between 0", "submit", APP, "echo", "--delay", "nan", S, STORE),
    cli("`--wait 0`", "--wait must be between 0.001", "submit", APP, "echo", "--wait", "0", S, STORE),
    cli("`expert --concurrency 0`", "--concurrency must be between 1 and 10000", "expert", APP, "--concurrency", "0", S, STORE),
    cli("`expert --lease 0`", "--lease must be between 0.5", "expert", APP, "--lease", "0", S, STORE),
    cli("`expert --capability mem_gb=lots`", "amount must be a number", "expert", APP, "--capability", "mem_gb=lots", S, STORE),
    cli("`expert --fitness` that is not a function", "is not a function", "expert", APP, "--fitness", APP, S, STORE),
    cli("`tasks list --limit 0`", "--limit must be between 1", "tasks", "list", "--limit", "0", S, STORE),
    cli("`supervise -n 0`", "--experts must be between 1 and 256", "supervise", "-n", "0", APP, S, STORE),
    cli("`supervise` on a memory:// store", "a memory:// store lives in one process", "supervise", APP, S, "memory://"),
    cli("`supervise --lease 0`: refused once, not per expert", "--lease must be between 0.5", "supervise", "-n", "4", APP, "--lease", "0", S, STORE),
    cli("an app that is not MODULE:APP", "MODULE:ATTRIBUTE", "submit", "just-a-name", "echo", S, STORE),
    cli("an app module that does not exist", "cannot import module 'no_module_here'", "submit", "no_module_here:app", "echo", S, STORE),
    cli("a relative app module", "a module name cannot be relative", "submit", "..tasks:app", "echo", S, STORE),
    # -- empty and huge names
    cli("`--store ''`", "argument --store: --store is empty", "submit", APP, "echo", S, ""),
    cli("`--queue ''` on submit", "argument --queue: queue must be a non-empty string", "submit", APP, "echo", "--queue", "", S, STORE),
    cli("`--queue ''` on expert", "argument --queue/-q: queue must be a non-empty string", "expert", APP, "--queue", "", S, STORE),
    cli("a 100 KB queue name on submit", "queue must be at most 200 characters", "submit", APP, "echo", "--queue", HUGE, S, STORE),
    cli("a 100 KB queue name on expert", "queue must be at most 200 characters", "expert", APP, "--queue", HUGE, S, STORE),
    cli("a 100 KB expert name", "an expert name must be at most 200 characters", "expert", APP, "--name", HUGE, S, STORE),
    cli("a 100 KB task id", "no task with id 'qqqq", "tasks", "show", HUGE, S, STORE),
    cli("a 100 KB `--tier`", "invalid choice", "expert", APP, "--tier", HUGE, S, STORE),
    # -- SQL metacharacters are values, never SQL
    cli("SQL in a task id", "no task with id", "tasks", "show", SQL, S, STORE),
    cli("SQL in `tasks list --queue`: lists nothing", "[]", "tasks", "list", "--queue", DROP, "--json", S, STORE, code=0),
    cli("SQL in a task type", "unknown task type", "submit", APP, "echo" + DROP, S, STORE),
    # -- store URLs and files that are not contend stores
    cli("an SQLite URL with a host", "has a host part", "status", S, "sqlite://host/x.db", proof="dir"),
    cli("`sqlite:/x.db`: one slash (read as a relative x.db before)", "needs three slashes", "submit", APP, "echo", "--args", "[1]", S, "sqlite:/x.db", proof="dir"),
    cli("an unknown URL scheme", "unknown store URL", "status", S, "mysql://localhost/db", proof="dir"),
    cli("not a URL", "unknown store URL", "status", S, "not a url", proof="dir"),
    cli("an unknown URL option", "unknown option", "status", S, "sqlite:///{dir}/x.db?journal=off", proof="dir"),
    cli("a directory that does not exist", "does not exist", "status", S, "sqlite:///{dir}/no/such/x.db", proof="dir"),
    cli("a text file given as the store", "is not an SQLite database", "submit", APP, "echo", "--args", "[1]", S, "sqlite:///{dir}/notes.db", proof="file:notes.db"),
    cli("another program's SQLite file", "not a contend store", "status", S, "sqlite:///{dir}/other.db", proof="file:other.db"),
    # -- ids and states
    cli("`tasks show` of a missing id", "no task with id 'nope'", "tasks", "show", "nope", S, STORE),
    cli("`tasks retry` of a missing id", "no task with id 'nope'", "tasks", "retry", "nope", S, STORE),
    cli("`tasks cancel` of a missing id", "no task with id 'nope'", "tasks", "cancel", "nope", S, STORE),
    cli("`tasks retry` of a running task", "cannot retry task {running}: it is running", "tasks", "retry", "{running}", S, STORE),
    cli("`tasks retry` of a pending task", "cannot retry task {pending}: it is pending", "tasks", "retry", "{pending}", S, STORE),
    cli("`tasks show` of an id prefix too short", "'01a2' is too short to name a task", "tasks", "show", "01a2", S, STORE),
    cli("`tasks cancel` of an id prefix no task has", "no task id starts with 'abcdef'", "tasks", "cancel", "abcdef", S, STORE),
    cli("`submit --depends-on` an id prefix no task has", "no task id starts with 'abcdef'", "submit", APP, "echo", "--args", "[1]", "--depends-on", "abcdef", S, STORE),
    cli("`prune` with an age that is not one", "is not an age", "prune", "--older-than", "7x", S, STORE),
    cli("`prune` with a batch of 0", "--batch must be from 1 to 100,000", "prune", "--older-than", "7d", "--batch", "0", S, STORE),
    cli("`prune` of a store that does not exist", "does not exist", "prune", "--older-than", "7d", S, "sqlite:///{dir}/none.db", proof="dir"),
    cli("an expert name that is live elsewhere", "expert id 'holder' is live elsewhere", "expert", APP, "--name", HOLDER, S, STORE, code=1),
    # -- the Python API
    py("`TaskSpec.build` with a lone surrogate", "not valid Unicode", "PayloadError", lambda env, app: _build(["\ud800"])),
    py("`app.submit` with a lone surrogate", "not valid Unicode", "PayloadError", lambda env, app: _submit(app, "echo", ["\ud800"])),
    py("`app.submit` nested 30,000 deep", "more than 200 levels deep", "PayloadError", lambda env, app: _submit(app, "echo", [_nested(30_000)])),
    py("`app.submit` of an unknown type", "unknown task type 'nope'", "UnknownTaskType", lambda env, app: _submit(app, "nope")),
    py("`app.submit` with `nan`", "not JSON-serialisable", "PayloadError", lambda env, app: _submit(app, "echo", [float("nan")])),
    py("`app.submit` of a Python object", "not JSON-serialisable", "PayloadError", lambda env, app: _submit(app, "echo", [object()])),
    py("`app.submit` of 2 MiB", "the limit is 1048576 bytes", "PayloadError", lambda env, app: _submit(app, "echo", ["x" * 2**21])),
    py("`app.submit(queue='')`", "queue must be a non-empty string", "TaskError", lambda env, app: _submit(app, "echo", queue="")),
    py("`app.submit` with a 100 KB key", "idempotency key must be at most 500", "TaskError", lambda env, app: _submit(app, "echo", key=HUGE)),
    py("`app.submit` with an unknown dependency", "no-such-task", "DependencyError", lambda env, app: _submit(app, "echo", depends_on=["no-such-task"])),
    py("`After(id, if_failed='skip')` in `depends_on`", "if_failed must be one of fail, cancel, run, got 'skip'", "TaskError", lambda env, app: _submit(app, "echo", depends_on=[After("x", if_failed="skip")])),
    py("`app.submit_many`: one bad spec among good ones", "no-such-task", "DependencyError", _submit_many_one_bad),
    py("`app.submit` with args that do not fit", "arguments do not fit task type echo(value=None): too many positional arguments", "TaskError", lambda env, app: _submit(app, "echo", [1, 2])),
    py("`memory_limit` without `isolation='process'`", "needs isolation='process'", "ConfigError", lambda env, app: _call(app.task(name="hog", memory_limit="1GiB"), print)),
    py("`App('')`", "a store URL must be a non-empty string", "ConfigError", lambda env, app: _call(App, "")),
    py("`ExpertConfig(queues=[''])`", "queue must be a non-empty string", "ConfigError", lambda env, app: _call(ExpertConfig(queues=[""]).validate)),
    py("`ExpertConfig(concurrency=0)`", "concurrency must be between 1 and 10000", "ConfigError", lambda env, app: _call(ExpertConfig(concurrency=0).validate)),
    py("`store.retry` of a running task", "it is running", "InvalidTransition", lambda env, app: _store_call(env, lambda s: s.retry(env.running))),
    py("`store.get` of a missing id", "no task with id 'nope'", "TaskNotFound", lambda env, app: _store_call(env, lambda s: s.get("nope"))),
    # -- a read-only command given a file that is no store yet: refused, the file left as it is
    cli("a 0-byte file given to `status`", "'empty.db' is empty: it is not (yet) a contend store", "status", S, "sqlite:///empty.db", proof="file:empty.db"),
    cli("a 0-byte file given to `tasks list`", "'empty.db' is empty: it is not (yet) a contend store", "tasks", "list", S, "sqlite:///empty.db", proof="file:empty.db"),
    cli("a store file that does not exist, to `tasks show`", "does not exist: it is not (yet) a contend store", "tasks", "show", "nope", S, "sqlite:///{dir}/absent.db", proof="dir"),
]  # fmt: skip


async def _build(args: list[Any]) -> object:
    return TaskSpec.build("echo", args)


async def _call(fn: Callable[..., object], *args: Any) -> object:
    return fn(*args)


# -- running a case ------------------------------------------------------------------------------
@dataclass
class Outcome:
    code: int | str  # the exit code, or the exception's class name ("returned" if none)
    message: str  # the message, with the work directory and the seeded ids made generic
    unchanged: bool
    proof: str  # what was compared, in words
    output: str = field(default="", repr=False)  # everything printed, for a failure report


def _cli_env() -> dict[str, str]:
    env = dict(os.environ)
    # absolute: the CLI runs in the work directory, where a relative entry (src) names nothing
    given = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *given])
    env.pop("CONTEND_STORE", None)
    return env


def _generic(env: Env, text: str) -> str:
    text = text.replace(str(env.dir), "DIR")
    for task_id, name in ((env.running, "RUNNING_ID"), (env.pending, "PENDING_ID")):
        if task_id:
            text = text.replace(task_id, name)
    return re.sub(r"pid \d+", "pid PID", text)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _run_cli(env: Env, case: Case) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "contend", *(env.subst(a) for a in case.argv)],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        env=_cli_env(),
        cwd=env.dir,
        input=case.stdin,
        timeout=60,
    )
    message = _last_line(done.stderr) if done.returncode else done.stdout.strip()
    return done.returncode, message, done.stdout + done.stderr


async def _run_python(env: Env, case: Case) -> tuple[str, str, str]:
    assert case.call is not None
    app = App(env.url)

    @app.task
    def echo(value: Any = None) -> Any:
        return value

    try:
        await case.call(env, app)
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        return type(exc).__name__, message, message
    finally:
        await app.aclose()
    return "returned", "(no error)", ""


def _fingerprint(env: Env, proof: str) -> Any:
    if proof == "store":
        return asyncio.run(snapshot(env.url))
    if proof == "dir":
        return _listing(env.dir)
    name = proof.removeprefix("file:")
    return hashlib.sha256((env.dir / name).read_bytes()).hexdigest()


def _proof_words(env: Env, proof: str) -> str:
    if proof == "store":
        data = json.loads(asyncio.run(snapshot(env.url)))
        events = sum(len(t["history"]) for t in data["tasks"])
        counts = (len(data["tasks"]), "task"), (events, "event"), (len(data["experts"]), "expert")
        return "store unchanged: " + ", ".join(f"{n} {w}{'' if n == 1 else 's'}" for n, w in counts)
    if proof == "dir":
        return "no file created"
    return f"`{proof.removeprefix('file:')}` unchanged, byte for byte"


def run_case(env: Env, case: Case) -> Outcome:
    before = _fingerprint(env, case.proof)
    code: int | str
    if case.call is not None:
        code, message, output = asyncio.run(_run_python(env, case))
    else:
        code, message, output = _run_cli(env, case)
    unchanged = _fingerprint(env, case.proof) == before
    proof = _proof_words(env, case.proof) if unchanged else "**changed**"
    return Outcome(code, _generic(env, message), unchanged, proof, _generic(env, output))


def problems(env: Env, case: Case, outcome: Outcome) -> list[str]:
    """What is wrong with an outcome: an empty list when the case behaves as it should."""
    found = []
    if outcome.code != case.code:
        found.append(f"exit {outcome.code}, expected {case.code}")
    want = _generic(env, env.subst(case.expect))
    if want not in outcome.message:
        found.append(f"{want!r} is not in the message")
    if "Traceback" in outcome.output:
        found.append("a traceback")
    if len(outcome.message) > 400:
        found.append(f"a message of {len(outcome.message)} characters")
    if not outcome.unchanged:
        found.append(f"the {case.proof} changed")
    return found


# -- the markdown -----------------------------------------------------------------------------------
HEADER = "| # | bad input | via | exit | message | proof |\n|---|---|---|---|---|---|"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def row(number: int, case: Case, outcome: Outcome) -> str:
    code = f"`{outcome.code}`" if isinstance(outcome.code, int) else f"raises `{outcome.code}`"
    return (
        f"| {number} | {_cell(case.kind)} | {case.via} | {code} | "
        f"`{_cell(outcome.message).replace('`', chr(39))}` | {outcome.proof} |"
    )


def table(rows: Sequence[str]) -> str:
    return "\n".join([START, HEADER, *rows, END])


def doc_rows(text: str) -> list[str]:
    """The rows of the table in the doc's *text*."""
    if START not in text or END not in text:
        return []
    inner = text[text.index(START) + len(START) : text.index(END)]
    return [line for line in inner.strip().splitlines()[2:]]


def rewrite(text: str, rows: Sequence[str]) -> str:
    """*text* with its table replaced by *rows*."""
    return text[: text.index(START)] + table(rows) + text[text.index(END) + len(END) :]
