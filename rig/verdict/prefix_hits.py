"""The prefix-cache gate of a conversation workload: hits on both sides, equal and above the
scenario's floor.

An ordinary run allows no hit (a hit is a prefill that skipped the kernel). A conversation
workload (rig.scenario.conversations) hits by design, so that the GDN prefill also runs from a
cached initial state; the run is then valid only when both sides took the same cached prompt
tokens for the same request, and at least `gates.min_prefix_cache_hits` of them in all: a side
that served fewer from its cache did other work, one that served none never ran the path.

Each request's cached tokens come from its usage (`prompt_tokens_details.cached_tokens`); a
turn after one whose texts differ between the sides is left out of the equality (the
candidate's cache holds its own earlier answer there, so its hits may fairly differ).
"""

from __future__ import annotations

from dataclasses import dataclass

from rig.records import RequestRecord, Side
from rig.verdict.words import Gate, GateKind

PREFIX_GATE = "prefix-cache hits"
SHOWN = 3  # differing requests named in the gate's line


@dataclass(frozen=True)
class TurnHits:
    """Cached prompt tokens at one turn of the conversations, summed per side."""

    turn: int
    requests: int
    prompt_tokens: int
    reference: int
    candidate: int


def _pairs(
    reference: list[RequestRecord], candidate: list[RequestRecord]
) -> list[tuple[RequestRecord, RequestRecord]]:
    by_id = {r.request_id: r for r in candidate}
    return [(r, by_id[r.request_id]) for r in reference if r.request_id in by_id]


def _diverged_turns(pairs: list[tuple[RequestRecord, RequestRecord]]) -> dict[tuple, int]:
    """The first turn whose texts differ, by (level, repeat, conversation)."""
    first: dict[tuple, int] = {}
    for ref, cand in pairs:
        if ref.text != cand.text and ref.turn is not None:
            key = (ref.level, ref.repeat, ref.conversation_id)
            first[key] = min(first.get(key, ref.turn), ref.turn)
    return first


def conversation_hits_gate(
    reference: list[RequestRecord], candidate: list[RequestRecord], floor: int
) -> Gate:
    """The gate over the compared pairs' cached tokens (finished, measured records)."""
    pairs = _pairs(reference, candidate)
    unreported = sum(r.cached_tokens is None for pair in pairs for r in pair)
    if not pairs or unreported:
        detail = (
            f"{unreported} of {2 * len(pairs)} responses report no cached tokens (vLLM sends "
            "them with --enable-prompt-tokens-details)"
            if pairs
            else "no request pair to read cached tokens from"
        )
        return Gate(PREFIX_GATE, False, detail, GateKind.VALIDITY)
    diverged = _diverged_turns(pairs)
    compared = [
        (ref, cand)
        for ref, cand in pairs
        if ref.turn is None
        or ref.turn <= diverged.get((ref.level, ref.repeat, ref.conversation_id), ref.turn)
    ]
    unequal = [(r, c) for r, c in compared if r.cached_tokens != c.cached_tokens]
    totals = [sum(pair[side].cached_tokens or 0 for pair in pairs) for side in (0, 1)]
    passed = not unequal and min(totals) >= floor
    detail = (
        f"cached prompt tokens: reference {totals[0]:,}, candidate {totals[1]:,} over "
        f"{len(pairs)} request pairs (floor {floor:,} per side); {len(unequal)} requests differ"
    )
    if unequal:
        shown = ", ".join(
            f"{r.request_id} ({r.cached_tokens} vs {c.cached_tokens})" for r, c in unequal[:SHOWN]
        )
        detail += f": {shown}" + (" ..." if len(unequal) > SHOWN else "")
        detail += " (a side whose step budget chunks a prompt by what else the step holds)"
    if len(compared) < len(pairs):
        detail += f"; {len(pairs) - len(compared)} turns after a divergence not held equal"
    return Gate(PREFIX_GATE, passed, detail, GateKind.VALIDITY)


def hits_by_turn(records: list[RequestRecord]) -> list[TurnHits]:
    """Cached tokens per conversation turn and side, over the finished measured requests that
    both sides served (the gate's pairs): what the report shows (turn 0 computes the shared
    prefix, later turns read it). A block that one side ran again after a JIT compile
    (rig.run.load_phase) has no counterpart, so it would make equal hits look unequal."""
    measured = [r for r in records if r.turn is not None and not r.warmup and r.error is None]
    pairs = _pairs(
        [r for r in measured if r.side == Side.REFERENCE],
        [r for r in measured if r.side == Side.CANDIDATE],
    )
    rows: dict[int, TurnHits] = {}
    for ref, cand in pairs:
        row = rows.get(ref.turn, TurnHits(ref.turn, 0, 0, 0, 0))
        rows[ref.turn] = TurnHits(
            ref.turn,
            row.requests + 1,
            row.prompt_tokens + (ref.prompt_tokens or 0),
            row.reference + (ref.cached_tokens or 0),
            row.candidate + (cand.cached_tokens or 0),
        )
    return [rows[turn] for turn in sorted(rows)]
