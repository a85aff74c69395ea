"""The initial-state gate (INVALID naming the side whose proof shows no sequence continued from
a non-zero state) and each prompt's chunk count at the step budget."""

from kernels.proof import InitialStateCounts
from rig.scenario.gates_config import GatesConfig
from rig.verdict.compare import PairResult
from rig.verdict.evidence import Evidence, SideKernel
from rig.verdict.gates import decide
from rig.verdict.initial_state import chunked_prefill, initial_state_gate
from rig.verdict.words import GateKind

CONTINUED = InitialStateCounts(calls=4, sequences=6, tokens=900, all_sequences=10, all_tokens=1200)
NONE_CONTINUED = InitialStateCounts(0, 0, 0, 10, 1200)


def kernels(reference, candidate) -> dict[str, SideKernel]:
    return {
        "reference": SideKernel("reference", "vllm-cpu-native", 10, initial_state=reference),
        "candidate": SideKernel("candidate", "ns4", 10, initial_state=candidate),
    }


def test_both_sides_continued_sequences_is_valid_and_says_how_many():
    gate = initial_state_gate(kernels(CONTINUED, CONTINUED))
    assert gate.passed and gate.kind is GateKind.VALIDITY
    assert gate.detail.startswith(
        "reference: 6 of 10 prefilled sequences started from a non-zero state (900 of 1,200 "
        "tokens, 4 calls); candidate: 6 of 10"
    )


def test_a_side_without_such_sequences_makes_the_run_invalid_and_is_named():
    gate = initial_state_gate(kernels(CONTINUED, NONE_CONTINUED))
    assert not gate.passed
    assert gate.detail.startswith("candidate never prefilled from a non-zero initial state")
    assert "reference" not in gate.detail.split("(gates.require_initial_state)")[0]
    uncounted = initial_state_gate(kernels(None, CONTINUED))
    assert not uncounted.passed
    assert uncounted.detail.startswith("reference: no initial-state count in its kernel proof")
    assert not initial_state_gate({}).passed


def test_the_gate_turns_the_word_to_invalid():
    same = [PairResult("q0", "p", 1, 0, 0, identical=True, divergence=None, pathologies=())]
    asked = Evidence(
        GatesConfig(require_initial_state=True),
        same,
        kernels(CONTINUED, NONE_CONTINUED),
        [],
        requested_kernel="ns4",
    )
    verdict = decide(asked)
    assert verdict.word == "INVALID" and verdict.exit_code() == 3
    assert verdict.failed_gates == [initial_state_gate(asked.kernels)]
    not_asked = Evidence(GatesConfig(), same, asked.kernels, requested_kernel="ns4")
    assert decide(not_asked).word == "identical"


def test_chunks_per_prompt_from_the_references_prompt_tokens(make_record):
    records = [
        make_record(prompt_id="long", prompt_tokens=2410),
        make_record(prompt_id="long", prompt_tokens=2410, request_id="again"),
        make_record(prompt_id="short", prompt_tokens=40),
        make_record(prompt_id="edge", prompt_tokens=256),
        make_record(side="candidate", prompt_id="other", prompt_tokens=9999),
    ]
    chunked = chunked_prefill(records, 256)
    assert [(p.prompt_id, p.tokens, p.chunks) for p in chunked.prompts] == [
        ("long", 2410, 10),
        ("edge", 256, 1),
        ("short", 40, 1),
    ]
    assert chunked.describe().startswith("1 of 3 prompts take several prefill steps at a budget")
    assert "up to 10 chunks (long: 2,410 tokens)" in chunked.describe()
    assert chunked_prefill(records, None) is None
