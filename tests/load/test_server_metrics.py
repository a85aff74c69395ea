"""A server's own word, read untimed: /metrics parsed (vLLM's prefix-cache counters summed over
label sets, the plugin's proof), one client for /metrics and /version, an API key sent."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from pydantic import SecretStr

from kernels.proof import CALLS_METRIC, INFO_METRIC
from rig.load.server_metrics import (
    MetricsUnreadable,
    fetch_kernel_proof,
    kernel_proof_from_metrics,
    metric_samples,
    parse_server_counters,
    read_server_counters,
    served_version,
)
from rig.records import RequestSpec
from rig.stub.server import StubConfig, serve_in_thread
from tests.aiohttp_thread import serve_app_in_thread
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


def test_missing_counters_are_the_servers_fault_not_the_rigs():
    with pytest.raises(MetricsUnreadable, match="prefix_cache_hits_total"):
        parse_server_counters(VLLM_METRICS.replace("hits", "misses"))


def test_counters_read_from_the_stub_show_a_repeated_unsalted_prompt():
    with serve_in_thread(StubConfig(ttft_s=0, itl_s=0, output_tokens=1, engines=2)) as stub:
        before = asyncio.run(read_server_counters(stub.url))
        one_side(stub, [spec(0)])
        one_side(stub, [RequestSpec(**{**spec(0).__dict__, "request_id": "again"})])
        after = asyncio.run(read_server_counters(stub.url))
    assert (before.queries, before.hits) == (0.0, 0.0)
    assert after.queries == 6.0 and after.hits == 3.0  # same salt and prompt: a hit


def test_label_values_are_unescaped_and_order_free():
    line = f'{CALLS_METRIC}{{source_sha256="{"b" * 64}",pid="7",kernel="ns\\"4\\\\x"}} 3 1700000000'
    (sample,) = metric_samples(line + "\nnot a sample\n", {CALLS_METRIC})
    assert sample.labels == {"source_sha256": "b" * 64, "pid": "7", "kernel": 'ns"4\\x'}
    assert sample.value == 3.0  # the timestamp is not the value
    proof = kernel_proof_from_metrics(line)
    assert proof.executed_kernels == ('ns"4\\x',) and proof.calls == 3 and proof.pids == (7,)


PLUGIN_METRICS_TEXT = "\n".join(
    [
        VLLM_METRICS,
        f'{INFO_METRIC}{{kernel="ns4",source_sha256="{"a" * 64}",platform="cpu",pid="30"}} 1.0',
        f'{CALLS_METRIC}{{kernel="ns4",source_sha256="{"a" * 64}",pid="30"}} 6.0',
    ]
)


@pytest.fixture
def keyed_server():
    """A server that asks for `Bearer sk-test` on /metrics and /version, as vLLM's --api-key
    does, in a thread of its own; yields its base URL."""

    def guarded(answer):
        async def handler(request: web.Request) -> web.Response:
            if request.headers.get("Authorization") != "Bearer sk-test":
                return web.Response(status=401, text="unauthorized")
            return answer()

        return handler

    app = web.Application()
    app.router.add_get("/metrics", guarded(lambda: web.Response(text=PLUGIN_METRICS_TEXT)))
    app.router.add_get("/version", guarded(lambda: web.json_response({"version": "0.32.0"})))
    with serve_app_in_thread(app) as base_url:
        yield base_url


def test_the_proof_and_version_are_read_with_the_servers_api_key(keyed_server):
    key = SecretStr("sk-test")
    proof = fetch_kernel_proof(keyed_server, key)
    assert proof.kernel == "ns4" and proof.calls == 6 and proof.origin == "metrics"
    assert served_version(keyed_server, key) == "0.32.0"
    counters = asyncio.run(read_server_counters(keyed_server, key))
    assert (counters.queries, counters.gdn_prefill_calls) == (1500.0, 6)
    with pytest.raises(MetricsUnreadable, match="401"):
        fetch_kernel_proof(keyed_server, SecretStr("wrong"))
    assert served_version(keyed_server) is None


def test_a_server_that_does_not_answer_is_unreadable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening
        with pytest.raises(MetricsUnreadable, match="/metrics"):
            fetch_kernel_proof(url)
        assert served_version(url) is None


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e400"])
def test_a_counter_that_is_not_a_finite_number_is_left_out(value):
    from kernels.proof import CALLS_METRIC, INFO_METRIC

    plugin = (
        f'{INFO_METRIC}{{pid="1",kernel="k"}} 1\n{CALLS_METRIC}{{pid="1",kernel="k"}} {value}\n'
    )
    text = VLLM_METRICS + plugin
    assert parse_server_counters(text).gdn_prefill_calls == 0
    assert kernel_proof_from_metrics(text).calls == 0


@pytest.mark.parametrize("separator", ["\x1e", "\x85", "\u2028", "\x0c"])
def test_a_line_separator_inside_a_label_value_keeps_the_sample(separator):
    text = f'vllm:prefix_cache_hits_total{{model="a{separator}b"}} 3\n'
    (sample,) = metric_samples(text, {"vllm:prefix_cache_hits_total"})
    assert sample.labels == {"model": f"a{separator}b"} and sample.value == 3
