"""scenarios/gpu-long.yaml on one GPU with vLLM's CUDA build (`pytest -m gpu
tests/e2e/test_gpu_long.py`): tiny-qwen35 at Qwen3-Next's GDN widths, 2K/8K/10K-token prompts,
C=1-64, both sides sharing the GPU. Three runs share the session's golden cache, so only the
first starts both servers: ns4 must pass, A/A must be identical, ns3 must be caught on the
long prompts. FLA (`--gdn-prefill-backend triton`) is the reference in every run.

Each run prints one line `gpu-long <name> {json}` (verdict, counts, kernels, timings, and for
ns4 the per-level perf rows; `pytest -s` shows it) and, with RIG_GPU_EVIDENCE_DIR set, copies
its summary.md, perf.csv, mismatches.csv and manifest.json there under <name>/, written before
any assertion so that a failing run leaves its evidence too.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from rig.models.tiny_qwen35 import ensure_tiny_qwen35_model

from .conftest import EQUIVALENT_WORDS, RigRun, rig_processes
from .test_gpu import assert_fla_reference, kernel_of, needs_gpus, passed

pytestmark = pytest.mark.gpu

SCENARIO = "scenarios/gpu-long.yaml"
LEVELS = [1, 4, 16, 64]
LONG_PROMPTS = ("long-10000-", "long-12400-")  # the ~8K- and ~10K-token prompts
EVIDENCE_FILES = ("summary.md", "perf.csv", "mismatches.csv", "manifest.json")
PERF_METRICS = ("mean_ttft_ms", "mean_e2el_ms", "total_token_throughput")


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV the rig wrote; an empty file (no mismatches) has none."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def perf_rows(run: RigRun) -> list[dict]:
    """Per level: each side's mean TTFT and throughput over the repeats, and the candidate's
    change against the reference with its interval and word (perf.csv)."""
    sides: dict[tuple[str, str], list[dict]] = {}
    for row in read_csv(run.run_dir / "summary.csv"):
        sides.setdefault((row["level"], row["side"]), []).append(row)

    def side_mean(level: str, side: str, column: str) -> float | None:
        values = [float(r[column]) for r in sides.get((level, side), []) if r.get(column)]
        return round(sum(values) / len(values), 2) if values else None

    rows = []
    for row in read_csv(run.run_dir / "perf.csv"):
        level = row["level"]
        entry = {"level": int(level), "repeats": int(row["repeats"]), "requests": row["requests"]}
        for side in ("reference", "candidate"):
            entry[f"{side}_mean_ttft_ms"] = side_mean(level, side, "mean_ttft_ms")
            entry[f"{side}_tok_s"] = side_mean(level, side, "total_token_throughput")
        for metric in PERF_METRICS:
            entry[metric] = change_with_interval(row, metric)
        rows.append(entry)
    return rows


def change_with_interval(row: dict, metric: str) -> str:
    """`+1.3% [-5.3, +8.4] within noise` from a perf.csv row (no interval from a single run)."""
    change, low, high = (
        row.get(f"{metric}_{part}") for part in ("change_pct", "ci_low_pct", "ci_high_pct")
    )
    if not change:
        return row.get(f"{metric}_word", "")
    interval = f" [{float(low):+.1f}, {float(high):+.1f}]" if low and high else ""
    return f"{float(change):+.1f}%{interval} {row.get(f'{metric}_word', '')}"


def bad_long_pairs(run: RigRun) -> int:
    """Pairs on the 8K/10K-token prompts with a substantive (or unclassified) divergence or a
    pathology."""
    return sum(
        1
        for row in read_csv(run.run_dir / "mismatches.csv")
        if row["prompt_id"].startswith(LONG_PROMPTS)
        and (row["divergence_kind"] in ("substantive", "unclassified") or row["pathologies"])
    )


def report(run: RigRun, name: str, wall_s: float) -> None:
    """Print the run's summary line and copy its evidence (RIG_GPU_EVIDENCE_DIR)."""
    summary: dict = {"run": name, "exit": run.returncode, "test_wall_s": round(wall_s, 1)}
    if (run.run_dir / "manifest.json").exists():
        manifest = run.manifest()
        verdict = manifest.get("verdict") or {}
        summary |= {
            "verdict": verdict.get("word"),
            "counts": verdict.get("counts"),
            "failed_gates": [g["name"] for g in verdict.get("gates", []) if not g["passed"]],
            "kernels": {
                side: f"{k['kernel']} ({k['calls']} calls)"
                for side, k in (manifest.get("kernels") or {}).items()
            },
            "placement": (manifest.get("placement") or {}).get("description"),
            "timings": manifest.get("timings"),
            "bad_long_pairs": bad_long_pairs(run),
            "perf": perf_rows(run),
        }
    keep_evidence(run, f"gpu-long {name}", summary, EVIDENCE_FILES)


def keep_evidence(run: RigRun, title: str, summary: dict, files: tuple[str, ...]) -> None:
    """Print `title {summary}` and, with RIG_GPU_EVIDENCE_DIR set, copy the summary and the
    run's `files` there under the run's name, before any assertion."""
    print(f"{title} {json.dumps(summary, default=str)}")
    evidence = os.environ.get("RIG_GPU_EVIDENCE_DIR")
    if evidence:
        folder = Path(evidence) / summary["run"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        for file in files:
            if (run.run_dir / file).exists():
                shutil.copy(run.run_dir / file, folder / file)


def one_gpu_runs(run_rig, scenario: str, reporter):
    """Runs of `scenario` on one GPU (CUDA_VISIBLE_DEVICES), tiny-qwen35 built before the clock
    starts, each reported by `reporter(run, name, wall_s)` before any assertion."""
    env = {"CUDA_VISIBLE_DEVICES": needs_gpus(1)[0]}
    ensure_tiny_qwen35_model()

    def run(name: str, *args: str) -> RigRun:
        started = time.monotonic()
        done = run_rig(*args, scenario=scenario, name=name, env=env)
        reporter(done, name, time.monotonic() - started)
        return done

    return run


@pytest.fixture(scope="module")
def run_long(run_rig):
    return one_gpu_runs(run_rig, SCENARIO, report)


@pytest.fixture(scope="module")
def long_ns4(run_long) -> RigRun:
    return run_long("gpu1-long-ns4")  # fills the golden cache: both sides measured here


@pytest.fixture(scope="module")
def long_aa(long_ns4, run_long) -> RigRun:
    return run_long("gpu1-long-aa", "--set", "candidate.kernel=null")


@pytest.fixture(scope="module")
def long_ns3(long_ns4, run_long) -> RigRun:
    return run_long("gpu1-long-ns3", "--set", "candidate.kernel=ns3")


def test_ns4_passes_with_both_sides_on_one_gpu_and_perf_intervals(long_ns4):
    run = long_ns4
    assert run.returncode == 0, passed(run)
    manifest = run.manifest()
    verdict = manifest["verdict"]
    assert verdict["word"] in EQUIVALENT_WORDS
    assert verdict["counts"]["substantive"] == 0 and verdict["counts"]["pathologies"] == 0
    placement = manifest["placement"]
    assert placement["mode"] == "shared" and placement["phases"] == [["reference", "candidate"]]
    assert_fla_reference(run)
    assert kernel_of(run, "candidate")["kernel"] == "ns4"
    rows = perf_rows(run)
    assert [row["level"] for row in rows] == LEVELS
    assert all(row["repeats"] >= 3 for row in rows)
    ttft = read_csv(run.run_dir / "perf.csv")
    assert all(row["mean_ttft_ms_ci_low_pct"] and row["mean_ttft_ms_ci_high_pct"] for row in ttft)


def test_reference_against_itself_is_identical(long_aa):
    run = long_aa
    assert run.returncode == 0, passed(run)
    assert run.manifest()["verdict"]["word"] == "identical"
    assert kernel_of(run, "candidate")["kernel"] == "vllm-triton"
    assert_fla_reference(run)


def test_ns3_is_caught_on_the_8k_and_10k_token_prompts(long_ns3):
    run = long_ns3
    assert run.returncode == 1, passed(run)
    verdict = run.manifest()["verdict"]
    assert verdict["word"] == "NOT equivalent"
    assert verdict["counts"]["substantive"] + verdict["counts"]["pathologies"] > 0
    assert bad_long_pairs(run) > 0
    assert kernel_of(run, "candidate")["kernel"] == "ns3"
    assert_fla_reference(run)
    assert rig_processes() == []
