"""The gates on which kernel ran: the candidate's kernel served (or no proof was asked for) and
the reference ran the backend asked for; both INVALID when they fail."""

from rig.scenario.gates_config import GatesConfig
from rig.verdict.evidence import Evidence, SideKernel
from rig.verdict.kernel_gates import (
    KERNEL_GATE,
    candidate_kernel_gate,
    kernel_proof,
    reference_backend,
)
from rig.verdict.words import GateKind

FLA, NS4 = SideKernel("reference", "fla", 12), SideKernel("candidate", "ns4", 12)


def evidence(kernels, **fields) -> Evidence:
    return Evidence(GatesConfig(), [], kernels, **fields)


def test_the_candidates_kernel_served_and_said_so():
    gate = kernel_proof(evidence({"reference": FLA, "candidate": NS4}, requested_kernel="ns4"))
    assert (gate.name, gate.passed, gate.kind) == (KERNEL_GATE, True, GateKind.VALIDITY)
    assert gate.detail == "candidate ran ns4 (12 calls), reference ran fla (12 calls)"


def test_each_way_the_candidates_kernel_can_go_unserved():
    both = {"reference": FLA, "candidate": NS4}
    assert "never served" in candidate_kernel_gate(both, "ns3", False).detail
    idle = {**both, "candidate": SideKernel("candidate", "ns4", 0)}
    assert "no prefill call reached it" in candidate_kernel_gate(idle, "ns4", False).detail
    same = {**both, "candidate": SideKernel("candidate", "fla", 12)}
    assert "both sides ran the same kernel" in candidate_kernel_gate(same, None, False).detail
    missing = candidate_kernel_gate({"reference": FLA}, "ns4", False)
    assert missing.detail == "no kernel proof for one of the sides"
    for gate in (missing, candidate_kernel_gate(idle, "ns4", False)):
        assert not gate.passed and gate.kind is GateKind.VALIDITY


def test_an_aa_run_wants_one_kernel_on_both_sides():
    aa = {"reference": FLA, "candidate": SideKernel("candidate", "fla", 12)}
    assert candidate_kernel_gate(aa, None, True).passed
    assert not candidate_kernel_gate({"reference": FLA, "candidate": NS4}, None, True).passed


def test_no_proof_asked_passes_and_names_why_and_what_was_seen():
    reason = "candidate.proof: none"
    gate = kernel_proof(evidence({"reference": FLA}, proof_not_asked=reason))
    assert gate.passed and gate.name == "kernel proof"
    assert gate.detail == "no kernel proof was asked for (candidate.proof: none); seen: " + (
        "reference ran fla (12 calls)"
    )


def test_the_reference_backend_is_checked_only_where_its_proof_is_read():
    flashinfer = {"reference": SideKernel("reference", "vllm-flashinfer", 12), "candidate": NS4}
    assert reference_backend(evidence(flashinfer)) is None  # reference.proof: none
    assert reference_backend(evidence({}, reference_backend="triton")) is None  # no proof at all
    wrong = reference_backend(evidence(flashinfer, reference_backend="triton"))
    assert not wrong.passed and wrong.kind is GateKind.VALIDITY
    assert wrong.detail == "requested triton (vllm-triton); reference ran vllm-flashinfer"
    assert reference_backend(evidence(flashinfer, reference_backend="flashinfer")).passed
