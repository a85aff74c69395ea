"""Version skew between the sides: the same facts are none, another torch or Python is refused
unless allowed, another vLLM release only when both sides declare it, and the versions that
running servers report are held to the same rule."""

from rig.serve.skew import install_skew, served_skew
from tests.serve.test_installs import installed, scenario


def test_the_same_install_facts_are_no_skew():
    assert install_skew(scenario(), installed()) == []


def test_another_torch_or_python_is_refused_unless_allowed():
    (problem,) = install_skew(scenario(), installed(torch="2.14.0"))
    assert "the reference has torch 2.13.0+cpu, the candidate 2.14.0" in problem
    assert "allow_version_skew: true" in problem
    assert install_skew(scenario(allow_version_skew=True), installed(torch="2.14.0")) == []
    assert install_skew(scenario(), installed(python_version="3.12.1"))


def test_another_vllm_release_needs_both_sides_to_declare_it():
    (problem,) = install_skew(scenario(), installed(vllm="0.33.0"))
    assert "the reference runs vLLM 0.32.0, the candidate vLLM 0.33.0" in problem
    declared = scenario(reference={"vllm_version": "0.32"}, candidate={"vllm_version": "0.33"})
    assert install_skew(declared, installed(vllm="0.33.0")) == []
    wrong = scenario(reference={"vllm_version": "0.32"}, candidate={"vllm_version": "0.34"})
    assert "candidate.vllm_version 0.34 is declared; its vLLM is 0.33.0" in install_skew(
        wrong, installed(vllm="0.33.0")
    )
    # a branch build of the same release differs in its commit only: not a skew
    assert install_skew(scenario(), installed(vllm="0.32.0.dev4+gabc1234")) == []


def test_served_versions_of_containers_are_checked_the_same_way():
    assert served_skew(scenario(), {"reference": "0.26.0", "candidate": "0.26.0+cu130"}) is None
    assert "another release" in served_skew(
        scenario(), {"reference": "0.26.0", "candidate": "0.27.1"}
    )
    assert served_skew(scenario(), {"reference": "0.26.0"}) is None
