"""The store contract: task id prefixes (``ids_with_prefix``), what ``contend tasks show
01a231`` turns into a task.

The ids are chosen so that the edges of a range are tried: ids just inside and just outside a
prefix, a prefix whose end carries (``…2f`` is followed by ``…30``), and the all-``f`` prefix
that has no upper bound.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from contend.domain.ids import ID_LENGTH
from contend.errors import ConfigError, TaskError
from contend.testing.contract.harness import Harness
from contend.testing.contract.helpers import snapshot, spec


def _id(head: str, fill: str = "0") -> str:
    return head + fill * (ID_LENGTH - len(head))


A1 = _id("01a2b3")
A2 = A1[:-1] + "1"  # A1 and A2 differ only in their last character
BEFORE = _id("01a2b2", "f")  # the last id before that prefix; 01a2b2f carries to 01a2b30
AFTER = _id("01a2b4")  # the first id after it
TOP, TOP2 = _id("ffffff", "f"), _id("fffffff", "e")  # no id is above ffffff…
IDS = (A1, A2, BEFORE, AFTER, TOP, TOP2)


async def _stored(harness: Harness) -> None:
    await harness.store.submit([replace(spec(), id=tid) for tid in reversed(IDS)])


async def test_ids_with_prefix_are_the_ids_that_start_with_it(harness: Harness) -> None:
    await _stored(harness)
    s = harness.store
    assert await s.ids_with_prefix("01a2b3") == [A1, A2]
    assert await s.ids_with_prefix(A1[:-1]) == [A1, A2]  # 27 characters
    assert await s.ids_with_prefix(A2) == [A2]  # a whole id is a prefix of itself
    assert await s.ids_with_prefix("01a2b2") == [BEFORE]
    assert await s.ids_with_prefix("01a2b2f") == [BEFORE]  # the bound carries: 01a2b30
    assert await s.ids_with_prefix("01a2b4") == [AFTER]
    assert await s.ids_with_prefix("01a2b5") == []
    assert await s.ids_with_prefix("000000") == []
    assert await s.ids_with_prefix("ffffff") == [TOP2, TOP]  # no upper bound
    assert await s.ids_with_prefix("fffffff") == [TOP2, TOP]
    assert await s.ids_with_prefix("ffffffff") == [TOP]


async def test_ids_with_prefix_stop_at_the_limit(harness: Harness) -> None:
    await _stored(harness)
    s = harness.store
    assert await s.ids_with_prefix("01a2b3", limit=1) == [A1]
    assert await s.ids_with_prefix("01a2b3", limit=2) == [A1, A2]
    assert await s.ids_with_prefix("01a2b3", limit=0) == []
    with pytest.raises(ConfigError):
        await s.ids_with_prefix("01a2b3", limit=-1)


@pytest.mark.parametrize(
    "prefix",
    ["", "01a2b", "01A2B3", "01a2bz", "01a2b3%", "01a2b3/", "01a2b3 ", "0" * (ID_LENGTH + 1)],
)
async def test_a_bad_prefix_is_refused_and_changes_nothing(harness: Harness, prefix: str) -> None:
    await _stored(harness)
    before = await snapshot(harness.store)
    with pytest.raises(TaskError):
        await harness.store.ids_with_prefix(prefix)
    assert await snapshot(harness.store) == before
