"""The plugin's evidence on /metrics: the stats-file collector (vLLM's default registry) and the
multiprocess gauges (PROMETHEUS_MULTIPROC_DIR), read back as the rig reads /metrics
(rig.load.server_metrics) into the proof and the plugin's counters."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from kernels.proof import (
    PLUGIN_METRICS,
    PluginCounters,
    PrefillStats,
    plugin_counters,
    stats_file_name,
)
from kernels.proof_metrics import StatsCollector
from rig.load.server_metrics import kernel_proof_from_metrics, metric_samples

REPO = Path(__file__).resolve().parents[2]
SHA = "c" * 64


def read_plugin_counters(metrics_text: str) -> PluginCounters | None:
    return plugin_counters(metric_samples(metrics_text, PLUGIN_METRICS))


def write(stats_dir: Path, record: PrefillStats) -> None:
    (stats_dir / stats_file_name(record.pid)).write_text(record.to_json())


def scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_collector_serves_this_servers_stats_files(tmp_path):
    write(tmp_path, PrefillStats("ns4", SHA, 0, 101, "cpu", server="s1"))  # API server
    write(tmp_path, PrefillStats("ns4", SHA, 0, 102, "cpu", server="s1"))  # engine core
    write(tmp_path, PrefillStats("ns4", SHA, 9, 103, "cpu", "cpu-native", "triton", "s1"))
    write(tmp_path, PrefillStats("vllm-cpu-native", "d" * 64, 5, 104, "cpu", server="s0"))
    registry = CollectorRegistry()
    registry.register(StatsCollector(tmp_path, "s1"))

    proof = kernel_proof_from_metrics(scrape(registry))
    assert proof.kernel == "ns4" and proof.calls == 9 and proof.pids == (103,)
    assert proof.loaded_pids == (101, 102, 103) and proof.source_sha256 == (SHA,)
    assert proof.vllm_backends == ("cpu-native",) and proof.requested_backend == "triton"

    write(tmp_path, PrefillStats("ns4", SHA, 11, 103, "cpu", "cpu-native", "triton", "s1"))
    assert kernel_proof_from_metrics(scrape(registry)).calls == 11  # read at scrape time


def test_collector_serves_time_and_compilations(tmp_path):
    write(tmp_path, PrefillStats("ns4", SHA, 0, 101, "cpu", server="s1", compiles=1))
    worker = PrefillStats("ns4", SHA, 9, 103, "cpu", server="s1", seconds=0.5, timed_calls=8)
    write(tmp_path, replace(worker, compiles=3))
    registry = CollectorRegistry()
    registry.register(StatsCollector(tmp_path, "s1"))

    text = scrape(registry)
    labels = f'kernel="ns4",pid="103",source_sha256="{SHA}"'
    assert f"rig_gdn_prefill_seconds{{{labels}}} 0.5" in text
    assert f"rig_gdn_prefill_timed_calls{{{labels}}} 8.0" in text
    assert 'rig_jit_compiles{pid="101"} 1.0' in text and 'rig_jit_compiles{pid="103"} 3.0' in text
    assert read_plugin_counters(text) == PluginCounters(
        calls=9, timed_calls=8, seconds=0.5, compiles=4
    )


def test_collector_with_no_stats_yet(tmp_path):
    registry = CollectorRegistry()
    registry.register(StatsCollector(tmp_path / "missing", "s1"))
    proof = kernel_proof_from_metrics(scrape(registry))
    assert proof.marker_kernels == () and proof.calls == 0


WORKER = """
import os, sys
from kernels.proof import PrefillStats
from kernels.proof_metrics import multiprocess_gauges_from_env

gauges = multiprocess_gauges_from_env()
record = PrefillStats("vllm-cuda-reference", "c" * 64, 1, os.getpid(), "cuda", compiles=2,
                      seconds=0.125, timed_calls=1)
gauges.publish(record)  # loaded (and, unlike vLLM, run once)
record = PrefillStats("vllm-triton", "c" * 64, 1, os.getpid(), "cuda", "triton", "triton",
                      compiles=2, seconds=0.125, timed_calls=1)
gauges.publish(record)  # the GDN op was built
gauges.publish(PrefillStats(**{**record.__dict__, "calls": 3, "seconds": 0.25, "compiles": 5}))
print(os.getpid())
"""


def test_multiprocess_gauges_reach_vllms_multiprocess_registry(tmp_path):
    """Like a vLLM worker started with PROMETHEUS_MULTIPROC_DIR set, scraped by an API server
    whose /metrics registry is a MultiProcessCollector over that folder."""
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    worker = subprocess.run(
        [sys.executable, "-c", WORKER], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert worker.returncode == 0, worker.stderr
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))

    proof = kernel_proof_from_metrics(scrape(registry))
    pid = int(worker.stdout)
    assert proof.loaded_pids == (pid,) and proof.pids == (pid,)
    assert proof.marker_kernels == ("vllm-triton",) and proof.backend == "vllm-triton"
    assert proof.calls == 3 and proof.platforms == ("cuda",)
    assert proof.reference_backend_problem("triton") is None
    text = scrape(registry)  # the superseded label set is 0 in every kernel-labelled family
    reference = f'kernel="vllm-cuda-reference",pid="{pid}",source_sha256="{SHA}"'
    assert f"rig_gdn_prefill_seconds{{{reference}}} 0.0" in text
    assert f"rig_gdn_prefill_timed_calls{{{reference}}} 0.0" in text
    assert f'rig_jit_compiles{{pid="{pid}"}} 5.0' in text
    assert read_plugin_counters(text) == PluginCounters(
        calls=3, timed_calls=1, seconds=0.25, compiles=5
    )


def test_collector_serves_the_initial_state_tally_and_the_proof_sums_it(tmp_path):
    tally = dict(
        initial_state_calls=3,
        initial_state_sequences=4,
        initial_state_tokens=500,
        initial_state_all_sequences=9,
        initial_state_all_tokens=800,
    )
    write(tmp_path, PrefillStats("ns4", SHA, 0, 101, "cpu", server="s1"))
    write(tmp_path, PrefillStats("ns4", SHA, 9, 103, "cpu", server="s1", **tally))
    write(tmp_path, PrefillStats("ns4", SHA, 2, 104, "cpu", server="s1", initial_state_calls=1))
    registry = CollectorRegistry()
    registry.register(StatsCollector(tmp_path, "s1"))
    text = scrape(registry)
    assert 'rig_gdn_initial_state_sequences{kernel="ns4",pid="103"' in text.replace(
        f',source_sha256="{SHA}"', ""
    )
    counts = kernel_proof_from_metrics(text).initial_state
    assert (counts.calls, counts.sequences, counts.tokens) == (4, 4, 500)
    assert (counts.all_sequences, counts.all_tokens) == (9, 800)
    assert "4 of 9 prefilled sequences started from a non-zero state" in (
        kernel_proof_from_metrics(text).describe()
    )
