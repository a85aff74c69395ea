"""The request body and the folding of server-sent events into a record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig.load.engine import run_level
from rig.load.sse import MalformedStream, StreamAccumulator, request_body
from rig.records import RequestRecord, ServerTarget, SideJob, empty_record
from rig.scenario.loader import PRESETS_DIR, load_presets, load_scenario
from rig.scenario.workload import level_requests, resolve_prompts, warmup_prompts
from rig.stub.server import serve_in_thread
from tests.stub_requests import FAST, spec

SCENARIOS = sorted(PRESETS_DIR.parent.glob("*.yaml"))
LOGPROB_KEYS = {"logprobs", "top_logprobs", "prompt_logprobs", "return_tokens_as_token_ids"}
# What a timed request carries: a production request (greedy, streamed, usage: as `vllm bench
# serve` sends) plus the cache salt and the token ids the comparison needs (text re-tokenized
# is not what was generated); no logprobs: they cost sampler and payload time.
TIMED_KEYS = {
    "model",
    "temperature",
    "seed",
    "stream",
    "stream_options",
    "cache_salt",
    "return_token_ids",
}
ENDPOINT_KEYS = {
    "completions": {"prompt", "max_tokens"},
    "chat": {"messages", "max_completion_tokens"},
}


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


def test_ignore_eos_is_sent_only_when_asked():
    assert request_body(spec(0, ignore_eos=True), "m")["ignore_eos"] is True
    assert request_body(spec(1, "chat", ignore_eos=True), "m")["ignore_eos"] is True
    assert "ignore_eos" not in request_body(spec(0), "m")


def default_scenarios() -> list[tuple[str, Path, list[str]]]:
    """Every shipped scenario, and the load scenarios with every model preset under them."""
    cases = [(path.stem, path, []) for path in SCENARIOS]
    for key, preset in load_presets().items():
        for path in SCENARIOS:
            if path.stem in ("lowconc", "highconc"):
                cases.append((f"{path.stem}+{key}", path, [f"model={preset.model['name']}"]))
    return cases


@pytest.mark.parametrize(
    ("path", "overrides"),
    [case[1:] for case in default_scenarios()],
    ids=[case[0] for case in default_scenarios()],
)
def test_default_scenarios_send_no_logprobs_on_timed_requests(path, overrides):
    """The bodies a server receives, through the rig's own request path, for the warm-up and
    the first level of every shipped scenario: nothing beyond what production sends."""
    scenario = load_scenario(path, overrides)
    workload = scenario.workload
    prompts = resolve_prompts(workload)
    level = workload.concurrency[0]
    specs = level_requests(
        workload,
        warmup_prompts(workload, prompts),
        level=0,
        repeat=0,
        side="x",
        run_id="w",
        tag="warmup-",
    ) + level_requests(workload, prompts, level=level, repeat=0, side="x", run_id="t")
    with serve_in_thread(FAST) as stub:
        job = SideJob(ServerTarget("x", stub.url, "stub"), specs)
        records = run_level([job], 32, timeout_s=30, progress=False)["x"]  # C: bodies only
        bodies = [entry.body for entry in stub.log]
    assert len(bodies) == len(specs) and all(r.error is None for r in records)
    expected = TIMED_KEYS | ENDPOINT_KEYS[workload.endpoint]
    if workload.chat_template_kwargs is not None:
        expected |= {"chat_template_kwargs"}
    for body in bodies:
        assert not LOGPROB_KEYS & body.keys()
        assert set(body) == expected


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


def test_cached_tokens_come_from_the_usage_prompt_tokens_details():
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 1400, "completion_tokens": 1, '
    record, _ = _accumulate(
        b'data: {"choices": [{"text": "a", "token_ids": [1]}]}\n\n',
        usage + b'"prompt_tokens_details": {"cached_tokens": 1280}}}\n\n',
    )
    assert (record.prompt_tokens, record.cached_tokens) == (1400, 1280)
    record, _ = _accumulate(usage + b'"prompt_tokens_details": null}}\n\n')
    assert record.prompt_tokens == 1400 and record.cached_tokens is None  # not reported
    with pytest.raises(MalformedStream, match="cached_tokens is str"):  # send_request's
        _accumulate(usage + b'"prompt_tokens_details": {"cached_tokens": "x"}}}\n\n')


@pytest.mark.parametrize("name", ["token_id:--5", "token_id:\u00b2", "token_id:5\n", "token_id:"])
def test_a_logprob_token_not_of_the_form_token_id_n_is_malformed(name):
    message = {"choices": [{"logprobs": {"content": [{"token": name, "logprob": 0.0}]}}]}
    record = empty_record(ServerTarget("reference", "http://127.0.0.1:1", "m"), spec(0))
    with pytest.raises(MalformedStream, match="is not of the form 'token_id:<id>'"):
        StreamAccumulator(record, 0.0, True).feed(f"data: {json.dumps(message)}\n\n".encode(), 1.0)


def test_a_negative_logprob_token_id_is_read():
    message = {"choices": [{"logprobs": {"content": [{"token": "token_id:-3", "logprob": -0.5}]}}]}
    record = empty_record(ServerTarget("reference", "http://127.0.0.1:1", "m"), spec(0))
    stream = StreamAccumulator(record, 0.0, True)
    stream.feed(f"data: {json.dumps(message)}\n\n".encode(), 1.0)
    stream.finish()
    assert [(p.token_id, p.logprob) for p in record.logprobs] == [(-3, -0.5)]


def test_an_event_nested_too_deeply_is_a_problem_not_an_exception():
    record, stream = _accumulate(b"data: " + b"[" * 5000 + b"\n\n")
    assert stream.problem.startswith("malformed_sse: event is not JSON")
    assert record.text == ""
