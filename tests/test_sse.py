"""The request body and the folding of server-sent events into a record."""

from __future__ import annotations

from rig.records import RequestRecord, ServerTarget, empty_record
from rig.sse import StreamAccumulator, request_body
from tests.stub_requests import spec


def test_completions_body_is_greedy_streamed_salted_with_ids_usage_and_logprobs():
    body = request_body(spec(0, top_logprobs=3, seed=7), "m")
    assert body["temperature"] == 0 and body["seed"] == 7 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["cache_salt"] == "run1.0" and body["return_token_ids"] is True
    assert body["logprobs"] == 3 and body["return_tokens_as_token_ids"] is True
    assert body["prompt"] == "prompt number 0" and body["max_tokens"] == 5
    assert "messages" not in body and "top_logprobs" not in body


def test_chat_body_uses_chat_logprobs_and_template_kwargs_and_extra_body_wins():
    request = spec(
        1,
        "chat",
        top_logprobs=2,
        chat_template_kwargs={"enable_thinking": False},
        extra_body={"temperature": 0.5, "ignore_eos": True},
    )
    body = request_body(request, "m")
    assert body["messages"] == [{"role": "user", "content": "hi 1"}]
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["temperature"] == 0.5 and body["ignore_eos"] is True


def test_no_logprobs_asked_for_by_default():
    assert "logprobs" not in request_body(spec(0), "m")


def _accumulate(*pieces: bytes) -> tuple[RequestRecord, StreamAccumulator]:
    record = empty_record(ServerTarget("reference", "http://127.0.0.1:1", "m"), spec(0))
    stream = StreamAccumulator(record, 0.0, False)
    for at, piece in enumerate(pieces, start=1):
        stream.feed(piece, float(at))
    stream.finish()
    return record, stream


def test_sse_parsing_across_reads_comments_and_a_last_event_without_its_blank_line():
    record, stream = _accumulate(
        b': ping\n\ndata: {"choices": [{"text": "a", "token_ids": [1]}]}\n',
        b'\ndata: {"choices": [{"text": "b", "token_ids": [2], "finish_reason": "stop"}]}',
    )
    assert (record.text, record.token_ids, record.finish_reason) == ("ab", [1, 2], "stop")
    assert record.ttft_s == 2.0 and record.itl_s == [0.0]  # both complete in the second read
    assert stream.problem is None and not stream.done


def test_an_error_event_in_the_stream_and_a_garbage_tail_are_problems_not_exceptions():
    _, stream = _accumulate(b'data: {"error": {"message": "boom", "code": 500}}\n\n')
    assert stream.problem == "http_500: error event in the stream: boom"
    _, stream = _accumulate(b"data: [1, 2]")
    assert stream.problem.startswith("malformed_sse:")
