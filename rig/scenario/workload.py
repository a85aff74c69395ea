"""Turn a scenario's workload into the ordered request list of each level.

The same ordered list goes to both sides; only the cache salt differs per side, so every request
of the run carries a salt of its own (no prefix-cache hit can hide the prefill path).
"""

from __future__ import annotations

from rig.records import RequestSpec, SamplingParams
from rig.salts import cache_salt
from rig.scenario.config import WorkloadConfig
from rig.scenario.conversations import Conversation, load_conversations, turn_prompts
from rig.scenario.long_prompts import build_long_prompt
from rig.scenario.prompt_sets import load_prompt_set
from rig.scenario.prompts import Prompt, load_prompts


class WorkloadError(ValueError):
    """A workload that cannot be built; the message is one line meant for the user."""


def resolve_conversations(workload: WorkloadConfig) -> list[Conversation]:
    """The workload's conversations ([] for a workload of prompts)."""
    if workload.conversations is None:
        return []
    return load_conversations(workload.conversations)


def resolve_prompts(workload: WorkloadConfig) -> list[Prompt]:
    """Every request's prompt; for conversations every turn's own (rig.scenario.conversations)."""
    if workload.conversations is not None:
        return turn_prompts(resolve_conversations(workload))
    prompts: list[Prompt] = []
    for source in workload.prompts:
        if source.path is not None:
            prompts += load_prompts(source.path, limit=source.limit)
        elif source.prompt_set is not None:
            prompts += load_prompt_set(source.prompt_set, limit=source.limit)
        else:
            prompts += [
                build_long_prompt(tokens, seed=source.seed) for tokens in source.long_tokens
            ]
    ids = [prompt.id for prompt in prompts]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise WorkloadError(
            f"prompt ids appear more than once across the prompt sources: {', '.join(duplicates)}"
        )
    if not prompts:
        raise WorkloadError("the workload's prompt sources hold no prompts")
    return prompts


def sampling_params(workload: WorkloadConfig) -> SamplingParams:
    return SamplingParams(
        max_tokens=workload.max_tokens,
        seed=workload.seed,
        top_logprobs=workload.top_logprobs,
        ignore_eos=workload.ignore_eos,
        chat_template_kwargs=workload.chat_template_kwargs,
        extra_body=dict(workload.extra_body),
    )


def level_requests(
    workload: WorkloadConfig,
    prompts: list[Prompt],
    *,
    level: int,
    repeat: int,
    side: str,
    run_id: str,
    tag: str = "",
    count: int | None = None,
) -> list[RequestSpec]:
    """The ordered requests of one level: `requests_per_level` of them (default: one per prompt),
    cycling through the prompts when more requests than prompts are asked for."""
    total = count if count is not None else (workload.requests_per_level or len(prompts))
    sampling = sampling_params(workload)
    specs = []
    for index in range(total):
        prompt = prompts[index % len(prompts)]
        request_id = f"{_block(tag, level, repeat)}-{index:04d}"
        salt = cache_salt(run_id, side, request_id)
        specs.append(_spec(workload, prompt, request_id, level, repeat, index, salt, sampling))
    return specs


def turn_requests(
    workload: WorkloadConfig,
    conversations: list[Conversation],
    answers: dict[str, list[str]],
    *,
    turn: int,
    positions: list[int],
    level: int,
    repeat: int,
    side: str,
    run_id: str,
    tag: str = "",
) -> list[RequestSpec]:
    """Turn `turn` of the conversations at `positions` that have one, built from `answers` (the
    reference's answers to its earlier turns, by conversation id). A conversation's turns share
    one salt, unique to the run, side, level and repeat; the request ids number the level's
    turns conversation by conversation, so every block has the same ids."""
    sampling = sampling_params(workload)
    offsets = _turn_offsets(conversations)
    specs = []
    for position in positions:
        conversation = conversations[position]
        if turn >= len(conversation.turns):
            continue
        prompt = conversation.prompt(turn, answers.get(conversation.id, []))
        index = offsets[position] + turn
        block = _block(tag, level, repeat)
        salt = cache_salt(run_id, side, f"{block}-{conversation.id}")
        request_id = f"{block}-{index:04d}"
        turn_fields = {"conversation_id": conversation.id, "turn": turn}
        specs.append(
            _spec(workload, prompt, request_id, level, repeat, index, salt, sampling, **turn_fields)
        )
    return specs


def _block(tag: str, level: int, repeat: int) -> str:
    """The start of every request id of one block (and of a conversation's salt key)."""
    return f"{tag}c{level}-r{repeat}"


def _spec(
    workload: WorkloadConfig,
    prompt: Prompt,
    request_id: str,
    level: int,
    repeat: int,
    index: int,
    salt: str,
    sampling: SamplingParams,
    **turn,
) -> RequestSpec:
    """One request of a level, the prompt sent as the workload's endpoint wants it."""
    chat = workload.endpoint == "chat"
    return RequestSpec(
        request_id=request_id,
        prompt_id=prompt.id,
        level=level,
        repeat=repeat,
        index=index,
        endpoint=workload.endpoint,
        prompt=None if chat else prompt.text,
        messages=tuple(prompt.messages_as_dicts()) if chat else None,
        cache_salt=salt,
        sampling=sampling,
        **turn,
    )


def _turn_offsets(conversations: list[Conversation]) -> list[int]:
    offsets, total = [], 0
    for conversation in conversations:
        offsets.append(total)
        total += len(conversation.turns)
    return offsets


def warmup_prompts(workload: WorkloadConfig, prompts: list[Prompt]) -> list[Prompt]:
    """What each server answers, untimed, before its first level: by default the shortest and
    the longest prompt (the shapes the levels use, so compilation and JIT happen here, not in a
    timed request); `warmup_requests: N` sends the first N prompts instead, 0 none."""
    if workload.warmup_requests is not None:
        return [prompts[i % len(prompts)] for i in range(workload.warmup_requests)]
    by_length = sorted(prompts, key=lambda p: len(p.text))
    return list({p.id: p for p in (by_length[0], by_length[-1])}.values())


def tokenize_body(prompt: Prompt, workload: WorkloadConfig) -> dict:
    """The /tokenize body that reproduces how the server tokenized this prompt when serving it."""
    if workload.endpoint == "completions":
        return {"prompt": prompt.text}
    body: dict = {"messages": prompt.messages_as_dicts(), "add_generation_prompt": True}
    if workload.chat_template_kwargs:
        body["chat_template_kwargs"] = workload.chat_template_kwargs
    return body
