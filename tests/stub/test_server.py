"""The paced stub: its schedule, its stamps, its wire format and every fault it can inject."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from rig.load.replay_client import forced_sequences, replay_forced
from rig.records import ServerTarget
from rig.stub.answers import forced_logprob, token_text, tokenize
from rig.stub.server import StubConfig, serve_in_thread
from rig.verdict.drift import drift_results

FAST = StubConfig(ttft_s=0.03, itl_s=0.01, output_tokens=6)


async def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers or {}) as response,
    ):
        return response.status, await response.read()


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    return asyncio.run(_post(url, body, headers))


def events(raw: bytes) -> list[dict | str]:
    """The data payloads of an SSE stream: dicts, or the raw text where it is not JSON."""
    out: list[dict | str] = []
    for block in raw.split(b"\n\n"):
        if not block.startswith(b"data: "):
            continue
        payload = block[6:]
        if payload == b"[DONE]":
            out.append("[DONE]")
            continue
        try:
            out.append(json.loads(payload))
        except ValueError:
            out.append(payload.decode("utf-8", errors="replace"))
    return out


def completion(**fields) -> dict:
    body = {"model": "stub", "prompt": "a b c", "max_tokens": 6, "stream": True}
    body.update(fields)
    return body


def test_tokens_follow_the_schedule_and_carry_their_send_stamp():
    with serve_in_thread(FAST) as stub:
        status, raw = post(stub.url + "/v1/completions", completion())
    assert status == 200
    entry = stub.log[0]
    stamps = [e["stub_sent"] for e in events(raw) if isinstance(e, dict) and e["choices"]]
    assert stamps == entry.sent
    assert len(stamps) == FAST.output_tokens
    assert entry.arrived <= entry.read
    for i, sent in enumerate(stamps):  # never early; asyncio timers do not fire ahead of time
        assert sent >= entry.read + FAST.ttft_s + i * FAST.itl_s - 1e-4


def test_stream_has_vllm_shape_usage_token_ids_and_done():
    with serve_in_thread(FAST) as stub:
        body = completion(stream_options={"include_usage": True}, return_token_ids=True)
        _, raw = post(stub.url + "/v1/completions", body)
    parsed = events(raw)
    assert parsed[-1] == "[DONE]"
    usage = parsed[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert usage["usage"]["prompt_tokens"] == 3
    chunks = parsed[:-2]
    ids = [c["choices"][0]["token_ids"][0] for c in chunks]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "".join(map(token_text, ids))
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]


def test_chat_stream_starts_with_the_role_and_has_logprobs_by_token_id():
    with serve_in_thread(FAST) as stub:
        body = {
            "messages": [{"role": "user", "content": "hello there"}],
            "max_completion_tokens": 3,
            "stream": True,
            "logprobs": True,
            "top_logprobs": 2,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        _, raw = post(stub.url + "/v1/chat/completions", body)
    chunks = [e for e in events(raw) if isinstance(e, dict)]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunk in chunks[1:]:
        choice = chunk["choices"][0]
        (entry,) = choice["logprobs"]["content"]
        assert entry["token"] == f"token_id:{choice['token_ids'][0]}"
        assert len(entry["top_logprobs"]) == 2
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_completion_logprobs_name_tokens_by_id_when_asked():
    with serve_in_thread(FAST) as stub:
        body = completion(logprobs=3, return_tokens_as_token_ids=True, return_token_ids=True)
        _, raw = post(stub.url + "/v1/completions", body)
    choice = events(raw)[0]["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{choice['token_ids'][0]}"]
    assert len(choice["logprobs"]["top_logprobs"][0]) == 3


def test_output_is_a_function_of_the_prompt_and_diverge_changes_the_second_half():
    config = StubConfig(ttft_s=0.0, itl_s=0.0, output_tokens=8)
    with serve_in_thread(config) as one, serve_in_thread(config) as two:
        _, first = post(one.url + "/v1/completions", completion(max_tokens=8))
        _, again = post(two.url + "/v1/completions", completion(max_tokens=8))
        _, other = post(two.url + "/v1/completions", completion(max_tokens=8, prompt="x y"))
        _, diverged = post(
            two.url + "/v1/completions", completion(max_tokens=8, stub_fault="diverge")
        )

    def texts(raw):
        return [
            e["choices"][0]["text"] for e in events(raw) if isinstance(e, dict) and e["choices"]
        ]

    assert texts(first) == texts(again)
    assert texts(first) != texts(other)
    assert texts(diverged)[:4] == texts(first)[:4] and texts(diverged)[4:] != texts(first)[4:]


@pytest.mark.parametrize("kind", ["http_409", "http_429", "http_500"])
def test_http_faults_answer_with_their_status(kind):
    with serve_in_thread(FAST) as stub:
        status, raw = post(stub.url + "/v1/completions", completion(stub_fault=kind))
    assert status == int(kind[5:])
    assert json.loads(raw)["error"]["code"] == status


def test_fault_chosen_by_arrival_index_on_the_command_line_config():
    config = StubConfig(ttft_s=0.0, itl_s=0.0, output_tokens=2, faults={1: "http_500"})
    with serve_in_thread(config) as stub:
        statuses = [post(stub.url + "/v1/completions", completion())[0] for _ in range(3)]
    assert statuses == [200, 500, 200]


def test_unknown_fault_is_a_400():
    with serve_in_thread(FAST) as stub:
        status, raw = post(stub.url + "/v1/completions", completion(stub_fault="nonsense"))
    assert status == 400 and b"nonsense" in raw


def test_content_faults():
    with serve_in_thread(StubConfig(ttft_s=0.0, itl_s=0.0, output_tokens=4)) as stub:
        url = stub.url + "/v1/completions"
        _, malformed = post(url, completion(stub_fault="malformed_sse"))
        _, invalid = post(url, completion(stub_fault="invalid_utf8"))
        _, replacement = post(url, completion(stub_fault="replacement_char"))
        _, repeated = post(url, completion(stub_fault="repetition", max_tokens=9))
        _, empty = post(url, completion(stub_fault="empty"))
    assert any(isinstance(e, str) and e != "[DONE]" for e in events(malformed))
    with pytest.raises(UnicodeDecodeError):
        invalid.decode("utf-8")
    assert events(replacement)[0]["choices"][0]["text"] == "\ufffd"
    repeats = [e["choices"][0]["text"] for e in events(repeated) if isinstance(e, dict)]
    assert len(repeats) == 9 and len(set(repeats)) == 1
    assert events(repeated)[-2]["choices"][0]["finish_reason"] == "length"
    (only, done) = events(empty)
    assert only["choices"][0]["text"] == "" and only["choices"][0]["finish_reason"] == "stop"
    assert done == "[DONE]"


def test_drop_resets_the_connection_and_the_log_says_so():
    with serve_in_thread(StubConfig(ttft_s=0.0, itl_s=0.001, output_tokens=6)) as stub:
        with pytest.raises(aiohttp.ClientPayloadError):
            post(stub.url + "/v1/completions", completion(stub_fault="drop"))
        assert stub.log[0].disconnected and len(stub.log[0].sent) == 3


@pytest.mark.parametrize("kind", ["hang", "stall"])
def test_hang_and_stall_keep_the_client_waiting(kind):
    async def request(url: str) -> None:
        timeout = aiohttp.ClientTimeout(total=0.5)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, json=completion(stub_fault=kind)) as response,
        ):
            await response.read()

    with serve_in_thread(FAST) as stub:
        with pytest.raises(TimeoutError):
            asyncio.run(request(stub.url + "/v1/completions"))
        sent = len(stub.log[0].sent)
    assert sent == (0 if kind == "hang" else 1)


def test_metrics_count_prefix_cache_hits_without_a_salt_over_engine_label_sets():
    config = StubConfig(ttft_s=0.0, itl_s=0.0, output_tokens=1, engines=2)
    with serve_in_thread(config) as stub:
        url = stub.url + "/v1/completions"
        post(url, completion(prompt="one two three four"))
        post(url, completion(prompt="one two three four"))  # same prompt, no salt: a hit
        post(url, completion(prompt="one two three four", cache_salt="s1"))
        post(url, completion(prompt="one two three four", cache_salt="s2"))
        text = asyncio.run(_get(stub.url + "/metrics"))
    lines = [line for line in text.splitlines() if line.startswith("vllm:")]
    assert len(lines) == 4  # two counters x two engines
    queries = sum(float(x.split()[-1]) for x in lines if "queries" in x)
    hits = sum(float(x.split()[-1]) for x in lines if "hits" in x)
    assert (queries, hits) == (16.0, 4.0)


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()


def test_hold_parks_requests_until_release():
    async def scenario(url: str) -> tuple[bool, int]:
        async with aiohttp.ClientSession() as session:
            await session.post(url + "/stub/hold")
            request = asyncio.ensure_future(_post(url + "/v1/completions", completion()))
            await asyncio.sleep(0.2)
            parked = not request.done()
            await session.post(url + "/stub/release")
            status, _ = await request
            return parked, status

    with serve_in_thread(FAST) as stub:
        parked, status = asyncio.run(scenario(stub.url))
        assert stub.log[0].held and stub.log[0].read - stub.log[0].arrived >= 0.15
    assert parked and status == 200


def test_log_and_reset_over_http_and_key_from_the_request_id_header():
    with serve_in_thread(FAST) as stub:
        post(stub.url + "/v1/completions", completion(cache_salt="salt-9"), {"X-Request-Id": "r9"})
        post(stub.url + "/v1/completions", completion(cache_salt="salt-10"))
        log = json.loads(asyncio.run(_get(stub.url + "/stub/log")))
        asyncio.run(_post(stub.url + "/stub/reset", {}))
        after = json.loads(asyncio.run(_get(stub.url + "/stub/log")))
    assert [r["key"] for r in log["requests"]] == ["r9", "salt-10"]
    assert [r["cache_salt"] for r in log["requests"]] == ["salt-9", "salt-10"]
    assert log["max_in_flight"] == 1
    assert after["requests"] == []


def test_non_streaming_answer():
    with serve_in_thread(FAST) as stub:
        status, raw = post(stub.url + "/v1/completions", completion(stream=False))
    answer = json.loads(raw)
    assert status == 200 and answer["usage"]["completion_tokens"] == 6
    assert answer["choices"][0]["text"].count(" w") == 6


def test_command_line_serves_and_stops_on_sigint():
    argv = [sys.executable, "-m", "rig.stub.server", "--port", "0", "--fault", "0=http_429"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        assert post(url + "/v1/completions", completion())[0] == 429
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)


def test_command_line_rejects_an_unknown_fault():
    result = subprocess.run(
        [sys.executable, "-m", "rig.stub.server", "--fault", "0=melt"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "melt" in result.stderr


def test_teacher_forced_replay_between_two_stubs_has_no_drift_and_keeps_its_delay(make_record):
    """The rig's own replay client against two stubs, one of them slowed down."""
    slow = dataclasses.replace(FAST, replay_delay_s=0.3)
    with serve_in_thread(FAST) as reference, serve_in_thread(slow) as candidate:
        targets = [
            ServerTarget("reference", reference.url, "stub"),
            ServerTarget("candidate", candidate.url, "stub"),
        ]
        answered = make_record("reference", "r0", prompt_id="p1", token_ids=[11, 12, 13])
        bodies = {"p1": {"prompt": "one two three four"}}
        (sequence,) = forced_sequences([answered], bodies, targets[0])
        started = time.monotonic()
        replayed = replay_forced([sequence], targets, "salt", top_k=5)
        elapsed = time.monotonic() - started
    assert sequence.prompt_token_ids == tuple(tokenize({"prompt": "one two three four"}))
    (drift,) = drift_results(
        [sequence], {0: replayed["reference"][0]}, {0: replayed["candidate"][0]}
    )
    assert drift.error is None and drift.completion_tokens == 3 and drift.max_abs == 0.0
    forced = replayed["candidate"][0].logprobs
    assert forced[0] is None and forced[5] == forced_logprob(5, 12)
    # the stub's top-k holds the forced token alone (rank 1), at every completion position
    assert replayed["candidate"][0].top[1] == {12: forced_logprob(5, 12)}
    assert elapsed >= 0.3
    assert [entry.body["prompt_logprobs"] for entry in candidate.log] == [5]
