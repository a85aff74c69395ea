"""What the stub answers: tokens that are a deterministic function of the prompt (so two stubs
answer a request identically unless told to diverge), the faults that shape them, vLLM-shaped
SSE chunks stamped with their send time, and whole (non-streamed) responses."""

from __future__ import annotations

import json
import re
import time
import zlib
from typing import Literal

from rig.stub.wire import Wire

FaultKind = Literal[
    "http_409",
    "http_429",
    "http_500",
    "hang",  # never answers
    "stall",  # sends the first token, then nothing, connection kept open
    "malformed_sse",  # an event whose data is not JSON, after the first token
    "drop",  # resets the connection half way through the stream
    "invalid_utf8",  # raw invalid UTF-8 bytes inside one event's JSON string
    "replacement_char",  # one token whose text is U+FFFD (valid protocol, bad content)
    "repetition",  # the same token until max_tokens, finish_reason "length"
    "empty",  # no tokens at all, finish_reason "stop"
    "diverge",  # different tokens from the middle of the output on
]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]
VOCAB_SIZE = 1000


def token_text(token_id: int) -> str:
    return f" w{token_id}"


class EventWriter:
    """Builds vLLM-shaped SSE chunks; the send stamp goes in last, right before the write."""

    def __init__(
        self, wire: Wire, index: int, sent: list[float], body: dict, chat: bool, model: str
    ) -> None:
        self.wire = wire
        self.sent = sent  # the send stamp of every choices event, appended as it goes out
        self.body = body
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-stub-{index}"
        self.as_ids = bool(body.get("return_tokens_as_token_ids"))
        logprobs = body.get("logprobs")
        if chat:
            self.top_k = int(body.get("top_logprobs") or 0) if logprobs else -1
        else:
            self.top_k = int(logprobs) if logprobs is not None else -1
        self.emitted_chars = 0
        self.tokens_sent = 0

    async def send_token(
        self, token_id: int, finish_reason: str | None, fault: str | None, text: str | None = None
    ) -> None:
        first = self.tokens_sent == 0
        if text is None:
            text = "\ufffd" if fault == "replacement_char" and first else token_text(token_id)
        delta: dict | str = {"content": text} if self.chat else text
        extra = {"token_ids": [token_id]} if self.body.get("return_token_ids") else {}
        if self.top_k >= 0:
            extra["logprobs"] = self._logprobs(token_id, text)
        await self.send(delta, finish_reason, extra, corrupt=fault == "invalid_utf8" and first)
        self.tokens_sent += 1
        self.emitted_chars += len(text)

    async def send(
        self,
        delta: dict | str,
        finish_reason: str | None,
        extra: dict | None = None,
        corrupt: bool = False,
    ) -> None:
        choice: dict = {"index": 0}
        choice.update({"delta": delta} if self.chat else {"text": delta})
        choice.update(extra or {})
        choice["finish_reason"] = finish_reason
        payload = json.dumps(self._chunk([choice])).encode()
        if corrupt:  # bytes that are not UTF-8, inside the text's JSON string
            field_start = b'"content": "' if self.chat else b'"text": "'
            payload = payload.replace(field_start, field_start + b"\xff\xfe", 1)
        self.sent.append(await self._send_stamped(payload))

    async def send_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        await self._send_stamped(json.dumps(self._chunk([]) | {"usage": usage}).encode())

    def _chunk(self, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
        }

    async def _send_stamped(self, payload: bytes) -> float:
        stamp = time.perf_counter()
        event = b'data: %s, "stub_sent": %r}\n\n' % (payload[:-1], stamp)
        await self.wire.send_chunk(event)
        return stamp

    def _logprobs(self, token_id: int, text: str) -> dict:
        """The chosen token at a fixed logprob and `top_k` lower-ranked neighbours."""
        top = [((token_id + j) % VOCAB_SIZE, -0.25 - j) for j in range(self.top_k)]

        def name(tid: int) -> str:
            return f"token_id:{tid}" if self.as_ids else token_text(tid)

        if self.chat:
            alternatives = [
                {"token": name(t), "logprob": lp, "bytes": list(token_text(t).encode())}
                for t, lp in top
            ]
            chosen = {"token": name(token_id), "logprob": -0.25, "bytes": list(text.encode())}
            return {"content": [chosen | {"top_logprobs": alternatives}]}
        return {
            "text_offset": [self.emitted_chars],
            "token_logprobs": [-0.25],
            "tokens": [name(token_id)],
            "top_logprobs": [{name(t): lp for t, lp in top}],
        }


def plan_tokens(
    prompt_key: str, n_tokens: int, max_tokens: int, fault: str | None
) -> tuple[list[int], str]:
    """Token ids and finish reason: a deterministic function of the prompt and the fault."""
    seed = zlib.crc32(prompt_key.encode())
    if fault == "empty":
        return [], "stop"
    if fault == "repetition":
        return [seed % VOCAB_SIZE] * max_tokens, "length"
    ids = [(seed + 7919 * i) % VOCAB_SIZE for i in range(n_tokens)]
    if fault == "diverge":
        ids = ids[: n_tokens // 2] + [(t + 1) % VOCAB_SIZE for t in ids[n_tokens // 2 :]]
    return ids, "length" if n_tokens == max_tokens else "stop"


def scripted_tokens(text: str, max_tokens: int) -> tuple[list[int], list[str], str]:
    """A scripted answer as the stub streams it: a token per word (its leading space kept),
    at most `max_tokens`, and the finish reason."""
    pieces = re.findall(r"\s*\S+", text)
    kept = pieces[:max_tokens]
    ids = [zlib.crc32(piece.encode()) % VOCAB_SIZE for piece in kept]
    return ids, kept, "length" if len(pieces) > max_tokens else "stop"


def answer_tokens(
    body: dict,
    chat: bool,
    prompt_key: str,
    fault: str | None,
    output_tokens: int,
    answers: dict[str, str],
) -> tuple[list[int], list[str] | None, str]:
    """What a completion says: its token ids, their texts where `answers` scripts it by the
    prompt's ending (else None, each token's own) and the finish reason; at most
    `output_tokens` planned tokens, fewer where the request's max_tokens says so."""
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    n_tokens = min(max_tokens, output_tokens)
    token_ids, finish_reason = plan_tokens(prompt_key, n_tokens, max_tokens, fault)
    prompt, texts = body.get("prompt"), None
    scripted = [t for s, t in answers.items() if str(prompt).endswith(s)]
    if scripted and not chat and fault is None:
        token_ids, texts, finish_reason = scripted_tokens(scripted[0], max_tokens)
    return token_ids, texts, finish_reason


def count_prompt_tokens(body: dict, chat: bool) -> int:
    if chat:
        return sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
    prompt = body.get("prompt")
    return len(prompt) if isinstance(prompt, list) else len(str(prompt or "").split())


def full_response(
    body: dict, chat: bool, token_ids: list[int], finish_reason: str, prompt_tokens: int
) -> dict:
    text = "".join(token_text(t) for t in token_ids)
    choice: dict = {"index": 0, "finish_reason": finish_reason}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    if body.get("return_token_ids"):
        choice["token_ids"] = token_ids
    if body.get("prompt_logprobs") is not None and not chat:
        choice["prompt_logprobs"] = prompt_logprobs(body.get("prompt"))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(token_ids),
        "total_tokens": prompt_tokens + len(token_ids),
    }
    return {"id": "stub", "choices": [choice], "usage": usage}


def tokenize(body: dict) -> list[int]:
    """Token ids of a /tokenize body, one per word (of the prompt, or of every message)."""
    if body.get("messages") is not None:
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        text = str(body.get("prompt") or "")
    return [zlib.crc32(word.encode()) % VOCAB_SIZE for word in text.split()]


def forced_logprob(position: int, token_id: int) -> float:
    """The logprob the stub gives token `token_id` at `position` of a forced sequence: a
    function of both only, so two stubs replay a sequence with zero drift."""
    return -((zlib.crc32(f"{position}:{token_id}".encode()) % 400) / 100)


def prompt_logprobs(prompt: object) -> list[dict | None]:
    """vLLM's `prompt_logprobs` of a prompt given as token ids: None for the first position,
    then {token id: {logprob, rank, decoded_token}} for each forced token."""
    token_ids = prompt if isinstance(prompt, list) else tokenize({"prompt": prompt})
    entries: list[dict | None] = [None]
    for position, token_id in enumerate(token_ids[1:], start=1):
        logprob = {"logprob": forced_logprob(position, token_id), "rank": 1}
        entries.append({str(token_id): logprob | {"decoded_token": token_text(token_id)}})
    return entries
