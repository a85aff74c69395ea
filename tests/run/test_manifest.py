"""manifest.json's provenance without servers: secrets redacted, the numerics knobs of the
environment, the rig's own tree, the machine."""

import json

from rig.manifest_record import GitState
from rig.run.manifest import build_manifest, git_state
from rig.scenario.config import Scenario
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers


def scenario(**overrides) -> Scenario:
    data = {"name": "t", "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}}
    data.update(overrides)
    return Scenario.model_validate(data)


def test_the_manifest_holds_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-from-env")
    monkeypatch.setenv("VLLM_HF_TOKEN", "hf-from-env")
    run = scenario(candidate={"api_key": "sk-secret", "serve_args": ["--dtype", "half"]})
    plan = plan_servers(run, "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    manifest = json.dumps(build_manifest(run, plan, "/m").to_json())
    for secret in ("sk-secret", "sk-from-env", "hf-from-env"):
        assert secret not in manifest
    assert '"VLLM_API_KEY": "<redacted>"' in manifest


def test_the_manifest_records_the_numerics_knobs_the_tree_and_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("FLA_CACHE", "/x")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/t")
    monkeypatch.setenv("UNRELATED_THING", "1")
    run = scenario()
    plan = plan_servers(run, "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    manifest = build_manifest(run, plan, "/m").to_json()
    environment = manifest["environment"]
    assert environment["NCCL_ALGO"] == "Ring" and environment["FLA_CACHE"] == "/x"
    assert environment["TRITON_CACHE_DIR"] == "/t" and "UNRELATED_THING" not in environment
    tree = manifest["rig_git"]
    assert len(tree["sha"]) == 40 and isinstance(tree["dirty"], bool)
    assert (tree["diff_sha256"] is not None) == tree["dirty"]
    assert "cuda_runtime" in manifest["machine"]
    assert manifest["placement"]["mode"] == "simultaneous"


def test_git_state_hashes_uncommitted_changes(monkeypatch):
    outputs = {
        "rev-parse": "a" * 40 + "\n",
        "status": " M rig/run/pipeline.py\n",
        "diff": "diff --git",
    }
    monkeypatch.setattr("rig.run.manifest._git", lambda command, *rest: outputs[command])
    state = git_state()
    assert state.dirty and state.diff_sha256 and state.sha == "a" * 40
    outputs["status"] = ""
    assert git_state() == GitState(sha="a" * 40, dirty=False, diff_sha256=None)
