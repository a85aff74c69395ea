"""Kernel names: ns1..ns8, the planted delays, the planted initial-state faults and the batch
skew resolve, anything else fails naming the known kernels."""

import time
from dataclasses import replace

import pytest
import torch

from kernels.cases import CPU_SHAPE, random_inputs
from kernels.functions import run_fla_contract
from kernels.registry import (
    BATCH_SKEW,
    UnknownKernelError,
    known_kernel_names,
    planted_delay_ms,
    planted_initial_state,
    resolve_kernel,
    sha256_of_files,
)
from kernels.runners import run_cpu_op


@pytest.mark.parametrize("rounds", range(1, 9))
def test_ns_names_resolve_to_their_round_count(rounds):
    spec = resolve_kernel(f"ns{rounds}")
    assert (spec.name, spec.ns_rounds) == (f"ns{rounds}", rounds)
    assert spec.cpu_op().ns_rounds == rounds


@pytest.mark.parametrize(
    ("name", "rounds", "delay_ms"),
    [("ref+delay-40ms", None, 40.0), ("ns4+delay-2.5ms", 4, 2.5), ("ns4", 4, 0.0)],
)
def test_planted_delays_resolve_to_their_base_and_delay(name, rounds, delay_ms):
    spec = resolve_kernel(name)
    assert (spec.ns_rounds, spec.delay_ms) == (rounds, delay_ms)


def test_only_a_delay_on_vllms_own_kernel_plants_a_known_slowdown():
    assert planted_delay_ms("ref+delay-40ms") == 40.0
    assert planted_delay_ms("ns4+delay-40ms") == 0.0  # ns4 itself differs from the reference


def test_planted_delay_runs_the_base_op_and_then_sleeps():
    calls = []
    op = resolve_kernel("ref+delay-30ms").cpu_op(lambda *a: calls.append(a) or "out")
    started = time.perf_counter()
    assert op(1, 2) == "out" and calls == [(1, 2)]
    assert time.perf_counter() - started >= 0.030
    with pytest.raises(ValueError, match="vLLM's own kernel"):
        resolve_kernel("ref+delay-30ms").cpu_op()


class CudaTensor:
    is_cuda = True


def test_planted_delay_on_cuda_waits_for_the_gpu_before_sleeping(monkeypatch):
    """The op's launches return before its GPU work ends; the sleep must come after that work,
    so it adds to the GPU's timeline. CPU tensors: no synchronisation."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(time, "sleep", lambda seconds: events.append(seconds))
    op = resolve_kernel("ref+delay-30ms").delayed(lambda *a, **k: events.append("op") or "out")
    assert op(torch.ones(1)) == "out" and events == ["op", 0.030]
    events.clear()
    assert op(torch.ones(1), state=CudaTensor()) == "out" and events == ["op", "sync", 0.030]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_planted_delay_adds_to_the_gpu_timeline():
    from tests.kernels.test_prefill_counter import gpu_sleep_cycles

    cycles = gpu_sleep_cycles(60)
    op = resolve_kernel("ref+delay-40ms").delayed(lambda x: torch.cuda._sleep(cycles) or x)
    torch.cuda.synchronize()
    started = time.perf_counter()
    op(torch.ones(1, device="cuda"))
    torch.cuda.synchronize()
    assert time.perf_counter() - started >= 0.095  # 60 ms of GPU work, then 40 ms of sleep


def test_gpu_delays_resolve_and_refuse_the_cpu():
    spec = resolve_kernel("ref+gpu-delay-750us")
    assert (spec.ns_rounds, spec.delay_ms, spec.gpu_delay_us) == (None, 0.0, 750.0)
    assert spec.runs_vllm_kernel and spec.planted
    assert resolve_kernel("ns4+gpu-delay-20.5us").gpu_delay_us == 20.5
    with pytest.raises(UnknownKernelError, match="needs a CUDA GPU"):
        spec.cpu_op(lambda *args: None)
    with pytest.raises(UnknownKernelError):
        resolve_kernel("ref+gpu-delay-5ms")  # microseconds only


def test_a_gpu_delay_queues_a_spin_and_never_waits(monkeypatch):
    import kernels.registry as registry

    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(time, "sleep", lambda seconds: events.append(seconds))
    monkeypatch.setattr(registry, "spin_stream", lambda us: events.append(("spin", us)))
    op = resolve_kernel("ref+gpu-delay-300us").delayed(lambda *a, **k: events.append("op") or 1)
    assert op(CudaTensor()) == 1 and events == ["op", ("spin", 300.0)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_delay_adds_to_the_gpu_timeline_and_not_to_the_host():
    op = resolve_kernel("ref+gpu-delay-2000us").delayed(lambda x: x)
    x = torch.ones(1, device="cuda")
    op(x)  # calibrates the spin rate once
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(5):
        op(x)
    end.record()
    host = time.perf_counter() - host
    end.synchronize()
    device_ms = start.elapsed_time(end)
    assert 9.0 <= device_ms <= 11.0, device_ms  # 5 x 2 ms on the stream
    assert host < 0.005, host  # queued, never waited for


def test_a_delay_changes_the_source_hash_the_proof_names():
    assert resolve_kernel("ns4+delay-5ms").source_sha256("cpu") != resolve_kernel(
        "ns4"
    ).source_sha256("cpu")


def test_other_names_have_no_planted_delay():
    assert planted_delay_ms("fastest") == planted_delay_ms(None) == 0.0


@pytest.mark.parametrize(
    "name", ["ns0", "ns9", "ns04", "fla", "NS4", "", "ref", "ref+delay-ms", "ns9+delay-5ms"]
)
def test_unknown_names_list_the_known_kernels(name):
    with pytest.raises(UnknownKernelError) as error:
        resolve_kernel(name)
    message = str(error.value)
    assert repr(name) in message
    assert all(known in message for known in known_kernel_names())


def test_source_hash_follows_file_contents(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text("x = 1\n")
    second.write_text("y = 2\n")
    before = sha256_of_files([first, second])
    assert before == sha256_of_files([first, second])
    second.write_text("y = 3\n")
    assert sha256_of_files([first, second]) != before


def test_cpu_and_cuda_sources_hash_differently():
    spec = resolve_kernel("ns4")
    assert spec.source_sha256("cpu") != spec.source_sha256("cuda")
    assert len(spec.source_sha256("cpu")) == 64


@pytest.mark.parametrize(
    ("name", "fault", "delay_ms"),
    [("ns4+drop-state", "drop", 0.0), ("ns3+bf16-state", "bf16", 0.0), ("ns4", None, 0.0)]
    + [("ns4+drop-state+delay-5ms", "drop", 5.0)],
)
def test_planted_state_faults_resolve_on_an_ns_base(name, fault, delay_ms):
    spec = resolve_kernel(name)
    assert (spec.state_fault, spec.delay_ms, spec.ns_rounds is not None) == (fault, delay_ms, True)


@pytest.mark.parametrize("name", ["ref+drop-state", "ns4+fp8-state", "ns4+delay-5ms+drop-state"])
def test_state_faults_need_an_ns_base_and_a_known_fault(name):
    with pytest.raises(UnknownKernelError, match="drop-state"):
        resolve_kernel(name)


def test_planted_state_faults_change_only_what_the_kernel_starts_from():
    """drop-state from a state = ns4 from zero; bf16-state = ns4 from the state rounded to
    BF16; from a zero state both are ns4. The CPU op and the FLA contract agree."""
    inputs = random_inputs([100, 30], CPU_SHAPE, torch.float32, seed=4)
    zero = replace(inputs, initial_state=torch.zeros_like(inputs.initial_state))
    rounded = inputs.with_state_dtype(torch.bfloat16).with_state_dtype(torch.float32)
    ns4 = resolve_kernel("ns4")
    for name, same_as in (("ns4+drop-state", zero), ("ns4+bf16-state", rounded)):
        spec = resolve_kernel(name)
        for run in (
            lambda s, x: run_cpu_op(s.cpu_op(), x),
            lambda s, x: run_fla_contract(s.fla_contract_function(), x),
        ):
            assert all(map(torch.equal, run(spec, inputs), run(ns4, same_as)))
            assert all(map(torch.equal, run(spec, zero), run(ns4, zero)))
    assert planted_initial_state(inputs.initial_state, "drop").count_nonzero() == 0


def test_a_state_fault_changes_the_source_hash_the_proof_names():
    for platform in ("cpu", "cuda"):
        assert resolve_kernel("ns4+drop-state").source_sha256(platform) != resolve_kernel(
            "ns4"
        ).source_sha256(platform)


@pytest.mark.parametrize("name", ["ns4+batch-skew", "ns3+drop-state+batch-skew+delay-2ms"])
def test_the_batch_skew_resolves_on_an_ns_base(name):
    assert resolve_kernel(name).batch_skew and resolve_kernel(name).ns_rounds is not None
    with pytest.raises(UnknownKernelError, match="batch-skew"):
        resolve_kernel("ref+batch-skew")


def test_the_batch_skew_leaves_a_calls_first_sequence_alone_and_scales_the_others():
    """One sequence: ns4 exactly. Two in one call: the first as ns4, the second's output scaled
    by BATCH_SKEW, the states untouched. The CPU op and the FLA contract agree."""
    alone = random_inputs([100], CPU_SHAPE, torch.float32, seed=5)
    pair = random_inputs([100, 30], CPU_SHAPE, torch.float32, seed=5)
    ns4, skew = resolve_kernel("ns4"), resolve_kernel("ns4+batch-skew")
    for run in (
        lambda s, x: run_cpu_op(s.cpu_op(), x),
        lambda s, x: run_fla_contract(s.fla_contract_function(), x),
    ):
        assert all(map(torch.equal, run(skew, alone), run(ns4, alone)))
        (out, state), (ns4_out, ns4_state) = run(skew, pair), run(ns4, pair)
        assert torch.equal(out[:100], ns4_out[:100]) and torch.equal(state, ns4_state)
        assert torch.allclose(out[100:], ns4_out[100:] * BATCH_SKEW)
        assert not torch.equal(out[100:], ns4_out[100:])
