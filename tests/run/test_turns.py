"""Conversations round by round: turn k of every conversation is built from the reference's
answers to the turns before it on both sides, a conversation keeps one salt and one server,
and the replay rebuilds each turn's prompt from the same answers."""

from __future__ import annotations

import json
from dataclasses import replace

from rig.records import RequestRecord, SideJob, empty_record
from rig.run.state import RunState
from rig.run.turns import answers_by_conversation, run_turns, turn_bodies
from rig.scenario.workload import resolve_conversations, resolve_prompts, tokenize_body
from rig.serve.servers import Server
from tests.run_fakes import run_context


def context(tmp_path, concurrency=2):
    talks = tmp_path / "talks.jsonl"
    rows = [
        {"id": "a", "system": "S", "turns": ["a0", "a1", "a2"]},
        {"id": "b", "turns": ["b0", "b1"]},
        {"id": "d", "system": "DOC", "questions": ["d0", "d1"]},
    ]
    talks.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ctx = run_context(
        tmp_path,
        workload={"conversations": {"path": str(talks)}, "concurrency": [concurrency]},
        gates={"min_prefix_cache_hits": 1},
        candidate={"kernel": "ns4"},
        model={"max_model_len": 1024, "max_num_batched_tokens": 1024 * concurrency},
    )
    return replace(ctx, conversations=tuple(resolve_conversations(ctx.scenario.workload)))


class Answering:
    """A send that answers every request at once: `<side>:<request id>` as its text, and keeps
    what each round sent."""

    def __init__(self, state: RunState | None = None) -> None:
        self.rounds: list[list[SideJob]] = []
        self.state = state

    def __call__(self, jobs: list[SideJob]) -> dict[str, list[RequestRecord]]:
        self.rounds.append(jobs)
        out: dict[str, list[RequestRecord]] = {}
        for job in jobs:
            for spec in job.specs:
                record = empty_record(job.target, spec)
                record.text = f"{job.target.side}:{spec.request_id}"
                out.setdefault(job.target.side, []).append(record)
                if self.state is not None:
                    self.state.records.append(record)  # as journal.keep_record does
        return out


def targets(ctx):
    return {label: Server(plan).target() for label, plan in ctx.plan.servers.items()}


def test_turns_go_round_by_round_from_the_reference_answers(tmp_path):
    ctx = context(tmp_path)
    state = RunState()
    send = Answering(state)
    records = run_turns(ctx, targets(ctx), 2, 0, send, state)
    assert len(send.rounds) == 3 and len(records) == 2 * 7  # 3 + 2 + 2 turns, both sides
    assert [sorted(s.turn for job in r for s in job.specs) for r in send.rounds] == [
        [0] * 6,
        [1] * 6,
        [2] * 2,
    ]
    last = {job.target.side: job.specs[0] for job in send.rounds[2]}
    assert last["reference"].prompt == last["candidate"].prompt  # byte-identical on both sides
    assert "reference:c2-r0-0000" in last["candidate"].prompt  # the reference's turn-0 answer
    assert "reference:c2-r0-0001" in last["candidate"].prompt
    assert "candidate:" not in last["candidate"].prompt
    assert last["candidate"].request_id == "c2-r0-0002" and last["candidate"].turn == 2
    for side in ("reference", "candidate"):
        salts = {
            (s.conversation_id, s.cache_salt)
            for r in send.rounds
            for j in r
            for s in j.specs
            if j.target.side == side
        }
        assert len(salts) == 3 and len({salt for _, salt in salts}) == 3  # one per conversation
    every_salt = {s.cache_salt for r in send.rounds for j in r for s in j.specs}
    assert len(every_salt) == 6  # unique to the side too


def test_shared_prefix_turns_carry_no_answers(tmp_path):
    ctx = context(tmp_path)
    state = RunState()
    send = Answering(state)
    run_turns(ctx, targets(ctx), 2, 0, send, state)
    doc = [s for j in send.rounds[1] for s in j.specs if s.conversation_id == "d"]
    assert {s.prompt for s in doc} == {"System: DOC\n\nUser: d1\n\nAssistant:"}


def test_the_warm_up_continues_from_each_sides_own_answers(tmp_path):
    ctx = context(tmp_path)
    send = Answering()
    run_turns(ctx, targets(ctx), 2, 0, send, tag="warmup-p0-")
    last = {job.target.side: job.specs[0] for job in send.rounds[2]}
    assert "candidate:warmup-p0-c2-r0-0000" in last["candidate"].prompt
    assert last["candidate"].cache_salt.endswith("warmup-p0-c2-r0-a")


def test_a_candidate_alone_reads_the_reference_from_the_state(tmp_path):
    """The golden cache or the reference's block that ran first: only the candidate sends."""
    ctx = context(tmp_path)
    state = RunState()
    run_turns(ctx, {"reference": targets(ctx)["reference"]}, 2, 0, Answering(state), state)
    send = Answering()
    run_turns(ctx, {"candidate": targets(ctx)["candidate"]}, 2, 0, send, state)
    (job,) = send.rounds[2]
    assert "reference:c2-r0-0001" in job.specs[0].prompt


def test_answers_stop_at_the_first_missing_turn_and_bodies_match_the_prompt_ids(tmp_path):
    ctx = context(tmp_path)
    state = RunState()
    run_turns(ctx, targets(ctx), 2, 0, Answering(state), state)
    reference = [r for r in state.records if r.side == "reference"]
    answers = answers_by_conversation(reference, "reference", 2, 0)
    assert answers["a"] == ["reference:c2-r0-0000", "reference:c2-r0-0001", "reference:c2-r0-0002"]
    gap = [r for r in reference if (r.conversation_id, r.turn) != ("a", 1)]
    assert answers_by_conversation(gap, "reference", 2, 0)["a"] == ["reference:c2-r0-0000"]
    bodies = turn_bodies(ctx, reference, tokenize_body)
    assert set(bodies) == {r.prompt_id for r in reference}
    third = next(r for r in reference if (r.conversation_id, r.turn) == ("a", 2))
    assert "reference:c2-r0-0001" in bodies[third.prompt_id]["prompt"]


def test_the_run_counts_every_turn_as_a_request(tmp_path):
    ctx = context(tmp_path)
    assert len(resolve_prompts(ctx.scenario.workload)) == 7
