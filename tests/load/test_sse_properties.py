"""The bad-input sweep of a server's SSE answer: whatever events a server sends, folding them
raises only the protocol's errors (the request fails as malformed_sse), finish() never raises,
and how the bytes were cut into reads changes nothing in the record."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rig.load.sse import PROTOCOL_ERRORS, StreamAccumulator
from rig.records import RequestRecord, ServerTarget, empty_record
from tests.stub_requests import spec


def _event(token: str) -> bytes:
    message = {"choices": [{"logprobs": {"content": [{"token": token, "logprob": 0}]}}]}
    return b"data: " + json.dumps(message).encode() + b"\n\n"


ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
TOKEN = st.integers(-5, 10**6).map(lambda i: f"token_id:{i}") | st.text(max_size=12)
TOP = st.dictionaries(TOKEN, st.floats() | ANY, max_size=3) | st.lists(
    st.fixed_dictionaries({"token": TOKEN | ANY, "logprob": st.floats() | ANY}), max_size=3
)
LOGPROBS = st.fixed_dictionaries(
    {
        "content": st.lists(
            st.fixed_dictionaries(
                {"token": TOKEN, "logprob": st.floats() | ANY, "top_logprobs": TOP}
            ),
            max_size=3,
        )
    }
) | st.fixed_dictionaries(
    {
        "tokens": st.lists(TOKEN | ANY, max_size=3),
        "token_logprobs": st.lists(st.floats() | ANY, max_size=3),
        "top_logprobs": st.lists(TOP | st.none(), max_size=3),
    }
)
CHOICE = st.fixed_dictionaries(
    {},
    optional={
        "text": st.text(max_size=8) | ANY,
        "delta": st.fixed_dictionaries({}, optional={"content": st.text(max_size=8) | ANY}) | ANY,
        "token_ids": st.lists(st.integers(0, 10**6), max_size=4) | ANY,
        "finish_reason": st.sampled_from(("stop", "length")) | ANY,
        "logprobs": LOGPROBS | ANY,
    },
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(CHOICE, min_size=1, max_size=2) | ANY,
        "usage": st.fixed_dictionaries(
            {},
            optional={
                "prompt_tokens": st.integers(0, 99) | ANY,
                "completion_tokens": st.integers(0, 99) | ANY,
                "prompt_tokens_details": st.fixed_dictionaries(
                    {}, optional={"cached_tokens": st.integers(0, 99) | ANY}
                )
                | ANY,
            },
        )
        | ANY,
        "error": ANY,
    },
)
EVENT = (
    MESSAGE.map(lambda m: b"data: " + json.dumps(m).encode())
    | st.just(b"data: [DONE]")
    | st.sampled_from((b": ping", b"event: x", b"data:", b"data: {", b"data: \xff\xfe"))
    | st.binary(max_size=20)
)
STREAM = st.lists(EVENT, max_size=6).map(lambda events: b"".join(e + b"\n\n" for e in events))


def _fold(stream: bytes, cuts: list[int], logprobs: bool) -> tuple[RequestRecord, str | None]:
    """The record after feeding `stream` cut at `cuts`, and the protocol error that ended it."""
    record = empty_record(ServerTarget("reference", "http://127.0.0.1:1", "m"), spec(0))
    record.sent_at = 0.0
    accumulator = StreamAccumulator(record, 0.0, logprobs)
    ended = None
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    try:
        for n, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
            accumulator.feed(stream[start:end], float(n))
    except PROTOCOL_ERRORS as exc:
        ended = f"{type(exc).__name__}: {exc}"
    accumulator.finish()
    accumulator.finish()  # send_request calls it on every exit
    return record, ended or accumulator.problem


@settings(max_examples=300)
@given(STREAM, st.lists(st.integers(0, 10**4), max_size=5), st.booleans())
@example(_event("token_id:--5"), [], True)
@example(_event("token_id:\u00b2"), [], True)
@example(b"data: " + b"[" * 5000 + b"\n\n", [], False)
def test_any_stream_folds_or_fails_as_malformed(stream, cuts, logprobs):
    _fold(stream, cuts, logprobs)


@settings(max_examples=200)
@given(STREAM, st.lists(st.integers(0, 10**4), max_size=5))
def test_the_cuts_between_reads_change_nothing_but_the_stamps(stream, cuts):
    whole, whole_error = _fold(stream, [], True)
    cut, cut_error = _fold(stream, cuts, True)
    assert (whole_error is None) == (cut_error is None)
    if whole_error is None:
        assert (cut.text, cut.token_ids, cut.finish_reason) == (
            whole.text,
            whole.token_ids,
            whole.finish_reason,
        )
        assert (cut.prompt_tokens, cut.output_tokens, cut.cached_tokens, cut.logprobs) == (
            whole.prompt_tokens,
            whole.output_tokens,
            whole.cached_tokens,
            whole.logprobs,
        )
