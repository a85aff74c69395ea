"""Teacher-forced drift: replay each reference prompt+completion as token ids on both sides with
`prompt_logprobs` and compare the logprob each side gives the same next token.

Text equality hides small bugs (a broken kernel can still pick the same greedy tokens) and
exaggerates benign ones (a bf16 near-tie flips a token). Forcing both sides along the same token
sequence measures how far the candidate's distribution moved, position by position. Runs after
the load phase and is not counted in performance numbers.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from rig.records import RequestRecord, ServerTarget
from rig.salts import cache_salt
from rig.secrets import auth_headers

DRIFT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ForcedSequence:
    """One sequence to replay: the reference's prompt and greedy completion, as token ids."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        return (self.prompt_id, self.completion_token_ids)


@dataclass(frozen=True)
class DriftResult:
    """|Δ logprob| of the forced tokens between the sides: completion positions gate the run,
    prompt positions show how much the prefill itself moved."""

    prompt_id: str
    completion_tokens: int
    max_abs: float
    mean_abs: float
    p99_abs: float
    prompt_max_abs: float
    prompt_mean_abs: float
    nonfinite: int
    error: str | None = None


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def drift_between(
    sequence: ForcedSequence, reference: list[float | None], candidate: list[float | None]
) -> DriftResult:
    """Compare two prompt_logprobs vectors over the same forced sequence."""
    prompt_len = len(sequence.prompt_token_ids)
    deltas_prompt, deltas_completion, nonfinite = [], [], 0
    for position in range(1, min(len(reference), len(candidate))):
        a, b = reference[position], candidate[position]
        if a is None or b is None:
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            nonfinite += 1
            continue
        (deltas_completion if position >= prompt_len else deltas_prompt).append(abs(a - b))
    completion = deltas_completion or [0.0]
    prompt = deltas_prompt or [0.0]
    return DriftResult(
        prompt_id=sequence.prompt_id,
        completion_tokens=len(deltas_completion),
        max_abs=max(completion),
        mean_abs=sum(completion) / len(completion),
        p99_abs=_quantile(completion, 0.99),
        prompt_max_abs=max(prompt),
        prompt_mean_abs=sum(prompt) / len(prompt),
        nonfinite=nonfinite,
    )


async def _json_answer(response: aiohttp.ClientResponse, what: str) -> dict:
    """The JSON body of a 200 answer; any other answer (JSON or not, e.g. a proxy's 502 page)
    raises with the status and the start of the body."""
    text = await response.text(errors="replace")
    if response.status != 200:
        raise RuntimeError(f"{what} answered {response.status}: {text[:300]}")
    return json.loads(text)


async def tokenize(
    session: aiohttp.ClientSession, target: ServerTarget, body: dict
) -> tuple[int, ...]:
    """The server's own tokenization of a prompt (vLLM's /tokenize), so replay matches serving."""
    async with session.post(
        f"{target.base_url}/tokenize",
        json={"model": target.model, **body},
        headers=auth_headers(target.api_key),
    ) as response:
        payload = await _json_answer(response, "/tokenize")
    return tuple(payload["tokens"])


def _forced_logprob(entry: dict | None, token_id: int) -> float | None:
    if entry is None:
        return None
    found = entry.get(str(token_id)) or entry.get(token_id)
    if found is None:
        return None
    return float(found["logprob"] if isinstance(found, dict) else found)


async def teacher_forced_logprobs(
    session: aiohttp.ClientSession, target: ServerTarget, token_ids: tuple[int, ...], salt: str
) -> list[float | None]:
    """Logprob the server gives each forced token (index i: token i given tokens < i)."""
    body = {
        "model": target.model,
        "prompt": list(token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 1,
        "cache_salt": salt,
    }
    async with session.post(
        f"{target.base_url}/v1/completions", json=body, headers=auth_headers(target.api_key)
    ) as response:
        payload = await _json_answer(response, "prompt_logprobs request")
    choice = payload["choices"][0]
    entries = choice.get("prompt_logprobs") or payload.get("prompt_logprobs") or []
    return [_forced_logprob(entry, token) for entry, token in zip(entries, token_ids, strict=False)]


@dataclass(frozen=True)
class ForcedLogprobs:
    """One side's logprobs along one forced sequence, or why there are none."""

    logprobs: tuple[float | None, ...] = ()
    error: str | None = None


async def _replay(
    sequences: list[ForcedSequence],
    targets: list[ServerTarget],
    salt_prefix: str,
    concurrency: int,
) -> dict[str, list[ForcedLogprobs]]:
    timeout = aiohttp.ClientTimeout(total=DRIFT_TIMEOUT_S)
    replayed: dict[str, list[ForcedLogprobs]] = {target.side: [] for target in targets}
    in_flight = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def on_every_target(index: int, sequence: ForcedSequence) -> list[object]:
            tokens = sequence.prompt_token_ids + sequence.completion_token_ids
            async with in_flight:  # all sides at once, so both see the same batch composition
                return await asyncio.gather(
                    *(
                        teacher_forced_logprobs(
                            session,
                            target,
                            tokens,
                            cache_salt(salt_prefix, target.side, str(index)),
                        )
                        for target in targets
                    ),
                    return_exceptions=True,
                )

        answered = await asyncio.gather(
            *(on_every_target(index, sequence) for index, sequence in enumerate(sequences))
        )
        for answers in answered:
            for target, answer in zip(targets, answers, strict=True):
                if isinstance(answer, BaseException):
                    if not isinstance(answer, Exception):
                        raise answer
                    error = f"{type(answer).__name__}: {answer}"[:300]
                    replayed[target.side].append(ForcedLogprobs(error=error))
                else:
                    replayed[target.side].append(ForcedLogprobs(tuple(answer)))
    return replayed


def replay_forced(
    sequences: list[ForcedSequence],
    targets: list[ServerTarget],
    salt_prefix: str,
    concurrency: int = 1,
) -> dict[str, list[ForcedLogprobs]]:
    """Teacher-forced logprobs of every sequence on every target (targets replay concurrently).

    `concurrency` sequences are in flight per target: 1 keeps the batch composition fixed (the
    candidate comparison); more lets the server batch them, as the A/A control wants."""
    return asyncio.run(_replay(sequences, targets, salt_prefix, concurrency))


def drift_results(
    sequences: list[ForcedSequence],
    reference: list[ForcedLogprobs],
    candidate: list[ForcedLogprobs],
) -> list[DriftResult]:
    results = []
    for sequence, ref, cand in zip(sequences, reference, candidate, strict=True):
        error = ref.error or cand.error
        if error is not None:
            nan = math.nan
            results.append(DriftResult(sequence.prompt_id, 0, nan, nan, nan, nan, nan, 0, error))
        else:
            results.append(drift_between(sequence, list(ref.logprobs), list(cand.logprobs)))
    return results


async def _forced_sequences(
    records: list[RequestRecord], prompt_bodies: dict[str, dict], target: ServerTarget
) -> list[ForcedSequence]:
    seen: dict[tuple, ForcedSequence] = {}
    prompt_tokens: dict[str, tuple[int, ...]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for record in records:
            if record.error is not None or not record.token_ids:
                continue
            if record.prompt_id not in prompt_tokens:
                prompt_tokens[record.prompt_id] = await tokenize(
                    session, target, prompt_bodies[record.prompt_id]
                )
            sequence = ForcedSequence(
                record.prompt_id, prompt_tokens[record.prompt_id], tuple(record.token_ids)
            )
            seen.setdefault(sequence.key, sequence)
    return list(seen.values())


def forced_sequences(
    records: list[RequestRecord], prompt_bodies: dict[str, dict], target: ServerTarget
) -> list[ForcedSequence]:
    """Unique (prompt, reference completion) pairs; prompt_bodies: /tokenize bodies by prompt id."""
    return asyncio.run(_forced_sequences(records, prompt_bodies, target))
