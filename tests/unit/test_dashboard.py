"""The dashboard's routes over a real memory store, through an ASGI client: pages, the live
feed, /metrics, the token, the CSRF check and the bind rule."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from contend.dashboard import check_bind, create_app
from contend.dashboard.auth import COOKIE, Guard
from contend.domain.task import TaskSpec, TaskState
from contend.errors import ConfigError
from contend.store.memory import MemoryStore
from contend.store.port import ExpertInfo, Failure

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


async def dead_task(store: MemoryStore) -> str:
    spec = TaskSpec.build("job", [1], max_attempts=1)
    await store.submit([spec])
    session = await store.register_expert(ExpertInfo("e1"), 15.0)
    (c,) = await store.claim(
        "e1", session, ["default"], ExpertInfo("e1").capabilities, limit=1, lease_ttl=15.0
    )
    await store.fail("e1", [Failure(c.id, c.fence, '{"type": "Boom", "message": "no"}', None)])
    return spec.id


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
