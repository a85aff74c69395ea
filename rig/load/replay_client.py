"""The teacher-forced replay on the wire: each reference prompt and completion sent as token ids
to every side with `prompt_logprobs: k`, untimed, after the load (vLLM's /tokenize gives the
prompt's ids, so the replay matches serving). Each answer is read into the side's logprob of the
forced token at every position and its top-k there (replay_records); rig.verdict.drift turns
them into drift and margins. The timed requests carry no logprobs."""

from __future__ import annotations

import asyncio
import json
import math

from rig.records import ForcedLogprobs, ForcedSequence, RequestRecord, ServerTarget
from rig.salts import cache_salt
from rig.secrets import auth_headers
from rig.untimed_http import Answer, AsyncClient, call

REPLAY_TIMEOUT_S = 600.0
TOKENIZE_TIMEOUT_S = 120.0


def _json_answer(answer: Answer, what: str) -> dict:
    """The JSON body of a 200 answer; any other answer (JSON or not, e.g. a proxy's 502 page)
    raises with the status and the start of the body."""
    text = answer.text()
    if answer.status != 200:
        raise RuntimeError(f"{what} answered {answer.status}: {text[:300]}")
    return json.loads(text)


def _post(target: ServerTarget, path: str, body: dict, timeout_s: float) -> Answer:
    return call(
        "POST",
        f"{target.base_url}{path}",
        timeout_s=timeout_s,
        headers=auth_headers(target.api_key),
        body=body,
    )


def tokenize(target: ServerTarget, body: dict) -> tuple[int, ...]:
    """The server's own tokenization of a prompt (vLLM's /tokenize), so replay matches serving."""
    answer = _post(target, "/tokenize", {"model": target.model, **body}, TOKENIZE_TIMEOUT_S)
    return tuple(_json_answer(answer, "/tokenize")["tokens"])


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


def forced_body(target: ServerTarget, sequence: ForcedSequence, salt: str, top_k: int) -> dict:
    """The prompt_logprobs request of one forced sequence: one token, greedy, salted."""
    return {
        "model": target.model,
        "prompt": list(sequence.prompt_token_ids + sequence.completion_token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": top_k,
        "cache_salt": salt,
    }


def forced_answer(payload: dict, sequence: ForcedSequence, top_k: int) -> ForcedLogprobs:
    """A prompt_logprobs answer read along the forced sequence."""
    token_ids = sequence.prompt_token_ids + sequence.completion_token_ids
    choice = payload["choices"][0]
    entries = choice.get("prompt_logprobs") or payload.get("prompt_logprobs") or []
    start = len(sequence.prompt_token_ids)
    return ForcedLogprobs(
        logprobs=tuple(
            _forced_logprob(entry, token) for entry, token in zip(entries, token_ids, strict=False)
        ),
        top=tuple(_top_k(entry, top_k) for entry in entries[start:]),
    )


def teacher_forced_logprobs(
    target: ServerTarget, sequence: ForcedSequence, salt: str, top_k: int
) -> ForcedLogprobs:
    """The server's logprobs along the forced sequence, with its top-k at the completion's
    positions."""
    body = forced_body(target, sequence, salt, top_k)
    answer = _post(target, "/v1/completions", body, REPLAY_TIMEOUT_S)
    return forced_answer(_json_answer(answer, "prompt_logprobs request"), sequence, top_k)


async def _replay(
    sequences: list[ForcedSequence],
    targets: list[ServerTarget],
    salt_prefix: str,
    top_k: int,
    concurrency: int,
) -> dict[str, list[ForcedLogprobs]]:
    replayed: dict[str, list[ForcedLogprobs]] = {target.side: [] for target in targets}
    in_flight = asyncio.Semaphore(concurrency)
    client = AsyncClient(concurrency * len(targets))

    async def on_every_target(index: int, sequence: ForcedSequence) -> list[object]:
        async with in_flight:  # all sides at once, so both see the same batch composition
            return await asyncio.gather(
                *(
                    client.run(
                        teacher_forced_logprobs,
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


def forced_sequences(
    records: list[RequestRecord], prompt_bodies: dict[str, dict], target: ServerTarget
) -> list[ForcedSequence]:
    """Unique (prompt, reference completion) pairs in the records' order; prompt_bodies: /tokenize
    bodies by prompt id."""
    seen: dict[tuple, ForcedSequence] = {}
    prompt_tokens: dict[str, tuple[int, ...]] = {}
    for record in records:
        if record.error is not None or not record.token_ids:
            continue
        if record.prompt_id not in prompt_tokens:
            prompt_tokens[record.prompt_id] = tokenize(target, prompt_bodies[record.prompt_id])
        sequence = ForcedSequence(
            record.prompt_id, prompt_tokens[record.prompt_id], tuple(record.token_ids)
        )
        seen.setdefault(sequence.key, sequence)
    return list(seen.values())
