"""The dashboard end to end in a real headless Chromium (Debian's ``chromium``, driven by the
``playwright`` package; ``scripts/install-chromium.sh`` installs it), against a real SQLite
store with real expert processes: a bad token is refused, the pages load, live numbers change
as tasks finish without a reload, and the cancel and retry buttons work. Screenshots go to
``tests/acceptance/screenshots/`` (not committed; docs/dashboard.png is one of them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from contend.domain.task import TaskSpec, TaskState
from tests.acceptance.conftest import ROOT, Experts, cli_env
from tests.acceptance.web import (
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    need_browser,
    on_store,
    wait_http,
)

SHOTS = Path(__file__).parent / "screenshots"
TOKEN = "browser-test-token"


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, str, Experts, int]]:
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    port, metrics_port = free_port(), free_port()
    on_store(url, lambda s: s.submit([TaskSpec.build("echo", ["warm-up"])]))  # makes the file
    experts = Experts(url, tmp_path)
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "contend", "dashboard", "--store", url, "--port", str(port)],
        stdout=log,
        stderr=log,
        env={**cli_env(), "CONTEND_DASHBOARD_TOKEN": TOKEN},
        cwd=ROOT,
    )
    log.close()
    try:
        experts.start("e1", "--metrics-port", str(metrics_port), concurrency=2, lease=3.0)
        experts.start("e2", concurrency=2, lease=3.0)
        wait_http(f"http://127.0.0.1:{port}/login")
        yield url, f"http://127.0.0.1:{port}", experts, metrics_port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        experts.stop_all()
        print((tmp_path / "dashboard.log").read_text(errors="replace")[-2000:])


def test_the_dashboard_in_a_real_browser(dashboard: tuple[str, str, Experts, int]) -> None:
    sync_playwright = need_browser()
    url, base, experts, metrics_port = dashboard
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(20_000)
            # a bad token is refused, the right one opens the dashboard
            page.goto(base + "/")
            assert page.url.endswith("/login")
            page.fill("#token", "not-the-token")
            page.click("button[type=submit]")
            assert "that token is not right" in page.inner_text("main")
            page.screenshot(path=str(SHOTS / "refused.png"))
            page.goto(base + "/experts")
            assert page.url.endswith("/login")  # still outside
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("text=tasks finished per second")

            # the experts are there; numbers change as tasks finish, without a reload
            page.goto(base + "/experts")
            page.wait_for_selector("#experts >> text=e1")
            assert "e2" in page.inner_text("#experts")
            page.goto(base + "/")
            done = page.locator('[data-live="total:succeeded"]')
            page.wait_for_function("() => document.body.getAttribute('data-refreshed') !== null")
            before = int(done.inner_text())
            specs = [TaskSpec.build("slow", [0.2]) for _ in range(40)]
            on_store(url, lambda s: s.submit(specs))
            page.wait_for_function(
                f"() => Number(document.querySelector('[data-live=\"total:succeeded\"]')"
                f".textContent) >= {before + 40}",
                timeout=60_000,
            )
            page.wait_for_function(
                "() => document.querySelector('svg[data-series=throughput] path') !== null"
            )
            page.screenshot(path=str(SHOTS / "overview.png"))
            experts.check_alive()

            # why not running, then cancel and retry by clicking
            later = TaskSpec.build("echo", ["later"], delay=3600)
            on_store(url, lambda s: s.submit([later]))
            page.goto(f"{base}/tasks?state=pending")
            assert "due in" in page.inner_text("#tasks")
            page.click(f"a[href='/tasks/{later.id}']")
            assert "due_later" in page.inner_text("#why")
            page.click("#cancel-button")
            page.wait_for_selector("text=cancel: the task is now cancelled")
            page.click("#retry-button")
            # due at once after a retry: an expert may claim it (even finish it) before the
            # store's answer is read back, as one did 6 ms after the retry in a loaded run
            page.wait_for_selector("text=retry: the task is now")
            note = page.inner_text(".flash")
            assert re.fullmatch(r"retry: the task is now (pending|running|succeeded)", note), note
            # retried, it is due at once: an expert runs it
            deadline = time.monotonic() + 30
            while (got := on_store(url, lambda s: s.get(later.id, history=True))).state != (
                TaskState.SUCCEEDED
            ):
                assert time.monotonic() < deadline, got
                time.sleep(0.1)
            events = [e.event for e in got.history]
            assert events[events.index("cancelled") :][:2] == ["cancelled", "retried"]
            page.reload()
            assert "succeeded" in page.inner_text("#facts")
            page.screenshot(path=str(SHOTS / "task.png"), full_page=True)

            # a task's progress, as ctx.progress reported it
            reporting = TaskSpec.build("report", [3])
            on_store(url, lambda s: s.submit([reporting]))
            page.goto(f"{base}/tasks/{reporting.id}")
            deadline = time.monotonic() + 30
            while "3 of 3" not in (page.inner_text("#facts")):
                assert time.monotonic() < deadline, page.inner_text("#facts")
                time.sleep(0.2)
                page.reload()
            assert "step 3 of 3" in page.inner_text("#progress")

            for path, name in (("/queues", "queues"), ("/competition", "competition")):
                page.goto(base + path)
                page.wait_for_selector("main table")
                page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(SHOTS / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()

    # the expert's own Prometheus endpoint counted the same work
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    claims = [ln for ln in text.splitlines() if ln.startswith('contend_claims_total{expert="e1"}')]
    assert claims and float(claims[0].split()[-1]) > 0
    if os.environ.get("CONTEND_DOCS_SCREENSHOT"):
        shutil.copy(SHOTS / "overview.png", ROOT / "docs" / "dashboard.png")
