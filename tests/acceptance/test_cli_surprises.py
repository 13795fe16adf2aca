"""A CLI that never surprises: each test is one surprise a new user met (issue 15, §5), run on
the real ``contend`` command in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import contend
from contend.domain.task import TaskSpec, TaskState
from contend.store.registry import open_store
from contend.testing.postgres import NoServer, fresh_database, server_url
from tests.acceptance.conftest import APP, ROOT, Experts, cli_env, run_cli, wait_until


def one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """The command failed with one line on stderr, no traceback, holding every one of *words*."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_version_is_the_package_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"contend {contend.__version__}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == contend.__version__


def test_a_task_module_with_a_syntax_error_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "typo_tasks.py").write_text("from contend import App\napp = App(\n  def\n")
    env = {"PYTHONPATH": f"{tmp_path}:{cli_env()['PYTHONPATH']}"}
    done = run_cli("submit", "typo_tasks:app", "echo", "--store", "memory://", env=env)
    assert done.returncode == 2
    one_line_error(done, "SyntaxError", "typo_tasks.py, line 2", "fix it")


def test_a_missing_orjson_with_an_etcd_url_names_the_extra(tmp_path: Path) -> None:
    # orjson made missing: a module of that name that says it is not installed
    (tmp_path / "orjson.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'orjson'\", name='orjson')\n"
    )
    env = {"PYTHONPATH": f"{tmp_path}:{cli_env()['PYTHONPATH']}"}
    done = run_cli("status", "--store", "etcd://127.0.0.1:1", env=env)
    assert done.returncode == 2
    one_line_error(
        done, "needs the 'orjson' package", "pip install 'aetcd>=1.0' 'orjson>=3.9'", "'etcd' extra"
    )


async def test_tasks_list_into_head_stops_quietly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    store = await open_store(url)
    await store.submit([TaskSpec.build("echo", [n]) for n in range(3000)])
    await store.close()
    done = subprocess.run(
        f"{sys.executable} -m contend tasks list --limit 3000 --store {url} | head -n 3",
        shell=True,
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert len(done.stdout.splitlines()) == 3
    assert done.stderr == "", done.stderr  # no BrokenPipeError, no "Exception ignored"


async def test_cancel_of_a_finished_task_is_bad_input(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    task_id = run_cli("submit", APP, "echo", "--args", "[1]", "--store", url).stdout.strip()
    assert run_cli("tasks", "cancel", task_id, "--store", url).returncode == 0
    again = run_cli("tasks", "cancel", task_id, "--store", url)
    assert again.returncode == 2  # like every refused input: nothing changed
    one_line_error(again, f"cannot cancel task {task_id}: it is cancelled")


def test_arguments_that_do_not_fit_are_refused_at_submit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    done = run_cli("submit", APP, "echo", "--args", "[1, 2]", "--store", url)
    assert done.returncode == 2
    one_line_error(done, "arguments do not fit task type echo(value)", "too many positional")
    assert not (tmp_path / "sig.db").exists()  # refused before the store was even opened


def test_args_and_kwargs_from_files(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'files.db'}"
    (tmp_path / "args.json").write_text('[{"big": "' + "x" * 5000 + '"}]')
    (tmp_path / "kw.json").write_text("{}")
    done = run_cli(
        "submit", APP, "echo", "--args", f"@{tmp_path / 'args.json'}",
        "--kwargs", f"@{tmp_path / 'kw.json'}", "--store", url, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(
        run_cli("tasks", "show", json.loads(done.stdout)["id"], "--store", url, "--json").stdout
    )
    assert shown["args"] == [{"big": "x" * 5000}]
    piped = run_cli("submit", APP, "echo", "--args", "@-", "--store", url, input="[7]")
    assert piped.returncode == 0, piped.stderr
    missing = run_cli("submit", APP, "echo", "--args", "@nope.json", "--store", url)
    assert missing.returncode == 2 and "cannot read 'nope.json'" in missing.stderr


def test_submit_takes_requirements_timeout_and_dependencies(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'opts.db'}"
    first = run_cli("submit", APP, "echo", "--args", "[1]", "--store", url).stdout.strip()
    done = run_cli(
        "submit", APP, "echo", "--args", "[2]", "--store", url, "--json",
        "--requirements", '{"tags": ["gpu"], "resources": {"mem_gb": 8}}',
        "--timeout", "2.5", "--depends-on", first,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    task_id = json.loads(done.stdout)["id"]
    task = json.loads(run_cli("tasks", "show", task_id, "--store", url, "--json").stdout)
    assert task["requirements"] == {"tags": ["gpu"], "resources": {"mem_gb": 8}}
    assert (task["timeout"], task["depends_on"], task["state"]) == (2.5, [first], "waiting")


async def test_submit_json_wait_prints_one_document_and_names_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wait.db'}"
    experts = Experts(url, tmp_path)
    try:
        experts.start("waiter")
        store = await open_store(url)

        async def live() -> bool:
            return any(e.alive for e in await store.list_experts())

        await wait_until(live, what="the expert", watch=experts)
        await store.close()
        done = run_cli(
            "submit", APP, "echo", "--args", '["hi"]', "--store", url, "--json", "--wait", "30"
        )
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)  # one document: json.loads refuses two
        assert (doc["state"], doc["result"], doc["error"], doc["created"]) == (
            "succeeded",
            "hi",
            None,
            True,
        )
        assert f"expert waiter started: store={url} " in experts.log("waiter")
    finally:
        experts.stop_all()


def test_submit_wait_with_no_live_expert_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'alone.db'}"
    done = run_cli(
        "submit",
        APP,
        "echo",
        "--args",
        "[1]",
        "--queue",
        "reports",
        "--store",
        url,
        "--wait",
        "0.5",
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "TimeoutError" not in done.stderr, done.stderr
    warning, error = [line for line in done.stderr.splitlines() if line.strip()]
    assert "no live expert serves queue 'reports'" in warning and "waiting 0.5s" in warning
    assert "did not finish within 0.5s (it is pending)" in error
    assert "no live expert serves queue 'reports': start one with `contend expert" in error


async def test_tasks_list_says_when_more_exist_and_shows_created_and_due(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'more.db'}"
    store = await open_store(url)
    await store.submit(
        [TaskSpec.build("echo", [n]) for n in range(4)] + [TaskSpec.build("echo", [9], delay=3600)]
    )
    await store.close()
    some = run_cli("tasks", "list", "--limit", "3", "--store", url)
    assert some.returncode == 0
    assert len(some.stdout.splitlines()) == 2 + 3  # header, rule, three tasks
    assert some.stdout.split()[8:10] == ["created", "due"]
    assert "more exist: raise --limit" in some.stderr
    every = run_cli("tasks", "list", "--store", url)
    assert every.stderr == "" and "in 60.0m" in every.stdout  # the delayed one is due in an hour
    assert run_cli("tasks", "list", "--limit", "5", "--store", url).stderr == ""


async def test_tasks_list_newest_first_of_one_type(tmp_path: Path) -> None:
    """The oldest 100 were all ``tasks list`` could show: a busy store's newest tasks, or one
    type's, never came up."""
    url = f"sqlite:///{tmp_path / 'newest.db'}"
    store = await open_store(url)
    specs = [TaskSpec.build("echo" if n % 2 else "add", [n]) for n in range(8)]
    await store.submit(specs)
    await store.close()
    echo_ids = sorted(t.id for t in specs if t.type == "echo")
    done = run_cli("tasks", "list", "--type", "echo", "--newest", "--limit", "2", "--store", url)
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()[2:]] == echo_ids[::-1][:2]
    assert "(newest first); more exist" in done.stderr and "--type" in done.stderr
    empty = run_cli("tasks", "list", "--type", " ", "--store", url)
    assert empty.returncode == 2 and "--type is empty" in empty.stderr


def test_a_short_id_says_what_an_id_is(tmp_path: Path) -> None:
    """An id cut too short to be a prefix says how many characters name a task; a word that is
    no id's prefix says what ids are (a prefix that is one: tests/acceptance/test_id_prefixes)."""
    url = f"sqlite:///{tmp_path / 'short.db'}"
    task_id = run_cli("submit", APP, "echo", "--args", "[1]", "--store", url).stdout.strip()
    done = run_cli("tasks", "show", task_id[:5], "--store", url)
    assert done.returncode == 2
    one_line_error(done, f"'{task_id[:5]}' is too short to name a task", "at least 6")
    word = run_cli("tasks", "show", task_id[:8] + "x", "--store", url)
    assert word.returncode == 2
    one_line_error(word, f"no task with id '{task_id[:8]}x'", "task ids are 28 hex digits")


def test_the_store_precedence_is_the_same_in_python_and_the_cli(tmp_path: Path) -> None:
    """``--store``, else the app's ``App(url)``, else ``CONTEND_STORE`` — and a
    ``CONTEND_STORE`` that is passed over is said to be."""
    pinned, other, given = (tmp_path / n for n in ("pinned.db", "env.db", "given.db"))
    (tmp_path / "pinned_app.py").write_text(
        "from contend import App\n"
        f"app = App('sqlite:///{pinned}')\n"
        "@app.task\n"
        "def echo(value):\n"
        "    return value\n"
        "if __name__ == '__main__':\n"
        "    print(app.submit_sync('echo', [1]).id)\n"
    )
    env = {
        "PYTHONPATH": f"{tmp_path}:{cli_env()['PYTHONPATH']}",
        "CONTEND_STORE": f"sqlite:///{other}",
    }
    via_cli = run_cli("submit", "pinned_app:app", "echo", "--args", "[1]", env=env)
    assert via_cli.returncode == 0, via_cli.stderr
    assert (
        f"CONTEND_STORE (sqlite:///{other}) is ignored: the app names the store" in via_cli.stderr
    )
    via_python = subprocess.run(
        [sys.executable, str(tmp_path / "pinned_app.py")],
        capture_output=True, text=True, env={**cli_env(), **env}, timeout=60,
    )  # fmt: skip
    assert via_python.returncode == 0, via_python.stderr
    assert "is ignored: the app names the store" in via_python.stderr
    for task_id in (via_cli.stdout.strip(), via_python.stdout.strip()):  # both in the app's store
        found = run_cli("tasks", "show", task_id, "--store", f"sqlite:///{pinned}")
        assert found.returncode == 0, found.stderr
    assert not other.exists()
    flag = run_cli(
        "submit",
        "pinned_app:app",
        "echo",
        "--args",
        "[1]",
        "--store",
        f"sqlite:///{given}",
        env=env,
    )
    assert flag.returncode == 0 and given.exists()


def test_batch_progress_is_shown_when_asked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'batch.db'}"
    batch = tmp_path / "b.jsonl"
    batch.write_text("".join(f'{{"args": [{n}]}}\n' for n in range(2500)))
    done = run_cli("submit", APP, "echo", "--batch", str(batch), "--progress", "--store", url)
    assert done.returncode == 0, done.stderr
    assert "submitting: 1,000/2,500 task(s) (40%" in done.stderr
    assert "submitting: 2,500/2,500 task(s) (100%" in done.stderr
    quiet = run_cli("submit", APP, "echo", "--batch", str(batch), "--store", url)
    assert "submitting:" not in quiet.stderr  # not a terminal, not asked: no progress lines
    assert "submitted 0 task(s), 2500 already present" in quiet.stderr


async def test_a_second_sigint_stops_an_expert_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    store = await open_store(url)
    experts = Experts(url, tmp_path)
    try:
        (spec,) = [TaskSpec.build("slow", [120.0])]
        await store.submit([spec])
        proc = experts.start("stubborn", grace=120)

        async def running() -> bool:
            return (await store.get(spec.id)).state == TaskState.RUNNING

        await wait_until(running, what="the task to run", watch=experts)
        proc.send_signal(signal.SIGINT)

        async def draining() -> bool:
            return "stopping gracefully" in experts.log("stubborn")

        await wait_until(draining, what="the expert to start draining")
        assert proc.poll() is None  # 120 s of grace for the task
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - asked < 10
        task = await store.get(spec.id)
        assert (task.state, task.owner) == (TaskState.PENDING, None)  # released at once
    finally:
        experts.stop_all()
        await store.close()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (
            f"{server_url()}/contend_no_such_database",
            'database "contend_no_such_database" does not exist',
        ),
        ("postgresql://no-such-host.invalid/test", "failed to resolve host 'no-such-host.invalid'"),
    ],
    ids=["no such database", "unknown host"],
)
async def test_postgresql_that_cannot_heal_fails_at_once_with_libpq_reason(
    url: str, reason: str
) -> None:
    try:
        async with fresh_database():  # the server is there
            pass
    except NoServer as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"not under CI and {exc}")
    started = time.monotonic()
    done = run_cli("status", "--store", url)
    took = time.monotonic() - started
    assert done.returncode == 2
    one_line_error(done, "cannot connect to PostgreSQL", reason)
    assert took < 8, took  # no 15 s of retries (a process start is most of this)
