"""Compare paired responses: exact text equality, the first divergence with the logprob margin
behind it, and pathologies on either side.

Exact equality alone misleads both ways: bf16 near-ties flip tokens between two correct kernels,
and small bugs leave text unchanged. So each mismatch is classified by the reference's top-1/top-2
margin at the first divergent token: a *near-tie* (each side's token in the other's top-k and a
margin within `near_tie_margin`) or a *substantive* divergence. The top-k come from the untimed
teacher-forced replay of the reference completion (rig.verdict.drift), which reaches the divergent
token along the prefix both sides generated: the timed requests carry no logprobs. Drift
completes the verdict.

Before any margin, a mismatch whose candidate text the reference itself wrote for the same prompt
in another request of the run is a *reference variant*: vLLM's output depends on the batch around
a request, so where the reference's own answers to one prompt differ between blocks, the candidate
writing one of them says nothing against its kernel (qwen35-control on one H100, 2026-12-07: FLA
answered a 7,960-token prompt one way in 39 blocks and the other in one, and a replay margin of
0.44 nats there made ns4 "substantive").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from rig.records import (
    CompletionKey,
    RequestRecord,
    Side,
    TokenLogprob,
    error_kind,
    is_transport_error,
)

EXCERPT_CHARS = 40
# Pathologies of the text itself: what any other continuation can do after a token flipped.
TEXT_CONSEQUENCES = frozenset(
    {"repetition_loop", "length_runaway", "empty_output", "replacement_char", "invalid_utf8"}
)
DivergenceKind = Literal["near_tie", "reference_variant", "substantive", "unclassified"]

# Each side's replay along the reference completions: side -> completion -> positions
# (rig.verdict.drift.forced_positions).
Replayed = Mapping[str, Mapping[CompletionKey, Sequence[TokenLogprob]]]


@dataclass(frozen=True)
class Divergence:
    """Where two responses first differ, and how confident the reference was there."""

    char_index: int
    token_index: int | None
    reference_excerpt: str
    candidate_excerpt: str
    reference_token_id: int | None = None
    candidate_token_id: int | None = None
    reference_logprob: float | None = None
    candidate_logprob: float | None = None
    candidate_token_rank_in_reference: int | None = None  # 1-based; None: not in top-k
    reference_token_rank_in_candidate: int | None = None
    reference_margin: float | None = None  # reference top-1 minus top-2 logprob
    kind: DivergenceKind = "unclassified"
    # Each side's top-k (token id -> logprob) at the divergent token, from the replay.
    reference_top: dict[int, float] | None = field(default=None, compare=False)
    candidate_top: dict[int, float] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Pathology:
    side: str
    kind: str
    detail: str
    candidate_only: bool  # absent on the reference for the same request

    @property
    def gating(self) -> bool:
        """Whether it counts against the pathologies gate: the candidate alone shows it, or the
        transport failed (no answer to compare is a failure whichever side it hit)."""
        return self.candidate_only or is_transport_error(self.kind)


@dataclass(frozen=True)
class PairResult:
    request_id: str
    prompt_id: str
    level: int
    repeat: int
    index: int
    identical: bool
    divergence: Divergence | None
    pathologies: tuple[Pathology, ...]

    @property
    def substantive(self) -> bool:
        """Its text differs where the measured margin is no near-tie."""
        return self.divergence is not None and self.divergence.kind == "substantive"

    @property
    def near_tie(self) -> bool:
        """Its text differs only at a near-tie: the one place this is decided."""
        return self.divergence is not None and self.divergence.kind == "near_tie"

    @property
    def reference_variant(self) -> bool:
        """Its candidate wrote what the reference wrote for the same prompt elsewhere in the run:
        the reference's own variation between batches, not a judgement on the kernel."""
        return self.divergence is not None and self.divergence.kind == "reference_variant"

    @property
    def unclassified(self) -> bool:
        """Its text differs where no margin was measured (no replay of it): neither a near-tie
        nor a substantive divergence, as far as the run can tell."""
        return self.divergence is not None and self.divergence.kind == "unclassified"

    @property
    def gating_pathologies(self) -> list[Pathology]:
        return [p for p in self.pathologies if p.gating]

    def after_benign_flip(self, pathology: Pathology) -> bool:
        """Whether `pathology` follows this pair's near-tie or reference-variant divergence and
        is of a kind that a different token brings about by itself (a loop, a long or empty
        answer, a split character): the flip's consequence, which a correct kernel's bf16 noise
        can have too."""
        return (self.near_tie or self.reference_variant) and pathology.kind in TEXT_CONSEQUENCES

    def as_row(self) -> dict:
        row = {
            "request_id": self.request_id,
            "prompt_id": self.prompt_id,
            "level": self.level,
            "repeat": self.repeat,
            "index": self.index,
            "identical": self.identical,
            "divergence_kind": self.divergence.kind if self.divergence else "",
            "pathologies": ";".join(f"{p.side}:{p.kind}" for p in self.pathologies),
        }
        if self.divergence is not None:
            skip = {"kind", "reference_top", "candidate_top"}
            row.update({f"div_{k}": v for k, v in asdict(self.divergence).items() if k not in skip})
        return row


def _finite_or_floor(value: float | None) -> float:
    """A broken kernel can make the server report NaN (sent as null) logprobs: rank them last."""
    return value if value is not None and math.isfinite(value) else -math.inf


def _rank(token_id: int, top: dict[int, float]) -> int | None:
    ordered = sorted(top.items(), key=lambda item: -_finite_or_floor(item[1]))
    for rank, (candidate_id, _) in enumerate(ordered, start=1):
        if candidate_id == token_id:
            return rank
    return None


def _margin(position: TokenLogprob) -> float | None:
    values = sorted((_finite_or_floor(v) for v in position.top.values()), reverse=True)
    if len(values) < 2 or not all(math.isfinite(v) for v in values[:2]):
        return None
    return values[0] - values[1]


def _first_token_mismatch(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _first_char_mismatch(a: str, b: str) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def replayed_positions(
    replayed: Replayed | None, side: str, reference: RequestRecord
) -> Sequence[TokenLogprob]:
    """`side`'s replay along the reference's completion; empty when it was not replayed."""
    if replayed is None or not reference.token_ids:
        return ()
    key = (reference.prompt_id, tuple(reference.token_ids))
    return replayed.get(side, {}).get(key, ())


def first_divergence(
    reference: RequestRecord,
    candidate: RequestRecord,
    near_tie_margin: float,
    replayed: Replayed | None = None,
) -> Divergence | None:
    """None when the texts are identical; else the first difference, classified from both
    sides' replay along the reference completion (unclassified where it is missing)."""
    if reference.text == candidate.text:
        return None
    char_index = _first_char_mismatch(reference.text, candidate.text)
    start = max(0, char_index - EXCERPT_CHARS)
    excerpt = {
        "reference_excerpt": reference.text[start : char_index + EXCERPT_CHARS],
        "candidate_excerpt": candidate.text[start : char_index + EXCERPT_CHARS],
    }
    if reference.token_ids is None or candidate.token_ids is None:
        return Divergence(char_index=char_index, token_index=None, **excerpt)
    token_index = _first_token_mismatch(reference.token_ids, candidate.token_ids)
    if token_index is None:
        return Divergence(char_index=char_index, token_index=None, **excerpt)
    ref_token = _at(reference.token_ids, token_index)
    cand_token = _at(candidate.token_ids, token_index)
    # Both replays force the reference's tokens: up to the divergence that is each side's own
    # prefix, so position `token_index` holds what each side chose its token from.
    ref_position = _at(replayed_positions(replayed, reference.side, reference), token_index)
    cand_position = _at(replayed_positions(replayed, candidate.side, reference), token_index)
    fields: dict = {"reference_token_id": ref_token, "candidate_token_id": cand_token}
    if ref_position is not None:
        fields["reference_logprob"] = ref_position.logprob
        fields["reference_margin"] = _margin(ref_position)
        fields["reference_top"] = dict(ref_position.top)
        if cand_token is not None:
            fields["candidate_token_rank_in_reference"] = _rank(cand_token, ref_position.top)
    if cand_position is not None:
        fields["candidate_top"] = dict(cand_position.top)
        if cand_token is not None:
            fields["candidate_logprob"] = cand_position.top.get(cand_token)
        if ref_token is not None:
            fields["reference_token_rank_in_candidate"] = _rank(ref_token, cand_position.top)
    kind: DivergenceKind = "unclassified"
    margin = fields.get("reference_margin")
    if ref_position is not None and margin is not None:
        # The reference's replay alone can rule a near-tie out: the candidate's token outside
        # its top-k, or a margin beyond the bound (ns3's empty answers at 15 nats, whose own
        # replay vLLM refuses for NaN). Only a near-tie needs the candidate's replay too. One
        # side stopping early (EOS vs more text) still has both tokens in the top-k.
        in_reference = fields.get("candidate_token_rank_in_reference") is not None
        if not in_reference or margin > near_tie_margin:
            kind = "substantive"
        elif cand_position is not None:
            in_candidate = fields.get("reference_token_rank_in_candidate") is not None
            kind = "near_tie" if in_candidate else "substantive"
    return Divergence(
        char_index=char_index, token_index=token_index, kind=kind, **excerpt, **fields
    )


def _at(items: list, index: int):
    return items[index] if 0 <= index < len(items) else None


def _repetition_loop(token_ids: list[int] | None, text: str) -> str | None:
    """A tail that repeats one short period at least 4 times over >= 32 tokens or chars."""
    sequence: list = list(token_ids) if token_ids else list(text)
    tail = sequence[-64:]
    if len(tail) < 32:
        return None
    for period in range(1, 17):
        repeats = 1
        while (repeats + 1) * period <= len(tail) and (
            tail[-(repeats + 1) * period : -repeats * period] == tail[-period:]
        ):
            repeats += 1
        if repeats >= 4 and repeats * period >= 32:
            return f"period {period} repeated {repeats}x at the end"
    return None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def content_pathologies(
    record: RequestRecord, max_tokens: int | None, replayed: Sequence[TokenLogprob] = ()
) -> list[tuple[str, str]]:
    """(kind, detail) for what is wrong with one response on its own; `replayed`: its side's
    replay along the pair's reference completion (NaN/inf logprobs show a broken kernel)."""
    if record.error is not None:
        return [(error_kind(record.error), record.error)]
    found = []
    if record.text == "":
        found.append(("empty_output", f"finish_reason={record.finish_reason}"))
    if "\ufffd" in record.text:
        found.append(("replacement_char", f"{record.text.count(chr(0xFFFD))} x U+FFFD"))
    if _LONE_SURROGATE.search(record.text):
        found.append(("invalid_utf8", "lone surrogate in decoded text"))
    nonfinite = sum(
        1
        for position in replayed
        if not math.isfinite(_finite_or_floor(position.logprob))
        or any(not math.isfinite(_finite_or_floor(v)) for v in position.top.values())
    )
    if nonfinite:
        found.append(("nonfinite_logprobs", f"{nonfinite} positions with NaN/inf logprobs"))
    loop = _repetition_loop(record.token_ids, record.text)
    if loop:
        found.append(("repetition_loop", loop))
    if (
        max_tokens is not None
        and record.output_tokens is not None
        and record.output_tokens > max_tokens
    ):
        found.append(("length_overrun", f"{record.output_tokens} > max_tokens {max_tokens}"))
    return found


def pair_pathologies(
    reference: RequestRecord,
    candidate: RequestRecord,
    max_tokens: int | None,
    replayed: Replayed | None = None,
) -> tuple[Pathology, ...]:
    ref_found = content_pathologies(
        reference, max_tokens, replayed_positions(replayed, reference.side, reference)
    )
    cand_found = content_pathologies(
        candidate, max_tokens, replayed_positions(replayed, candidate.side, reference)
    )
    ref_kinds = {kind for kind, _ in ref_found}
    found = [Pathology(Side.REFERENCE, kind, detail, False) for kind, detail in ref_found]
    found += [
        Pathology(Side.CANDIDATE, kind, detail, kind not in ref_kinds)
        for kind, detail in cand_found
    ]
    both_answered = candidate.error is None and reference.error is None
    if both_answered and candidate.finish_reason == "length" and reference.finish_reason == "stop":
        found.append(
            Pathology(Side.CANDIDATE, "length_runaway", "hit max_tokens; reference stopped", True)
        )
    return tuple(found)


def _prompt_key(record: RequestRecord) -> tuple[str, int | None] | None:
    """Requests that ask the same: one prompt, its token count as the server saw it. None for a
    conversation's turn, whose prompt carries its own side's earlier answers."""
    if record.conversation_id is not None:
        return None
    return record.prompt_id, record.prompt_tokens


def _reference_answers(reference: list[RequestRecord]) -> dict[tuple[str, int | None], set[str]]:
    """Every text the reference wrote for each prompt in the run (answered requests only)."""
    answers: dict[tuple[str, int | None], set[str]] = {}
    for record in reference:
        key = _prompt_key(record)
        if key is not None and record.error is None:
            answers.setdefault(key, set()).add(record.text)
    return answers


def compare_pairs(
    reference: list[RequestRecord],
    candidate: list[RequestRecord],
    near_tie_margin: float,
    max_tokens: int | None = None,
    replayed: Replayed | None = None,
    reference_variants: bool = True,
) -> list[PairResult]:
    """Pair by request_id (both sides get the same ordered requests) and compare each pair;
    `replayed`: each side's teacher-forced top-k along the reference completions. A mismatch
    whose candidate text the reference wrote for the same prompt elsewhere is a reference
    variant, whatever its margin, unless `reference_variants` is off (a comparison whose very
    subject is how the batch moves one side's answers)."""
    answers = _reference_answers(reference) if reference_variants else {}
    by_id = {record.request_id: record for record in candidate}
    missing = [record.request_id for record in reference if record.request_id not in by_id]
    if missing:
        raise ValueError(
            f"candidate has no result for {len(missing)} request(s), e.g. {missing[0]}"
        )
    results = []
    for ref in reference:
        cand = by_id[ref.request_id]
        pathologies = pair_pathologies(ref, cand, max_tokens, replayed)
        both_answered = ref.error is None and cand.error is None
        divergence = (
            first_divergence(ref, cand, near_tie_margin, replayed) if both_answered else None
        )
        if divergence is not None and cand.text in answers.get(_prompt_key(ref), ()):
            divergence = replace(divergence, kind="reference_variant")
        results.append(
            PairResult(
                request_id=ref.request_id,
                prompt_id=ref.prompt_id,
                level=ref.level,
                repeat=ref.repeat,
                index=ref.index,
                identical=both_answered and divergence is None,
                divergence=divergence,
                pathologies=pathologies,
            )
        )
    return results
