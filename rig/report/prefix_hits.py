"""The prefix-cache hits of a conversation workload, rendered: cached prompt tokens by turn on
both sides (summary.md and report.html, from the outcome's turn_hits, computed in
rig/verdict/prefix_hits.py) and each request's (report.html). Nothing for a workload of single
requests, whose evidence is the counters' zero."""

from __future__ import annotations

from rig.records import RequestRecord, Side
from rig.report.format import cell, table
from rig.verdict.prefix_hits import TurnHits

REQUESTS_SHOWN = 200  # per-request rows in report.html


def hits_markdown(turns: tuple[TurnHits, ...]) -> list[str]:
    """summary.md's lines: one row per turn (empty without conversation turns)."""
    if not turns:
        return []
    lines = [
        "Prefix-cache hits by turn (cached prompt tokens):",
        "",
        "| turn | requests | prompt tokens | reference | candidate |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {t.turn} | {t.requests} | {t.prompt_tokens:,} | {t.reference:,} | {t.candidate:,} |"
        for t in turns
    ]
    return [*lines, ""]


def hits_html(turns: tuple[TurnHits, ...], records: list[RequestRecord]) -> str:
    """report.html's tables: by turn, then every measured request's cached tokens per side."""
    if not turns:
        return ""
    turn_rows = [
        cell(t.turn, t.turn, "num")
        + cell(t.requests, t.requests, "num")
        + cell(f"{t.prompt_tokens:,}", t.prompt_tokens, "num")
        + cell(f"{t.reference:,}", t.reference, "num")
        + cell(
            f"{t.candidate:,}", t.candidate, "num" + (" bad" if t.reference != t.candidate else "")
        )
        for t in turns
    ]
    by_id: dict[str, dict[str, RequestRecord]] = {}
    for record in records:
        if record.turn is not None and not record.warmup:
            by_id.setdefault(record.request_id, {})[record.side] = record
    request_rows = []
    for request_id, sides in list(by_id.items())[:REQUESTS_SHOWN]:
        first = next(iter(sides.values()))
        cached = [
            sides[s].cached_tokens if s in sides else None for s in (Side.REFERENCE, Side.CANDIDATE)
        ]
        request_rows.append(
            cell(request_id, cls="mono")
            + cell(first.conversation_id)
            + cell(first.turn, first.turn, "num")
            + "".join(
                cell(
                    "—" if c is None else f"{c:,}",
                    c or 0,
                    "num" + (" bad" if None not in (c, cached[0]) and c != cached[0] else ""),
                )
                for c in cached
            )
        )
    headers = ["request", "conversation", "turn", Side.REFERENCE, Side.CANDIDATE]
    return (
        "<h3>Cached prompt tokens by conversation turn</h3>"
        + table(
            ["turn", "requests", "prompt tokens", Side.REFERENCE, Side.CANDIDATE],
            turn_rows,
            "compact",
        )
        + f"<details><summary>per request ({len(by_id)}, first {REQUESTS_SHOWN} shown)</summary>"
        + table(headers, request_rows)
        + "</details>"
    )
