"""The accuracy block: the scenario's graded questions sent to a round's servers after its timed
levels (or instead of them), as one block of the rig's own load, recorded like every request.

It runs once per side: a round whose sides already hold its records (an earlier round of the
same servers, or an interrupted run's kept block) sends nothing.
"""

from __future__ import annotations

import functools

from rig.records import RequestSpec, SamplingParams
from rig.run.load_phase import run_block, run_load
from rig.run.state import RunContext, RunJournal
from rig.salts import cache_salt
from rig.scenario.accuracy_config import ACCURACY_REPEAT
from rig.scenario.config import Scenario
from rig.serve.servers import Server

TAG = "acc"


def accuracy_level(scenario: Scenario) -> int:
    """The questions' concurrency: the block's own, else the highest timed level's."""
    block = scenario.accuracy
    return (block and block.concurrency) or max(scenario.workload.concurrency)


def timed_levels(scenario: Scenario) -> list[int]:
    """The workload's levels, none where the questions replace them."""
    block = scenario.accuracy
    return [] if block is not None and block.replace_timed_levels else scenario.workload.concurrency


def question_requests(ctx: RunContext, side: str) -> list[RequestSpec]:
    """Every question as a greedy completion request, a salt of its own per side."""
    block = ctx.scenario.accuracy
    assert block is not None
    sampling = SamplingParams(
        max_tokens=block.max_tokens,
        seed=ctx.scenario.workload.seed,
        extra_body={"stop": list(block.stop)} if block.stop else {},
    )
    level = accuracy_level(ctx.scenario)
    specs = []
    for index, question in enumerate(ctx.questions):
        request_id = f"{TAG}-{question.id}"
        specs.append(
            RequestSpec(
                request_id=request_id,
                prompt_id=question.id,
                level=level,
                repeat=ACCURACY_REPEAT,
                index=index,
                endpoint="completions",
                prompt=question.prompt(block.shots).text,
                messages=None,
                cache_salt=cache_salt(ctx.run_id, side, request_id),
                sampling=sampling,
                task=block.source,
            )
        )
    return specs


def run_questions(ctx: RunContext, journal: RunJournal, servers: dict[str, Server]) -> None:
    """The block on `servers`, unless their sides hold its records already."""
    if not ctx.questions:
        return
    done = {r.side for r in journal.state.records if r.repeat == ACCURACY_REPEAT}
    todo = {label: s for label, s in servers.items() if s.plan.side not in done}
    if not todo:
        return
    level = accuracy_level(ctx.scenario)
    print(f"rig: accuracy: {len(ctx.questions)} questions per side at C={level}", flush=True)
    requests = functools.partial(question_requests, ctx)
    run_block(ctx, journal, todo, level, ACCURACY_REPEAT, requests=requests)


def load_and_questions(
    ctx: RunContext,
    journal: RunJournal,
    servers: dict[str, Server],
    levels: list[tuple[int, int]],
) -> None:
    """A round's load: its timed levels, then the questions."""
    run_load(ctx, journal, servers, levels)
    run_questions(ctx, journal, servers)
