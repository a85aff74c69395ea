"""A user's own kernel function: resolved by `module:function` or the `rig.kernels` entry point
group, refused with one line when it does not import or does not take FLA's contract, and run
behind vLLM's CPU op and CUDA call with the same numbers as the built-in kernel it wraps."""

import importlib.metadata
import subprocess
import sys

import pytest
import torch

from kernels.cases import CPU_SHAPE, random_inputs
from kernels.functions import (
    FlaFunctionCpuOp,
    KernelFunctionError,
    fla_contract_caller,
    load_function,
    run_fla_contract,
)
from kernels.ns_torch import NsCpuOp
from kernels.registry import UnknownKernelError, resolve_kernel
from kernels.runners import candidate_runner, run_cpu_op
from tests.kernels import my_kernel

REFERENCE = "tests.kernels.my_kernel:chunk_fwd"


def inputs(lengths=(5, 130, 64)):
    return random_inputs(list(lengths), CPU_SHAPE, torch.float32, seed=3)


def test_a_function_reference_resolves_without_importing_it():
    spec = resolve_kernel("nowhere.at_all:chunk_fwd")
    assert (spec.name, spec.function, spec.ns_rounds) == (
        "nowhere.at_all:chunk_fwd",
        "nowhere.at_all:chunk_fwd",
        None,
    )
    assert not spec.runs_vllm_kernel
    with pytest.raises(KernelFunctionError, match="module nowhere.at_all does not import"):
        spec.loaded_function()


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("tests.kernels.my_kernel:missing", "has no attribute missing"),
        ("tests.kernels.my_kernel:time", "is not callable"),
        ("tests.kernels.my_kernel:wrong_signature", r"wrong signature \(x, y\)"),
        ("tests.kernels.my_kernel:", "not a module:function"),
    ],
)
def test_bad_functions_are_refused_with_one_line(reference, message):
    with pytest.raises(KernelFunctionError, match=message) as caught:
        resolve_kernel(reference).loaded_function()
    assert "\n" not in str(caught.value)


def test_the_cpu_op_adapter_matches_the_builtin_kernel_it_wraps():
    batch = inputs()
    mine = run_cpu_op(resolve_kernel(REFERENCE).cpu_op(), batch)
    builtin = run_cpu_op(NsCpuOp(4), batch)
    for got, expected in zip(mine, builtin, strict=True):
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-3)


def test_the_wrapped_ns3_differs_from_ns4_as_the_builtins_do():
    batch = inputs()
    ns3 = run_cpu_op(resolve_kernel("tests.kernels.my_kernel:chunk_fwd_ns3").cpu_op(), batch)
    builtin = run_cpu_op(NsCpuOp(3), batch)
    torch.testing.assert_close(ns3[0], builtin[0], atol=2e-4, rtol=2e-3)


def test_the_cuda_call_passes_only_the_keywords_a_function_takes_and_fills_the_buffer():
    batch = inputs((70,))
    caller = resolve_kernel(REFERENCE).fla_contract_function()
    buffer = torch.zeros(1, 70, *batch.v.shape[1:])
    out, final_state = caller(
        batch.q.unsqueeze(0),
        batch.k.unsqueeze(0),
        batch.v.unsqueeze(0),
        batch.g.unsqueeze(0),
        batch.beta.unsqueeze(0),
        initial_state=batch.initial_state.transpose(-1, -2).contiguous(),
        output_final_state=True,
        cu_seqlens=batch.cu_seqlens.to(torch.int32),
        chunk_indices=torch.zeros(2, 2),
        chunk_offsets=torch.zeros(2),
        use_qk_l2norm_in_kernel=batch.use_qk_l2norm,
        core_attn_out=buffer,
    )
    torch.testing.assert_close(buffer, out.to(buffer.dtype))
    direct = run_fla_contract(fla_contract_caller(my_kernel.chunk_fwd), batch)
    torch.testing.assert_close(out[0], direct[0])
    assert final_state.shape == (1, *batch.initial_state.shape[1:])


def test_a_function_that_takes_core_attn_out_fills_it_itself():
    seen = {}

    def writes_its_buffer(q, k, v, g, beta, *, core_attn_out=None, **rest):
        seen["buffer"] = core_attn_out
        return torch.ones(3), None

    caller = fla_contract_caller(writes_its_buffer)
    buffer = torch.zeros(3)
    caller(1, 2, 3, 4, 5, initial_state=None, output_final_state=False, core_attn_out=buffer)
    assert seen["buffer"] is buffer and buffer.sum() == 0  # not copied over by the adapter


def test_the_kernel_check_runs_a_users_function():
    runner = candidate_runner(REFERENCE, "cpu")
    assert runner.name == REFERENCE
    out, state = runner.run(inputs((64,)))
    assert torch.isfinite(out).all() and torch.isfinite(state).all()


def test_the_proof_hashes_the_file_that_defines_the_function():
    spec = resolve_kernel(REFERENCE)
    assert spec.source_sha256("cpu") == spec.source_sha256("cuda")
    assert spec.source_sha256("cpu") != resolve_kernel("ns4").source_sha256("cpu")


def test_a_name_registered_under_rig_kernels_resolves(monkeypatch):
    entry = importlib.metadata.EntryPoint("mine", REFERENCE, "rig.kernels")
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group=None: [entry] if group == "rig.kernels" else [],
    )
    spec = resolve_kernel("mine")
    assert (spec.name, spec.function) == ("mine", REFERENCE)
    assert resolve_kernel("ns4").function is None  # a built-in name stays the built-in
    with pytest.raises(UnknownKernelError, match=r"rig.kernels \(here: mine\)"):
        resolve_kernel("theirs")


def test_load_function_reaches_a_dotted_attribute():
    assert load_function("kernels.functions:FlaFunctionCpuOp.__call__") is FlaFunctionCpuOp.__call__


def test_kernel_check_command_takes_a_function(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kernels.check", "--kernel", REFERENCE, "--cases", "correlated"]
        + ["--csv", str(tmp_path / "check.csv")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "0 gate failures" in done.stdout
    assert REFERENCE in (tmp_path / "check.csv").read_text()
    bad = subprocess.run(
        [sys.executable, "-m", "kernels.check", "--kernel", "tests.kernels.my_kernel:nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "has no attribute nope" in bad.stderr
