"""Candidate GDN prefill kernels by name: `ns<R>`, the chunked GDN with R BF16 Newton-Schulz
rounds for the 16x16 block inverses (ns3 reproduces the seeds' failure, ns4 is the fix); the
performance controls `<base>+delay-<N>ms`: the base kernel (`ref` = vLLM's own, or an `ns<R>`)
with N milliseconds of host sleep added to every prefill call after a device sync, a slowdown
of known size in any regime; and `<base>+gpu-delay-<N>us`, N microseconds of spin queued on the
GPU's stream after every call with no host wait, the shape of a slower kernel
(kernels/device_delay.py); the
initial-state control `ns<R>+drop-state` (every sequence starts from zero, as a kernel that
ignores the state it is given) and `ns<R>+bf16-state` (the state rounded to BF16 on the way
in, as the seeds' fused kernel did before its inter-chunk term), faults planted on the way into
an untouched kernel; the batch control `ns<R>+batch-skew` (right for a call's first sequence,
wrong for the others: what the candidate self-check must see); and a kernel engineer's own
function, `module:function` or a name under the entry point group `rig.kernels`
(kernels/functions.py)."""

import functools
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.device_delay import spin_stream
from kernels.functions import (
    ENTRY_POINT_GROUP,
    FlaFunctionCpuOp,
    check_contract,
    fla_contract_caller,
    is_function_reference,
    load_function,
    registered_kernels,
    source_file,
)
from kernels.ns_torch import NsCpuOp

KERNEL_DIR = Path(__file__).resolve().parent
NS_ROUNDS_RANGE = range(1, 9)
REGISTERED = ("ns3", "ns4")
REFERENCE_BASE = "ref"  # a planted delay on top of vLLM's own kernel
CPU_SOURCES = ("ns_torch.py", "gdn_inputs.py")
CUDA_SOURCES = ("ns_triton.py", "ns_triton_device.py")
PLANTED_SOURCES = ("registry.py", "device_delay.py")  # where delays and faults are added
STATE_FAULTS = ("drop", "bf16")  # ns<R>+<fault>-state: planted_initial_state
BATCH_SKEW = -4.0  # ns<R>+batch-skew: skew_later_sequences
_NAME = re.compile(
    r"(?:ns(?P<rounds>[1-9][0-9]*)|(?P<ref>ref))(?:\+(?P<fault>drop|bf16)-state)?"
    r"(?P<skew>\+batch-skew)?(?:\+delay-(?P<delay>\d+(?:\.\d+)?)ms)?"
    r"(?:\+gpu-delay-(?P<gpu_delay>\d+(?:\.\d+)?)us)?"
)


class UnknownKernelError(ValueError):
    pass


@dataclass(frozen=True)
class KernelSpec:
    name: str
    ns_rounds: int | None  # None: vLLM's own kernel (with a planted delay) or `function`
    delay_ms: float = 0.0  # slept after every prefill call
    gpu_delay_us: float = 0.0  # spun on the device's stream after every prefill call
    function: str | None = None  # `module:function` of a kernel engineer's own kernel
    state_fault: str | None = None  # one of STATE_FAULTS: planted on the initial state
    batch_skew: bool = False  # planted on the output of a call's later sequences

    @property
    def delay_s(self) -> float:
        return self.delay_ms / 1000

    @property
    def runs_vllm_kernel(self) -> bool:
        """vLLM's own kernel runs, slowed by the planted delay (`ref+delay-<N>ms`)."""
        return self.ns_rounds is None and self.function is None

    @property
    def planted(self) -> bool:
        """Anything planted on the way in or out of the kernel (a delay, a fault, a skew)."""
        return bool(self.delay_ms or self.gpu_delay_us or self.state_fault or self.batch_skew)

    def loaded_function(self) -> Callable:
        """The user's function, imported and checked against the contract."""
        function = load_function(self.function)
        check_contract(function)
        return function

    def cpu_op(self, reference: Callable | None = None) -> Callable:
        """Replacement for `vllm._custom_ops.chunk_gated_delta_rule_cpu`; `reference` is that
        op, which a planted delay on vLLM's own kernel wraps."""
        if self.gpu_delay_us:
            raise UnknownKernelError(f"{self.name}: a gpu-delay needs a CUDA GPU, not the CPU")
        if self.function is not None:
            return self.delayed(FlaFunctionCpuOp(fla_contract_caller(self.loaded_function())))
        op = (
            NsCpuOp(self.ns_rounds, self._state_fault())
            if self.ns_rounds is not None
            else reference
        )
        if op is None:
            raise ValueError(f"{self.name} runs vLLM's own kernel: pass it as `reference`")
        return self.delayed(_skewed_cpu_op(op) if self.batch_skew else op)

    def fla_contract_function(self) -> Callable:
        """Replacement for FLA's `chunk_gated_delta_rule` as vLLM's CUDA path calls it: Triton
        for CUDA tensors, the PyTorch implementation for any other device; or the user's own."""
        if self.function is not None:
            return self.delayed(fla_contract_caller(self.loaded_function()))
        if self.ns_rounds is None:
            raise ValueError(f"{self.name} runs vLLM's own kernel, not an FLA-contract function")
        return self.delayed(
            functools.partial(
                _fla_contract,
                ns_rounds=self.ns_rounds,
                state_fault=self._state_fault(),
                batch_skew=self.batch_skew,
            )
        )

    def _state_fault(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if self.state_fault is None:
            return None
        return functools.partial(planted_initial_state, fault=self.state_fault)

    def delayed(self, op: Callable) -> Callable:
        """`op` itself without a planted delay, else `op` followed by the delay. A gpu-delay is
        queued on the device's stream and never waited for. A host delay: on CUDA tensors the
        device is synchronised before the sleep (the op's launches return before its work is
        done, and a sleep overlapping that queued work would add less than the delay to the
        GPU's timeline); on CPU the op has finished when it returns."""
        if not self.delay_ms and not self.gpu_delay_us:
            return op

        @functools.wraps(op)
        def slowed(*args, **kwargs):
            result = op(*args, **kwargs)
            if self.gpu_delay_us:
                spin_stream(self.gpu_delay_us)
            if self.delay_ms:
                if runs_on_cuda(args, kwargs):
                    torch.cuda.synchronize()
                time.sleep(self.delay_s)
            return result

        return slowed

    def source_sha256(self, platform: str) -> str:
        """sha256 over the source files that run on `platform` ("cpu" or "cuda"); a user's
        function: the file that defines it."""
        if self.function is not None:
            found = source_file(self.loaded_function())
            return sha256_of_files([found] if found else [])
        sources = _sources(platform) if self.ns_rounds is not None else ()
        if self.planted:
            sources += PLANTED_SOURCES
        return sha256_of_files([KERNEL_DIR / f for f in sources])


def runs_on_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether a prefill call's arguments put it on a CUDA device, where its launches return
    before the work is done (its tensors decide, not whether this process initialised CUDA)."""
    return any(getattr(value, "is_cuda", False) for value in (*args, *kwargs.values()))


def _sources(platform: str) -> tuple[str, ...]:
    return CPU_SOURCES if platform == "cpu" else CUDA_SOURCES


def planted_initial_state(state: torch.Tensor, fault: str) -> torch.Tensor:
    """The initial states a planted fault hands the kernel in place of `state`: zeros
    ("drop"), or `state` rounded to BF16 ("bf16"; the identity on a BF16 state pool, vLLM's
    default for a BF16 Qwen3-Next model, so that fault needs --mamba-ssm-cache-dtype float32)."""
    if fault == "drop":
        return torch.zeros_like(state)
    return state.to(torch.bfloat16).to(state.dtype)


def skew_later_sequences(out: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """`out` [1, T, H, V] with every sequence after the call's first scaled by BATCH_SKEW: a
    kernel right for a sequence alone and wrong beside others, as one that misreads
    cu_seqlens past its first entry would be."""
    if cu_seqlens is None or cu_seqlens.numel() <= 2:
        return out
    skewed = out.clone()
    skewed[:, int(cu_seqlens[1]) :] *= BATCH_SKEW
    return skewed


def _skewed_cpu_op(op: Callable) -> Callable:
    @functools.wraps(op)
    def skewed(*args, **kwargs):
        out, state = op(*args, **kwargs)
        cu_seqlens = kwargs["cu_seqlens"] if "cu_seqlens" in kwargs else args[7]
        return skew_later_sequences(out, cu_seqlens), state

    return skewed


def _fla_contract(
    q, *args, ns_rounds: int, state_fault: Callable | None = None, batch_skew=False, **kwargs
):
    if state_fault is not None and kwargs.get("initial_state") is not None:
        kwargs["initial_state"] = state_fault(kwargs["initial_state"])
    if q.is_cuda:
        from kernels.ns_triton import chunk_gated_delta_rule
    else:
        from kernels.ns_torch import chunk_gated_delta_rule
    out, *rest = chunk_gated_delta_rule(q, *args, ns_rounds=ns_rounds, **kwargs)
    if batch_skew:
        out = skew_later_sequences(out, kwargs.get("cu_seqlens"))
    return (out, *rest)


def sha256_of_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def known_kernel_names() -> list[str]:
    return [f"ns{r}" for r in NS_ROUNDS_RANGE]


def resolve_kernel(name: str) -> KernelSpec:
    """The candidate called `name`; UnknownKernelError naming the known ones otherwise. A
    user's function is resolved by name only: `loaded_function` imports it."""
    name = name.strip()
    if is_function_reference(name):
        return KernelSpec(name=name, ns_rounds=None, function=name)
    match = _NAME.fullmatch(name)
    rounds = match and match.group("rounds")
    delay = float(match.group("delay")) if match and match.group("delay") else 0.0
    gpu_delay = float(match.group("gpu_delay")) if match and match.group("gpu_delay") else 0.0
    fault = match and match.group("fault")
    skew = bool(match and match.group("skew"))
    delayed = bool(delay or gpu_delay)
    if (
        match is not None
        and (rounds is None or int(rounds) in NS_ROUNDS_RANGE)
        and ((delayed and not fault and not skew) or not match.group("ref"))
    ):
        return KernelSpec(
            name=name,
            ns_rounds=int(rounds) if rounds else None,
            delay_ms=delay,
            gpu_delay_us=gpu_delay,
            state_fault=fault or None,
            batch_skew=skew,
        )
    registered = registered_kernels()
    if name in registered:
        return KernelSpec(name=name, ns_rounds=None, function=registered[name])
    raise UnknownKernelError(
        f"unknown GDN kernel {name!r}; known kernels: {', '.join(known_kernel_names())} "
        f"(ns<R> = R BF16 Newton-Schulz rounds; {' and '.join(REGISTERED)} are the "
        "failing and fixed controls), the performance controls <base>+delay-<N>ms "
        f"(base {REFERENCE_BASE} = vLLM's own kernel, or ns<R>; N ms slept after every "
        "prefill call) and <base>+gpu-delay-<N>us (N µs spun on the GPU's stream), the "
        "initial-state control ns<R>+drop-state and ns<R>+bf16-state, "
        "the batch control ns<R>+batch-skew, "
        "a module:function of your own, or a name under the entry point "
        f"group {ENTRY_POINT_GROUP}"
        + (f" (here: {', '.join(sorted(registered))})" if registered else "")
    )


def planted_delay_ms(name: str | None) -> float:
    """N for a candidate `ref+delay-<N>ms`, vLLM's own kernel slowed by N ms per prefill call:
    its only difference from the reference. 0 for any other name (an `ns<R>+delay-<N>ms`
    differs from the reference by its kernel too, so its slowdown is not known in advance)."""
    if not name:
        return 0.0
    try:
        spec = resolve_kernel(name)
    except UnknownKernelError:
        return 0.0
    return spec.delay_ms if spec.runs_vllm_kernel else 0.0
