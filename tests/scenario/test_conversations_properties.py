"""The bad-input sweep of conversation files: any bytes end in conversations or in one
PromptFileError line; what loads is typed as the Conversation says (texts are strings), and a
file of valid conversations loses none of them, nor any turn."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rig.scenario.conversations import Conversation, ConversationSource, load_conversations
from rig.scenario.prompts import PromptFileError
from tests.scenario.test_prompts_properties import TEXT, json_values

KEYS = ("id", "system", "category", "turns", "questions")
JSON = json_values(KEYS)
TALK = st.builds(
    lambda kind, texts, system: {kind: texts, **({"system": system} if system else {})},
    st.sampled_from(("turns", "questions")),
    st.lists(TEXT, min_size=2, max_size=4),
    st.none() | TEXT,
)


def _read(content: bytes, limit: int | None = None) -> list[Conversation] | str:
    """The conversations, or the PromptFileError's message; any other exception fails."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "talks.jsonl"
        path.write_bytes(content)
        try:
            talks = load_conversations(ConversationSource(path=path, limit=limit))
        except PromptFileError as exc:
            message = str(exc)
        else:
            for talk in talks:
                assert isinstance(talk.id, str) and isinstance(talk.system, str)
                assert all(isinstance(turn, str) for turn in talk.turns)
                assert talk.category is None or isinstance(talk.category, str)
            return talks
    assert message.startswith(str(path)) and "\n" not in message, message
    return message


@settings(max_examples=200)
@given(st.binary(max_size=200))
@example(b"\xff\n")
def test_any_bytes_give_conversations_or_one_line(content):
    _read(content)


@settings(max_examples=200)
@given(st.lists(JSON | TALK, min_size=1, max_size=4))
@example([{"turns": ["a", "b"], "category": 5}])
@example([{"turns": ["a", "b"], "system": 0}])
def test_any_json_lines_give_conversations_or_one_line(rows):
    _read("\n".join(json.dumps(row, ensure_ascii=False) for row in rows).encode())


@settings(max_examples=200)
@given(st.lists(TALK, min_size=1, max_size=5), st.none() | st.integers(1, 6))
def test_valid_conversations_lose_none(rows, limit):
    talks = _read("\n".join(json.dumps(row, ensure_ascii=False) for row in rows).encode(), limit)
    assert isinstance(talks, list), talks
    kept = rows[:limit]
    assert len(talks) == len(kept)
    for talk, row in zip(talks, kept, strict=True):
        assert list(talk.turns) == row.get("turns", row.get("questions"))
        assert talk.history == ("turns" in row)
