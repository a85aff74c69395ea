import json
from itertools import product
from pathlib import Path

import pytest

from rig.scenario.config import WorkloadConfig
from rig.scenario.prompts import ChatMessage, Prompt
from rig.scenario.workload import (
    WorkloadError,
    level_requests,
    resolve_prompts,
    sampling_params,
    tokenize_body,
    warmup_prompts,
)
from tests.test_salts import assert_vllm_salt

SIDES = ("reference", "candidate", "reference-aa")


def workload(**fields) -> WorkloadConfig:
    values = {"prompts": [{"long_tokens": [50]}], "concurrency": [1]}
    values.update(fields)
    return WorkloadConfig.model_validate(values)


def prompt(pid: str, *messages: tuple[str, str]) -> Prompt:
    return Prompt(id=pid, messages=tuple(ChatMessage(r, c) for r, c in messages), source="test")


PROMPTS = [prompt("a", ("user", "first")), prompt("b", ("user", "second"))]


def write_jsonl(path: Path, ids: list[str]) -> Path:
    lines = [json.dumps({"id": i, "prompt": f"prompt {i}"}) for i in ids]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- cache salts -------------------------------------------------------------------------------


def all_salts(run_id: str, wl: WorkloadConfig, levels, repeats) -> list[str]:
    salts = []
    for side, level, repeat in product(SIDES, levels, range(repeats)):
        specs = level_requests(wl, PROMPTS, level=level, repeat=repeat, side=side, run_id=run_id)
        salts += [s.cache_salt for s in specs]
    for side in SIDES:  # warm-up requests are tagged
        specs = level_requests(
            wl, PROMPTS, level=0, repeat=0, side=side, run_id=run_id, tag="warmup-", count=3
        )
        salts += [s.cache_salt for s in specs]
    return salts


@pytest.mark.parametrize(
    "run_id",
    [
        "20261129-120000-smoke",
        "x" * 300,
        "a/b@c\\d\x00e",
        "/" * 200,
    ],
    ids=["plain", "very-long", "forbidden-chars", "long-forbidden"],
)
def test_salts_are_unique_and_valid_across_sides_levels_repeats(run_id):
    wl = workload(requests_per_level=7)
    salts = all_salts(run_id, wl, levels=[1, 4, 16, 128], repeats=3)
    assert len(salts) == len(SIDES) * (4 * 3 * 7 + 3)
    assert len(set(salts)) == len(salts)
    for salt in salts:
        assert_vllm_salt(salt)


# --- the ordered request list -----------------------------------------------------------------


def test_one_request_per_prompt_by_default():
    specs = level_requests(workload(), PROMPTS, level=4, repeat=0, side="reference", run_id="r")
    assert [s.prompt_id for s in specs] == ["a", "b"]
    assert [s.index for s in specs] == [0, 1]
    assert {s.level for s in specs} == {4}


def test_cycles_through_the_prompts_when_more_requests_are_asked_for():
    wl = workload(requests_per_level=5)
    specs = level_requests(wl, PROMPTS, level=1, repeat=0, side="reference", run_id="r")
    assert [s.prompt_id for s in specs] == ["a", "b", "a", "b", "a"]
    assert len({s.request_id for s in specs}) == 5


def test_fewer_requests_than_prompts_takes_the_first():
    wl = workload(requests_per_level=1)
    specs = level_requests(wl, PROMPTS, level=1, repeat=0, side="reference", run_id="r")
    assert [s.prompt_id for s in specs] == ["a"]


def test_count_beats_requests_per_level():
    wl = workload(requests_per_level=5)
    specs = level_requests(wl, PROMPTS, level=1, repeat=0, side="r", run_id="r", count=3)
    assert len(specs) == 3


def test_both_sides_get_the_same_requests_but_different_salts():
    wl = workload(requests_per_level=4, max_tokens=17)
    ref = level_requests(wl, PROMPTS, level=2, repeat=1, side="reference", run_id="r")
    cand = level_requests(wl, PROMPTS, level=2, repeat=1, side="candidate", run_id="r")
    for a, b in zip(ref, cand, strict=True):
        assert (a.request_id, a.prompt_id, a.prompt, a.messages, a.sampling) == (
            b.request_id,
            b.prompt_id,
            b.prompt,
            b.messages,
            b.sampling,
        )
        assert a.cache_salt != b.cache_salt


def test_request_ids_differ_across_levels_and_repeats():
    wl = workload()
    ids = [
        s.request_id
        for level, repeat in product([1, 2], [0, 1])
        for s in level_requests(wl, PROMPTS, level=level, repeat=repeat, side="x", run_id="r")
    ]
    assert len(set(ids)) == len(ids) == 8


def test_completions_body_carries_the_prompt_text():
    chat = prompt("c", ("system", "Be brief."), ("user", "Hi"))
    wl = workload(endpoint="completions")
    (spec,) = level_requests(wl, [chat], level=1, repeat=0, side="x", run_id="r")
    assert spec.endpoint == "completions"
    assert spec.messages is None
    assert spec.prompt == chat.text
    assert "Be brief." in spec.prompt and "Hi" in spec.prompt


def test_chat_body_carries_the_messages():
    chat = prompt("c", ("system", "Be brief."), ("user", "Hi"))
    wl = workload(endpoint="chat", chat_template_kwargs={"enable_thinking": False})
    (spec,) = level_requests(wl, [chat], level=1, repeat=0, side="x", run_id="r")
    assert spec.endpoint == "chat"
    assert spec.prompt is None
    assert spec.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    )
    assert spec.sampling.chat_template_kwargs == {"enable_thinking": False}


def test_sampling_params_follow_the_workload():
    wl = workload(max_tokens=33, seed=7, top_logprobs=3, ignore_eos=True, extra_body={"n": 1})
    params = sampling_params(wl)
    assert (params.max_tokens, params.seed, params.top_logprobs) == (33, 7, 3)
    assert params.ignore_eos is True
    assert params.extra_body == {"n": 1}
    params.extra_body["x"] = 1  # a copy: the scenario is not changed through it
    assert wl.extra_body == {"n": 1}
    assert sampling_params(workload()).ignore_eos is False


# --- prompt resolution -------------------------------------------------------------------------


def test_resolve_prompts_concatenates_sources_in_order(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ["x", "y", "z"])
    wl = workload(prompts=[{"path": str(path), "limit": 2}, {"long_tokens": [20, 40], "seed": 3}])
    assert [p.id for p in resolve_prompts(wl)] == ["x", "y", "long-20-3", "long-40-3"]


def test_duplicate_prompt_ids_across_sources_are_an_error(tmp_path):
    first = write_jsonl(tmp_path / "one.jsonl", ["shared", "only-one"])
    second = write_jsonl(tmp_path / "two.jsonl", ["shared", "only-two"])
    wl = workload(prompts=[{"path": str(first)}, {"path": str(second)}])
    with pytest.raises(WorkloadError, match="shared") as caught:
        resolve_prompts(wl)
    assert "only-one" not in str(caught.value)


def test_same_long_prompt_twice_is_an_error():
    wl = workload(prompts=[{"long_tokens": [30]}, {"long_tokens": [30]}])
    with pytest.raises(WorkloadError, match="long-30-0"):
        resolve_prompts(wl)


def test_long_prompts_with_other_seeds_are_distinct():
    wl = workload(prompts=[{"long_tokens": [30]}, {"long_tokens": [30], "seed": 1}])
    assert len(resolve_prompts(wl)) == 2


# --- /tokenize bodies --------------------------------------------------------------------------


def test_tokenize_body_for_completions_is_the_prompt_text():
    chat = prompt("c", ("system", "S"), ("user", "U"))
    assert tokenize_body(chat, workload(endpoint="completions")) == {"prompt": chat.text}


def test_tokenize_body_for_chat_applies_the_template_like_serving():
    chat = prompt("c", ("system", "S"), ("user", "U"))
    body = tokenize_body(chat, workload(endpoint="chat"))
    assert body == {
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        "add_generation_prompt": True,
    }
    kwargs = {"enable_thinking": False}
    body = tokenize_body(chat, workload(endpoint="chat", chat_template_kwargs=kwargs))
    assert body["chat_template_kwargs"] == kwargs


# --- warm-up -------------------------------------------------------------------------------------


def test_warmup_by_default_sends_the_shortest_and_the_longest_prompt():
    prompts = [prompt("mid", ("user", "x" * 50)), prompt("s", ("user", "x")), *PROMPTS]
    prompts.append(prompt("long", ("user", "x" * 900)))
    assert [p.id for p in warmup_prompts(workload(), prompts)] == ["s", "long"]
    assert [p.id for p in warmup_prompts(workload(), PROMPTS[:1])] == ["a"]  # one shape only


@pytest.mark.parametrize(("count", "expected"), [(0, []), (3, ["a", "b", "a"])])
def test_warmup_requests_overrides_the_default(count, expected):
    assert [p.id for p in warmup_prompts(workload(warmup_requests=count), PROMPTS)] == expected
