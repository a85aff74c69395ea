"""Reading back which kernel a server ran from its log and stats folder."""

import json

from kernels.proof import format_marker, read_kernel_proof, stats_file_name

SHA_A = "a" * 64
SHA_B = "b" * 64


def write_stats(folder, pid, kernel, calls, sha=SHA_A):
    record = {"kernel": kernel, "source_sha256": sha, "calls": calls, "pid": pid}
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
