"""The teacher-forced replay and the A/A control without servers: who replays what, with which
salts, and where the answers land."""

import pytest

import rig.run.replay
from rig.records import ForcedLogprobs, ForcedSequence, ServerTarget
from rig.run.replay import AA_SIDE, aa_concurrency, replay, replay_indices, run_aa
from rig.run.state import RunState
from tests.run_fakes import FakeServer, run_context, scenario


def diverging_state(make_record) -> RunState:
    """Three reference completions; the candidate diverges from q2, the A/A from q1 only."""
    state = RunState()
    texts = {"q0": "a", "q1": "b", "q2": "c"}
    for i, (request, text) in enumerate(texts.items()):
        reference = make_record("reference", request, text, prompt_id=f"p{i}", token_ids=[i])
        state.records.append(reference)
        state.sequences.append(ForcedSequence(f"p{i}", (9,), (i,)))
        other = "changed" if request == "q2" else text
        state.records.append(make_record("candidate", request, other, token_ids=[7]))
        if request != "q0":
            state.aa_records.append(make_record(AA_SIDE, request, text, token_ids=[i]))
    state.aa_records[0] = make_record(AA_SIDE, "q1", "other", token_ids=[5])
    return state


def test_the_reference_replays_every_completion_another_side_its_sample_and_divergences(
    make_record,
):
    """The reference's replay must hold the margins of any divergence a later candidate shows
    (golden cache, sides one after the other); the others replay what their verdict reads."""
    state = diverging_state(make_record)
    assert replay_indices(state, "reference", 1) == [0, 1, 2]
    assert replay_indices(state, "candidate", 1) == [0, 2]
    assert replay_indices(state, AA_SIDE, 1) == [0, 1]


def test_aa_concurrency_is_its_own_else_the_highest_level():
    workload = {"prompts": [{"long_tokens": [100]}], "concurrency": [1, 8, 4]}
    assert aa_concurrency(scenario(workload=workload)) == 8
    assert aa_concurrency(scenario(workload=workload, control={"aa_concurrency": 2})) == 2


@pytest.fixture
def replays(monkeypatch):
    """replay_forced that notes each call and answers every sequence with its own index."""
    calls: list = []

    def fake(sequences, targets, salt_prefix, top_k=1, concurrency=1):
        calls.append((salt_prefix, [t.side for t in targets], len(sequences), top_k, concurrency))
        answers = [ForcedLogprobs((float(s.completion_token_ids[0]),)) for s in sequences]
        return {t.side: answers for t in targets}

    monkeypatch.setattr(rig.run.replay, "replay_forced", fake)
    return calls


def test_what_sides_share_they_replay_together_the_rest_alone(tmp_path, make_record, replays):
    ctx = run_context(tmp_path, drift={"max_requests": 1, "top_logprobs": 3})
    state = diverging_state(make_record)
    targets = {
        side: ServerTarget(side, f"http://127.0.0.1:{port}", "m")
        for side, port in (("reference", 1), ("candidate", 2))
    }
    replay(ctx, state, targets, "drift")
    assert replays == [
        ("r.drift", ["reference", "candidate"], 2, 3, 1),  # 0 and 2
        ("r.drift-reference", ["reference"], 1, 3, 1),  # 1
    ]
    assert {side: sorted(forced) for side, forced in state.forced.items()} == {
        "reference": [0, 1, 2],
        "candidate": [0, 2],
    }
    assert state.forced["reference"][1].logprobs == (1.0,)  # each answer at its own index


def test_the_aa_control_replays_the_first_level_reversed_then_its_sequences_batched(
    tmp_path, monkeypatch, make_record, replays
):
    ctx = run_context(
        tmp_path,
        workload={"prompts": [{"long_tokens": [100, 120, 140]}], "concurrency": [2, 4]},
        control={"aa": True, "aa_concurrency": 3},
    )
    state = RunState(sequences=[ForcedSequence("p0", (9,), (0,))])
    sent: list = []

    def fake_run_level(jobs, concurrency, *, timeout_s):
        (job,) = jobs
        sent.append((job.target.side, [s.request_id for s in job.specs], concurrency))
        return {AA_SIDE: [make_record(AA_SIDE, s.request_id) for s in job.specs]}

    monkeypatch.setattr(rig.run.replay, "run_level", fake_run_level)
    run_aa(ctx, state, FakeServer(ctx.plan.servers["reference"]))
    assert sent == [(AA_SIDE, ["c2-r0-0002", "c2-r0-0001", "c2-r0-0000"], 3)]
    assert len(state.aa_records) == 3
    assert [(salt, sides, concurrency) for salt, sides, _, _, concurrency in replays] == [
        ("r.aa-drift", [AA_SIDE], 3)
    ]
