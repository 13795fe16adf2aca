"""The dashboard at a sub-path behind a reverse proxy: ``contend dashboard --root-path /contend``
on a real SQLite store, behind a proxy that strips the prefix as nginx's
``proxy_pass http://127.0.0.1:8765/;`` does (``tests.acceptance.web.ReverseProxy``). Through it,
with httpx: the sign-in, every page and every link found on them, the static files, the live
feed and a token-protected retry; in a real browser, that the page's script asks for the live
feed under the prefix."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from contend.domain.task import TaskState
from tests.acceptance.conftest import ROOT, cli_env, run_cli
from tests.acceptance.web import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ReverseProxy,
    free_port,
    need_browser,
    on_store,
    wait_http,
)
from tests.dashboard_tasks import dead_task

pytestmark = pytest.mark.slow

PREFIX = "/contend"
TOKEN = "proxy-test-token"


@dataclass
class Deployed:
    store_url: str
    direct: str  # the dashboard itself, http://127.0.0.1:PORT
    proxy: ReverseProxy
    dead_task: str


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[Deployed]:
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    task_id = on_store(url, dead_task)
    port = free_port()
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "contend", "dashboard", "--store", url, "--port", str(port),
         "--root-path", PREFIX + "/"],
        stdout=log,
        stderr=log,
        env={**cli_env(), "CONTEND_DASHBOARD_TOKEN": TOKEN},
        cwd=ROOT,
    )  # fmt: skip
    log.close()
    proxy = ReverseProxy(port, PREFIX).start()
    try:
        wait_http(f"http://127.0.0.1:{port}/login")
        yield Deployed(url, f"http://127.0.0.1:{port}", proxy, task_id)
    finally:
        proxy.close()
        proc.terminate()
        proc.wait(timeout=10)
        print((tmp_path / "dashboard.log").read_text(errors="replace")[-2000:])


class Links(HTMLParser):
    """The URLs a page points at: to follow (href, src) and to post to (form actions)."""

    def __init__(self) -> None:
        super().__init__()
        self.follow: list[str] = []
        self.actions: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is not None and name in ("href", "src"):
                self.follow.append(value)
            elif value is not None and name == "action":
                self.actions.append(value)


def links(page: str) -> Links:
    parser = Links()
    parser.feed(page)
    return parser


def test_the_dashboard_works_through_a_proxy_at_a_sub_path(deployed: Deployed) -> None:
    d, task_id = deployed, deployed.dead_task
    with httpx.Client(base_url=d.proxy.url, timeout=20) as c:
        # the proxy's own answers, outside its location
        assert c.get("/").status_code == 404
        assert c.get(PREFIX).headers["location"] == f"{PREFIX}/"
        # without the token: sent to the sign-in form under the prefix
        first = c.get(f"{PREFIX}/tasks")
        assert first.status_code == 303 and first.headers["location"] == f"{PREFIX}/login"
        assert c.get(f"{PREFIX}/api/live").status_code == 401
        login_page = c.get(f"{PREFIX}/login")
        assert login_page.status_code == 200 and links(login_page.text).actions == [
            f"{PREFIX}/login"
        ]
        signed_in = c.post(f"{PREFIX}/login", data={"token": TOKEN})
        assert signed_in.status_code == 303 and signed_in.headers["location"] == f"{PREFIX}/"
        assert f"Path={PREFIX};" in signed_in.headers["set-cookie"]  # the jar keeps it there

        # every page and every link on them, followed through the proxy
        queue, seen, actions = [f"{PREFIX}/", f"{PREFIX}/tasks/{task_id}"], set(), set()
        while queue:
            url = queue.pop()
            if url in seen:
                continue
            seen.add(url)
            r = c.get(url)
            assert r.status_code == 200, (url, r.status_code, r.text[:300])
            if "html" not in r.headers["content-type"]:
                continue
            found = links(r.text)
            outside = [u for u in found.follow + found.actions if not u.startswith(f"{PREFIX}/")]
            assert not outside, f"{url} links outside {PREFIX}/: {outside}"
            actions.update(found.actions)
            queue += [u for u in found.follow if u not in seen]
        pages = {u.split("?")[0] for u in seen}
        for page in ("/", "/experts", "/queues", "/tasks", "/competition", f"/tasks/{task_id}",
                     "/static/dashboard.css", "/static/dashboard.js"):  # fmt: skip
            assert PREFIX + page in pages, f"{PREFIX}{page} was never linked"
        assert f"{PREFIX}/tasks/{task_id}/retry" in actions and f"{PREFIX}/tasks" in actions
        script = c.get(f"{PREFIX}/static/dashboard.js").text
        assert 'fetch(root + "/api/live"' in script

        # the live feed the page's script reads
        live = c.get(f"{PREFIX}/api/live")
        assert live.status_code == 200 and live.json()["numbers"]["total:dead"] == 1

        # a retry: a POST with the page's CSRF token, from a page of the proxy's origin
        detail = c.get(f"{PREFIX}/tasks/{task_id}").text
        csrf = detail.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        done = c.post(
            f"{PREFIX}/tasks/{task_id}/retry", data={"csrf": csrf}, headers={"origin": d.proxy.url}
        )
        assert done.status_code == 303, done.text[:500]
        assert done.headers["location"].startswith(f"{PREFIX}/tasks/{task_id}?note=retry")
        shown = c.get(done.headers["location"])
        assert "retry: the task is now pending" in shown.text
        forged = c.post(
            f"{PREFIX}/tasks/{task_id}/cancel",
            data={"csrf": csrf},
            headers={"origin": "https://elsewhere.example"},
        )
        assert forged.status_code == 403

        # Prometheus through the proxy, with the bearer token and no cookie
        c.cookies.clear()
        metrics = c.get(f"{PREFIX}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        assert metrics.status_code == 200 and "contend_tasks{" in metrics.text
    assert on_store(d.store_url, lambda s: s.get(task_id)).state == TaskState.PENDING

    # the proxy stripped the prefix, and the dashboard answered those paths
    assert d.proxy.forwarded and not [p for _, p in d.proxy.forwarded if p.startswith(PREFIX)]
    assert ("POST", f"/tasks/{task_id}/retry") in d.proxy.forwarded
    # and it answers the prefixed paths too: a direct visit, through a tunnel
    direct = httpx.get(
        f"{d.direct}{PREFIX}/tasks", headers={"authorization": f"Bearer {TOKEN}"}, timeout=20
    )
    assert direct.status_code == 200 and f'href="{PREFIX}/tasks/{task_id}"' in direct.text


def test_the_page_s_script_reads_the_live_feed_under_the_prefix(deployed: Deployed) -> None:
    sync_playwright = need_browser()
    d = deployed
    requested: list[tuple[str, int]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.on("response", lambda r: requested.append((r.url, r.status)))
            page.goto(f"{d.proxy.url}{PREFIX}/")
            assert page.url == f"{d.proxy.url}{PREFIX}/login"
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("text=tasks finished per second")
            assert page.url == f"{d.proxy.url}{PREFIX}/"
            # the script has refreshed the numbers from the live feed: twice, to see it go on
            page.wait_for_function("() => document.body.getAttribute('data-refreshed') !== null")
            first = page.evaluate("() => document.body.getAttribute('data-refreshed')")
            page.wait_for_function(
                f"() => document.body.getAttribute('data-refreshed') !== '{first}'"
            )
            assert page.inner_text('[data-live="total:dead"]') == "1"
            page.click("nav >> text=tasks")
            page.wait_for_selector("#tasks")
            assert page.url == f"{d.proxy.url}{PREFIX}/tasks"
        finally:
            browser.close()
    outside = [u for u, _ in requested if not u.startswith(f"{d.proxy.url}{PREFIX}/")]
    assert not outside, outside
    assert (f"{d.proxy.url}{PREFIX}/api/live", 200) in requested
    # the only refusal: the sign-in page's script asking for the feed before the token
    assert {u for u, s in requested if s >= 400} <= {f"{d.proxy.url}{PREFIX}/api/live"}


@pytest.mark.parametrize(
    ("given", "problem"),
    [("contend", "--root-path must start with '/'"),
     ("/tasks", "--root-path '/tasks' begins like the dashboard's own /tasks path"),
     ("/a b", "--root-path may hold only letters, digits")],
)  # fmt: skip
def test_a_bad_root_path_is_refused_before_the_store_is_opened(
    tmp_path: Path, given: str, problem: str
) -> None:
    db = tmp_path / "never.db"
    done = run_cli("dashboard", "--store", f"sqlite:///{db}", "--root-path", given)
    assert done.returncode == 2, done.stderr
    assert problem in done.stderr and "Traceback" not in done.stderr
    assert not db.exists()
