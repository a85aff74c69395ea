"""The bench's arithmetic and lookups (it only runs on a GPU): byte floors, the per-workload
summary, and where it finds vLLM's copy of FLA."""

import math
import sys
import types
from dataclasses import asdict

import pandas as pd
import pytest

from kernels.bench import (
    QWEN35_SHAPE,
    VLLM_FLA_MODULES,
    WORKLOADS,
    Timing,
    floor_bytes,
    graph_time_us,
    reference_kernels,
    staged_floor_bytes,
    summary,
)


@pytest.mark.parametrize(
    ("workload", "floor_us"), [("2k", 11), ("8k", 40), ("16k", 80), ("64x128", 102)]
)
def test_floor_is_the_issue_s_at_4_3_tb_per_s(workload, floor_us):
    assert 1e6 * floor_bytes(WORKLOADS[workload], QWEN35_SHAPE) / 4.3e12 == pytest.approx(
        floor_us, rel=0.03
    )


def test_staged_floor_counts_the_intermediates_between_launches():
    """8K: q, k, v, g, beta into the WY launch; w, u and 128 chunks of 32 P tiles of 64 x 64
    BF16 with their row scales out of it and back into the walk, which reads q and k again and
    writes o and the state (547 MB)."""
    lengths = WORKLOADS["8k"]
    staged = staged_floor_bytes(lengths, QWEN35_SHAPE)
    assert staged / 1e6 == pytest.approx(547, rel=0.01)
    assert staged > 3 * floor_bytes(lengths, QWEN35_SHAPE)
    intermediates = 2 * (2 * 8192 * 32 * 128 * 2 + 128 * 32 * 64 * 64 * 2 + 128 * 32 * 129 * 4)
    q_and_k = 2 * 8192 * 8 * 128 * 2
    assert staged - intermediates == floor_bytes(lengths, QWEN35_SHAPE) + q_and_k


def test_summary_compares_the_default_and_names_the_best_variant():
    rows = [
        ("fla", "-", 700.0),
        ("ns4", "default", 350.0),
        ("ns4", "walk-bv64", 280.0),
        ("ns3", "default", 340.0),
        ("ns4:wy", "default", 60.0),
        ("ns4:walk", "default", 200.0),
    ]
    graphed = {("fla", "-"): 500.0, ("ns4", "default"): 340.0}

    def timing(kernel: str, variant: str, us: float) -> dict:
        graph = graphed.get((kernel, variant), float("nan"))
        return asdict(Timing("8k", kernel, variant, us, us, us, 40.0, 700 / us, graph, 200.0))

    frame = pd.DataFrame(timing(*row) for row in rows)
    row = summary(frame).iloc[0]
    assert row["fla/ns4"] == pytest.approx(2.0)
    assert row.fla_graph_us == 500.0 and row.ns4_graph_us == 340.0
    assert row["fla_graph/staged_floor"] == pytest.approx(2.5)
    assert row["fla/ns4_graph"] == pytest.approx(500 / 340)
    assert row.best_variant == "walk-bv64" and row.best_us == 280.0
    assert row["ns4/ns3"] == pytest.approx(350 / 340)
    assert row["wy/walk_us"] == "60/200"


def test_graph_time_is_nan_with_the_reason_when_capture_fails(capsys, monkeypatch):
    """A call that cannot be captured (here: one that syncs with the host) costs its row's
    graph time, not the bench."""
    import triton.testing

    def host_sync():
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", lambda function, **_: function())
    assert math.isnan(graph_time_us(host_sync))
    assert "graph capture failed: RuntimeError: operation not permitted" in capsys.readouterr().out
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", lambda function, **_: 0.25)
    assert graph_time_us(host_sync) == 250.0


@pytest.mark.parametrize("module", VLLM_FLA_MODULES)
def test_vllm_s_fla_copy_is_found_where_each_version_keeps_it(module, monkeypatch):
    """vLLM 0.26+ keeps FLA under third_party, 0.20-0.25 under layers/fla."""

    def chunk_gated_delta_rule():
        return None

    for name in VLLM_FLA_MODULES:
        monkeypatch.setitem(sys.modules, name, None)  # None: ImportError on import
    monkeypatch.setitem(
        sys.modules, module, types.SimpleNamespace(chunk_gated_delta_rule=chunk_gated_delta_rule)
    )
    assert reference_kernels()["vllm-fla"] is chunk_gated_delta_rule


def test_a_missing_vllm_fla_copy_says_where_it_was_looked_for(monkeypatch):
    for name in VLLM_FLA_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    found = reference_kernels()["vllm-fla"]
    assert isinstance(found, str) and all(name in found for name in VLLM_FLA_MODULES)
