"""Version skew between the two sides' installations: what may differ (only what the scenario
declares, or anything with allow_version_skew) and what the servers report once they run."""

from __future__ import annotations

from kernels.backends import UnsupportedVllmError, parse_vllm_version
from rig.records import Side
from rig.scenario.config import SIDES, Scenario
from rig.serve.installs import SideInstall


def install_skew(scenario: Scenario, installs: dict[str, SideInstall]) -> list[str]:
    """How the two sides' installations differ beyond what the scenario declares: another vLLM
    release unless both sides declare `vllm_version`, another torch, triton or Python unless
    `allow_version_skew: true`; and a declared version the install does not have."""
    problems = []
    for side, install in installs.items():
        declared = scenario.side(side).vllm_version
        if declared and install.facts.vllm and not install.facts.vllm.startswith(declared):
            found = install.facts.vllm
            problems.append(f"{side}.vllm_version {declared} is declared; its vLLM is {found}")
    ref, cand = installs.get(Side.REFERENCE), installs.get(Side.CANDIDATE)
    if ref is None or cand is None or not (ref.facts.probed and cand.facts.probed):
        return problems
    if scenario.allow_version_skew:
        return problems
    declared = all(scenario.side(side).vllm_version for side in SIDES)
    releases = [parse_vllm_version(i.facts.vllm)[:3] for i in (ref, cand)]
    if releases[0] != releases[1] and not declared:
        problems.append(
            f"the reference runs vLLM {ref.facts.vllm}, the candidate vLLM {cand.facts.vllm}: "
            "another release than the scenario declares (set reference.vllm_version and "
            "candidate.vllm_version, or allow_version_skew: true)"
        )
    for name in ("torch", "triton", "python_version"):
        mine, theirs = getattr(ref.facts, name), getattr(cand.facts, name)
        if mine != theirs:
            problems.append(
                f"the reference has {name.replace('_version', '')} {mine}, the candidate "
                f"{theirs}: the sides would differ in more than vLLM (allow_version_skew: true "
                "to compare them anyway)"
            )
    return problems


def served_skew(scenario: Scenario, versions: dict[str, str]) -> str | None:
    """Another vLLM release on the two sides, by what their servers say, that the scenario
    neither declares nor allows: what preflight could not see for a container or an attached
    server. None when the versions agree, are declared, or one is unknown."""
    ref, cand = versions.get(Side.REFERENCE), versions.get(Side.CANDIDATE)
    if ref is None or cand is None or scenario.allow_version_skew:
        return None
    if all(scenario.side(side).vllm_version for side in SIDES):
        return None
    try:
        if parse_vllm_version(ref)[:3] == parse_vllm_version(cand)[:3]:
            return None
    except UnsupportedVllmError:
        return None
    return (
        f"the reference served vLLM {ref}, the candidate vLLM {cand}: another release than "
        "the scenario declares (set both sides' vllm_version, or allow_version_skew: true)"
    )
