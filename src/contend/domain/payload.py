"""What a user hands contend as data: JSON payloads and names, and the rules they are held to.

A payload (args and kwargs, a result, a checkpoint) is JSON of at most ``MAX_PAYLOAD_BYTES``,
nested at most ``MAX_JSON_DEPTH`` deep, and valid Unicode; :func:`encode_json` checks all three
where a payload is written and :func:`parse_json` where a user's JSON text is read. A name (a
queue, a task type, an expert, a tag) passes :func:`check_name`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from itertools import accumulate
from typing import Any

from contend.errors import PayloadError, TaskError, shown

#: The largest JSON document (args+kwargs, result, checkpoint or error) a task may carry, in bytes.
MAX_PAYLOAD_BYTES = 1024 * 1024
#: How deep arrays and objects may nest in a payload. Python's own JSON reader gives up near
#: 1,000 levels (fewer inside a deep call stack), so a payload is held well below that: what a
#: store accepted, every reader can decode.
MAX_JSON_DEPTH = 200
#: The longest queue, task type, expert, tag or resource name, in characters.
MAX_NAME_CHARS = 200
#: The longest idempotency key, in characters.
MAX_KEY_CHARS = 500

JSON = Any

# A JSON string (its loop unrolled: one pass, no per-character alternation) and a bracket;
# with the strings taken out, the brackets left measure the depth of a JSON text.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting(text: str, limit: int) -> bool:
    """Whether the arrays and objects of the JSON *text* nest more than *limit* deep."""
    if text.count("[") + text.count("{") <= limit:
        return False  # the common case: too few brackets to nest that deep
    bare = _JSON_STRING.sub("", text) if '"' in text else text
    # the running depth, bracket by bracket, in C (a batch of 1,000 records: 0.9 ms, where a
    # Python loop over the tokens took 2.7)
    return max(accumulate(map(_STEP.__getitem__, _BRACKET.findall(bare))), default=0) > limit


def _too_deep(what: str, limit: int) -> PayloadError:
    return PayloadError(f"{what} nests arrays or objects more than {limit} levels deep")


def encode_json(
    value: JSON, what: str, limit: int = MAX_PAYLOAD_BYTES, depth: int = MAX_JSON_DEPTH
) -> str:
    """Serialise *value* as compact JSON or raise :class:`PayloadError` naming *what* is wrong:
    not JSON, text that is not valid Unicode (a lone surrogate), nested more than *depth*
    levels, or more than *limit* bytes."""
    if value is None:  # what most tasks return: no encoder, no checks
        return "null"
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except RecursionError:
        raise _too_deep(what, depth) from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"{what} is not JSON-serialisable: {exc}") from exc
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise PayloadError(
            f"{what} holds text that is not valid Unicode: character {exc.start} of its JSON "
            f"is {_surrogate(text[exc.start])}"
        ) from None
    if size > limit:
        raise PayloadError(f"{what} is {size} bytes of JSON; the limit is {limit} bytes")
    if len(text) > depth and _nesting(text, depth):  # a short text cannot nest that deep
        raise _too_deep(what, depth)
    return text


def decode_args(text: str) -> list[JSON]:
    """A task's stored positional arguments; ``[]``, which most tasks have, without the
    parser (two ``json.loads`` a claimed task were about a tenth of an expert's CPU)."""
    return [] if text == "[]" else json.loads(text)


def decode_kwargs(text: str) -> dict[str, JSON]:
    """A task's stored keyword arguments; ``{}`` without the parser."""
    return {} if text == "{}" else json.loads(text)


def _surrogate(ch: str) -> str:
    """Name the lone surrogate *ch*; U+DC80 to U+DCFF is how Python keeps a byte that was not
    UTF-8 in a command line or a file name."""
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:
        return (
            f"a lone surrogate U+{code:04X}, from the byte 0x{code - 0xDC00:02X} that is not UTF-8"
        )
    return f"a lone surrogate U+{code:04X}"


def _no_constant(name: str) -> JSON:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, what: str, depth: int = MAX_JSON_DEPTH) -> JSON:
    """Read a user's JSON *text* (an option, a line of a batch file), or raise
    :class:`PayloadError` naming *what* and the problem: not JSON (``NaN`` and ``Infinity``
    are not JSON), or nested more than *depth* levels."""
    if len(text) > depth and _nesting(text, depth):  # a short text cannot nest that deep
        raise _too_deep(what, depth)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise _too_deep(what, depth) from None
    except ValueError as exc:  # JSONDecodeError, NaN, an integer of more than 4,300 digits
        raise PayloadError(f"{what} is not valid JSON: {exc}") from None


def decode_json(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


def text_problem(value: str) -> str | None:
    """What makes *value* unfit to be a name or key, or None: a lone surrogate (not valid
    Unicode, as a command line or a file in another encoding can give) or a control character
    (PostgreSQL refuses NUL; a tab or newline garbles every listing)."""
    if value.isprintable():
        return None  # the common case, checked in C: no surrogate, no control character
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode ({_surrogate(value[exc.start])})"
    for ch in value:
        if unicodedata.category(ch) == "Cc":
            return f"holds a control character (U+{ord(ch):04X})"
    return None


def check_name(value: object, what: str, limit: int = MAX_NAME_CHARS) -> str:
    """*value* if it is a fit name for *what* (a queue, task type, tag, ...): a string of 1 to
    *limit* characters, valid Unicode, without control characters. Raises TaskError."""
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{what} must be a non-empty string, got {shown(value)}")
    if len(value) > limit:
        raise TaskError(f"{what} must be at most {limit} characters, got {shown(value)}")
    problem = text_problem(value)
    if problem is not None:
        raise TaskError(f"{what} {problem}: {shown(value)}")
    return value


def check_queue(value: object) -> str:
    """A queue name, as every submission and every expert's ``--queue`` is held to."""
    return check_name(value, "queue")
