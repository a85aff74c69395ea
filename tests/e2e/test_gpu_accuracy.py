"""The accuracy block alone catches ns3 on tiny-qwen35 with vLLM's CUDA build, the text gates
off (`pytest -m gpu -s tests/e2e/test_gpu_accuracy.py`, under 4 minutes on one H100/H200).

tiny-qwen35 scores about 0 on GSM8K, so the graded questions here are 40 made-up sums whose
answer is the number the reference itself writes: a first run, the reference against itself,
answers them; its flexible answers become the key. The second run is FLA against ns3, whose
outputs on this model are empty (docs/gpu-long.md): every question the reference answers is
lost, and the exact McNemar test fails the run though the substantive-divergence, drift and
pathology gates are turned off (the unclassified-divergence gate has no switch; the printed
gates say whether it fired too). Each run prints `gpu-accuracy <name> {json}` and, with
RIG_GPU_EVIDENCE_DIR set, copies its evidence there before any assertion.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest

from rig.models.tiny_qwen35 import ensure_tiny_qwen35_model

from .conftest import RigRun
from .test_gpu import needs_gpus
from .test_gpu_long import keep_evidence

pytestmark = pytest.mark.gpu

SCENARIO = "scenarios/accuracy.yaml"
QUESTIONS = 40
EVIDENCE = ("accuracy.csv", "summary.md", "manifest.json")
TEXT_GATES_OFF = (
    "gates.max_substantive_divergences=100000",
    "gates.max_pathologies=100000",
    "gates.max_mean_drift=null",
)


def block(path: Path) -> list[str]:
    sets = [
        "model.name=tiny-qwen35",
        "model.enforce_eager=true",  # no CUDA graphs to capture: two runs within 4 minutes
        f"accuracy.path={path}",
        "accuracy.answer=flexible",
        "accuracy.replace_timed_levels=true",
        "accuracy.max_tokens=32",
        "accuracy.concurrency=40",
        *TEXT_GATES_OFF,
    ]
    return [arg for value in sets for arg in ("--set", value)]


@pytest.fixture(scope="module")
def runs(run_rig, tmp_path_factory):
    env = {"CUDA_VISIBLE_DEVICES": needs_gpus(1)[0]}
    ensure_tiny_qwen35_model()
    folder = tmp_path_factory.mktemp("gpu-accuracy")
    sums = folder / "sums.jsonl"
    sums.write_text(
        "".join(
            json.dumps({"id": i, "question": f"What is {i} plus {2 * i + 1}?", "answer": "0"})
            + "\n"
            for i in range(QUESTIONS)
        )
    )

    def run(name: str, path: Path, *args: str) -> RigRun:
        started = time.monotonic()
        done = run_rig(*block(path), *args, "--no-cache", scenario=SCENARIO, name=name, env=env)
        summary = {
            "run": name,
            "exit": done.returncode,
            "wall_s": round(time.monotonic() - started),
        }
        if (done.run_dir / "manifest.json").exists():
            gates = done.manifest()["verdict"]["gates"]
            summary |= {"gates": {g["name"]: [g["passed"], g["detail"][:300]] for g in gates}}
        keep_evidence(done, f"gpu-accuracy {name}", summary, EVIDENCE)
        return done

    aa = run("aa", sums, "--set", "candidate.kernel=null")
    with open(aa.run_dir / "accuracy.csv", encoding="utf-8") as handle:
        said = {row["question_id"]: row["reference_flexible"] for row in csv.DictReader(handle)}
    key = folder / "key.jsonl"
    rows = [
        {"id": qid.removeprefix("sums-"), "question": q["question"], "answer": said[qid]}
        for q in map(json.loads, sums.read_text().splitlines())
        if (qid := f"sums-{q['id']}") in said and said[qid] != "[invalid]"
    ]
    key.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return aa, rows, run("ns3", key, "--set", "candidate.kernel=ns3")


def test_ns3_is_caught_by_accuracy_alone(runs):
    aa, rows, ns3 = runs
    assert aa.returncode in (0, 1), aa.stderr[-2000:]
    assert len(rows) >= 6, f"the reference wrote a number in {len(rows)} answers: too few flips"
    gates = {g["name"]: g for g in ns3.manifest()["verdict"]["gates"]}
    assert not gates["accuracy"]["passed"] and "significant loss" in gates["accuracy"]["detail"]
    turned_off = {"pathologies", "teacher-forced drift", "substantive divergences"}
    assert all(gates[name]["passed"] for name in turned_off & set(gates)), gates
    assert ns3.returncode == 1
