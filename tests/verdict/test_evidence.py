"""The Evidence the gates read: its counts, computed once from its pairs and drift, the A/A
control's beside them, and which kernels count as the same."""

import math

import pytest

from rig.scenario.gates_config import GatesConfig
from rig.verdict.compare import Pathology
from rig.verdict.evidence import Evidence, SideKernel, count
from tests.verdict.test_gates import drift, identical, pair


def test_count_sums_what_the_gates_need():
    sick = Pathology("candidate", "invalid_utf8", "x", candidate_only=True)
    pairs = [pair("a"), pair("b", "near_tie"), pair("c", "substantive", (sick,))]
    counts = count(pairs, [drift(0.2, maximum=0.5), drift(0.4, maximum=0.3)], 2.0)
    assert (counts.pairs, counts.identical, counts.near_tie, counts.substantive) == (3, 1, 1, 1)
    assert counts.pathologies == 1
    assert counts.prefix_cache_hits == 2.0
    assert counts.drift_mean == pytest.approx(0.3)
    assert counts.drift_max == pytest.approx(0.5)


def test_failed_replays_are_counted_not_averaged():
    counts = count(identical(1), [drift(0.1), drift(math.nan, error="down")])
    assert counts.drift_errors == 1 and counts.drift_mean == pytest.approx(0.1)
    assert math.isnan(count(identical(1), []).drift_mean)


def test_the_evidence_counts_its_pairs_once_and_the_aa_control_apart():
    evidence = Evidence(
        GatesConfig(),
        identical(2) + [pair("t", "near_tie")],
        {},
        [drift(0.02)],
        prefix_cache_hits=4.0,
        aa_pairs=identical(3),
    )
    assert evidence.counts is evidence.counts  # computed once, however many gates read it
    assert (evidence.counts.pairs, evidence.counts.near_tie) == (3, 1)
    assert evidence.counts.prefix_cache_hits == 4.0
    assert (evidence.aa_counts.pairs, evidence.aa_counts.identical) == (3, 3)
    assert math.isnan(evidence.aa_counts.drift_mean)  # the A/A control replayed nothing
    assert Evidence(GatesConfig(), [], {}).aa_counts is None


def test_one_kernel_name_from_two_sources_is_not_the_same_kernel():
    stock = SideKernel("reference", "vllm-triton", 12, source_sha256=("aaaa",))
    assert not stock.same_kernel_as(SideKernel("candidate", "vllm-triton", 3, source_sha256=("b",)))
    assert stock.same_kernel_as(SideKernel("candidate", "vllm-triton", 3, source_sha256=("aaaa",)))
    assert stock.same_kernel_as(SideKernel("candidate", "vllm-triton", 3))  # no source to tell
    assert not stock.same_kernel_as(SideKernel("candidate", "ns4", 3, source_sha256=("aaaa",)))
