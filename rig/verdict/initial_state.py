"""The initial-state path: whether both sides' GDN prefill continued sequences from the state an
earlier step left (a chunked prefill's later chunks, a prefix-cache hit), where a kernel that
mishandles its initial state goes wrong while every first chunk stays exact; and how many chunks
each prompt's prefill takes under the step's token budget (`model.max_num_batched_tokens`).

A scenario that sets `gates.require_initial_state` declares that it exercises this path; a side
whose kernel proof shows no such sequence makes the run INVALID: its verdict could not have
caught such a kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rig.records import RequestRecord, Side
from rig.scenario.config import SIDES
from rig.verdict.evidence import SideKernel
from rig.verdict.words import Gate, GateKind


def initial_state_gate(kernels: dict[str, SideKernel]) -> Gate:
    """Valid when each side's proof counted at least one prefilled sequence that started from
    a non-zero state; the detail names each side's counts, the reason the side that had none."""
    seen, missing = [], []
    for side in SIDES:
        counts = kernels[side].initial_state if side in kernels else None
        if counts is None:
            missing.append(f"{side}: no initial-state count in its kernel proof")
            continue
        seen.append(f"{side}: {counts.describe()}")
        if counts.sequences <= 0:
            missing.append(f"{side} never prefilled from a non-zero initial state")
    detail = "; ".join(seen) or "no kernel proof"
    if missing:
        detail = f"{'; '.join(missing)} (gates.require_initial_state): {detail}"
    return Gate("initial state exercised", not missing, detail, GateKind.VALIDITY)


@dataclass(frozen=True)
class PromptChunks:
    """One prompt's prefill in steps of the token budget: ceil(tokens / budget), computed, as
    a request alone on the server prefills it; with other requests in the step, more."""

    prompt_id: str
    tokens: int
    chunks: int


@dataclass(frozen=True)
class ChunkedPrefill:
    budget: int  # model.max_num_batched_tokens
    prompts: tuple[PromptChunks, ...]  # longest first

    @property
    def chunked(self) -> list[PromptChunks]:
        return [p for p in self.prompts if p.chunks > 1]

    def describe(self) -> str:
        if not self.prompts:
            return f"budget {self.budget:,} tokens per step; no prompt's token count is known"
        chunked = self.chunked
        text = (
            f"{len(chunked)} of {len(self.prompts)} prompts take several prefill steps at a "
            f"budget of {self.budget:,} tokens (computed: ceil(prompt tokens / budget), a "
            "request alone on the server)"
        )
        if chunked:
            longest = chunked[0]
            text += (
                f"; up to {longest.chunks} chunks ({longest.prompt_id}: {longest.tokens:,} tokens)"
            )
        return text


def chunked_prefill(records: list[RequestRecord], budget: int | None) -> ChunkedPrefill | None:
    """Each prompt's chunk count, from the reference's reported prompt tokens; None when the
    scenario leaves the budget to vLLM's default."""
    if budget is None:
        return None
    tokens: dict[str, int] = {}
    for record in records:
        if record.side == Side.REFERENCE and record.prompt_tokens:
            tokens.setdefault(record.prompt_id, record.prompt_tokens)
    prompts = sorted(
        (PromptChunks(pid, n, math.ceil(n / budget)) for pid, n in tokens.items()),
        key=lambda p: (-p.tokens, p.prompt_id),
    )
    return ChunkedPrefill(budget, tuple(prompts))
