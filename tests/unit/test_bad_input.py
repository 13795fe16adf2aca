"""Bad input through the Python API: text that is not valid Unicode, JSON nested too deep,
empty and over-long names, and error messages that echo a 100 KB value. Each is refused with an
error naming the problem, and a refused submission leaves the store unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contend import App
from contend.cli.submit import batch_digest, batch_key, read_batch
from contend.domain.payload import (
    MAX_JSON_DEPTH,
    MAX_NAME_CHARS,
    _nesting,
    check_queue,
    encode_json,
    parse_json,
)
from contend.domain.task import TaskSpec
from contend.errors import ConfigError, PayloadError, TaskError, TaskNotFound, shown
from contend.runtime.config import ExpertConfig

HUGE = "q" * 100_000


def nested(depth: int) -> Any:
    """An array nested *depth* deep: ``[[[...]]]``; built without recursion."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


# -- text that is not valid Unicode ----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(["\ud800"], None), (["ok", {"deep": ["\udcff"]}], None), ([], {"\ud800": 1})],
)
def test_a_lone_surrogate_in_a_payload_is_refused(args: Any, kwargs: Any) -> None:
    with pytest.raises(PayloadError, match=r"not valid Unicode.*lone surrogate U\+D"):
        TaskSpec.build("t", args, kwargs)


def test_a_surrogate_from_a_byte_says_which_byte() -> None:
    with pytest.raises(PayloadError, match="from the byte 0xFF that is not UTF-8"):
        encode_json(["\udcff"], "result")


@pytest.mark.parametrize("field", ["type", "queue", "key"])
@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("a\ud800", "not valid Unicode"),
        ("a\x00b", "control character \\(U\\+0000\\)"),
        ("a\nb", "control character"),
        ("", "non-empty string"),
        ("   ", "non-empty string"),
    ],
)
def test_a_bad_name_or_key_is_refused(field: str, value: str, words: str) -> None:
    call: dict[str, Any] = {"type": "t", field: value}
    with pytest.raises(TaskError, match=words):
        TaskSpec.build(**call)


def test_bad_text_in_requirements_and_dependencies_is_refused() -> None:
    with pytest.raises(TaskError, match="not valid Unicode"):
        TaskSpec.build("t", requirements={"tags": ["gpu\udcff"]})
    with pytest.raises(TaskError, match="dependency"):
        TaskSpec.build("t", depends_on=["\ud800"])


# -- nesting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 30_000])
def test_a_payload_nested_too_deep_is_refused(depth: int) -> None:
    with pytest.raises(PayloadError, match=f"args nests .* more than {MAX_JSON_DEPTH} levels"):
        TaskSpec.build("t", [nested(depth - 1)])
    with pytest.raises(PayloadError, match="checkpoint nests"):
        encode_json({"k": nested(depth - 1)}, "checkpoint")


def test_nesting_up_to_the_limit_is_accepted_and_brackets_in_strings_do_not_count() -> None:
    spec = TaskSpec.build("t", [nested(MAX_JSON_DEPTH - 1)])
    assert parse_json(spec.args_json, "args") == [nested(MAX_JSON_DEPTH - 1)]
    text = encode_json(["[" * 5000, "{" * 5000, '"]\\'], "args")
    assert parse_json(text, "args") == ["[" * 5000, "{" * 5000, '"]\\']


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 30_000 + "]" * 30_000, "nests arrays or objects more than 200 levels"),
        ('{"a":' * 201 + "1" + "}" * 201, "more than 200 levels"),
        ("[" * 30_000, "more than 200 levels"),  # not even closed
        ("[NaN]", "not valid JSON: NaN is not a JSON number"),
        ("[-Infinity]", "not valid JSON: -Infinity is not a JSON number"),
        ("[" + "9" * 5000 + "]", "not valid JSON: Exceeds the limit"),
        ("[1,", "not valid JSON: Expecting value"),
        ("", "not valid JSON"),
    ],
)
def test_parse_json_names_the_problem(text: str, words: str) -> None:
    with pytest.raises(PayloadError, match=words):
        parse_json(text, "--args")


# -- through the app: refused, and the store unchanged -------------------------------------------


@pytest.mark.parametrize(
    ("args", "options", "error", "words"),
    [
        (["\ud800"], {}, PayloadError, "not valid Unicode"),
        ([nested(30_000)], {}, PayloadError, "more than 200 levels"),
        ([1], {"queue": ""}, TaskError, "queue must be a non-empty string"),
        ([1], {"queue": HUGE}, TaskError, "queue must be at most 200 characters"),
        ([1], {"key": "k\udcff"}, TaskError, "idempotency key is not valid Unicode"),
    ],
)
async def test_app_submit_refuses_and_writes_nothing(
    args: list[Any], options: dict[str, Any], error: type[Exception], words: str
) -> None:
    app = App("memory://")

    @app.task
    def echo(value: Any) -> Any:
        return value

    try:
        await app.submit("echo", ["before"])
        store = await app.store()
        before = [t.to_json() for t in await store.list_tasks(limit=100)]
        with pytest.raises(error, match=words):
            await app.submit("echo", args, **options)
        with pytest.raises(error, match=words):
            await app.submit_many([app.build_spec("echo", args, **options)])
        assert [t.to_json() for t in await store.list_tasks(limit=100)] == before
    finally:
        await app.aclose()


def test_an_empty_queue_is_not_replaced_by_the_default() -> None:
    app = App("memory://")

    @app.task(queue="mail")
    def send() -> None: ...

    assert app.build_spec("send").queue == "mail"  # no queue given: the task type's
    with pytest.raises(TaskError, match="queue must be a non-empty string"):
        app.build_spec("send", queue="")


@pytest.mark.parametrize("url", ["", "   "])
def test_an_empty_store_url_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="a store URL must be a non-empty string"):
        App(url)
    with pytest.raises(ConfigError, match="a store URL must be a non-empty string"):
        App().with_store(url)


# -- one rule for a queue name: submissions and experts ---------------------------------------------


@pytest.mark.parametrize("queue", ["", " ", "q" * (MAX_NAME_CHARS + 1), HUGE, "a\tb", "\udcff"])
def test_an_expert_is_held_to_the_queue_rule_of_a_submission(queue: str) -> None:
    with pytest.raises(TaskError) as submitted:
        check_queue(queue)
    with pytest.raises(ConfigError) as configured:
        ExpertConfig(queues=["default", queue]).validate()
    assert str(configured.value) == str(submitted.value)


def test_an_expert_takes_a_list_of_queues_and_a_fit_name() -> None:
    with pytest.raises(ConfigError, match="queues must be a list of names"):
        ExpertConfig(queues="default").validate()
    with pytest.raises(ConfigError, match="specialties must be a list of names"):
        ExpertConfig(specialties="render").validate()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"a specialty \(a task type\) is not valid Unicode"):
        ExpertConfig(specialties=frozenset({"render\udcff"})).validate()
    with pytest.raises(ConfigError, match=r"a specialty \(a task type\) must be a non-empty"):
        ExpertConfig(specialties=frozenset({""})).validate()
    with pytest.raises(ConfigError, match="an expert name must be at most 200 characters"):
        ExpertConfig(name=HUGE).validate()
    with pytest.raises(ConfigError, match="an expert name holds a control character"):
        ExpertConfig(name="a\x00b").validate()
    ExpertConfig(queues=["q" * MAX_NAME_CHARS], name="n" * MAX_NAME_CHARS).validate()


# -- a 100 KB value is echoed cut short ----------------------------------------------------------


def test_shown_cuts_a_long_value_and_says_how_long_it_was() -> None:
    assert shown("abc") == "'abc'"
    assert shown(HUGE) == f"'{'q' * 80}'… (100,000 characters)"
    numbers = list(range(100_000))
    assert shown(numbers) == f"{repr(numbers)[:80]}… ({len(repr(numbers)):,} characters)"
    assert shown(10**5000) == "an int too large to show"


@pytest.mark.parametrize(
    "call",
    [
        {"type": HUGE},
        {"queue": HUGE},
        {"key": HUGE},
        {"args": HUGE},
        {"kwargs": [HUGE]},
        {"priority": HUGE},
        {"delay": HUGE},
        {"timeout": HUGE},
        {"max_attempts": HUGE},
        {"depends_on": [10**5000]},
        {"priority": 10**5000},
        {"requirements": {HUGE: 1}},
        {"requirements": {"tags": [HUGE]}},
        {"requirements": {"resources": {HUGE: -1}}},
        {"requirements": {"resources": {"mem": HUGE}}},
    ],
)
def test_errors_echo_a_huge_value_cut_short(call: dict[str, Any]) -> None:
    with pytest.raises(TaskError) as info:
        TaskSpec.build(**{"type": "t", **call})
    assert len(str(info.value)) < 400, str(info.value)[:400]


def test_unknown_ids_and_types_are_echoed_cut_short() -> None:
    assert len(str(TaskNotFound(HUGE))) < 200
    with pytest.raises(TaskError) as info:
        App("memory://").build_spec(HUGE)
    assert "… (100,000 characters)" in str(info.value)


# -- batch files ----------------------------------------------------------------------------------


def test_batch_keys_depend_on_type_content_and_line() -> None:
    data = b'{"args": [1]}\n{"args": [2]}\n'
    digest = batch_digest("echo", data)
    assert digest == batch_digest("echo", data)
    assert digest not in (batch_digest("other", data), batch_digest("echo", data + b"\n"))
    assert batch_key(digest, 1) != batch_key(digest, 2)
    TaskSpec.build("t", key=batch_key(digest, 10**9))  # a key a spec takes


def test_read_batch_refuses_invalid_utf8_naming_the_line_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'{"args": [1]}\n{"args": ["caf\xe9"]}\n')
    with pytest.raises(TaskError, match=r"b.jsonl:2: not valid UTF-8 \(byte 0xE9 at byte 15"):
        read_batch(str(path))


def test_read_batch_skips_blank_lines_and_a_bom_and_counts_lines(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"args": [1]}\r\n\r\n  \n{"key": "k"}\n')
    lines, data = read_batch(str(path))
    assert [(line.number, line.fields) for line in lines] == [(1, {"args": [1]}), (4, {"key": "k"})]
    assert data == path.read_bytes()


@given(
    st.recursive(
        st.none() | st.text(alphabet='[]{}"\\ab', max_size=6),
        lambda kids: (
            st.lists(kids, max_size=3)
            | st.dictionaries(st.text(alphabet='[]{}"ab', max_size=3), kids, max_size=3)
        ),
        max_leaves=60,
    )
)
def test_the_depth_check_measures_what_the_json_nests(value: object) -> None:
    # brackets and quotes inside strings must not count; the depth is that of the value
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    for limit in range(0, 6):
        assert _nesting(text, limit) == (depth(value) > limit), (text, limit)
