"""Both sides' profiled blocks side by side (rig.verdict.profile_report): the groups' ratio,
the CSV frame, the lines the report prints; and the measured-share prediction
(rig.verdict.sensitivity.profiled_share) beside what was measured."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from rig.report.tables import profile_table
from rig.verdict.perf_records import FASTER, NOISE, Metric, PerfResult
from rig.verdict.profile_report import (
    PROFILE_COLUMNS,
    ProfiledBlock,
    ProfileResult,
    TraceFile,
    side_profile,
)
from rig.verdict.sensitivity import profiled_share
from tests.perf_builders import changed, perf_level

STORED = Path(__file__).parent / "data" / "cpu-ns4-trace.json.gz"


def block(side: str, level: int = 1) -> ProfiledBlock:
    return ProfiledBlock(side, side, level, 4, 0, 2.5, 0.4)


def relabelled(kernel: str) -> bytes:
    """The stored ns4 trace as if another kernel's scope had held the same ops."""
    trace = json.loads(gzip.decompress(STORED.read_bytes()))
    for event in trace["traceEvents"]:
        if str(event.get("name", "")).startswith("rig_gdn_prefill["):
            event["name"] = f"rig_gdn_prefill[{kernel}]"
    return json.dumps(trace).encode()


@pytest.fixture(scope="module")
def result() -> ProfileResult:
    stored = STORED.read_bytes()
    reference = side_profile(
        block("reference"), [(TraceFile("profile/reference/r.json", 10), relabelled("ref"))]
    )
    candidate = side_profile(
        block("candidate"), [(TraceFile("profile/candidate/c.json.gz", len(stored)), stored)]
    )
    return ProfileResult(1, (reference, candidate))


def test_each_sides_gdn_group_is_its_own_kernels(result):
    groups = {g.group: g for g in result.groups()}
    assert groups["GDN prefill: ref"].candidate_ms is None
    assert groups["GDN prefill: ns4"].reference_ms is None
    assert groups["GDN prefill: ns4"].ratio is None
    other = groups["other"]
    assert other.ratio == pytest.approx(1.0)  # the same trace on both sides
    assert list(groups)[-1] == "other"


def test_the_table_has_top_kernels_per_side_then_the_groups(result):
    frame = profile_table(result)
    assert list(frame.columns) == PROFILE_COLUMNS
    kernels = frame[frame.kind == "kernel"]
    assert set(kernels.side) == {"reference", "candidate"}
    assert len(kernels) == 2 * 11  # ten by name and the rest summed, per side
    assert kernels.time_ms.sum() == pytest.approx(2 * result.table("candidate").kernel_us / 1000)
    assert set(frame[frame.kind == "group"].name) == {g.group for g in result.groups()}
    assert list(profile_table(None).columns) == PROFILE_COLUMNS and profile_table(None).empty


def test_lines_state_each_sides_share_and_trace_size(result):
    reference, candidate = result.lines()
    share = result.table("candidate").gdn_share_pct
    assert candidate.startswith("candidate: GDN prefill") and f"{share:.1f} % of" in candidate
    assert "1 trace(s), 0.09 MiB gzipped" in candidate and "3 steps" in candidate


def test_a_side_without_traces_says_so():
    found = side_profile(block("reference"), [])
    assert found.table is None and found.problem == "reference wrote no worker trace"
    broken = side_profile(block("reference"), [(TraceFile("x", 3), b"{")])
    assert broken.table is None and "not a gzip or JSON trace" in broken.problem


def _level(ttft, throughput, gdn=None):
    metrics = [
        changed(1, Metric.MEAN_TTFT, *ttft),
        changed(1, Metric.TOTAL_TOKEN_THROUGHPUT, *throughput),
    ]
    if gdn is not None:
        ref_ms, cand_ms = gdn
        metrics.append(
            changed(1, Metric.GDN_MS_PER_CALL, 100 * (cand_ms / ref_ms - 1), (0, 1), sides=gdn)
        )
    return PerfResult((perf_level(1, *metrics),))


def test_the_measured_share_predicts_from_the_servers_call_ratio(result):
    share = result.table("reference").gdn_share_pct / 100
    perf = _level((-10.0, (-12.0, -8.0), FASTER), (11.0, (9.0, 13.0), FASTER), gdn=(2.0, 1.0))
    found = profiled_share(result, perf)
    stretch = share * (0.5 - 1)
    ttft, throughput = found.predictions
    assert found.ratio == 0.5 and found.ratio_source == "the servers' call timing"
    assert ttft.predicted_pct == pytest.approx(100 * stretch)
    assert throughput.predicted_pct == pytest.approx(-100 * stretch / (1 + stretch))
    text = found.describe()
    assert text.startswith("kernel at C1, from the profiled share: GDN prefill ")
    assert f"TTFT mean predicted {100 * stretch:+.1f} %, measured -10.0 % [-12.0, -8.0]" in text


def test_without_the_servers_timing_the_profiles_own_calls_give_the_ratio(result):
    perf = _level((0.0, (-1.0, 1.0), NOISE), (0.0, (-1.0, 1.0), NOISE))
    found = profiled_share(result, perf)
    assert found.ratio_source == "the profiled block's calls"
    assert found.ratio == pytest.approx(1.0)  # the same calls on both sides


def test_no_profile_or_level_no_prediction(result):
    perf = _level((0.0, (-1.0, 1.0), NOISE), (0.0, (-1.0, 1.0), NOISE))
    assert profiled_share(None, perf) is None
    assert profiled_share(replace(result, level=8), perf) is None
