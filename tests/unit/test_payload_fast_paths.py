"""The payload codec's fast paths give what the parser and the encoder would, and never share
an object between two tasks."""

from __future__ import annotations

import json

import pytest

from contend.domain.payload import decode_args, decode_kwargs, encode_json


@pytest.mark.parametrize("text", ["[]", "[1, 2]", '["a", {"b": []}]', "[ ]"])
def test_args_decode_as_the_parser_does(text: str) -> None:
    assert decode_args(text) == json.loads(text)


@pytest.mark.parametrize("text", ["{}", '{"a": 1}', "{ }"])
def test_kwargs_decode_as_the_parser_does(text: str) -> None:
    assert decode_kwargs(text) == json.loads(text)


def test_empty_args_and_kwargs_are_fresh_objects() -> None:
    first, second = decode_args("[]"), decode_args("[]")
    first.append(1)
    assert second == []
    one, other = decode_kwargs("{}"), decode_kwargs("{}")
    one["x"] = 1
    assert other == {}


def test_none_encodes_as_the_encoder_does() -> None:
    assert encode_json(None, "a result") == json.dumps(None) == "null"
