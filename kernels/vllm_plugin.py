"""vLLM general plugin: swap the GDN prefill kernel for a candidate, and prove what ran.

Entry point `vllm.general_plugins: rig_gdn_kernels = kernels.vllm_plugin:register`; vLLM calls
`register()` in the API server (while it parses the command line, before it starts anything),
the engine core and every worker, possibly more than once.

  RIG_GDN_KERNEL=ns4      run candidate ns4 (kernels/registry.py); unset = vLLM's own kernel.
                          `ref+delay-20ms`: vLLM's own kernel and 20 ms of sleep per prefill
                          call (the performance control); `mypkg.gdn:chunk_fwd` or a name under
                          the entry point group `rig.kernels`: your own FLA-contract function
                          (kernels/functions.py), imported in every process; an unknown name or
                          a function that does not import fails the server at start.
  RIG_GDN_STATS_DIR=dir   every process the plugin loads in keeps dir/gdn-calls-<pid>.json.
                          Unset: the first process makes a private temporary folder and sets
                          it, so the engine core and workers vLLM starts later inherit it.
  RIG_GDN_CAPTURE=dir     save the first RIG_GDN_CAPTURE_N (4) prefill calls per layer.
  RIG_GDN_TIME=1          time every prefill call between two device synchronisations rather
                          than by CUDA events read later (the default, which never waits for
                          the GPU): the GDN share of a prefill (benchmarks/gdn_share.py).

CPU build: `vllm._custom_ops.chunk_gated_delta_rule_cpu` is looked up as a module attribute on
every call, so rebinding it swaps the kernel, compiled mode included. CUDA: an out-of-tree
`ChunkGatedDeltaRule` (CustomOp name "ChunkGatedDeltaRule") whose forward is the candidate
whatever --gdn-prefill-backend resolved to. Either way the prefill op, the reference included,
is wrapped by a call counter that also times the calls (kernels/prefill_counter.py), and the
process's JIT compilations are counted (kernels/compile_counter.py). Evidence, one set per
process (kernels/proof.py reads it back): a marker line naming the kernel and the sha256 of its
source, the stats file, and gauge families on the API server's /metrics
(kernels/proof_metrics.py).
"""

import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.backends import AUTO, CPU_NATIVE, reference_kernel_name
from kernels.capture import CaptureWriter, calling_layer_name, capture_writer_from_env
from kernels.compile_counter import count_compilations
from kernels.functions import KernelFunctionError
from kernels.gdn_inputs import GdnInputs
from kernels.initial_state import cpu_op_tally, fla_call_tally
from kernels.prefill_counter import PrefillCounter, new_counter, share_evidence_folder
from kernels.proof import KERNEL_ENV
from kernels.proof_metrics import register_collector
from kernels.registry import KernelSpec, UnknownKernelError, resolve_kernel, sha256_of_files

CPU_REFERENCE = reference_kernel_name(CPU_NATIVE)
CUDA_REFERENCE_UNBUILT = "vllm-cuda-reference"  # until the GDN op is built and names its backend
CUDA_OP_NAME = "ChunkGatedDeltaRule"
CPU_OP_PARAMETERS = (
    "query",
    "key",
    "value",
    "g",
    "beta",
    "initial_state",
    "output_final_state",
    "cu_seqlens",
    "head_first",
    "use_qk_l2norm_in_kernel",
    "initial_state_indices",
    "eps",
)
FLA_L2NORM_EPS = 1e-6
FLA_BACKEND = "triton"
FLA_METADATA_BACKENDS = ("triton", "flashinfer")  # vLLM builds FLA chunk_indices for these

_installed_platform: str | None = None


def requested_gdn_backend() -> str:
    """What vLLM was asked for: `additional_config["gdn_prefill_backend"]`, which
    --gdn-prefill-backend sets (read the way vLLM 0.22-0.33 read it), else "auto"."""
    from vllm.config import get_current_vllm_config

    extra = get_current_vllm_config().additional_config
    requested = extra.get("gdn_prefill_backend", AUTO) if isinstance(extra, dict) else AUTO
    return str(requested).strip().lower()


def selected_kernel() -> KernelSpec | None:
    """The candidate named by RIG_GDN_KERNEL, None when unset; UnknownKernelError otherwise."""
    name = os.environ.get(KERNEL_ENV, "").strip()
    return resolve_kernel(name) if name else None


def register() -> None:
    """Install the selected kernel (or the counted reference) once per process, count its JIT
    compilations, and publish this server's evidence on /metrics."""
    global _installed_platform
    if _installed_platform is not None:
        return
    try:
        spec = selected_kernel()
        if spec is not None and spec.function is not None:
            spec.loaded_function()
    except (UnknownKernelError, KernelFunctionError) as error:
        name = os.environ.get(KERNEL_ENV, "").strip()
        print(f"rig GDN plugin: {KERNEL_ENV}={name}: {error}", file=sys.stderr, flush=True)
        raise
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        platform = "cpu"
    elif current_platform.is_cuda_alike():
        platform = "cuda"
    elif spec is not None:
        raise RuntimeError(
            f"rig GDN plugin: {KERNEL_ENV}={spec.name} needs vLLM's CPU or CUDA platform, "
            f"not {current_platform.device_name}"
        )
    else:
        return
    share_evidence_folder()
    counter = install_cpu(spec) if platform == "cpu" else install_cuda(spec).rig_counter
    count_compilations(counter)
    register_collector(counter.stats_dir, counter.server)
    _installed_platform = platform


def _file_sha256(function: Callable) -> str:
    return sha256_of_files([Path(inspect.getsourcefile(function))])


def vllm_gdn_sources_sha256(op_class: type) -> str:
    """sha256 of vLLM's own GDN prefill sources: the op's file and the FLA ops it calls, so a
    vLLM branch that changed FLA's kernel proves another source than stock vLLM."""
    module = sys.modules[op_class.__module__]
    fla = getattr(module, "fla_chunk_gated_delta_rule", None)
    files = [Path(inspect.getsourcefile(op_class))]
    if fla is not None and inspect.getsourcefile(inspect.unwrap(fla)):
        files += sorted(Path(inspect.getsourcefile(inspect.unwrap(fla))).parent.glob("*.py"))
    return sha256_of_files(files)


def cpu_op_gdn_inputs(args: tuple, kwargs: dict) -> GdnInputs:
    """GdnInputs of a `chunk_gated_delta_rule_cpu` call, states gathered before the call."""
    from kernels.ns_torch import cpu_op_inputs

    bound = dict(zip(CPU_OP_PARAMETERS, args, strict=False)) | kwargs
    bound.setdefault("eps", 1e-5)
    bound.pop("output_final_state")
    return cpu_op_inputs(**bound)


def counted_cpu_op(
    op: Callable, counter: PrefillCounter, capture: CaptureWriter | None
) -> Callable:
    def chunk_gated_delta_rule_cpu(*args, **kwargs):
        if capture is not None:
            layer = calling_layer_name()
            if capture.wants(layer):
                capture.save(layer, cpu_op_gdn_inputs(args, kwargs))
        bound = dict(zip(CPU_OP_PARAMETERS, args, strict=False)) | kwargs
        counter.saw_states(
            cpu_op_tally(
                bound["initial_state"], bound["cu_seqlens"], bound["initial_state_indices"]
            )
        )
        return counter.call(op, *args, **kwargs)

    chunk_gated_delta_rule_cpu.rig_counter = counter
    return chunk_gated_delta_rule_cpu


def install_cpu(spec: KernelSpec | None) -> PrefillCounter:
    """Rebind vLLM's CPU GDN prefill op to the counted candidate (or counted reference)."""
    from vllm import _custom_ops

    current = _custom_ops.chunk_gated_delta_rule_cpu
    if hasattr(current, "rig_counter"):
        return current.rig_counter
    if spec is None:
        kernel, sha, op = CPU_REFERENCE, _file_sha256(current), current
    else:
        kernel, sha, op = spec.name, spec.source_sha256("cpu"), spec.cpu_op(current)
    counter = new_counter(kernel, sha, "cpu")
    _custom_ops.chunk_gated_delta_rule_cpu = counted_cpu_op(
        op, counter, capture_writer_from_env(kernel)
    )
    _register_cpu_backend_recorder(counter)
    return counter


def _register_cpu_backend_recorder(counter: PrefillCounter) -> None:
    """vLLM's CPU GDN layer still builds the (unused) ChunkGatedDeltaRule op: an out-of-tree
    subclass that only notes what vLLM was asked for; the CPU build always runs cpu-native."""
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import ChunkGatedDeltaRule

    if CUDA_OP_NAME in op_registry_oot:
        return

    class RigCpuChunkGatedDeltaRule(ChunkGatedDeltaRule):
        rig_counter = counter

        def __init__(self) -> None:
            super().__init__()
            counter.built_op(counter.kernel, CPU_NATIVE, requested_gdn_backend())

    CustomOp.register_oot(name=CUDA_OP_NAME)(RigCpuChunkGatedDeltaRule)


def fla_call_gdn_inputs(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm) -> GdnInputs:
    """GdnInputs of an FLA-contract call (V-first states), copied to the host."""
    num_tokens = q.shape[0] * q.shape[1]
    num_value_heads = v.shape[2]
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, num_tokens], dtype=torch.int32)
    return GdnInputs(
        q=q.reshape(num_tokens, *q.shape[2:]),
        k=k.reshape(num_tokens, *k.shape[2:]),
        v=v.reshape(num_tokens, *v.shape[2:]),
        g=g.reshape(num_tokens, num_value_heads),
        beta=beta.reshape(num_tokens, num_value_heads),
        initial_state=initial_state.transpose(-1, -2),
        cu_seqlens=cu_seqlens,
        use_qk_l2norm=use_qk_l2norm,
        eps=FLA_L2NORM_EPS,
        scale=q.shape[-1] ** -0.5,
    ).to("cpu")


@dataclass(frozen=True)
class CudaRoute:
    """What this process's ChunkGatedDeltaRule runs: the candidate's FLA-contract function, or
    vLLM's own forward (wrapped in a planted delay when `planted` is set), counted and
    captured either way."""

    kernel: str
    counter: PrefillCounter
    capture: CaptureWriter | None
    candidate: Callable | None = None
    planted: KernelSpec | None = None  # a delay on vLLM's own kernel


def cuda_route(spec: KernelSpec | None, op_class: type) -> CudaRoute:
    """The route of `spec` (None: vLLM's own kernel, named once the op is built), with this
    process's counter and capture."""
    if spec is None:
        kernel, sha = CUDA_REFERENCE_UNBUILT, vllm_gdn_sources_sha256(op_class)
    else:
        kernel, sha = spec.name, spec.source_sha256("cuda")
    planted = spec if spec is not None and spec.runs_vllm_kernel else None
    candidate = spec.fla_contract_function() if spec is not None and planted is None else None
    counter = new_counter(kernel, sha, "cuda")
    return CudaRoute(kernel, counter, capture_writer_from_env(kernel), candidate, planted)


class RoutedGdnOp:
    """The rig's half of its ChunkGatedDeltaRule, mixed in ahead of vLLM's class (install_cuda):
    at build, the forward vLLM picked is replaced by the candidate or wrapped by the counter."""

    rig_route: CudaRoute

    def __init__(self) -> None:
        super().__init__()
        # CustomOp.__init__ and ChunkGatedDeltaRule.__init__ both pick _forward_method.
        self.rig_vllm_backend = self.gdn_prefill_backend
        requested = requested_gdn_backend()
        route = self.rig_route
        if route.candidate is None:
            kernel = route.kernel if route.planted else reference_kernel_name(self.rig_vllm_backend)
            route.counter.built_op(kernel, self.rig_vllm_backend, requested)
            forward = self._forward_method
            self.rig_reference_forward = (
                route.planted.delayed(forward) if route.planted else forward
            )
            self._forward_method = self.forward_reference_counted
        else:
            route.counter.built_op(route.kernel, self.rig_vllm_backend, requested)
            # The candidate keeps FLA's contract, so the layer must treat it as Triton/FLA:
            # with "flashinfer" vLLM 0.33 calls FlashInfer directly, past this op, for
            # prefills that export prefix-cache checkpoints.
            self.gdn_prefill_backend = FLA_BACKEND
            self._forward_method = self.forward_candidate

    def _capture(self, q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm) -> None:
        capture = self.rig_route.capture
        if capture is None:
            return
        layer = calling_layer_name()
        if capture.wants(layer):
            inputs = fla_call_gdn_inputs(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm)
            capture.save(layer, inputs)

    def forward_reference_counted(self, *args, **kwargs):
        route = self.rig_route
        call = kwargs  # vLLM passes every argument by keyword
        if args or route.capture is not None:
            call = inspect.signature(self.forward_native).bind(*args, **kwargs).arguments
        if route.capture is not None:
            self._capture(
                *(call[name] for name in ("q", "k", "v", "g", "beta", "initial_state")),
                call.get("cu_seqlens"),
                call.get("use_qk_l2norm_in_kernel", True),
            )
        route.counter.saw_states(
            fla_call_tally(call["q"], call.get("initial_state"), call.get("cu_seqlens"))
        )
        return route.counter.call(self.rig_reference_forward, *args, **kwargs)

    def forward_candidate(
        self, q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
        chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=True,
        core_attn_out=None, aiter_prefill_metadata=None,
    ):  # fmt: skip
        """The candidate in vLLM's place. Its 13 parameters stay: they are vLLM's forward_cuda's,
        as vLLM calls it; the candidate gets FLA's contract of them."""
        counter = self.rig_route.counter
        self._capture(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm_in_kernel)
        counter.saw_states(fla_call_tally(q, initial_state, cu_seqlens))
        if self.rig_vllm_backend not in FLA_METADATA_BACKENDS:
            chunk_indices = chunk_offsets = None  # e.g. cutedsl's are not FLA's layout
        return counter.call(
            self.rig_route.candidate, q, k, v, g, beta, initial_state=initial_state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
            chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, core_attn_out=core_attn_out,
        )  # fmt: skip


def install_cuda(spec: KernelSpec | None) -> type:
    """Register an out-of-tree ChunkGatedDeltaRule that runs the candidate (or counts the
    backend vLLM chose). Returns the registered class; its `rig_counter` is this process's."""
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import ChunkGatedDeltaRule

    if CUDA_OP_NAME in op_registry_oot:
        return op_registry_oot[CUDA_OP_NAME]
    route = cuda_route(spec, ChunkGatedDeltaRule)

    class RigChunkGatedDeltaRule(RoutedGdnOp, ChunkGatedDeltaRule):
        """vLLM's op with the prefill forward replaced (candidate) or counted (reference)."""

        rig_route = route
        rig_counter = route.counter

    CustomOp.register_oot(name=CUDA_OP_NAME)(RigChunkGatedDeltaRule)
    return RigChunkGatedDeltaRule
