"""Conversation files: two kinds (multi-turn, shared prefix), each turn's messages, one-line
errors, and the scenario keys that go with them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rig.scenario.config import Scenario
from rig.scenario.conversations import (
    ConversationSource,
    load_conversations,
    turn_prompts,
)
from rig.scenario.prompts import PromptFileError

SHIPPED = Path(__file__).parents[2] / "prompts" / "conversations.jsonl"


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "talks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_multi_turn_carries_earlier_turns_with_the_given_answers(tmp_path):
    path = write(tmp_path, {"id": "a", "system": "Be brief.", "turns": ["q1", "q2", "q3"]})
    (talk,) = load_conversations(ConversationSource(path=path))
    assert talk.history and talk.category == "multi-turn"
    messages = [(m.role, m.content) for m in talk.messages(2, ["r1", "r2"])]
    assert messages == [
        ("system", "Be brief."),
        ("user", "q1"),
        ("assistant", "r1"),
        ("user", "q2"),
        ("assistant", "r2"),
        ("user", "q3"),
    ]
    first, second = talk.prompt(1, ["r1"]), talk.prompt(1, ["other"])
    assert first.id.startswith("a.t1.") and first.id != second.id  # the answers it carries
    assert talk.prompt(0, []).id == "a.t0"
    with pytest.raises(ValueError, match="1 earlier answers"):
        talk.messages(2, ["r1"])


def test_shared_prefix_questions_stand_alone_after_the_document(tmp_path):
    path = write(tmp_path, {"id": "d", "system": "DOC", "questions": ["x?", "y?"]})
    (doc,) = load_conversations(ConversationSource(path=path))
    assert not doc.history and doc.category == "shared-prefix"
    assert [(m.role, m.content) for m in doc.messages(1, [])] == [("system", "DOC"), ("user", "y?")]
    assert doc.prompt(1, ["ignored"]).id == "d.t1"


def test_prefix_tokens_put_a_seeded_document_before_each_system_text(tmp_path):
    path = write(
        tmp_path, {"id": "a", "system": "S", "turns": ["1", "2"]}, {"questions": ["3", "4"]}
    )
    source = ConversationSource(path=path, prefix_tokens=300, seed=4)
    first, second = load_conversations(source)
    assert first.system.endswith("\n\nS") and len(first.system) > 1000
    assert second.id == "conversation-1" and second.system != first.system[:-3]
    assert load_conversations(source) == [first, second]  # seeded: the same every time
    assert [p.id for p in turn_prompts([first, second])] == [
        "a.t0",
        "a.t1",
        "conversation-1.t0",
        "conversation-1.t1",
    ]


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("{not json", ":1: not JSON"),
        ({"turns": ["a"]}, "'turns' must be a list of at least two strings"),
        ({"turns": ["a", "b"], "questions": ["c", "d"]}, "exactly one of 'turns' or 'questions'"),
        ({"turns": ["a", ""]}, "'turns[1]' must be a non-empty string"),
        ({"turns": ["a", "b"], "system": 3}, "'system' must be a non-empty string"),
        ({"turns": ["a", "b"], "model": "x"}, "unknown key 'model'"),
        ([1], "expected an object"),
    ],
)
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, row, problem):
    path = write(tmp_path, row)
    with pytest.raises(PromptFileError, match=re.escape(problem)) as caught:
        load_conversations(ConversationSource(path=path))
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_duplicate_ids_missing_files_and_limit(tmp_path):
    path = write(tmp_path, {"id": "a", "turns": ["1", "2"]}, {"id": "a", "questions": ["3", "4"]})
    with pytest.raises(PromptFileError, match="'a' appears more than once"):
        load_conversations(ConversationSource(path=path))
    with pytest.raises(PromptFileError, match="conversation file not found"):
        load_conversations(ConversationSource(path=tmp_path / "nope.jsonl"))
    assert len(load_conversations(ConversationSource(path=SHIPPED, limit=2))) == 2


BUDGET = {"max_model_len": 4096, "max_num_batched_tokens": 8192}  # C=2 x max_model_len


def scenario(workload: dict, gates: dict | None = None, **more) -> Scenario:
    more.setdefault("model", BUDGET)
    return Scenario.model_validate(
        {"name": "t", "workload": {"concurrency": [1], **workload}, "gates": gates or {}, **more}
    )


TALKS = {"conversations": {"path": str(SHIPPED)}}


@pytest.mark.parametrize(
    ("workload", "gates", "more", "problem"),
    [
        (TALKS, {}, {}, "go together"),
        ({"prompts": [{"long_tokens": [10]}]}, {"min_prefix_cache_hits": 5}, {}, "go together"),
        (
            {**TALKS, "prompts": [{"long_tokens": [10]}]},
            {"min_prefix_cache_hits": 5},
            {},
            "exactly one",
        ),
        ({}, {}, {}, "exactly one of 'prompts' or 'conversations'"),
        (
            {**TALKS, "requests_per_level": 4},
            {"min_prefix_cache_hits": 5},
            {},
            "requests_per_level",
        ),
        (TALKS, {"min_prefix_cache_hits": 5}, {"control": {"aa": True}}, "control.aa"),
        (
            {**TALKS, "concurrency": [2]},
            {"min_prefix_cache_hits": 5},
            {"control": {"self_check": True}},
            "control.self_check: not with workload.conversations",
        ),
        (
            {"prompts": [{"long_tokens": [10]}]},
            {},
            {"control": {"self_check": True}},
            "control.self_check: needs a level above C=1",
        ),
        (
            {"prompts": [{"long_tokens": [10]}], "concurrency": [1, 4]},
            {"allow_self_check_beyond_aa": 0},
            {"control": {"self_check": True}},
            "needs control.aa and self_check",
        ),
        ({**TALKS, "warmup_requests": 2}, {"min_prefix_cache_hits": 5}, {}, "every turn"),
        (TALKS, {"min_prefix_cache_hits": 5}, {"model": {}}, "max_num_batched_tokens"),
        (
            {**TALKS, "concurrency": [1, 4]},
            {"min_prefix_cache_hits": 5},
            {},
            r">= 4 x max_model_len \(4 conversations in flight\)",
        ),
    ],
)
def test_scenario_keys_that_do_not_go_together_are_refused(workload, gates, more, problem):
    with pytest.raises(ValueError, match=problem):
        scenario(workload, gates, **more)


def test_a_self_check_needs_a_batched_level_to_compare():
    prompts = {"prompts": [{"long_tokens": [10]}], "concurrency": [1, 4]}
    assert scenario(prompts, control={"self_check": True}).control.self_check


def test_conversations_with_a_floor_validate():
    run = scenario(TALKS, {"min_prefix_cache_hits": 5})
    assert run.workload.conversations.path == SHIPPED and run.workload.prompts == []


def test_the_step_budget_counts_only_the_conversations_that_can_be_in_flight():
    """C=16 over a limit of 2 conversations has 2 in flight: 2 x max_model_len is enough."""
    talks = {"conversations": {"path": str(SHIPPED), "limit": 2}, "concurrency": [16]}
    assert scenario(talks, {"min_prefix_cache_hits": 5}).workload.conversations.limit == 2


def test_a_line_separator_inside_a_turn_is_part_of_it(tmp_path):
    path = tmp_path / "talks.jsonl"
    row = {"id": "a", "turns": ["one\u2028two", "three"]}
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    (talk,) = load_conversations(ConversationSource(path=path))
    assert talk.turns == ("one\u2028two", "three")


def test_json_nested_too_deeply_is_one_line(tmp_path):
    path = write(tmp_path, '{"turns": ' + "[" * 5000)
    with pytest.raises(PromptFileError, match="talks.jsonl:1: JSON nested too deeply"):
        load_conversations(ConversationSource(path=path))


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "talks.jsonl"
    path.write_bytes(b'{"turns": ["caf\xe9", "b"]}\n')
    with pytest.raises(PromptFileError, match="talks.jsonl: not UTF-8 text .* at byte 15"):
        load_conversations(ConversationSource(path=path))


def test_a_file_that_cannot_be_read_is_one_line(tmp_path):
    path = tmp_path / ("t" * 300)
    with pytest.raises(PromptFileError, match="cannot read the conversation file"):
        load_conversations(ConversationSource(path=path))


@pytest.mark.parametrize(("key", "value"), [("system", 0), ("system", []), ("category", 5)])
def test_a_system_or_category_that_is_not_text_is_one_line(tmp_path, key, value):
    path = write(tmp_path, {"turns": ["a", "b"], key: value})
    with pytest.raises(PromptFileError, match=f"talks.jsonl:1: '{key}' must be a non-empty string"):
        load_conversations(ConversationSource(path=path))


def test_a_null_system_is_none(tmp_path):
    (talk,) = load_conversations(
        ConversationSource(path=write(tmp_path, {"turns": ["a", "b"], "system": None}))
    )
    assert talk.system == "" and talk.messages(0, [])[0].role == "user"
