import json
import re
from pathlib import Path

import pytest

from rig import PROJECT_ROOT
from rig.scenario.prompts import ChatMessage, Prompt, PromptFileError, load_prompts

PROMPTS = PROJECT_ROOT / "prompts" / "prompts.jsonl"
EXAMPLES = PROJECT_ROOT / "prompts" / "examples"


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), "utf-8")
    return path


# --- the shipped prompt set -----------------------------------------------------------------


def test_prompt_set_has_at_least_60_unique_ids():
    raw_ids = [json.loads(line)["id"] for line in PROMPTS.read_text("utf-8").splitlines()]
    prompts = load_prompts(PROMPTS)
    assert len(prompts) == len(raw_ids) >= 60
    assert len({p.id for p in prompts}) == len(prompts)


def test_prompt_set_covers_the_categories():
    categories = {p.category for p in load_prompts(PROMPTS)}
    expected = {"coding", "math", "reasoning", "writing", "summarisation", "multilingual"}
    expected |= {"emoji", "rtl", "json", "whitespace", "markdown"}
    assert expected <= categories


@pytest.mark.parametrize(
    ("script", "pattern"),
    [
        ("Chinese/Japanese kanji", r"[\u4e00-\u9fff]"),
        ("Japanese kana", r"[\u3040-\u30ff]"),
        ("Korean hangul", r"[\uac00-\ud7af]"),
        ("Arabic", r"[\u0600-\u06ff]"),
        ("Hebrew", r"[\u0590-\u05ff]"),
        ("emoji", r"[\U0001f300-\U0001faff]"),
        ("zero-width joiner sequence", "\u200d"),
        ("tab", "\t"),
        ("markdown heading", r"(?m)^# "),
    ],
)
def test_prompt_set_contains(script, pattern):
    assert any(re.search(pattern, p.text) for p in load_prompts(PROMPTS)), script


def test_prompt_set_lengths_range_from_one_line_to_paragraphs():
    lengths = [len(p.text) for p in load_prompts(PROMPTS)]
    assert min(lengths) < 40
    assert max(lengths) > 600
    assert any(p.text.count("\n\n") >= 3 for p in load_prompts(PROMPTS))


# --- formats ------------------------------------------------------------------------------


def test_plain_prompt_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "plain.jsonl",
        [{"id": "a", "prompt": "  keep my spaces  ", "category": "x"}, {"prompt": "second"}],
    )
    first, second = load_prompts(path)
    assert first == Prompt("a", (ChatMessage("user", "  keep my spaces  "),), first.source, "x")
    assert first.text == "  keep my spaces  "
    assert first.messages_as_dicts() == [{"role": "user", "content": "  keep my spaces  "}]
    assert second.id == "plain-2"
    assert second.source.endswith("line 2")


def test_blank_lines_are_skipped_and_ids_use_line_numbers(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text('\n{"prompt": "x"}\n\n   \n{"prompt": "y"}\n', "utf-8")
    assert [p.id for p in load_prompts(path)] == ["gaps-2", "gaps-5"]


def test_chat_messages_jsonl():
    prompts = load_prompts(EXAMPLES / "chat.jsonl")
    system_prompt = next(p for p in prompts if p.messages[0].role == "system")
    user_content = system_prompt.messages[-1].content
    assert system_prompt.messages_as_dicts()[-1] == {"role": "user", "content": user_content}
    assert system_prompt.text.startswith("System: " + system_prompt.messages[0].content)
    assert system_prompt.text.endswith(f"User: {user_content}\n\nAssistant:")
    single = next(p for p in prompts if len(p.messages) == 1)
    assert single.text == single.messages[0].content
    assert prompts[-1].id == "chat-4"


def test_mtbench_takes_first_turn_and_question_id(tmp_path):
    path = write_jsonl(tmp_path / "mt.jsonl", [{"question_id": 81, "turns": ["one", "two"]}])
    (prompt,) = load_prompts(path)
    assert prompt.id == "81"
    assert prompt.messages == (ChatMessage("user", "one"),)
    assert len(load_prompts(EXAMPLES / "mtbench.jsonl")) == 3


def test_sharegpt_stops_at_first_human_turn(tmp_path):
    conversation = [
        {"from": "system", "value": "be brief"},
        {"from": "gpt", "value": "hello"},
        {"from": "human", "value": "question"},
        {"from": "gpt", "value": "answer"},
        {"from": "human", "value": "follow-up"},
    ]
    path = tmp_path / "sg.json"
    path.write_text(
        json.dumps(
            [
                {"id": "c1", "conversations": conversation},
                {"conversations": [{"from": "human", "value": "only"}]},
            ]
        ),
        "utf-8",
    )
    first, second = load_prompts(path)
    assert [m.role for m in first.messages] == ["system", "assistant", "user"]
    assert first.messages[-1].content == "question"
    assert second.id == "sg-2"
    assert second.source.endswith("entry 2")
    assert len(load_prompts(EXAMPLES / "sharegpt.json")) == 3


def test_limit_takes_the_first_prompts_but_validates_all(tmp_path):
    rows = [{"prompt": f"p{i}"} for i in range(5)]
    path = write_jsonl(tmp_path / "five.jsonl", rows)
    assert [p.text for p in load_prompts(path, limit=2)] == ["p0", "p1"]
    assert len(load_prompts(path, limit=99)) == 5
    write_jsonl(path, [*rows, {"prompt": ""}])
    with pytest.raises(PromptFileError, match="line 6"):
        load_prompts(path, limit=1)
    with pytest.raises(ValueError, match="limit"):
        load_prompts(path, limit=0)


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "where", "problem"),
    [
        ('{"prompt": "ok"}\n{"prompt": "bad\n', "line 2", "invalid JSON"),
        ('{"prompt": "ok"}\n{"text": "x"}\n', "line 2", "no prompt field"),
        ('{"prompt": "   "}\n', "line 1", "empty prompt"),
        ('{"prompt": 5}\n', "line 1", "wrong type"),
        ('["just", "strings"]\n', "entry 1", "wrong type"),
        ('{"id": true, "prompt": "x"}\n', "line 1", "wrong type for 'id'"),
        ('{"messages": []}\n', "line 1", "empty prompt"),
        ('{"messages": [{"role": "system", "content": "s"}]}\n', "line 1", "no user message"),
        ('{"messages": [{"role": "robot", "content": "s"}]}\n', "line 1", "role 'robot'"),
        ('{"messages": [{"role": "user", "content": ""}]}\n', "line 1", "empty prompt"),
        ('{"turns": "not a list"}\n', "line 1", "wrong type for 'turns'"),
        ('[{"conversations": [{"from": "gpt", "value": "hi"}]}]', "entry 1", "no human turn"),
        ('[{"conversations": [{"from": "bot", "value": "hi"}]}]', "entry 1", "'from' 'bot'"),
        ('[{"conversations": "x"}]', "entry 1", "wrong type"),
        ('[{"conversations": [{"from": ["human"], "value": "x"}]}]', "entry 1", "'from' ['human']"),
        ('{"messages": [{"role": ["user"], "content": "s"}]}\n', "line 1", "role ['user']"),
        ('[{"prompt": "a"},\n {"prompt": "b",}]', "line 2", "invalid JSON"),
        ('{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}\n', "line 2", "duplicate id 'x'"),
        ("", "", "empty file"),
        ("\n  \n", "", "empty file"),
        ("[]", "", "empty file"),
    ],
)
def test_bad_input_names_file_place_and_problem(tmp_path, content, where, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, "utf-8")
    with pytest.raises(PromptFileError) as error:
        load_prompts(path)
    message = str(error.value)
    assert message.startswith(str(path))
    assert where in message
    assert problem in message


def test_duplicate_id_from_fallback_collides(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}, {"id": "d-1", "prompt": "b"}])
    with pytest.raises(PromptFileError, match="duplicate id 'd-1'.*line 1"):
        load_prompts(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(PromptFileError, match="not found"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(PromptFileError, match="directory"):
        load_prompts(tmp_path)


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    with pytest.raises(PromptFileError, match="UTF-8"):
        load_prompts(path)


def test_prompt_file_error_is_a_value_error():
    assert issubclass(PromptFileError, ValueError)


# --- long prompts -------------------------------------------------------------------------


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_line_separator_inside_a_string_is_part_of_the_prompt(tmp_path, separator):
    path = tmp_path / "p.jsonl"
    rows = [{"id": "a", "prompt": f"one{separator}two"}, {"id": "b", "prompt": "three"}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == [f"one{separator}two", "three"]
    assert prompts[1].source.endswith("line 2")


@pytest.mark.parametrize("content", ["[" * 5000, '{"prompt": ' + "[" * 5000])
def test_json_nested_too_deeply_is_one_line(tmp_path, content):
    path = tmp_path / "deep.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PromptFileError, match="nested too deeply"):
        load_prompts(path)
