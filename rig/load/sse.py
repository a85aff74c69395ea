"""The OpenAI streaming protocol as vLLM speaks it: the JSON body of one greedy, streamed,
salted request, and its server-sent events folded into a RequestRecord.

Timing follows `vllm bench serve`: TTFT = first SSE message with non-empty `choices` minus the
send time, ITL = gaps between such messages, E2EL = last such message minus the send time.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from rig.load.http_client import MalformedResponse
from rig.records import ErrorKind, RequestRecord, RequestSpec, TokenLogprob


def request_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    """The JSON body for one request: greedy, streamed, salted, token ids and usage returned.
    Logprobs only when the scenario asks (they cost sampler and payload time that production
    does not spend; the verdict's margins come from the untimed replay, rig.verdict.drift)."""
    sampling = spec.sampling
    body: dict[str, Any] = {"model": model}
    if spec.endpoint == "chat":
        body["messages"] = list(spec.messages or ())
        body["max_completion_tokens"] = sampling.max_tokens
    else:
        body["prompt"] = spec.prompt
        body["max_tokens"] = sampling.max_tokens
    body.update(
        temperature=0.0,
        seed=sampling.seed,
        stream=True,
        stream_options={"include_usage": True},
        cache_salt=spec.cache_salt,
        return_token_ids=True,
    )
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if sampling.top_logprobs > 0:
        body["return_tokens_as_token_ids"] = True
        if spec.endpoint == "chat":
            body.update(logprobs=True, top_logprobs=sampling.top_logprobs)
        else:
            body["logprobs"] = sampling.top_logprobs
    if spec.endpoint == "chat" and sampling.chat_template_kwargs is not None:
        body["chat_template_kwargs"] = sampling.chat_template_kwargs
    body.update(sampling.extra_body)
    return body


class MalformedStream(Exception):
    """The server broke the SSE / JSON protocol; the request fails as malformed_sse."""


# What a response that breaks the protocol raises while it is parsed: the parsers check what
# the server sent and raise these, so that any other exception (a KeyError, a TypeError) is a
# bug of the rig's, which ends the run (exit 2), never a pathology of the server's.
PROTOCOL_ERRORS = (MalformedStream, MalformedResponse)


def _checked(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """`value` when the server sent the kind the protocol says, else MalformedStream."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedStream(f"{what} is {type(value).__name__}: {value!r:.60}")
    return value


def _field(message: dict, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in message:
        raise MalformedStream(f"{what} has no {key!r}")
    return _checked(message[key], kind, f"{what}[{key!r}]")


class StreamAccumulator:
    """Folds the SSE messages of one response into a RequestRecord."""

    def __init__(self, record: RequestRecord, start: float, want_logprobs: bool) -> None:
        self.record = record
        self.start = start  # may be moved until finish(): times are kept absolute till then
        self.token_times: list[float] = []
        self.buffer = b""
        self.text_parts: list[str] = []
        self.token_ids: list[int] = []
        self.saw_token_ids = False
        self.logprobs: list[TokenLogprob] | None = [] if want_logprobs else None
        self.done = False
        self.problem: str | None = None  # first protocol problem seen; the stream is still read

    def feed(self, data: bytes, received: float) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\n\n")) >= 0:
            event, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            self._event(event, received)

    def finish(self) -> None:
        """Fill the record in; safe to call again (it is, on every exit of send_request)."""
        rest, self.buffer = self.buffer.strip(), b""
        if rest:  # a last event without its blank line
            try:
                self._event(rest, self.token_times[-1] if self.token_times else self.start)
            except PROTOCOL_ERRORS as exc:
                self._problem(ErrorKind.MALFORMED_SSE.error(f"{type(exc).__name__}: {exc}"))
        record = self.record
        record.text = "".join(self.text_parts)
        record.token_ids = self.token_ids if self.saw_token_ids else None
        record.logprobs = self.logprobs
        times = self.token_times
        if times:
            record.ttft_s = times[0] - self.start
            record.itl_s = [later - earlier for earlier, later in itertools.pairwise(times)]
            record.e2el_s = times[-1] - self.start

    def _event(self, event: bytes, received: float) -> None:
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if not line.startswith(b"data:"):
                continue  # comments (pings), event names, ids
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                self._problem(ErrorKind.MALFORMED_SSE.error("invalid UTF-8 in an event"))
                text = payload.decode("utf-8", errors="replace")
            try:
                message = json.loads(text)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
                self._problem(
                    ErrorKind.MALFORMED_SSE.error(f"event is not JSON ({exc}): {payload[:80]!r}")
                )
                continue
            self._message(message, received)

    def _problem(self, detail: str) -> None:
        if self.problem is None:
            self.problem = detail

    def _message(self, message: dict, received: float) -> None:
        if not isinstance(message, dict):
            raise MalformedStream(f"event is not a JSON object: {message!r:.80}")
        if error := message.get("error"):
            code = error.get("code") if isinstance(error, dict) else None
            detail = error.get("message") if isinstance(error, dict) else error
            detail = f"error event in the stream: {detail}"
            if isinstance(code, int):
                self._problem(ErrorKind.HTTP.error(detail, code))
            else:
                self._problem(ErrorKind.MALFORMED_SSE.error(detail))
            return
        if usage := message.get("usage"):
            usage = _checked(usage, dict, "usage")
            counts = (("prompt_tokens", "prompt_tokens"), ("completion_tokens", "output_tokens"))
            for key, field in counts:
                count = usage.get(key)
                setattr(self.record, field, None if count is None else _checked(count, int, key))
            if (details := usage.get("prompt_tokens_details")) is not None:
                cached = _checked(details, dict, "prompt_tokens_details").get("cached_tokens")
                if cached is not None:
                    self.record.cached_tokens = _checked(cached, int, "cached_tokens")
        choices = message.get("choices")
        if not choices:
            return
        record = self.record
        self.token_times.append(received)
        choice = _checked(_checked(choices, list, "choices")[0], dict, "choices[0]")
        delta = choice.get("delta")
        if delta is None:
            text = choice.get("text")
        else:
            text = _checked(delta, dict, "delta").get("content")
        if text:
            self.text_parts.append(_checked(text, str, "text"))
        if (ids := choice.get("token_ids")) is not None:
            self.saw_token_ids = True
            ids = _checked(ids, list, "token_ids")
            self.token_ids.extend(_checked(token, int, "token id") for token in ids)
        if choice.get("finish_reason") is not None:
            record.finish_reason = _checked(choice["finish_reason"], str, "finish_reason")
        if self.logprobs is not None and (logprobs := choice.get("logprobs")):
            self.logprobs.extend(parse_logprobs(_checked(logprobs, dict, "logprobs")))


_TOKEN_NAME = re.compile(r"token_id:(-?[0-9]+)")  # ASCII digits: str.isdigit takes "²"


def _token_id(name: str) -> int:
    """vLLM names tokens "token_id:<id>" when asked with return_tokens_as_token_ids."""
    match = _TOKEN_NAME.fullmatch(name)
    if match is None:
        raise MalformedStream(f"logprob token {name!r} is not of the form 'token_id:<id>'")
    return int(match[1])


NUMBER = (int, float)


def _top(entries: list | dict | None, what: str) -> dict[int, float]:
    """A position's top-k: chat's list of {token, logprob}, completions' {token: logprob}."""
    if entries is None:
        return {}
    if isinstance(entries, dict):
        return {_token_id(name): _checked(v, NUMBER, what) for name, v in entries.items()}
    top = {}
    for entry in _checked(entries, list, what):
        entry = _checked(entry, dict, what)
        top[_token_id(_field(entry, "token", str, what))] = _field(entry, "logprob", NUMBER, what)
    return top


def parse_logprobs(logprobs: dict) -> list[TokenLogprob]:
    """A choice's logprobs, checked: what the server sent wrong is MalformedStream."""
    if "content" in logprobs:  # chat
        positions = []
        for entry in _checked(logprobs["content"] or [], list, "logprobs.content"):
            entry = _checked(entry, dict, "logprobs.content[]")
            positions.append(
                TokenLogprob(
                    token_id=_token_id(_field(entry, "token", str, "logprobs.content[]")),
                    logprob=_field(entry, "logprob", (*NUMBER, type(None)), "logprobs.content[]"),
                    top=_top(entry.get("top_logprobs"), "top_logprobs"),
                )
            )
        return positions
    tokens = _field(logprobs, "tokens", list, "logprobs")
    values = _field(logprobs, "token_logprobs", list, "logprobs")
    tops = _field(logprobs, "top_logprobs", list, "logprobs")
    if not len(tokens) == len(values) == len(tops):
        raise MalformedStream("logprobs' tokens, token_logprobs and top_logprobs differ in length")
    return [  # completions
        TokenLogprob(
            token_id=_token_id(_checked(token, str, "logprobs.tokens[]")),
            logprob=_checked(value, (*NUMBER, type(None)), "logprobs.token_logprobs[]"),
            top=_top(top, "logprobs.top_logprobs[]"),
        )
        for token, value, top in zip(tokens, values, tops, strict=True)
    ]
