"""Task ids as people type them: a whole id, or a unique prefix of one, as git takes a hash.

``contend tasks show 01a231d2`` is ``contend tasks show 01a231d25f581b262383a3087f27`` when
no other task id starts with ``01a231d2``. A whole id is passed on as it is (no extra read);
a prefix costs one range read of the store's ids (``Store.ids_with_prefix``).
"""

from __future__ import annotations

from contend.cli.common import UsageError
from contend.domain.ids import ID_LENGTH, check_id_prefix, is_hex
from contend.errors import shown
from contend.store.port import Store

#: The most ids an ambiguous prefix is counted up to, and the most its message names.
COUNTED = 10
NAMED = 4


def is_prefix(text: str) -> bool:
    """Whether *text* is looked up as a prefix: shorter than an id and hex digits (either
    case). Anything else is looked up as the id it is, as before prefixes were taken."""
    return len(text) < ID_LENGTH and is_hex(text.lower())


def check_prefix(text: str) -> None:
    """Refuse, before any store is opened, a prefix too short to name a task."""
    if is_prefix(text):
        check_id_prefix(text.lower())


async def resolve_id(store: Store, text: str) -> str:
    """The id that *text* names: itself when it is not a prefix, else the one id that starts
    with it. A UsageError (exit 2, nothing written) when none does or several do."""
    if not is_prefix(text):
        return text
    prefix = check_id_prefix(text.lower())
    found = await store.ids_with_prefix(prefix, limit=COUNTED + 1)
    if len(found) == 1:
        return found[0]
    if not found:
        raise UsageError(
            f"no task id starts with {shown(text)} (`contend tasks list` prints the ids)"
        )
    count = str(len(found)) if len(found) <= COUNTED else f"more than {COUNTED}"
    named = ", ".join(found[:NAMED]) + (", …" if len(found) > NAMED else "")
    raise UsageError(
        f"{shown(text)} is ambiguous: it starts {count} tasks ({named}); give more characters"
    )
