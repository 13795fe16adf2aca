"""``After``: a dependency given with its edge's choice, mixed with bare ids and handles."""

from __future__ import annotations

import pytest

from contend import After, App, TaskError


async def test_after_items_mix_with_ids_and_handles() -> None:
    app = App("memory://")

    @app.task
    def job() -> None:
        return None

    try:
        a = await app.submit(job)
        b = await app.submit(job)
        c = await app.submit(job, depends_on=[a, After(b, if_failed="run"), After(a.id)])
        task = await c.get()
        assert task.depends_on == (a.id, b.id)
        assert task.if_failed == ("fail", "run")
    finally:
        await app.aclose()


async def test_a_bad_choice_is_refused_and_nothing_is_written() -> None:
    app = App("memory://")

    @app.task
    def job() -> None:
        return None

    try:
        a = await app.submit(job)
        with pytest.raises(TaskError, match="if_failed must be one of fail, cancel, run"):
            await app.submit(job, depends_on=[After(a, if_failed="skip")])
        with pytest.raises(TaskError, match="given twice"):
            await app.submit(job, depends_on=[a, After(a, if_failed="cancel")])
        assert [t.id for t in await (await app.store()).list_tasks()] == [a.id]
    finally:
        await app.aclose()
