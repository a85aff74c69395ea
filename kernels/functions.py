"""A kernel engineer's own GDN prefill function as the candidate: `module:function`, or a name
registered under the entry point group `rig.kernels`, called with the contract of FLA's
`chunk_gated_delta_rule` as vLLM's CUDA path calls it (kernels/README.md, "Your own kernel
function"):

    f(q, k, v, g, beta, initial_state=, output_final_state=, cu_seqlens=,
      use_qk_l2norm_in_kernel=, [scale=, chunk_indices=, chunk_offsets=, core_attn_out=])
      -> (o, final_state)

The bracketed keywords are passed only where the function takes them; a function without
`core_attn_out` has its output copied into vLLM's buffer, as vLLM's own backends do. On vLLM's
CPU build the same function runs behind an adapter from the CPU op's contract (a state pool
updated in place), so one function serves both builds and the kernel checks.
"""

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from pathlib import Path

import torch

from kernels.gdn_inputs import GdnInputs

ENTRY_POINT_GROUP = "rig.kernels"
POSITIONAL = ("q", "k", "v", "g", "beta")
KEYWORDS = ("initial_state", "output_final_state", "cu_seqlens", "use_qk_l2norm_in_kernel")
OPTIONAL_KEYWORDS = ("scale", "chunk_indices", "chunk_offsets", "core_attn_out")
CONTRACT = f"f({', '.join(POSITIONAL)}, {'=, '.join(KEYWORDS)}=)"

GdnResult = tuple[torch.Tensor, torch.Tensor]


class KernelFunctionError(ValueError):
    """A kernel function that cannot be used; the message is one line for the user."""


def is_function_reference(name: str) -> bool:
    return ":" in name


def registered_kernels() -> dict[str, str]:
    """Names under the `rig.kernels` entry point group of this environment -> `module:function`."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def load_function(reference: str) -> Callable:
    """Import `module:function` (the function may be a dotted attribute path)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise KernelFunctionError(f"{reference!r} is not a module:function reference")
    try:
        target = importlib.import_module(module_name)
    except Exception as error:  # any import-time failure of the user's module
        raise KernelFunctionError(
            f"module {module_name} does not import ({type(error).__name__}: {error})"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise KernelFunctionError(f"module {module_name} has no attribute {attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise KernelFunctionError(f"{reference} is not callable ({type(target).__name__})")
    return target


def check_contract(function: Callable) -> None:
    """Raise KernelFunctionError unless `function` can be called as vLLM calls FLA."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin or C extension without a signature: it is called and counted
    try:
        signature.bind(*POSITIONAL, **dict.fromkeys(KEYWORDS))
    except TypeError as error:
        raise KernelFunctionError(
            f"wrong signature {signature}: vLLM calls it as {CONTRACT} ({error})"
        ) from None


def source_file(function: Callable) -> Path | None:
    """The file that defines `function`, for the proof's source hash."""
    try:
        found = inspect.getsourcefile(inspect.unwrap(function))
    except TypeError:
        return None
    return Path(found) if found else None


def accepted_keywords(function: Callable) -> frozenset[str]:
    """Which of the optional keywords `function` takes (all of them with **kwargs)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return frozenset(OPTIONAL_KEYWORDS)
    return frozenset(p.name for p in parameters) & frozenset(OPTIONAL_KEYWORDS)


def fla_contract_caller(function: Callable) -> Callable:
    """`function` behind the full call vLLM's CUDA path makes: optional keywords only where
    taken, the output copied into `core_attn_out` where the function does not write it."""
    accepted = accepted_keywords(function)

    def call(q, k, v, g, beta, *, initial_state, output_final_state, cu_seqlens=None, **extra):
        optional = {key: value for key, value in extra.items() if key in accepted}
        out, final_state = function(
            q,
            k,
            v,
            g,
            beta,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=extra.get("use_qk_l2norm_in_kernel", True),
            **{key: value for key, value in optional.items() if value is not None},
        )
        buffer = extra.get("core_attn_out")
        if buffer is not None and "core_attn_out" not in accepted:
            flat = out.reshape(-1)
            buffer.reshape(-1)[: flat.numel()].copy_(flat)
        return out, final_state

    call.__wrapped__ = function
    return call


def run_fla_contract(function: Callable, inputs: GdnInputs) -> GdnResult:
    """Call an FLA-`chunk_gated_delta_rule`-shaped function with vLLM's V-first states;
    returns (output [T, HV, V], final states [N, HV, K, V])."""
    out, final_state = function(
        q=inputs.q.unsqueeze(0),
        k=inputs.k.unsqueeze(0),
        v=inputs.v.unsqueeze(0),
        g=inputs.g.unsqueeze(0),
        beta=inputs.beta.unsqueeze(0),
        scale=inputs.scale,
        initial_state=inputs.initial_state.transpose(-1, -2).contiguous(),
        output_final_state=True,
        cu_seqlens=inputs.cu_seqlens.to(torch.int32),
        use_qk_l2norm_in_kernel=inputs.use_qk_l2norm,
    )
    return out[0], final_state.transpose(-1, -2)


class FlaFunctionCpuOp:
    """Drop-in for `vllm._custom_ops.chunk_gated_delta_rule_cpu` that runs an FLA-contract
    function: the pool's states gathered (V-first, FP32), the function called, the final
    states written back in place, as the CPU op does."""

    def __init__(self, function: Callable) -> None:
        self.function = function

    def __call__(
        self,
        query,
        key,
        value,
        g,
        beta,
        initial_state,
        output_final_state,
        cu_seqlens,
        head_first,
        use_qk_l2norm_in_kernel,
        initial_state_indices,
        eps=1e-5,
    ):
        from kernels.ns_torch import cpu_op_inputs

        inputs = cpu_op_inputs(
            query,
            key,
            value,
            g,
            beta,
            initial_state,
            cu_seqlens,
            head_first,
            use_qk_l2norm_in_kernel,
            initial_state_indices,
            eps,
        )
        out, final_state = run_fla_contract(self.function, inputs.with_state_dtype(torch.float32))
        initial_state[initial_state_indices.long()] = final_state.to(initial_state.dtype)
        return out.to(query.dtype).unsqueeze(0), initial_state
