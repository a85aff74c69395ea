"""The gates on which kernels ran, from each side's kernel proof: the candidate's kernel served
(or why no proof was asked for), and the reference ran the backend the scenario asked for.
Both are validity gates: a run that cannot say which kernel it measured vouches for nothing."""

from __future__ import annotations

from kernels.backends import CPU_NATIVE, reference_kernel_name
from rig.records import Side
from rig.verdict.evidence import Evidence, SideKernel
from rig.verdict.words import Gate, GateKind

# vLLM's CPU build has one GDN prefill op and ignores the backend asked for.
CPU_REFERENCE = reference_kernel_name(CPU_NATIVE)
KERNEL_GATE = "candidate kernel active"


def kernel_proof(evidence: Evidence) -> Gate:
    """The candidate's kernel served, or, where the scenario asks for no proof, a passed gate
    that says so."""
    if evidence.proof_not_asked is not None:
        return _no_proof_gate(evidence.kernels, evidence.proof_not_asked)
    return candidate_kernel_gate(evidence.kernels, evidence.requested_kernel, evidence.is_aa)


def candidate_kernel_gate(
    kernels: dict[str, SideKernel], requested: str | None, is_aa: bool
) -> Gate:
    """Both sides' proofs are there; in an A/A run they name one kernel; else the candidate ran
    what it asked for (`requested`), at least once, and not the reference's own kernel."""
    ref, cand = kernels.get(Side.REFERENCE), kernels.get(Side.CANDIDATE)
    if ref is None or cand is None:
        return Gate(KERNEL_GATE, False, "no kernel proof for one of the sides", GateKind.VALIDITY)
    seen = (
        f"candidate ran {cand.kernel} ({cand.calls} calls), "
        f"reference ran {ref.kernel} ({ref.calls} calls)"
    )
    if is_aa:
        return Gate(KERNEL_GATE, ref.kernel == cand.kernel, f"A/A run: {seen}", GateKind.VALIDITY)
    same = cand.same_kernel_as(ref)
    if requested is not None and cand.kernel != requested:
        why = "the candidate kernel never served" + (
            " (both sides ran the same kernel)" if same else ""
        )
        detail = f"candidate asked for {requested} but {seen}: {why}"
        return Gate(KERNEL_GATE, False, detail, GateKind.VALIDITY)
    if cand.calls <= 0:
        return Gate(KERNEL_GATE, False, f"{seen}: no prefill call reached it", GateKind.VALIDITY)
    if same:
        detail = (
            f"both sides ran the same kernel: {seen} (comparing two vLLM installs or another "
            "op? set gates.require_candidate_kernel: false or candidate.proof: none)"
        )
        return Gate(KERNEL_GATE, False, detail, GateKind.VALIDITY)
    if ref.kernel == cand.kernel:
        hashes = (", ".join(h[:12] for h in k.source_sha256) for k in (cand, ref))
        seen += ", from other sources (candidate {}, reference {})".format(*hashes)
    return Gate(KERNEL_GATE, True, seen, GateKind.VALIDITY)


def _no_proof_gate(kernels: dict[str, SideKernel], reason: str) -> Gate:
    """A run that asks for no kernel proof (another op, two vLLM versions) is valid, and says
    so: its verdict is about the served text, not about which kernel ran."""
    seen = "; ".join(f"{k.side} ran {k.kernel} ({k.calls} calls)" for k in kernels.values())
    detail = f"no kernel proof was asked for ({reason})" + (f"; seen: {seen}" if seen else "")
    return Gate("kernel proof", True, detail, GateKind.VALIDITY)


def reference_backend(evidence: Evidence) -> Gate | None:
    """The reference must be the backend the scenario asked for (FLA's Triton by default): on
    an H200, vLLM's own default is FlashInfer, and a fallback would silently change the
    yardstick. In an A/A run both sides are the reference. None when the reference's proof is
    not read, or no side has one."""
    backend, kernels = evidence.reference_backend, evidence.kernels
    if backend is None or not kernels:
        return None
    wanted = reference_kernel_name(backend)
    sides = (Side.REFERENCE, Side.CANDIDATE) if evidence.is_aa else (Side.REFERENCE,)
    ran = {side: kernels[side].kernel for side in sides if side in kernels}
    wrong = {side: k for side, k in ran.items() if k not in (wanted, CPU_REFERENCE)}
    seen = ", ".join(f"{side} ran {kernel}" for side, kernel in ran.items()) or "no proof"
    detail = f"requested {backend} ({wanted}); {seen}"
    return Gate("reference backend", not wrong, detail, GateKind.VALIDITY)
