"""The bad-input sweep of prompt files: any bytes end in prompts or in one PromptFileError line,
and a file of valid records loses none of them (one Prompt per record, in order)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rig.scenario.prompts import Prompt, PromptFileError, load_prompts

TEXT = st.text(min_size=1, max_size=12).filter(str.strip)
KEYS = ("id", "question_id", "prompt", "messages", "turns", "conversations", "category", "role")


def json_values(keys: tuple[str, ...]) -> st.SearchStrategy:
    """Any JSON value, its objects' keys mostly from `keys` (so that they reach past the first
    unknown key)."""
    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=12,
    )


JSON = json_values(KEYS)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(("system", "user")), "content": TEXT})
RECORD = st.one_of(
    st.fixed_dictionaries({"prompt": TEXT}),
    st.fixed_dictionaries({"messages": st.lists(MESSAGE, min_size=1, max_size=3)}).filter(
        lambda r: any(m["role"] == "user" for m in r["messages"])
    ),
    st.fixed_dictionaries({"turns": st.lists(TEXT, min_size=1, max_size=3)}),
    st.fixed_dictionaries(
        {
            "conversations": st.tuples(
                st.fixed_dictionaries({"from": st.just("human"), "value": TEXT})
            )
        }
    ),
)


def _read(content: bytes) -> list[Prompt] | str:
    """The prompts, or the PromptFileError's message; any other exception fails the test."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.jsonl"
        path.write_bytes(content)
        try:
            return load_prompts(path)
        except PromptFileError as exc:
            message = str(exc)
    assert message.startswith(str(path)) and "\n" not in message, message
    return message


@settings(max_examples=200)
@given(st.binary(max_size=200))
@example(b"\xef\xbb\xbf" + b'{"prompt": "x"}\n')
@example(b"[" * 5000)
def test_any_bytes_give_prompts_or_one_line(content):
    _read(content)


@settings(max_examples=200)
@given(st.lists(JSON, min_size=1, max_size=4), st.booleans())
def test_any_json_records_give_prompts_or_one_line(records, as_array):
    if as_array:
        content = json.dumps(records, ensure_ascii=False)
    else:
        content = "\n".join(json.dumps(record, ensure_ascii=False) for record in records)
    _read(content.encode("utf-8", errors="surrogatepass"))


@settings(max_examples=200)
@given(st.lists(RECORD, min_size=1, max_size=5), st.booleans())
@example([{"prompt": "a\u2028b"}], False)
def test_valid_records_lose_none(records, as_array):
    if as_array:
        content = json.dumps(records, ensure_ascii=False)
    else:
        content = "\n".join(json.dumps(record, ensure_ascii=False) for record in records)
    prompts = _read(content.encode("utf-8", errors="surrogatepass"))
    assert isinstance(prompts, list), prompts
    assert len(prompts) == len(records)
    assert len({p.id for p in prompts}) == len(records)
    for prompt, record in zip(prompts, records, strict=True):
        if "prompt" in record:
            assert prompt.text == record["prompt"]
