"""Conversations on the wire (workload.conversations): a block sends turn 0 of every
conversation, then turn 1, and so on, each round through the level's ordinary send (at once,
C in flight, paced, in waves or in request pairs). A conversation's turns so go in order on one
server, different conversations run concurrently, and turn k is built from the reference's
answers to the turns before it on both sides: in the same block's earlier rounds, in the
reference's own block that ran first (sides timed in turn), or in the golden cache.
"""

from __future__ import annotations

from collections.abc import Callable

from rig.records import RequestRecord, ServerTarget, Side, SideJob
from rig.run.state import RunContext, RunState
from rig.scenario.workload import turn_requests
from rig.serve.placement import shard

Send = Callable[[list[SideJob]], dict[str, list[RequestRecord]]]


def answers_by_conversation(
    records: list[RequestRecord], side: str, level: int, repeat: int
) -> dict[str, list[str]]:
    """One side's answers in one block, by conversation, in turn order up to the first turn
    it has no record of."""
    texts: dict[str, dict[int, str]] = {}
    for record in records:
        if record.conversation_id is None or record.turn is None:
            continue
        if (record.side, record.level, record.repeat) == (side, level, repeat):
            texts.setdefault(record.conversation_id, {})[record.turn] = record.text
    answers = {}
    for conversation, turns in texts.items():
        ordered: list[str] = []
        while len(ordered) in turns:
            ordered.append(turns[len(ordered)])
        answers[conversation] = ordered
    return answers


def run_turns(
    ctx: RunContext,
    targets: dict[str, ServerTarget],
    level: int,
    repeat: int,
    send: Send,
    reference: RunState | None = None,
    tag: str = "",
) -> list[RequestRecord]:
    """Every turn of the level's conversations on `targets`, round by round; returns the
    records. `reference`: the run's state, whose records hold the reference's answers (read
    again before each round); None: each side continues from its own answers (the warm-up,
    which is never compared). Conversation i goes to replica pair i % R."""
    conversations = list(ctx.conversations)
    sent: list[RequestRecord] = []
    for turn in range(max(len(c.turns) for c in conversations)):
        answers = None
        if reference is not None:
            answers = answers_by_conversation(reference.records, Side.REFERENCE, level, repeat)
        jobs = []
        for target in targets.values():
            replicas = len(ctx.plan.side_servers(target.side))
            shards = shard(len(conversations), replicas, level)
            if target.replica >= len(shards):
                continue
            positions, concurrency = shards[target.replica]
            specs = turn_requests(
                ctx.scenario.workload,
                conversations,
                answers
                if answers is not None
                else answers_by_conversation(sent, target.side, level, repeat),
                turn=turn,
                positions=positions,
                level=level,
                repeat=repeat,
                side=target.side,
                run_id=ctx.run_id,
                tag=tag,
            )
            if specs:
                jobs.append(SideJob(target, specs, concurrency))
        if jobs:
            results = send(jobs)
            sent += [record for records in results.values() for record in records]
    return sent


def turn_bodies(ctx: RunContext, reference: list[RequestRecord], body) -> dict[str, dict]:
    """The /tokenize body of every conversation turn the reference answered, by prompt id
    (`body`: a Prompt's body, rig.scenario.workload.tokenize_body), for the replay."""
    by_id = {c.id: c for c in ctx.conversations}
    blocks: dict[tuple[int, int], dict[str, list[str]]] = {}
    bodies = {}
    for record in reference:
        conversation = by_id.get(record.conversation_id or "")
        if conversation is None or record.turn is None:
            continue
        block = (record.level, record.repeat)
        if block not in blocks:
            blocks[block] = answers_by_conversation(reference, Side.REFERENCE, *block)
        prompt = conversation.prompt(record.turn, blocks[block].get(conversation.id, []))
        bodies[prompt.id] = body(prompt, ctx.scenario.workload)
    return bodies
