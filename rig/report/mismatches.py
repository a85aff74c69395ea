"""The mismatches of report.html, the way a reviewer reads them: one card per mismatched pair,
substantive first, with both completions side by side and the first divergent token marked,
both sides' top-k logprobs at that token (from the teacher-forced replay, rig.verdict.drift), long
outputs folded, and data attributes that the page's filters (level, prompt category, label)
select on."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rig.records import RequestRecord, Side
from rig.report.format import DASH, cell, esc, number
from rig.verdict.compare import PairResult

# token ids -> text, from the served model's tokenizer when the report stage can load it
Decode = Callable[[Sequence[int]], str]

MISMATCH_CARDS = 200  # cards on the page; the rest are in mismatches.csv
OPEN_CARDS = 20  # the first cards are unfolded
FOLD_CHARS = 600  # a completion longer than this shows a window around the divergence
WINDOW_CHARS = 240


def prompt_category(prompt_id: str, categories: dict[str, str]) -> str:
    """The prompt's category; without one recorded, the id's leading word (`math-03` -> math)."""
    if prompt_id in categories:
        return categories[prompt_id]
    return re.sub(r"(-\d+)+$", "", prompt_id) or prompt_id


def label(pair: PairResult) -> str:
    if pair.divergence is not None and pair.divergence.kind != "unclassified":
        return pair.divergence.kind.replace("_", "-")
    return "pathology" if pair.pathologies else "unclassified"


@dataclass(frozen=True)
class Span:
    """Where the first divergent token sits in one side's text (characters)."""

    start: int
    end: int


def divergent_span(
    record: RequestRecord | None, pair: PairResult, decode: Decode | None
) -> Span | None:
    """The divergent token's characters when the tokenizer can place it, else the first
    differing character; None when the texts do not diverge (a pathology alone)."""
    d = pair.divergence
    if d is None:
        return None
    start = d.char_index
    if record is None:
        return Span(start, start)
    if decode is not None and d.token_index is not None and record.token_ids:
        ids = record.token_ids
        try:
            before = decode(ids[: d.token_index])
            through = decode(ids[: d.token_index + 1])
        except Exception:  # a tokenizer that cannot decode these ids: fall back to characters
            before = through = None
        if (
            before is not None
            and record.text.startswith(through)
            and through.startswith(before)
            and len(before) <= start
        ):
            return Span(len(before), max(len(through), len(before)))
    return Span(start, min(start + 1, len(record.text)))


def completion_html(text: str, span: Span | None) -> str:
    """One side's completion with the divergent token marked (when there is a divergence); a
    long one shows a window around the divergence and folds the whole text."""
    if span is None:
        return _folded(
            esc(text[:FOLD_CHARS]) + ("…" if len(text) > FOLD_CHARS else ""), text, esc(text)
        )
    token = text[span.start : span.end]
    mark = f"<mark>{esc(token) if token else '∅'}</mark>"
    full = esc(text[: span.start]) + mark + esc(text[span.end :])
    lo, hi = max(0, span.start - WINDOW_CHARS), span.end + WINDOW_CHARS
    window = (
        ("…" if lo else "")
        + esc(text[lo : span.start])
        + mark
        + esc(text[span.end : hi])
        + ("…" if hi < len(text) else "")
    )
    return _folded(window, text, full)


def _folded(window: str, text: str, full: str) -> str:
    if len(text) <= FOLD_CHARS:
        return f"<pre>{full}</pre>"
    return (
        f"<pre>{window}</pre><details class='whole'><summary>whole completion "
        f"({len(text):,} characters)</summary><pre>{full}</pre></details>"
    )


def _token_text(token_id: int | None, decode: Decode | None) -> str:
    if token_id is None:
        return DASH
    if decode is None:
        return f"id {token_id}"
    try:
        text = decode([token_id])
    except Exception:  # not decodable alone: the id says enough
        return f"id {token_id}"
    shown = text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")
    return f"{shown!r} (id {token_id})"


def _topk(
    top: dict[int, float] | None, own: int | None, other: int | None, decode: Decode | None
) -> str:
    if top is None:
        return "<p>no logprobs at this position</p>"
    ordered = sorted(
        top.items(),
        key=lambda item: -(item[1] if item[1] is not None and math.isfinite(item[1]) else -1e30),
    )
    rows = []
    for rank, (token_id, logprob) in enumerate(ordered, start=1):
        cls = "chosen" if token_id == own else "other-side" if token_id == other else ""
        rows.append(
            f'<tr class="{cls}">{cell(rank, rank, "num")}{cell(_token_text(token_id, decode))}'
            f"{cell(number(logprob, digits=3), logprob, 'num')}</tr>"
        )
    return (
        '<table class="topk"><thead><tr><th>rank</th><th>token</th><th>logprob</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def mismatch_card(
    pair: PairResult,
    records: dict[tuple[str, str], RequestRecord],
    category: str,
    decode: Decode | None,
    open_: bool,
) -> str:
    ref = records.get((Side.REFERENCE, pair.request_id))
    cand = records.get((Side.CANDIDATE, pair.request_id))
    d, kind = pair.divergence, label(pair)
    facts = [f"prompt {pair.prompt_id} ({category})", f"C={pair.level}", f"repeat {pair.repeat}"]
    if d is not None:
        facts.append(f"char {d.char_index:,}")
        if d.token_index is not None:
            facts.append(f"token {d.token_index:,}")
        if d.reference_margin is not None:
            facts.append(f"reference margin {number(d.reference_margin, 'nats', 3)}")
    summary = (
        f'<summary><span class="badge {kind}">{kind}</span> <b>{esc(pair.request_id)}</b> '
        f"<span class='facts'>{esc(' · '.join(facts))}</span></summary>"
    )
    sides = []
    ref_token, cand_token = (d.reference_token_id, d.candidate_token_id) if d else (None, None)
    for side, record, own, other, top in (
        (Side.REFERENCE, ref, ref_token, cand_token, d and d.reference_top),
        (Side.CANDIDATE, cand, cand_token, ref_token, d and d.candidate_top),
    ):
        text = record.text if record is not None else ""
        body = completion_html(text, divergent_span(record, pair, decode))
        error = f'<p class="error">{esc(record.error)}</p>' if record and record.error else ""
        topk = ""
        if d is not None and d.token_index is not None:
            topk = (
                f"<p class='topk-title'>top-k at token {d.token_index:,}: "
                f"{esc(_token_text(own, decode))} chosen</p>" + _topk(top, own, other, decode)
            )
        sides.append(f'<div class="side"><h4>{side}</h4>{error}{body}{topk}</div>')
    pathologies = "".join(
        f"<li>{esc(p.side)} {esc(p.kind)}: {esc(p.detail)}"
        f"{' (candidate only)' if p.candidate_only else ''}</li>"
        for p in pair.pathologies
    )
    return (
        f'<details class="mismatch" id="pair-{esc(pair.request_id)}" data-level="{pair.level}" '
        f'data-category="{esc(category)}" data-label="{kind}"{" open" if open_ else ""}>{summary}'
        + (f"<ul class='pathologies'>{pathologies}</ul>" if pathologies else "")
        + f'<div class="sides">{"".join(sides)}</div></details>'
    )


def mismatch_order(pair: PairResult) -> tuple:
    """Substantive divergences first, then pathologies, then near-ties and reference variants."""
    rank = {
        "substantive": 0,
        "unclassified": 1,
        "pathology": 1,
        "near-tie": 2,
        "reference-variant": 2,
    }[label(pair)]
    return (rank, pair.level, pair.repeat, pair.index)


def _select(name: str, title: str, values: Sequence[object]) -> str:
    options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in values)
    return (
        f'<label>{esc(title)} <select name="{name}"><option value="">all</option>'
        f"{options}</select></label>"
    )


def mismatches_section(outcome, decode: Decode | None) -> str:
    mismatched = sorted((p for p in outcome.pairs if not p.identical), key=mismatch_order)
    categories = getattr(outcome, "prompt_categories", None) or {}
    records = {(r.side, r.request_id): r for r in outcome.records}
    counts = Counter(label(p) for p in mismatched).most_common()  # ties in order of severity
    tally = ", ".join(f"{n} {k}" for k, n in counts) or "none"
    parts = [
        f'<section id="mismatches"><h2>Mismatches ({len(mismatched):,})</h2><p>{esc(tally)}. '
        "Substantive first; each card shows both completions with the first divergent token "
        "marked, and both sides' top-k logprobs at that token.</p>"
    ]
    if not mismatched:
        parts.append("</section>")
        return "\n".join(parts)
    shown = mismatched[:MISMATCH_CARDS]
    cats = [prompt_category(p.prompt_id, categories) for p in shown]
    parts.append(
        '<form class="filters">'
        + _select("level", "level", sorted({p.level for p in shown}))
        + _select("category", "prompt category", sorted(set(cats)))
        + _select("label", "label", sorted({label(p) for p in shown}))
        + '<output id="filter-count"></output></form>'
    )
    parts += [
        mismatch_card(pair, records, cat, decode, open_=i < OPEN_CARDS)
        for i, (pair, cat) in enumerate(zip(shown, cats, strict=True))
    ]
    if len(mismatched) > len(shown):
        parts.append(
            f"<p>{len(mismatched) - len(shown):,} more mismatches are listed in "
            "mismatches.csv next to this page.</p>"
        )
    parts.append("</section>")
    return "\n".join(parts)
