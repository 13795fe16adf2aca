"""contend.store.registry: a store URL picks a backend, or a ConfigError says what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from contend.errors import ConfigError, MissingExtraError, SchemaError
from contend.store import registry
from contend.store.memory import MemoryStore
from contend.store.registry import make_store, open_store
from contend.store.sqlite import SQLiteStore
from contend.testing import FakeClock


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("", "a store URL is needed"),
        ("   ", "a store URL is needed"),
        (None, "a store URL is needed"),
        (42, "a store URL is needed"),
        ("redis://localhost", "unknown store URL 'redis://localhost'"),
        ("/tmp/x.db", "unknown store URL"),
        ("sqlite://[::1", "malformed store URL"),
        ("sqlite:///:memory:", "cannot be shared between experts; use memory://"),
        ("sqlite://host/x.db", "has a host part 'host'"),
        ("sqlite:///", "names no file"),
        ("sqlite:///dir/", "names no file"),
        ("sqlite:///x.db?journal=wal", r"unknown option\(s\) \['journal'\]"),
        ("sqlite:///x.db?synchronous=maybe", "synchronous must be one of"),
        ("sqlite:/x.db", "needs three slashes"),
        ("sqlite:x.db", "needs three slashes"),
    ],
)
def test_a_bad_url_is_a_config_error_naming_the_problem(url: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        make_store(url)  # type: ignore[arg-type]


def test_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        make_store("mongodb://db")
    for scheme in ("sqlite://", "postgresql://", "etcd://", "memory://"):
        assert scheme in str(info.value)


def test_memory_and_sqlite_urls_pick_their_backends(tmp_path: Path) -> None:
    clock = FakeClock(123.0)
    mem = make_store("memory://", clock=clock)
    assert isinstance(mem, MemoryStore) and mem.url == "memory://"
    db = tmp_path / "c.db"
    lite = make_store(f"sqlite:///{db}?synchronous=FULL", clock=clock)
    assert isinstance(lite, SQLiteStore) and lite.path == str(db)
    assert make_store("SQLITE:///rel.db").path == "rel.db"  # type: ignore[attr-defined]
    assert not db.exists()  # building a store does no I/O


async def test_the_clock_reaches_the_store(tmp_path: Path) -> None:
    for url in ("memory://", f"sqlite:///{tmp_path / 'c.db'}"):
        clock = FakeClock(500.0)
        store = await open_store(url, clock=clock)
        try:
            assert await store.now() == 500.0
            clock.advance(2)
            assert await store.now() == 502.0
        finally:
            await store.close()


def test_a_missing_optional_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        registry.BACKENDS,
        "fakedb",
        ("contend_no_such_driver.backend", "Store", "fakedb", ("contend_no_such_driver",)),
    )
    with pytest.raises(MissingExtraError, match=r"pip install 'contend\[fakedb\]'") as info:
        make_store("fakedb://somewhere")
    assert isinstance(info.value, ConfigError)
    assert info.value.extra == "fakedb"


def test_the_missing_extra_hint_is_a_line_that_works_outside_a_checkout() -> None:
    # contend is not on an index: the hint names the extra's own requirements, as installed
    error = MissingExtraError("the postgresql store", "postgres", "psycopg")
    assert "pip install 'psycopg[binary]>=3.3' 'psycopg-pool>=3.2'" in str(error)
    assert "contend[" not in str(error)


async def test_sqlite_in_a_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    store = make_store(f"sqlite:///{tmp_path / 'nope' / 'c.db'}")
    with pytest.raises(ConfigError, match="does not exist"):
        await store.open()


async def test_sqlite_refuses_a_file_that_is_not_a_contend_store(tmp_path: Path) -> None:
    import sqlite3

    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE users (id INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(SchemaError, match="not a contend store"):
        await open_store(f"sqlite:///{other}")
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a database at all" * 100)
    with pytest.raises(SchemaError, match="not an SQLite database"):
        await open_store(f"sqlite:///{text}")
    assert text.read_text().startswith("hello")


async def test_sqlite_reopens_its_own_store(tmp_path: Path) -> None:
    from contend.domain.task import TaskSpec

    url = f"sqlite:///{tmp_path / 'c.db'}"
    first = await open_store(url)
    spec = TaskSpec.build("t", [1])
    await first.submit([spec])
    await first.close()
    again = await open_store(url)
    try:
        assert (await again.get(spec.id)).args == [1]
    finally:
        await again.close()
