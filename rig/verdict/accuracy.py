"""Paired task accuracy: each question's answer on both sides scored as lm-eval-harness's gsm8k
task scores it, the flips counted both ways, and an exact McNemar test on them.

Two sides with equal accuracy can still disagree on many questions, and a paired test on the
discordant pairs is far stronger than two accuracies with independent intervals: the questions
both sides get right, or both wrong, say nothing about the difference.

Scoring follows lm-eval's gsm8k.yaml (lm_eval 0.4.13): the strict answer is the first match of
`#### (\\-?[0-9\\.\\,]+)`, the flexible one the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`,
"[invalid]" where none; exact match after taking ",", "$", everything up to "#### " and a final
"." out of both the answer and the reference, case ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from rig.records import RequestRecord, Side
from rig.scenario.accuracy_config import ACCURACY_REPEAT
from rig.verdict.words import Gate

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED = (",", r"\$", r"(?s).*#### ", r"\.$")  # lm-eval's regexes_to_ignore
INVALID = "[invalid]"
Z_95 = 1.959963984540054
AnswerMode = Literal["strict", "flexible"]
__all__ = ["ACCURACY_REPEAT", "AccuracyResult", "accuracy_gate", "accuracy_result"]


def extract(text: str, mode: AnswerMode) -> str:
    """The answer lm-eval's filter takes from a completion: its regex, then take_first."""
    regex, group = (STRICT, 0) if mode == "strict" else (FLEXIBLE, -1)
    found = regex.findall(text)
    if not found:
        return INVALID
    match = found[group]
    if isinstance(match, tuple):
        match = next((part for part in match if part), INVALID)
    return match.strip()


def normalized(text: str) -> str:
    for pattern in IGNORED:
        text = re.sub(pattern, "", text)
    return text.lower()


def is_right(answer: str, reference: str) -> bool:
    """lm-eval's exact_match with the gsm8k task's regexes_to_ignore and ignore_case."""
    return normalized(answer) == normalized(reference)


def mcnemar_p(lost: int, gained: int) -> float:
    """Exact two-sided McNemar: 2 P(X <= min(b, c)) for X ~ Bin(b + c, 1/2), at most 1."""
    n = lost + gained
    tail = sum(math.comb(n, i) for i in range(min(lost, gained) + 1))
    return min(1.0, 2 * tail / 2**n)


def wilson(right: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a proportion (95 % by default); (0, 1) for no questions."""
    if n == 0:
        return (0.0, 1.0)
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class AnswerScore:
    """One side's answer to one question: both extractions, and whether the verdict's is right."""

    strict: str
    flexible: str
    right: bool


@dataclass(frozen=True)
class QuestionPair:
    """One question on both sides: the request pair it was (request_id, as in mismatches)."""

    question_id: str
    request_id: str
    level: int
    repeat: int
    target: str  # the reference answer's number, normalized
    reference: AnswerScore
    candidate: AnswerScore

    @property
    def flip(self) -> str:
        """lost: the reference right, the candidate wrong; gained: the reverse; '' neither."""
        if self.reference.right == self.candidate.right:
            return ""
        return "lost" if self.reference.right else "gained"


@dataclass(frozen=True)
class AccuracyResult:
    task: str
    mode: AnswerMode
    pairs: tuple[QuestionPair, ...]
    unanswered: int  # questions without a finished answer on both sides (not scored)
    alpha: float
    max_drop_pt: float | None

    @property
    def questions(self) -> int:
        return len(self.pairs)

    def right(self, side: str) -> int:
        return sum(
            getattr(p, "reference" if side == Side.REFERENCE else "candidate").right
            for p in self.pairs
        )

    def accuracy(self, side: str) -> float:
        return self.right(side) / self.questions if self.questions else math.nan

    def interval(self, side: str) -> tuple[float, float]:
        return wilson(self.right(side), self.questions)

    @property
    def lost(self) -> int:
        return sum(p.flip == "lost" for p in self.pairs)

    @property
    def gained(self) -> int:
        return sum(p.flip == "gained" for p in self.pairs)

    @property
    def change_pt(self) -> float:
        return 100 * (self.accuracy(Side.CANDIDATE) - self.accuracy(Side.REFERENCE))

    @property
    def p_value(self) -> float:
        return mcnemar_p(self.lost, self.gained)

    @property
    def word(self) -> str:
        if self.p_value >= self.alpha:
            return "no significant change"
        return "significant loss" if self.lost > self.gained else "significant gain"

    @property
    def fails(self) -> bool:
        """A significant loss beyond the allowed drop (never, with no drop allowed for)."""
        return (
            self.max_drop_pt is not None
            and self.word == "significant loss"
            and -self.change_pt > self.max_drop_pt
        )

    def line(self) -> str:
        """`accuracy: 71.2 % vs 70.9 % (-0.3 pt), flips 9 / 5, McNemar p = 0.42: ...`"""
        ref, cand = (100 * self.accuracy(side) for side in (Side.REFERENCE, Side.CANDIDATE))
        text = (
            f"accuracy: {ref:.1f} % vs {cand:.1f} % ({self.change_pt:+.1f} pt), flips "
            f"{self.lost} / {self.gained}, McNemar p = {self.p_value:.2g}: {self.word}"
        )
        if self.fails:
            text += f", beyond the allowed {self.max_drop_pt:g} pt drop: FAIL"
        return text


def score(text: str, target: str, mode: AnswerMode) -> AnswerScore:
    strict, flexible = extract(text, "strict"), extract(text, "flexible")
    return AnswerScore(strict, flexible, is_right(strict if mode == "strict" else flexible, target))


def accuracy_result(
    targets: dict[str, str],
    records: Iterable[RequestRecord],
    task: str,
    mode: AnswerMode = "strict",
    alpha: float = 0.05,
    max_drop_pt: float | None = 0.0,
) -> AccuracyResult:
    """Pair the task's records by request id and score both answers; `targets`: each question's
    reference answer by question (prompt) id, in the order the pairs keep (the file's)."""
    order = {question: i for i, question in enumerate(targets)}
    answers: dict[str, dict[str, RequestRecord]] = {}
    for record in records:
        if record.task is not None and record.prompt_id in targets and not record.cancelled:
            answers.setdefault(record.request_id, {})[record.side] = record
    pairs = []
    by_question = sorted(
        answers.items(), key=lambda a: (order[next(iter(a[1].values())).prompt_id], a[0])
    )
    for request_id, sides in by_question:
        ref, cand = sides.get(Side.REFERENCE), sides.get(Side.CANDIDATE)
        if ref is None or cand is None or ref.error is not None or cand.error is not None:
            continue
        target = targets[ref.prompt_id]
        pairs.append(
            QuestionPair(
                ref.prompt_id,
                request_id,
                ref.level,
                ref.repeat,
                normalized(target),
                score(ref.text, target, mode),
                score(cand.text, target, mode),
            )
        )
    unanswered = len(targets) - len(pairs)
    return AccuracyResult(task, mode, tuple(pairs), unanswered, alpha, max_drop_pt)


def accuracy_gate(result: AccuracyResult) -> Gate:
    """Fails on a significant loss (McNemar p < alpha) beyond the scenario's allowed drop."""
    if not result.questions:
        return Gate("accuracy", False, f"{result.task}: no question answered on both sides")
    detail = f"{result.task}, {result.questions} questions ({result.mode}): {result.line()}"
    if result.unanswered:
        detail += f"; {result.unanswered} without an answer on both sides"
    return Gate("accuracy", not result.fails, detail)
