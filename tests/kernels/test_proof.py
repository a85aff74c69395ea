"""Reading back which kernel a server ran from its log and stats folder, or its /metrics
(parsed by rig.load.server_metrics, the one parser of /metrics)."""

import json

import pytest

from kernels.proof import (
    CALLS_METRIC,
    COMPILES_METRIC,
    INFO_METRIC,
    PLUGIN_METRICS,
    SECONDS_METRIC,
    TIMED_CALLS_METRIC,
    InitialStateCounts,
    PluginCounters,
    PrefillStats,
    format_marker,
    plugin_counters,
    read_kernel_proof,
    stats_file_name,
)
from rig.load.server_metrics import kernel_proof_from_metrics, metric_samples

SHA_A = "a" * 64
SHA_B = "b" * 64


def read_plugin_counters(metrics_text: str) -> PluginCounters | None:
    return plugin_counters(metric_samples(metrics_text, PLUGIN_METRICS))


def write_stats(folder, pid, kernel, calls, sha=SHA_A, server=""):
    record = {"kernel": kernel, "source_sha256": sha, "calls": calls, "pid": pid, "server": server}
    (folder / stats_file_name(pid)).write_text(json.dumps(record))


def test_markers_and_stats_of_this_server_count(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "\n".join(
            [
                "(APIServer pid=10) INFO starting",
                format_marker("ns4", SHA_A, 10, "cpu"),
                format_marker("ns4", SHA_A, 11, "cpu"),
                format_marker("ns4", SHA_A, 12, "cpu"),
                "(Worker pid=12) INFO 11-29 [qwen_gdn_linear_attn.py:206] "
                "Using CPU GDN prefill kernel (head_k_dim=128).",
            ]
        )
    )
    stats = tmp_path / "stats"
    stats.mkdir()
    write_stats(stats, 12, "ns4", 8)
    write_stats(stats, 11, "ns4", 0)  # loaded, never ran prefill
    write_stats(stats, 99, "vllm-cpu-native", 5, SHA_B)  # another server's process
    (stats / stats_file_name(13)).write_text("{not json")

    proof = read_kernel_proof(log, stats)
    assert proof.marker_kernels == ("ns4",)
    assert proof.executed_kernels == ("ns4",)
    assert proof.kernel == "ns4"
    assert proof.calls == proof.prefill_calls == 8
    assert proof.pids == (12,)
    assert proof.source_sha256 == (SHA_A,)
    assert proof.vllm_backend_line.startswith("Using CPU GDN prefill kernel")
    assert "8 GDN prefill calls" in proof.describe()


def test_a_silent_process_of_the_same_server_counts_and_another_servers_does_not(tmp_path):
    """vLLM runs some processes with their stderr captured (its model-registry inspection
    subprocess loads plugins): no marker in the log, but a stats file with this server's id."""
    log = tmp_path / "server.log"
    log.write_text("\n".join(format_marker("ns4", SHA_A, pid, "cuda") for pid in (10, 12)))
    stats = tmp_path / "stats"
    stats.mkdir()
    write_stats(stats, 10, "ns4", 0, server="s1")
    write_stats(stats, 12, "ns4", 6, server="s1")
    write_stats(stats, 11, "ns4", 0, server="s1")  # silent: stderr captured
    write_stats(stats, 40, "ns4", 9, server="s2")  # another server in the same folder
    proof = read_kernel_proof(log, stats)
    assert proof.loaded_pids == (10, 12, 11)
    assert proof.calls == 6 and proof.pids == (12,)


def test_installed_but_never_ran(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(format_marker("vllm-cpu-native", SHA_B, 7, "cpu") + "\n")
    proof = read_kernel_proof(log, tmp_path / "missing-stats")
    assert proof.kernel == "vllm-cpu-native"
    assert proof.calls == 0 and proof.pids == () and proof.vllm_backend_line is None


def test_no_plugin_no_proof(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("Using CPU GDN prefill kernel (head_k_dim=128).\n")
    stats = tmp_path / "stats"
    stats.mkdir()
    write_stats(stats, 5, "ns4", 3)
    proof = read_kernel_proof(log, stats)
    assert proof.kernel == "unknown" and proof.calls == 0
    assert "not loaded" in proof.describe()
    assert read_kernel_proof(tmp_path / "no.log", stats).marker_kernels == ()


def test_stats_name_vllms_backend_choice_in_the_log_proof(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "\n".join(
            [
                format_marker("vllm-cuda-reference", SHA_A, 20, "cuda"),
                format_marker("vllm-cuda-reference", SHA_A, 21, "cuda"),
                format_marker("vllm-flashinfer", SHA_A, 21, "cuda"),  # the op was built
            ]
        )
    )
    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / stats_file_name(21)).write_text(
        PrefillStats("vllm-flashinfer", SHA_A, 12, 21, "cuda", "flashinfer", "auto").to_json()
    )
    proof = read_kernel_proof(log, stats)
    assert proof.backend == "vllm-flashinfer" and proof.calls == 12
    assert proof.vllm_backends == ("flashinfer",) and proof.requested_backend == "auto"
    assert proof.platforms == ("cuda",) and proof.loaded_pids == (20, 21)
    assert "vLLM chose flashinfer (requested auto)" in proof.describe()
    assert "ran vllm-flashinfer" in proof.reference_backend_problem("triton")


def info_line(pid, kernel, backend="", requested="", platform="cpu", sha=SHA_A, value=1):
    labels = (
        f'backend="{backend}",kernel="{kernel}",pid="{pid}",platform="{platform}",'
        f'requested_backend="{requested}",source_sha256="{sha}"'
    )
    return f"{INFO_METRIC}{{{labels}}} {float(value)}"


def calls_line(pid, kernel, calls, sha=SHA_A):
    return f'{CALLS_METRIC}{{kernel="{kernel}",pid="{pid}",source_sha256="{sha}"}} {float(calls)}'


VLLM_METRICS = """# HELP vllm:prefix_cache_hits_total Prefix cache hits
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0
"""


def test_metrics_proof_of_a_candidate():
    text = "\n".join(
        [
            VLLM_METRICS,
            f"# TYPE {INFO_METRIC} gauge",
            info_line(31, "ns4"),
            info_line(30, "ns4"),
            info_line(32, "ns4", backend="", requested=""),
            info_line(32, "ns4", backend="cpu-native", requested="triton"),
            info_line(32, "ns4", backend="stale", value=0),  # superseded label set
            calls_line(30, "ns4", 0),
            calls_line(31, "ns4", 0),
            calls_line(32, "ns4", 6),
        ]
    )
    proof = kernel_proof_from_metrics(text)
    assert proof.origin == "metrics"
    assert proof.kernel == proof.backend == "ns4" and proof.calls == 6
    assert proof.pids == (32,) and proof.loaded_pids == (30, 31, 32)
    assert proof.source_sha256 == (SHA_A,)
    assert proof.vllm_backends == ("cpu-native",) and proof.requested_backend == "triton"
    assert proof.platforms == ("cpu",) and proof.vllm_backend_line is None
    assert "ran ns4" in proof.reference_backend_problem("triton")


def test_a_restarted_servers_proofs_add_up():
    def started(pid: int, calls: int):
        lines = [f"# TYPE {INFO_METRIC} gauge", info_line(pid, "ns4", backend="cpu-native")]
        return kernel_proof_from_metrics("\n".join([*lines, calls_line(pid, "ns4", calls)]))

    both = started(40, 6).combined_with(started(50, 8))
    assert both.calls == 14 and both.pids == (40, 50) and both.loaded_pids == (40, 50)
    assert both.kernel == "ns4" and both.vllm_backends == ("cpu-native",)
    assert both.origin == "metrics"


def test_metrics_tell_not_loaded_from_never_called():
    not_loaded = kernel_proof_from_metrics(VLLM_METRICS)
    assert not_loaded.kernel == "unknown" and not_loaded.marker_kernels == ()
    assert "not loaded" in not_loaded.describe() and "/metrics" in not_loaded.describe()

    idle = kernel_proof_from_metrics(
        "\n".join([info_line(40, "vllm-cpu-native"), calls_line(40, "vllm-cpu-native", 0)])
    )
    assert idle.marker_kernels == ("vllm-cpu-native",) and idle.loaded_pids == (40,)
    assert idle.calls == 0 and idle.backend == "none" and idle.pids == ()
    assert "no process ran GDN prefill" in idle.reference_backend_problem("triton")


def kernel_line(metric, pid, kernel, value, sha=SHA_A):
    return f'{metric}{{kernel="{kernel}",pid="{pid}",source_sha256="{sha}"}} {float(value)}'


def test_plugin_counters_add_up_over_processes():
    text = "\n".join(
        [
            VLLM_METRICS,
            info_line(30, "vllm-cuda-reference"),  # engine core
            info_line(31, "vllm-cuda-reference", value=0),  # worker: superseded
            info_line(31, "vllm-triton", backend="triton", requested="auto"),
            calls_line(30, "vllm-cuda-reference", 0),
            calls_line(31, "vllm-cuda-reference", 0),
            calls_line(31, "vllm-triton", 12),
            kernel_line(TIMED_CALLS_METRIC, 31, "vllm-cuda-reference", 0),
            kernel_line(TIMED_CALLS_METRIC, 31, "vllm-triton", 11),
            kernel_line(SECONDS_METRIC, 31, "vllm-cuda-reference", 0),
            kernel_line(SECONDS_METRIC, 31, "vllm-triton", 0.375),
            f'{COMPILES_METRIC}{{pid="30"}} 2.0',
            f'{COMPILES_METRIC}{{pid="31"}} 40.0',
        ]
    )
    assert read_plugin_counters(text) == PluginCounters(
        calls=12, timed_calls=11, seconds=0.375, compiles=42
    )


def test_no_plugin_evidence_no_counters():
    assert read_plugin_counters(VLLM_METRICS) is None
    superseded_only = "\n".join([info_line(30, "ns4", value=0), calls_line(30, "ns4", 5)])
    assert read_plugin_counters(superseded_only) is None


@pytest.mark.parametrize(
    ("executed", "platform", "vllm_backend", "requested", "problem"),
    [
        ("vllm-triton", "cuda", "triton", "triton", None),
        ("vllm-cpu-native", "cpu", "cpu-native", "triton", None),  # the CPU build ignores it
        ("vllm-flashinfer", "cuda", "flashinfer", "auto", None),
        (
            "vllm-triton",
            "cuda",
            "triton",
            "cutedsl",
            "cutedsl was requested, but it ran vllm-triton",
        ),
        ("ns4", "cuda", "triton", "triton", "ran ns4"),
        ("ns4", "cuda", "flashinfer", "auto", "ran ns4"),
    ],
)
def test_reference_backend_problem(executed, platform, vllm_backend, requested, problem):
    text = "\n".join(
        [
            info_line(50, executed, vllm_backend, requested, platform),
            calls_line(50, executed, 4),
        ]
    )
    found = kernel_proof_from_metrics(text).reference_backend_problem(requested)
    assert found == problem if problem is None else problem in found


def test_the_initial_state_counts_of_a_log_proof_and_of_a_restarted_server_add_up(tmp_path):
    stats = tmp_path / "stats"
    stats.mkdir()
    log = tmp_path / "server.log"
    log.write_text(format_marker("ns4", SHA_A, 60, "cpu") + "\n")
    record = PrefillStats(
        "ns4", SHA_A, 5, 60, "cpu", initial_state_calls=2, initial_state_sequences=3,
        initial_state_tokens=90, initial_state_all_sequences=6, initial_state_all_tokens=200,
    )  # fmt: skip
    (stats / stats_file_name(60)).write_text(record.to_json())
    proof = read_kernel_proof(log, stats)
    assert proof.initial_state == InitialStateCounts(2, 3, 90, 6, 200)
    assert proof.combined_with(proof).initial_state == InitialStateCounts(4, 6, 180, 12, 400)
