"""vLLM's prefix-cache counters: parsed from /metrics, summed over label sets."""

from __future__ import annotations

import asyncio

import pytest

from rig.load.server_metrics import parse_server_counters, read_server_counters
from rig.records import RequestSpec
from rig.stub.server import StubConfig, serve_in_thread
from tests.stub_requests import one_side, spec

VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 300.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0
"""


def test_counters_are_summed_over_label_sets():
    counters = parse_server_counters(VLLM_METRICS)
    assert (counters.queries, counters.hits) == (1500.0, 640.0)


def test_gdn_prefill_calls_come_from_the_rig_plugins_evidence(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from kernels.proof import PrefillStats, stats_file_name
    from kernels.proof_metrics import StatsCollector

    assert parse_server_counters(VLLM_METRICS).gdn_prefill_calls is None
    for pid, calls in ((101, 0), (102, 7)):  # API server, engine core
        record = PrefillStats("ref+delay-40ms", "c" * 64, calls, pid, "cpu", server="s1")
        (tmp_path / stats_file_name(pid)).write_text(record.to_json())
    registry = CollectorRegistry()
    registry.register(StatsCollector(tmp_path, "s1"))
    text = VLLM_METRICS + generate_latest(registry).decode()
    assert parse_server_counters(text).gdn_prefill_calls == 7


def test_missing_counters_are_an_error():
    with pytest.raises(ValueError, match="prefix_cache_hits_total"):
        parse_server_counters(VLLM_METRICS.replace("hits", "misses"))


def test_counters_read_from_the_stub_show_a_repeated_unsalted_prompt():
    with serve_in_thread(StubConfig(ttft_s=0, itl_s=0, output_tokens=1, engines=2)) as stub:
        before = asyncio.run(read_server_counters(stub.url))
        one_side(stub, [spec(0)])
        one_side(stub, [RequestSpec(**{**spec(0).__dict__, "request_id": "again"})])
        after = asyncio.run(read_server_counters(stub.url))
    assert (before.queries, before.hits) == (0.0, 0.0)
    assert after.queries == 6.0 and after.hits == 3.0  # same salt and prompt: a hit
