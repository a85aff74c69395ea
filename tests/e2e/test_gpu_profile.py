"""The profiled block on one GPU with vLLM's CUDA build (`pytest -m gpu -s
tests/e2e/test_gpu_profile.py`; benchmarks/gpu_profile_session.sh runs the same and keeps the
traces): tiny-qwen35, FLA against ns4, eager, C=1, one token out, gpu-long's 2K-10K-token
prompts. The reference's GDN prefill must be FLA's kernels and the candidate's ns4's; with
RIG_GDN_SHARE_CSV naming a CSV of benchmarks/gdn_share.py on the same GPU and prompts, the
reference's profiled GDN share must agree with gdn_share.py's within SHARE_POINTS."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics

import pytest

from rig.models.tiny_qwen35 import ensure_tiny_qwen35_model

from .conftest import RigRun
from .test_gpu import assert_fla_reference, needs_gpus, passed

pytestmark = pytest.mark.gpu

SHARE_POINTS = 3.0  # percentage points between the profile's GDN share and gdn_share.py's
SHORT = [
    "--set", "workload.concurrency=[1]", "--set", "workload.repeats=2",
    "--set", "workload.max_tokens=1", "--set", "workload.requests_per_level=6",
    "--set", "workload.warmup_requests=3", "--set", "model.enforce_eager=true",
    "--set", "profile.requests=6", "--no-cache", "--profile",
]  # fmt: skip


@pytest.fixture(scope="module")
def profiled(run_rig) -> RigRun:
    needs_gpus(1)
    ensure_tiny_qwen35_model()
    run = run_rig(*SHORT, scenario="scenarios/gpu-long.yaml", name="gpu-profiled")
    groups = _groups(run) if (run.run_dir / "profile.csv").exists() else {}
    print("gpu-profile", json.dumps(groups, default=str))
    return run


def _groups(run: RigRun) -> dict[str, dict]:
    rows = csv.DictReader(io.StringIO(run.read("profile.csv")))
    return {r["name"]: r for r in rows if r["kind"] == "group"}


def test_the_tables_name_flas_kernels_and_ns4s(profiled):
    run = profiled
    assert run.returncode == 0, passed(run)
    assert_fla_reference(run)
    groups = _groups(run)
    fla, ns = groups["GDN prefill: FLA"], groups["GDN prefill: nsR (Triton)"]
    assert float(fla["reference_ms"]) > 0 and fla["candidate_ms"] == ""
    assert float(ns["candidate_ms"]) > 0 and ns["reference_ms"] == ""
    rows = list(csv.DictReader(io.StringIO(run.read("profile.csv"))))
    named = {(r["side"], r["name"]) for r in rows if r["kind"] == "kernel"}
    assert any(side == "reference" and name.startswith("chunk_") for side, name in named)
    assert {("candidate", "wy_kernel"), ("candidate", "walk_kernel")} & named
    for side in ("reference", "candidate"):
        (trace,) = (run.run_dir / "profile" / side).glob("*rank0*.pt.trace.json.gz")
        assert trace.stat().st_size > 0


def test_the_profiled_share_agrees_with_gdn_share(profiled):
    source = os.environ.get("RIG_GDN_SHARE_CSV")
    if not source:
        pytest.skip("RIG_GDN_SHARE_CSV names no gdn_share.py CSV of this GPU")
    with open(source, encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    expected = statistics.mean(float(r["gdn_share_pct"]) for r in rows if r["side"] == "reference")
    measured = sum(
        float(g["reference_share_pct"] or 0)
        for name, g in _groups(profiled).items()
        if name.startswith("GDN prefill")
    )  # the whole call, as gdn_share.py times it: FLA's kernels and the copies around them
    print(f"gpu-profile share: profile {measured:.1f} %, gdn_share.py {expected:.1f} %")
    assert abs(measured - expected) <= SHARE_POINTS
