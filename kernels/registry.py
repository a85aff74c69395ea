"""Candidate GDN prefill kernels by name: `ns<R>`, the chunked GDN with R BF16 Newton-Schulz
rounds for the 16x16 block inverses (ns3 reproduces the seeds' failure, ns4 is the fix)."""

import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernels.ns_torch import NsCpuOp

KERNEL_DIR = Path(__file__).resolve().parent
NS_ROUNDS_RANGE = range(1, 9)
REGISTERED = ("ns3", "ns4")
CPU_SOURCES = ("ns_torch.py", "gdn_inputs.py")
CUDA_SOURCES = ("ns_triton.py",)


class UnknownKernelError(ValueError):
    pass


@dataclass(frozen=True)
class KernelSpec:
    name: str
    ns_rounds: int

    def cpu_op(self) -> NsCpuOp:
        """Replacement for `vllm._custom_ops.chunk_gated_delta_rule_cpu`."""
        return NsCpuOp(self.ns_rounds)

    def fla_contract_function(self) -> Callable:
        """Replacement for FLA's `chunk_gated_delta_rule` as vLLM's CUDA path calls it: Triton
        for CUDA tensors, the PyTorch implementation for any other device."""
        return functools.partial(_fla_contract, ns_rounds=self.ns_rounds)

    def source_sha256(self, platform: str) -> str:
        """sha256 over the source files that run on `platform` ("cpu" or "cuda")."""
        return sha256_of_files([KERNEL_DIR / f for f in _sources(platform)])


def _sources(platform: str) -> tuple[str, ...]:
    return CPU_SOURCES if platform == "cpu" else CUDA_SOURCES


def _fla_contract(q, *args, ns_rounds: int, **kwargs):
    if q.is_cuda:
        from kernels.ns_triton import chunk_gated_delta_rule
    else:
        from kernels.ns_torch import chunk_gated_delta_rule
    return chunk_gated_delta_rule(q, *args, ns_rounds=ns_rounds, **kwargs)


def sha256_of_files(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def known_kernel_names() -> list[str]:
    return [f"ns{r}" for r in NS_ROUNDS_RANGE]


def resolve_kernel(name: str) -> KernelSpec:
    """The candidate called `name`; UnknownKernelError naming the known ones otherwise."""
    match = re.fullmatch(r"ns([1-9][0-9]*)", name.strip())
    if match is None or int(match.group(1)) not in NS_ROUNDS_RANGE:
        raise UnknownKernelError(
            f"unknown GDN kernel {name!r}; known kernels: {', '.join(known_kernel_names())} "
            f"(ns<R> = R BF16 Newton-Schulz rounds; {' and '.join(REGISTERED)} are the "
            "failing and fixed controls)"
        )
    return KernelSpec(name=name.strip(), ns_rounds=int(match.group(1)))
