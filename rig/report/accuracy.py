"""The accuracy block in the report: its line in summary.md and its section in report.html (each
flip linked to its request pair's mismatch card); accuracy.csv is laid out in report/tables."""

from __future__ import annotations

from rig.records import Side
from rig.report.format import cell, esc, number, table
from rig.report.mismatches import MISMATCH_CARDS, label, mismatch_order
from rig.verdict.accuracy import AccuracyResult, QuestionPair
from rig.verdict.compare import PairResult


def accuracy_markdown(result: AccuracyResult | None) -> list[str]:
    """summary.md's accuracy line, under the kernels."""
    if result is None:
        return []
    return [
        f"Accuracy ({result.task}, {result.questions} questions, {result.mode}): "
        + result.line().removeprefix("accuracy: "),
        "",
    ]


def accuracy_section(result: AccuracyResult | None, pairs: list[PairResult]) -> str:
    """Per side the accuracy and its 95 % interval, then every flip with its request pair."""
    if result is None:
        return ""
    sides = []
    for side in (Side.REFERENCE, Side.CANDIDATE):
        low, high = result.interval(side)
        sides.append(
            cell(side)
            + cell(f"{result.right(side)} / {result.questions}")
            + cell(number(100 * result.accuracy(side), "%", 1))
            + cell(f"{100 * low:.1f} – {100 * high:.1f} %")
        )
    carded = {
        p.request_id
        for p in sorted((p for p in pairs if not p.identical), key=mismatch_order)[:MISMATCH_CARDS]
    }
    by_id = {p.request_id: p for p in pairs}
    flips = [
        _flip_row(q, by_id.get(q.request_id), q.request_id in carded)
        for q in result.pairs
        if q.flip
    ]
    return (
        '<section id="accuracy"><h2>Accuracy</h2>'
        f"<p>{esc(result.line())}. Task {esc(result.task)}, the {esc(result.mode)} answer "
        "scored (lm-eval-harness's gsm8k filters); lost: the reference right and the candidate "
        "wrong, gained: the reverse.</p>"
        + table(["side", "right", "accuracy", "95 % interval (Wilson)"], sides, cls="")
        + (
            table(
                ["question", "flip", "answer", "reference", "candidate", "request pair", "label"],
                flips,
            )
            if flips
            else "<p>No flips.</p>"
        )
        + "</section>"
    )


def _flip_row(question: QuestionPair, pair: PairResult | None, carded: bool) -> str:
    link = (
        f'<a href="#pair-{esc(question.request_id)}">{esc(question.request_id)}</a>'
        if carded
        else f"{esc(question.request_id)} (mismatches.csv)"
    )
    kind = label(pair) if pair is not None and not pair.identical else ""
    return (
        cell(question.question_id)
        + cell(question.flip)
        + cell(question.target)
        + cell(question.reference.strict + " / " + question.reference.flexible)
        + cell(question.candidate.strict + " / " + question.candidate.flexible)
        + cell(link, sort=question.request_id, raw=True)
        + cell(kind)
    )
