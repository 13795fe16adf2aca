"""Task ids and their prefixes: what a person may type instead of a whole id.

Ids are 28 hex digits (``new_task_id``), too long to type, so ``contend tasks show 01a231``
takes a unique prefix as git takes one of a hash. A store answers a prefix with a range read of
its primary key (``ids_with_prefix``); this module says what a valid prefix is and where that
range ends, so that every backend reads the same range.
"""

from __future__ import annotations

from contend.errors import TaskError, shown

#: How long a task id is (``contend.domain.task.new_task_id``).
ID_LENGTH = 28
#: The fewest characters of an id that name it (git's default abbreviation is 7).
MIN_PREFIX = 6
HEX_DIGITS = frozenset("0123456789abcdef")


def is_hex(text: str) -> bool:
    return bool(text) and set(text) <= HEX_DIGITS


def check_id_prefix(prefix: str) -> str:
    """*prefix* if it can start a task id (6 to 28 lowercase hex digits); else a TaskError
    that says what is wrong, before any store is asked."""
    if not isinstance(prefix, str) or not is_hex(prefix):
        raise TaskError(
            f"a task id prefix is hex digits (0-9, a-f), got {shown(prefix)}: "
            "`contend tasks list` prints the ids"
        )
    if len(prefix) < MIN_PREFIX:
        raise TaskError(
            f"{shown(prefix)} is too short to name a task: give at least {MIN_PREFIX} of the "
            f"{ID_LENGTH} characters of its id (`contend tasks list` prints them)"
        )
    if len(prefix) > ID_LENGTH:
        raise TaskError(f"a task id has {ID_LENGTH} characters; {shown(prefix)} has {len(prefix)}")
    return prefix


def prefix_bound(prefix: str) -> str | None:
    """The least hex string of *prefix*'s length above every id that starts with it
    (``01a2ff`` → ``01a300``), None for ``ffffff…`` (no id is above it). A range
    ``prefix <= id < bound`` of hex ids is the same in every collation, as a bound made by
    bumping the last character to a non-hex one (``01a2f`` → ``01a2g``) is not."""
    value = int(prefix, 16) + 1
    if value >> (4 * len(prefix)):
        return None
    return f"{value:0{len(prefix)}x}"
