"""JIT compilations counted in the process the plugin loaded in: torch.compile through dynamo's
on_compile_end, Triton through its post-compile hook chained with the one set before. No GPU
needed: the Triton hook is called here as Triton calls it after a compilation."""

import sys

import pytest
import torch
from torch._dynamo.callback import callback_handler

from kernels import compile_counter
from kernels.compile_counter import count_compilations
from kernels.prefill_counter import PrefillCounter, new_counter
from kernels.proof import read_stats

SHA = "0" * 64
TRITON_HOOK_KWARGS = dict(
    key="k", repr="kernel[num_warps=4]()", fn=None, compile={}, is_manual_warmup=False,
    already_compiled=False,
)  # fmt: skip


@pytest.fixture
def fresh_hooks(monkeypatch):
    """No hook installed yet in this process; dynamo's callbacks and Triton's hook (where Triton
    is) restored afterwards. Returns triton.knobs, None without Triton."""
    monkeypatch.setattr(compile_counter, "_installed", set())
    monkeypatch.setattr(compile_counter, "_counter", None)
    monkeypatch.setattr(callback_handler, "end_callbacks", list(callback_handler.end_callbacks))
    try:
        from triton import knobs
    except ImportError:
        return None
    hook = knobs.runtime.jit_post_compile_hook
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", hook)
    return knobs


@pytest.fixture
def knobs(fresh_hooks):
    if fresh_hooks is None:
        pytest.skip("needs triton")
    return fresh_hooks


def test_a_torch_compile_here_is_counted_and_published(fresh_hooks, monkeypatch, tmp_path):
    monkeypatch.setenv("RIG_GDN_STATS_DIR", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    counter = new_counter("ns4", SHA, "cpu")
    count_compilations(counter)

    def doubled(x):
        return x * 2 + 1

    compiled = torch.compile(doubled, backend="eager", dynamic=False)
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert counter.compiles == 1
    compiled(torch.ones(3))  # compiled already
    compiled(torch.ones(5))  # a new shape: dynamo compiles again
    assert counter.compiles == 2
    (stats,) = read_stats(tmp_path)
    assert stats.compiles == 2


def test_the_triton_hook_counts_and_chains_the_hook_set_before(knobs, monkeypatch):
    seen = []
    monkeypatch.setattr(
        knobs.runtime, "jit_post_compile_hook", lambda **kwargs: seen.append(kwargs) or "x"
    )
    counter = PrefillCounter("ns4", SHA, "cuda", None)
    count_compilations(counter)
    hook = knobs.runtime.jit_post_compile_hook
    assert hook(**TRITON_HOOK_KWARGS) == "x"  # the previous hook's answer
    assert seen == [TRITON_HOOK_KWARGS] and counter.compiles == 1

    count_compilations(counter)  # once per process: not chained a second time
    assert knobs.runtime.jit_post_compile_hook is hook
    hook(**TRITON_HOOK_KWARGS)
    assert len(seen) == 2 and counter.compiles == 2


def test_the_triton_hook_alone(knobs, monkeypatch):
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    counter = PrefillCounter("ns4", SHA, "cuda", None)
    count_compilations(counter)
    assert knobs.runtime.jit_post_compile_hook(**TRITON_HOOK_KWARGS) is None
    assert counter.compiles == 1


def test_a_process_without_triton_counts_torch_compile_only(fresh_hooks, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton: ImportError
    count_compilations(PrefillCounter("ns4", SHA, "cpu", None))
    assert compile_counter._installed == {"dynamo"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_triton_compilation_is_counted(knobs):
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, size: tl.constexpr):
        offsets = tl.arange(0, size)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1)

    counter = PrefillCounter("ns4", SHA, "cuda", None)
    count_compilations(counter)
    x = torch.zeros(16, device="cuda")
    add_one[(1,)](x, 16)
    add_one[(1,)](x, 16)  # compiled already
    assert counter.compiles == 1 and torch.equal(x, torch.full_like(x, 2))
