"""Teacher-forced replay: each reference prompt+completion is sent as token ids to every side
with `prompt_logprobs: k`, untimed, after the load. It gives, per side and position, the logprob
of the forced token and the side's top-k there.

Drift compares the logprob each side gives the same next token: text equality hides small bugs
(a broken kernel can still pick the same greedy tokens) and exaggerates benign ones (a bf16
near-tie flips a token). The top-k are the margin evidence: where a pair's texts first part,
both sides have seen the same prefix (the reference's), so the reference completion's replay
holds both sides' top-k at the divergent token (compare.py classifies it from them) and every
position's greedy margin (the report's margin CDF). The timed requests carry no logprobs.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from rig.records import CompletionKey, RequestRecord, ServerTarget, TokenLogprob
from rig.salts import cache_salt
from rig.secrets import auth_headers

DRIFT_TIMEOUT_S = 600.0
REPLAY_FILE = "replay.jsonl"


@dataclass(frozen=True)
class ForcedSequence:
    """One sequence to replay: the reference's prompt and greedy completion, as token ids."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]

    @property
    def key(self) -> CompletionKey:
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


def _logprob_value(found: dict | float | None) -> float:
    """A logprob as vLLM sends it; NaN (from a broken kernel) arrives as null."""
    value = found.get("logprob") if isinstance(found, dict) else found
    return math.nan if value is None else float(value)


def _forced_logprob(entry: dict | None, token_id: int) -> float | None:
    if entry is None:
        return None
    found = entry.get(str(token_id)) or entry.get(token_id)
    return None if found is None else _logprob_value(found)


def _top_k(entry: dict | None, k: int) -> dict[int, float]:
    """The side's k best tokens at one position. vLLM adds the forced token to its top-k with
    its true rank; beyond k it is left out, as it would be from a sampled token's top-k."""
    if entry is None:
        return {}
    return {
        int(token): _logprob_value(found)
        for token, found in entry.items()
        if not isinstance(found, dict) or found.get("rank") is None or found["rank"] <= k
    }


@dataclass(frozen=True)
class ForcedLogprobs:
    """One side's answer along one forced sequence, or why there is none: the forced token's
    logprob at every position (index i: token i given tokens < i) and the side's top-k at every
    completion position."""

    logprobs: tuple[float | None, ...] = ()
    top: tuple[dict[int, float], ...] = ()
    error: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "top": [{str(t): v for t, v in top.items()} for top in self.top]}

    @classmethod
    def from_json(cls, data: dict) -> ForcedLogprobs:
        top = tuple({int(t): v for t, v in position.items()} for position in data["top"])
        return cls(tuple(data["logprobs"]), top, data["error"])


async def teacher_forced_logprobs(
    session: aiohttp.ClientSession,
    target: ServerTarget,
    sequence: ForcedSequence,
    salt: str,
    top_k: int,
) -> ForcedLogprobs:
    """The server's logprobs along the forced sequence, with its top-k at the completion's
    positions."""
    token_ids = sequence.prompt_token_ids + sequence.completion_token_ids
    body = {
        "model": target.model,
        "prompt": list(token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": top_k,
        "cache_salt": salt,
    }
    async with session.post(
        f"{target.base_url}/v1/completions", json=body, headers=auth_headers(target.api_key)
    ) as response:
        payload = await _json_answer(response, "prompt_logprobs request")
    choice = payload["choices"][0]
    entries = choice.get("prompt_logprobs") or payload.get("prompt_logprobs") or []
    start = len(sequence.prompt_token_ids)
    return ForcedLogprobs(
        logprobs=tuple(
            _forced_logprob(entry, token) for entry, token in zip(entries, token_ids, strict=False)
        ),
        top=tuple(_top_k(entry, top_k) for entry in entries[start:]),
    )


async def _replay(
    sequences: list[ForcedSequence],
    targets: list[ServerTarget],
    salt_prefix: str,
    top_k: int,
    concurrency: int,
) -> dict[str, list[ForcedLogprobs]]:
    timeout = aiohttp.ClientTimeout(total=DRIFT_TIMEOUT_S)
    replayed: dict[str, list[ForcedLogprobs]] = {target.side: [] for target in targets}
    in_flight = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def on_every_target(index: int, sequence: ForcedSequence) -> list[object]:
            async with in_flight:  # all sides at once, so both see the same batch composition
                return await asyncio.gather(
                    *(
                        teacher_forced_logprobs(
                            session,
                            target,
                            sequence,
                            cache_salt(salt_prefix, target.side, str(index)),
                            top_k,
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
                    replayed[target.side].append(answer)
    return replayed


def replay_forced(
    sequences: list[ForcedSequence],
    targets: list[ServerTarget],
    salt_prefix: str,
    top_k: int = 1,
    concurrency: int = 1,
) -> dict[str, list[ForcedLogprobs]]:
    """Teacher-forced logprobs of every sequence on every target (targets replay concurrently).
    Every call needs a salt prefix of its own: the salts repeat the sequence's index.

    `concurrency` sequences are in flight per target: 1 keeps the batch composition fixed (the
    candidate comparison); more lets the server batch them, as the A/A control wants."""
    return asyncio.run(_replay(sequences, targets, salt_prefix, top_k, concurrency))


def replay_selection(
    sequences: list[ForcedSequence],
    reference: Iterable[RequestRecord],
    side: Iterable[RequestRecord],
    sample: int | None,
) -> list[int]:
    """Which sequences a side other than the reference replays: the drift's sample (the first
    `sample`, all when None) and the reference completion of every pair whose texts differ, so
    that each divergence has both sides' top-k."""
    index = {sequence.key: i for i, sequence in enumerate(sequences)}
    wanted = set(range(len(sequences) if sample is None else min(sample, len(sequences))))
    by_id = {r.request_id: r for r in reference if r.error is None and r.token_ids}
    for record in side:
        ref = by_id.get(record.request_id)
        if ref is not None and record.error is None and record.text != ref.text:
            found = index.get((ref.prompt_id, tuple(ref.token_ids)))
            if found is not None:
                wanted.add(found)
    return sorted(wanted)


def drift_results(
    sequences: list[ForcedSequence],
    reference: dict[int, ForcedLogprobs],
    candidate: dict[int, ForcedLogprobs],
) -> list[DriftResult]:
    """One result per sequence both sides replayed (by index into `sequences`)."""
    results = []
    for index in sorted(reference.keys() & candidate.keys()):
        sequence, ref, cand = sequences[index], reference[index], candidate[index]
        error = ref.error or cand.error
        if error is not None:
            nan = math.nan
            results.append(DriftResult(sequence.prompt_id, 0, nan, nan, nan, nan, nan, 0, error))
        else:
            results.append(drift_between(sequence, list(ref.logprobs), list(cand.logprobs)))
    return results


def forced_positions(
    sequences: list[ForcedSequence], forced: dict[int, ForcedLogprobs]
) -> dict[CompletionKey, list[TokenLogprob]]:
    """One side's replay along each reference completion it replayed: position i holds the
    forced token i, the logprob this side gives it, and this side's top-k there."""
    positions = {}
    for index, answer in forced.items():
        if answer.error is not None:
            continue
        sequence = sequences[index]
        start = len(sequence.prompt_token_ids)
        positions[sequence.key] = [
            TokenLogprob(
                token_id=token,
                logprob=answer.logprobs[start + i] if start + i < len(answer.logprobs) else None,
                top=top,
            )
            for i, (token, top) in enumerate(
                zip(sequence.completion_token_ids, answer.top, strict=False)
            )
        ]
    return positions


def write_replay(
    path: Path, sequences: list[ForcedSequence], forced: dict[str, dict[int, ForcedLogprobs]]
) -> None:
    """replay.jsonl: one line per side and replayed sequence, with the completion's token ids,
    the forced logprobs at its positions and the side's top-k there (token id -> logprob)."""
    with open(path, "w", encoding="utf-8") as handle:
        for side, answers in forced.items():
            for index, answer in sorted(answers.items()):
                sequence = sequences[index]
                start = len(sequence.prompt_token_ids)
                row = {
                    "side": side,
                    "prompt_id": sequence.prompt_id,
                    "prompt_tokens": start,
                    "completion_token_ids": list(sequence.completion_token_ids),
                    "logprobs": list(answer.logprobs[start:]),
                    "top": answer.to_json()["top"],
                    "error": answer.error,
                }
                handle.write(json.dumps(row) + "\n")


def read_replay(path: Path) -> dict[str, dict[CompletionKey, list[TokenLogprob]]]:
    """replay.jsonl back as forced_positions gives it, per side; empty without the file."""
    replayed: dict[str, dict[CompletionKey, list[TokenLogprob]]] = {}
    if not Path(path).exists():
        return replayed
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line) if line.strip() else None
            if row is None or row["error"] is not None:
                continue
            completion = tuple(row["completion_token_ids"])
            positions = zip(completion, row["logprobs"], row["top"], strict=False)
            replayed.setdefault(row["side"], {})[(row["prompt_id"], completion)] = [
                TokenLogprob(token, logprob, {int(t): v for t, v in top.items()})
                for token, logprob, top in positions
            ]
    return replayed


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
    """Unique (prompt, reference completion) pairs in the records' order; prompt_bodies: /tokenize
    bodies by prompt id."""
    return asyncio.run(_forced_sequences(records, prompt_bodies, target))
