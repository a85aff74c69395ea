"""The accuracy block in the report: its line in summary.md, its section in report.html (each
flip linked to its request pair's mismatch card) and accuracy.csv (one row per question)."""

from __future__ import annotations

import pandas as pd

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


def accuracy_frame(result: AccuracyResult | None, pairs: list[PairResult]) -> pd.DataFrame:
    """accuracy.csv: per question both sides' answers (strict and flexible), which the verdict
    scored right, the flip, and its request pair's first divergence and margin label."""
    if result is None:
        return pd.DataFrame()
    by_id = {p.request_id: p for p in pairs}
    rows = []
    for question in result.pairs:
        pair = by_id.get(question.request_id)
        d = pair.divergence if pair is not None else None
        rows.append(
            {
                "question_id": question.question_id,
                "request_id": question.request_id,
                "level": question.level,
                "target": question.target,
                "reference_strict": question.reference.strict,
                "reference_flexible": question.reference.flexible,
                "reference_right": question.reference.right,
                "candidate_strict": question.candidate.strict,
                "candidate_flexible": question.candidate.flexible,
                "candidate_right": question.candidate.right,
                "flip": question.flip,
                "pair_label": label(pair) if pair is not None and not pair.identical else "",
                "div_char_index": d.char_index if d else None,
                "div_token_index": d.token_index if d else None,
                "div_reference_margin": d.reference_margin if d else None,
            }
        )
    return pd.DataFrame(rows)


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
