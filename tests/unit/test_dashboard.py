"""The dashboard's routes over a real memory store, through an ASGI client: pages, the live
feed, /metrics, the token, the CSRF check and the bind rule."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser

import httpx
import pytest
from starlette.routing import Mount, Route

from contend.dashboard import check_bind, check_root_path, create_app
from contend.dashboard.app import OWN_PATHS
from contend.dashboard.auth import COOKIE, Guard
from contend.domain.task import TaskSpec, TaskState
from contend.errors import ConfigError
from contend.store.memory import MemoryStore
from tests.dashboard_tasks import dead_task

TOKEN = "s3cret-token"
HOST = "127.0.0.1:8765"


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore("memory://")
    await s.open()
    yield s
    await s.close()


def client(store: MemoryStore, token: str | None = None) -> httpx.AsyncClient:
    app = create_app(store, token=token)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{HOST}")


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


async def test_every_page_renders_with_the_store_s_facts(store: MemoryStore) -> None:
    task_id = await dead_task(store)
    await store.submit([TaskSpec.build("other", queue="q2")])
    async with client(store) as c:
        for path in ("/", "/experts", "/queues", "/competition", "/tasks", f"/tasks/{task_id}"):
            r = await c.get(path)
            assert r.status_code == 200, path
            assert "<!doctype html>" in r.text and "&lt;" not in r.text.split("<main>")[0]
        assert "e1" in (await c.get("/experts")).text
        tasks = (await c.get("/tasks?queue=q2")).text
        assert "other" in tasks and "no live expert claims from queue &#x27;q2&#x27;" in tasks
        detail = (await c.get(f"/tasks/{task_id}")).text
        assert "Boom" in detail and 'id="retry-button"' in detail and "claimed" in detail
        assert (await c.get("/tasks?type=nothing")).text.count("/tasks/0") == 0
        assert (await c.get("/tasks/nope")).status_code == 404
        assert (await c.get("/tasks?state=bogus")).status_code == 400
        live = (await c.get("/api/live")).json()
        assert live["numbers"]["total:dead"] == 1
        assert live["numbers"]["blocked:no_live_expert"] == 1
        metrics = (await c.get("/metrics")).text
        assert 'contend_tasks{queue="default",state="dead"} 1.0' in metrics
        assert 'contend_pending_blocked{queue="q2",reason="no_live_expert"} 1.0' in metrics


async def test_retry_needs_a_post_with_the_page_s_csrf_token(store: MemoryStore) -> None:
    task_id = await dead_task(store)
    async with client(store) as c:
        page = (await c.get(f"/tasks/{task_id}")).text
        forged = await c.post(f"/tasks/{task_id}/retry", data={"csrf": "0" * 64})
        assert forged.status_code == 403
        assert (await store.get(task_id)).state == TaskState.DEAD
        other_site = await c.post(
            f"/tasks/{task_id}/retry",
            data={"csrf": csrf_of(page)},
            headers={"origin": "http://evil.example"},
        )
        assert other_site.status_code == 403
        assert (await c.get(f"/tasks/{task_id}/retry")).status_code == 405
        done = await c.post(f"/tasks/{task_id}/retry", data={"csrf": csrf_of(page)})
        assert done.status_code == 303
        assert (await store.get(task_id)).state == TaskState.PENDING
        again = await c.post(f"/tasks/{task_id}/retry", data={"csrf": csrf_of(page)})
        assert again.status_code == 409  # a pending task cannot be retried
        cancelled = await c.post(f"/tasks/{task_id}/cancel", data={"csrf": csrf_of(page)})
        assert cancelled.status_code == 303
        assert (await store.get(task_id)).state == TaskState.CANCELLED


async def test_a_token_guards_every_page_and_a_bad_one_is_refused(store: MemoryStore) -> None:
    task_id = await dead_task(store)
    async with client(store, TOKEN) as c:
        r = await c.get("/")
        assert r.status_code == 303 and r.headers["location"] == "/login"
        assert (await c.get("/api/live")).status_code == 401
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.post(f"/tasks/{task_id}/retry", data={"csrf": "x"})).status_code == 401
        bad = await c.post("/login", data={"token": "wrong-token"})
        assert bad.status_code == 403 and "not right" in bad.text and COOKIE not in bad.cookies
        assert (
            await c.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
        ).status_code == 200
        good = await c.post("/login", data={"token": TOKEN})
        assert good.status_code == 303 and TOKEN not in good.headers["set-cookie"]
        assert "httponly" in good.headers["set-cookie"].lower()
        page = await c.get(f"/tasks/{task_id}")
        assert page.status_code == 200
        done = await c.post(f"/tasks/{task_id}/retry", data={"csrf": csrf_of(page.text)})
        assert done.status_code == 303
    assert (await store.get(task_id)).state == TaskState.PENDING


def test_the_csrf_token_belongs_to_the_cookie_and_the_process() -> None:
    a, b = Guard(TOKEN), Guard(TOKEN)
    assert a.csrf("c1") != a.csrf("c2") and a.csrf("c1") != b.csrf("c1")
    assert a.csrf_ok("c1", a.csrf("c1"), None, HOST)
    assert not a.csrf_ok("c1", a.csrf("c1"), "null", HOST)
    assert a.csrf_ok("c1", a.csrf("c1"), f"http://{HOST}", HOST)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_token(host: str) -> None:
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.org"])
def test_another_address_needs_a_token(host: str) -> None:
    with pytest.raises(ConfigError, match="--token"):
        check_bind(host, None)
    check_bind(host, TOKEN)
    with pytest.raises(ConfigError, match="8 characters"):
        check_bind(host, "short")


async def test_a_task_page_shows_each_dependency_s_choice(store: MemoryStore) -> None:
    a, b = TaskSpec.build("a"), TaskSpec.build("b")
    child = TaskSpec.build("c", depends_on=[a.id, b.id], if_failed=["fail", "run"])
    await store.submit([a, b, child])
    async with client(store) as c:
        detail = (await c.get(f"/tasks/{child.id}")).text
    assert f'href="/tasks/{a.id}"' in detail and f'href="/tasks/{b.id}"' in detail
    assert detail.count("(if failed: run)") == 1 and "if failed: fail" not in detail


# -- served under a path prefix (behind a reverse proxy) ----------------------------------------
ROOT = "/contend"


class Links(HTMLParser):
    """Every URL a page points at: href, src, action, and ``<html data-root>``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.data_root: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src", "action") and value is not None:
                self.urls.append(value)
            if tag == "html" and name == "data-root":
                self.data_root = value


def links_of(page: str) -> Links:
    parser = Links()
    parser.feed(page)
    return parser


@pytest.mark.parametrize(
    ("given", "root"),
    [("", ""), ("/", ""), ("/contend", "/contend"), ("/contend/", "/contend"),
     ("/ops/contend-1.x", "/ops/contend-1.x"), ("/taskboard", "/taskboard")],
)  # fmt: skip
def test_a_root_path_loses_its_trailing_slash(given: str, root: str) -> None:
    assert check_root_path(given) == root


@pytest.mark.parametrize(
    ("given", "problem"),
    [("contend", "must start with '/'"), ("//contend", "between single slashes"),
     ("/contend//", "between single slashes"), ("/a b", "between single slashes"),
     ("/a?b", "between single slashes"), ("/../etc", "between single slashes"),
     ("/contend/./x", "between single slashes"), ('/"><script>', "between single slashes"),
     ("/tasks", "own /tasks path"), ("/static/x", "own /static path"),
     ("/api", "own /api path")],
)  # fmt: skip
def test_a_bad_root_path_is_refused_by_its_option_s_name(given: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
        check_root_path(given, "--root-path")
    assert str(caught.value).startswith("--root-path ")
    with pytest.raises(ConfigError, match=r"^root_path "):
        create_app(MemoryStore("memory://"), root_path=given)


def test_the_paths_a_root_path_may_not_begin_with_are_the_app_s_own(store: MemoryStore) -> None:
    app = create_app(store)
    firsts = {r.path.split("/")[1] for r in app.routes if isinstance(r, Route | Mount)}
    assert firsts - {""} == OWN_PATHS


async def test_under_a_root_path_every_link_form_and_redirect_carries_it(
    store: MemoryStore,
) -> None:
    task_id = await dead_task(store)
    app = create_app(store, token=TOKEN, root_path=ROOT + "/")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=f"http://{HOST}") as c:
        # a proxy that strips the prefix sends /tasks; a direct visit sends /contend/tasks
        for path in ("/", f"{ROOT}/", "/tasks", f"{ROOT}/tasks"):
            r = await c.get(path)
            assert r.status_code == 303 and r.headers["location"] == f"{ROOT}/login", path
        assert (await c.get(f"{ROOT}/api/live")).status_code == 401
        login_page = (await c.get("/login")).text
        assert links_of(login_page).data_root == ROOT
        good = await c.post(f"{ROOT}/login", data={"token": TOKEN})
        assert good.status_code == 303 and good.headers["location"] == f"{ROOT}/"
        assert f"Path={ROOT}" in good.headers["set-cookie"]
        c.cookies.set(COOKIE, good.cookies[COOKIE])  # the jar would keep it for /contend only
        seen: list[str] = []
        for path in ("/", "/experts", "/queues", "/competition", "/tasks", f"/tasks/{task_id}",
                     "/tasks/nope", "/tasks?state=bogus", "/login"):  # fmt: skip
            for url in (path, ROOT + path):
                page = await c.get(url)
                assert page.status_code in (200, 303, 400, 404), url
                if page.status_code == 303:
                    assert page.headers["location"] == f"{ROOT}/"  # /login, once signed in
                    continue
                links = links_of(page.text)
                assert links.data_root == ROOT, url
                seen += links.urls
        assert seen and all(u.startswith(f"{ROOT}/") for u in seen), sorted(set(seen))
        assert f"{ROOT}/static/dashboard.js" in seen and f"{ROOT}/tasks/{task_id}/retry" in seen
        for static in ("/static/dashboard.js", f"{ROOT}/static/dashboard.css"):
            assert (await c.get(static)).status_code == 200, static
        js = (await c.get(f"{ROOT}/static/dashboard.js")).text
        assert 'fetch(root + "/api/live"' in js and 'getAttribute("data-root")' in js
        assert (await c.get(f"{ROOT}/api/live")).json()["numbers"]["total:dead"] == 1
        detail = (await c.get(f"{ROOT}/tasks/{task_id}")).text
        done = await c.post(f"{ROOT}/tasks/{task_id}/retry", data={"csrf": csrf_of(detail)})
        assert done.status_code == 303
        assert done.headers["location"].startswith(f"{ROOT}/tasks/{task_id}?note=retry")
        # a slash too many: Starlette's redirect keeps the prefix
        slash = await c.get(f"{ROOT}/tasks/")
        assert slash.status_code in (307, 308)
        assert httpx.URL(slash.headers["location"]).path == f"{ROOT}/tasks"
    assert (await store.get(task_id)).state == TaskState.PENDING


async def test_without_a_root_path_links_start_at_the_host_s_root(store: MemoryStore) -> None:
    async with client(store) as c:
        page = (await c.get("/tasks")).text
        assert (await c.get("/contend/tasks")).status_code == 404
    links = links_of(page)
    assert links.data_root == "" and "/tasks" in links.urls
    assert all(u.startswith("/") and not u.startswith("/contend") for u in links.urls)


async def test_the_tasks_page_shows_the_newest_of_a_type_past_the_scan(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page read the oldest SCAN tasks and picked the type out of those: a type whose
    tasks all came after them never showed. The store now filters the type, newest first."""
    from contend.dashboard import app as dashboard_app

    monkeypatch.setattr(dashboard_app, "SCAN", 5)
    old = [TaskSpec.build("bulk", [n]) for n in range(10)]
    await store.submit(old)
    late = [TaskSpec.build("rare", [n]) for n in range(3)]
    await store.submit(late)
    async with client(store) as c:
        page = (await c.get("/tasks?type=rare")).text
        shown = re.findall(r'href="/tasks/([0-9a-f]{28})"', page)
        assert shown == sorted((t.id for t in late), reverse=True)
        everything = re.findall(r'href="/tasks/([0-9a-f]{28})"', (await c.get("/tasks")).text)
        newest = sorted((t.id for t in old + late), reverse=True)[:5]
        assert everything == newest
