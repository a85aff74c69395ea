"""A synthetic run for the report tests: two levels, two repeats, an A/A control, and every
kind of mismatch a reviewer meets (substantive with hostile model output in the text: script,
a textarea and an attribute broken out of, bidi controls; near-tie, a long completion, a failed
request), built from RequestRecords with token ids and each side's teacher-forced top-k along
the reference completions (the replay; timed records carry none)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

from rig.manifest_record import GitState, MachineFacts, PlacementFacts, RunManifest
from rig.records import CompletionKey, LevelFault, RequestRecord, ServerDelta, TokenLogprob
from rig.scenario.config import Scenario
from rig.scenario.gates_config import GatesConfig
from rig.verdict.compare import compare_pairs
from rig.verdict.drift import DriftResult
from rig.verdict.evidence import Evidence, SideKernel
from rig.verdict.gates import decide
from rig.verdict.outcome import RunOutcome

XSS_IMG = '<img src=x onerror="window.__rigXss=1">'
XSS_SCRIPT = "<script>window.__rigXss=2</script>"
XSS_TEXTAREA = '</textarea><textarea id="rig-injected">'  # breaks out of a textarea, if any
XSS_ATTRIBUTE = '"><img src=x id="rig-injected" onerror="window.__rigXss=3">'  # out of an attribute
# Right-to-left override (ended by a pop), and the three isolates, each closed by U+2069
BIDI = "\u202eevil\u202c \u2066left\u2069 \u2067right\u2069 \u2068first\u2069"
HOSTILE = f"{XSS_IMG} {XSS_SCRIPT} {XSS_TEXTAREA} {XSS_ATTRIBUTE} {BIDI}"
KERNELS = {
    "reference": SideKernel("reference", "fla", 120, "vLLM's own chunk_gated_delta_rule"),
    "candidate": SideKernel("candidate", "ns3", 118, "rig ns3 <b>plugin</b>"),
}


class Vocabulary:
    """Words as tokens: a text is split into words (each with its trailing space) and every
    distinct word gets an id, so decode(ids) gives the text back exactly."""

    def __init__(self) -> None:
        self.words: list[str] = []

    def encode(self, text: str) -> list[int]:
        pieces = [piece for piece in text.split(" ")]
        words = [piece + " " for piece in pieces[:-1]] + [pieces[-1]]
        ids = []
        for word in words:
            if word == "":
                continue
            if word not in self.words:
                self.words.append(word)
            ids.append(self.words.index(word))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.words[i] for i in ids)


def unit_manifest(name: str = "unit", gates: GatesConfig | None = None, **fields) -> RunManifest:
    """A run's manifest without servers or a machine behind it: a minimal scenario, vLLM 0.32.0."""
    scenario = Scenario.model_validate(
        {
            "name": name,
            "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]},
            "gates": (gates or GatesConfig()).model_dump(),
        }
    )
    facts = {
        "model_path": "tiny",
        "servers": {},
        "placement": PlacementFacts("simultaneous", 1, [], "both sides at once"),
        "simultaneous": True,
        "versions": {"vllm": "0.32.0"},
        "rig_git": GitState(sha=None, dirty=False, diff_sha256=None),
        "kernel_file_sha256": {},
        "machine": MachineFacts("Linux", "3.12", 2, [], None),
        "environment": {},
    }
    return RunManifest(scenario=scenario, **(facts | fields))


def _logprobs(ids: list[int], alternatives: dict[int, dict[int, float]]) -> list[TokenLogprob]:
    """A replay's top-k: the forced token far ahead of an unrelated runner-up, except where
    `alternatives` gives that position's top-k."""
    positions = []
    for index, token in enumerate(ids):
        top = alternatives.get(index, {token: -0.01, token + 1000: -9.0, token + 1001: -11.5})
        positions.append(TokenLogprob(token, top.get(token, -0.01), top))
    return positions


Replayed = dict[str, dict[CompletionKey, list[TokenLogprob]]]


def _pair(
    make_record: Callable[..., RequestRecord],
    vocabulary: Vocabulary,
    request: dict,
    reference_text: str,
    candidate_text: str,
    timing: random.Random,
    replayed: Replayed,
    near_tie_at: int | None = None,
    **candidate_fields,
) -> list[RequestRecord]:
    """Both records of one request pair; each side's replay along the reference completion
    goes into `replayed` (a near-tie's replay replaces the plain one of the same completion)."""
    records = []
    reference_ids = vocabulary.encode(reference_text)
    candidate_ids = vocabulary.encode(candidate_text)
    for side, text in (("reference", reference_text), ("candidate", candidate_text)):
        ids = vocabulary.encode(text)
        alternatives = {}
        if near_tie_at is not None:
            ref_id, cand_id = reference_ids[near_tie_at], candidate_ids[near_tie_at]
            own, other = (ref_id, cand_id) if side == "reference" else (cand_id, ref_id)
            alternatives[near_tie_at] = {own: -0.70, other: -0.78, own + 2000: -3.2}
        completions = replayed.setdefault(side, {})
        key = (request["prompt_id"], tuple(reference_ids))
        if near_tie_at is not None or key not in completions:
            completions[key] = _logprobs(reference_ids, alternatives)
        slow = 1.15 if side == "candidate" else 1.0
        fields = {
            "prompt_id": request["prompt_id"],
            "level": request["level"],
            "repeat": request["repeat"],
            "index": request["index"],
            "token_ids": ids,
            "output_tokens": len(ids),
            "prompt_tokens": 40,
            "sent_at": 1000.0 + request["index"] * 0.05 + request["repeat"] * 10,
            "ttft_s": 0.02 * request["level"] * slow * timing.uniform(0.8, 1.4),
            "itl_s": [0.004 * slow * timing.uniform(0.7, 1.6) for _ in range(max(len(ids) - 1, 0))],
            "e2el_s": 0.3 * request["level"] * slow * timing.uniform(0.9, 1.3),
        }
        if side == "candidate":
            fields.update(candidate_fields)
        records.append(make_record(side, request["request_id"], text, **fields))
    return records


LONG_TEXT = " ".join(f"sentence {i} of a long and careful answer." for i in range(120))


def synthetic_outcome(
    make_record: Callable[..., RequestRecord], run_dir: Path, with_aa: bool = True
) -> tuple[RunOutcome, Vocabulary]:
    vocabulary = Vocabulary()
    timing = random.Random(7)
    prompts = ["math-01", "coding-02", "long-1000-0", "chat-03", "math-02", "coding-05"]
    records: list[RequestRecord] = []
    replayed: Replayed = {}
    for level in (1, 4):
        for repeat in (0, 1):
            for index, prompt_id in enumerate(prompts):
                request = {
                    "prompt_id": prompt_id,
                    "level": level,
                    "repeat": repeat,
                    "index": index,
                    "request_id": f"c{level}-r{repeat}-{index:04d}",
                }
                answer = f"The answer to {prompt_id} is 42 and the reasons follow."
                if prompt_id == "long-1000-0":
                    answer = LONG_TEXT
                candidate = answer
                extra: dict = {}
                near_tie_at = None
                if prompt_id == "math-01" and level == 4:
                    candidate = f"The answer to {prompt_id} is {HOSTILE} indeed."
                elif prompt_id == "coding-02" and level == 1:
                    candidate = answer.replace("reasons", "reasoning")
                    near_tie_at = vocabulary.encode(answer).index(vocabulary.encode("reasons ")[0])
                elif prompt_id == "long-1000-0" and repeat == 1:
                    candidate = LONG_TEXT.replace("sentence 80 of", "sentence eighty of")
                elif prompt_id == "chat-03" and level == 4 and repeat == 0:
                    candidate, extra = "", {"error": "http_500: <b>boom</b>", "http_status": 500}
                records += _pair(
                    make_record,
                    vocabulary,
                    request,
                    answer,
                    candidate,
                    timing,
                    replayed,
                    near_tie_at,
                    **extra,
                )
    reference = [r for r in records if r.side == "reference"]
    candidate = [r for r in records if r.side == "candidate"]
    pairs = compare_pairs(reference, candidate, 0.25, max_tokens=2048, replayed=replayed)
    drift = [
        DriftResult(p, 12, 0.9 * (i + 1), 0.3 * (i + 1), 0.8 * (i + 1), 0.2, 0.6, 0)
        for i, p in enumerate(prompts)
    ] + [DriftResult("chat-03", 0, *[float("nan")] * 5, 0, error=f"RuntimeError: {XSS_SCRIPT}")]
    aa_pairs = aa_drift = None
    if with_aa:
        first = [r for r in reference if r.level == 1 and r.repeat == 0]
        aa_pairs = compare_pairs(first, first, 0.25, max_tokens=2048, replayed=replayed)
        aa_drift = [DriftResult(p, 12, 0.0, 0.0, 0.0, 0.0, 0.0, 0) for p in prompts]
    gates = GatesConfig(max_mean_drift=0.1, max_mean_prompt_drift=0.25)
    evidence = Evidence(
        gates,
        pairs,
        KERNELS,
        drift,
        requested_kernel="ns3",
        log_faults=1,
        aa_pairs=aa_pairs,
        aa_drift=aa_drift,
    )
    verdict = decide(evidence)
    outcome = RunOutcome(
        run_id="synthetic-ns3",
        run_dir=run_dir,
        scenario_name="synthetic",
        manifest=unit_manifest("synthetic", gates, kernel_file_sha256={"kernels/ns.py": "ab" * 32}),
        records=records,
        pairs=pairs,
        drift=drift,
        server_deltas=[
            ServerDelta(side, level, repeat, 240.0, 0.0)
            for side in ("reference", "candidate")
            for level in (1, 4)
            for repeat in (0, 1)
        ],
        faults=[LevelFault("candidate", 4, "traceback", "<b>Traceback</b> (most recent call)")],
        kernels=KERNELS,
        verdict=verdict,
        aa_pairs=aa_pairs,
        aa_drift=aa_drift,
        timings={"wall_s": 81.5},
        prompt_categories={"long-1000-0": "long"},
        replayed=replayed,
    )
    return outcome, vocabulary
