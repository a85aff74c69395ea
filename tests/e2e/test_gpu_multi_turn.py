"""scenarios/gpu-multi-turn.yaml on one GPU with vLLM's CUDA build (`pytest -m gpu
tests/e2e/test_gpu_multi_turn.py`): conversations on tiny-qwen35 behind ~8K-token documents,
both sides sharing the GPU, FLA the reference. The ns4 run fills the golden cache and must
pass with equal hits above the floor; the run with the candidate's prefix caching off starts
only the candidate and must be INVALID on the prefix-cache gate alone; ns4+drop-state writes
the same text on tiny-qwen35 and must fail on the prompt positions' drift alone.

Each run prints one line `gpu-multi-turn <name> {json}` (verdict, failed gates, cached tokens
per turn and side) and, with RIG_GPU_EVIDENCE_DIR set, copies its evidence there under <name>/
before any assertion, as tests/e2e/test_gpu_long.py does.
"""

from __future__ import annotations

import pytest

from .conftest import EQUIVALENT_WORDS, RigRun, rig_processes
from .test_gpu import assert_fla_reference, kernel_of, passed
from .test_gpu_long import keep_evidence, one_gpu_runs

pytestmark = pytest.mark.gpu

SCENARIO = "scenarios/gpu-multi-turn.yaml"
FLOOR = 100000  # the scenario's gates.min_prefix_cache_hits
EVIDENCE_FILES = ("summary.md", "requests.jsonl", "server_counters.jsonl", "manifest.json")


def cached_by_turn(run: RigRun) -> dict[str, dict[int, int]]:
    """Cached prompt tokens per side and turn, over the measured requests both sides served (a
    block that one side ran again after a JIT compile has no counterpart: the H200 run of
    2026-12-04 had one on the golden-cache reference only)."""
    measured = [r for r in run.records() if r["turn"] is not None and not r["warmup"]]
    sides_of: dict[str, set[str]] = {}
    for row in measured:
        sides_of.setdefault(row["request_id"], set()).add(row["side"])
    sums: dict[str, dict[int, int]] = {}
    for row in measured:
        if len(sides_of[row["request_id"]]) == 2:
            side = sums.setdefault(row["side"], {})
            side[row["turn"]] = side.get(row["turn"], 0) + (row["cached_tokens"] or 0)
    return sums


def report(run: RigRun, name: str, wall_s: float) -> None:
    summary: dict = {"run": name, "exit": run.returncode, "test_wall_s": round(wall_s, 1)}
    if (run.run_dir / "manifest.json").exists():
        verdict = run.manifest().get("verdict") or {}
        summary |= {
            "verdict": verdict.get("word"),
            "failed_gates": [g["detail"] for g in verdict.get("gates", []) if not g["passed"]],
            "cached_by_turn": cached_by_turn(run),
        }
    keep_evidence(run, f"gpu-multi-turn {name}", summary, EVIDENCE_FILES)


@pytest.fixture(scope="module")
def run_turns(run_rig):
    return one_gpu_runs(run_rig, SCENARIO, report)


@pytest.fixture(scope="module")
def turns_ns4(run_turns) -> RigRun:
    return run_turns("gpu1-turns-ns4")  # fills the golden cache


@pytest.fixture(scope="module")
def turns_lopsided(turns_ns4, run_turns) -> RigRun:
    return run_turns(
        "gpu1-turns-lopsided", "--set", 'candidate.serve_args=["--no-enable-prefix-caching"]'
    )


@pytest.fixture(scope="module")
def turns_dropped(turns_ns4, run_turns) -> RigRun:
    return run_turns("gpu1-turns-drop", "--set", "candidate.kernel=ns4+drop-state")


def test_ns4_hits_equally_on_both_sides_above_the_floor(turns_ns4):
    run = turns_ns4
    assert run.returncode == 0, passed(run)
    assert run.manifest()["verdict"]["word"] in EQUIVALENT_WORDS
    gate = run.gate("prefix-cache hits")
    assert gate["passed"] and "0 requests differ" in gate["detail"], gate
    sums = cached_by_turn(run)
    assert sums["reference"] == sums["candidate"]
    assert sum(sums["reference"].values()) >= FLOOR and sums["reference"][0] == 0
    assert kernel_of(run, "candidate")["kernel"] == "ns4"
    assert_fla_reference(run)


def test_hits_that_differ_between_the_sides_make_the_run_invalid(turns_lopsided):
    run = turns_lopsided
    assert run.returncode == 3, passed(run)
    failed = [g for g in run.manifest()["verdict"]["gates"] if not g["passed"]]
    assert [g["name"] for g in failed] == ["prefix-cache hits"]
    assert "\n" not in failed[0]["detail"] and "candidate 0 " in failed[0]["detail"]
    assert rig_processes() == []


def test_a_dropped_cached_state_fails_on_the_prompt_positions(turns_dropped):
    """On one H200 (2026-12-04): identical text, prompt drift 0.099 against ns4's 0.059."""
    run = turns_dropped
    assert run.returncode == 1, passed(run)
    failed = [g["name"] for g in run.manifest()["verdict"]["gates"] if not g["passed"]]
    assert failed == ["teacher-forced drift"]
    assert kernel_of(run, "candidate")["kernel"] == "ns4+drop-state"
    assert kernel_of(run, "candidate")["initial_state"]["sequences"] > 0
    sums = cached_by_turn(run)
    assert sums["reference"] == sums["candidate"] and sum(sums["candidate"].values()) >= FLOOR
