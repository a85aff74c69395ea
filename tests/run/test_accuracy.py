"""The accuracy block in whole runs of `python -m rig.run` against two paced stubs attached by
url, each told which questions to answer right (`--answers`): the planted flips come out as
exact counts and p-values in accuracy.csv, summary.md, report.html and the gate; the questions
are records of their own, never timed; `replace_timed_levels` sends them alone."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.rig_process import LiveRig, RigRun

QUESTIONS = 40
RIGHT = set(range(30))  # the reference answers these right


class Stub:
    """`python -m rig.stub.server` answering question i right (`#### 2i`) or wrong (2i + 1)."""

    def __init__(self, folder: Path, name: str, right: set[int]) -> None:
        said = {i: 2 * i if i in right else 2 * i + 1 for i in range(QUESTIONS)}
        answers = {
            f"Question: What is {i} plus {i}?\nAnswer:": f" {i} + {i} = {n}.\n#### {n}"
            for i, n in said.items()
        }
        path = folder / f"{name}-answers.json"
        path.write_text(json.dumps(answers))
        argv = [sys.executable, "-m", "rig.stub.server", "--port", "0", "--ttft-ms", "5"]
        argv += ["--itl-ms", "2", "--tokens", "8", "--answers", str(path)]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        self.url = re.search(r"http://\S+", self.process.stdout.readline())[0]  # type: ignore

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=10)


def accuracy_run(folder: Path, lost: set[int], gained: set[int], **block) -> RigRun:
    questions = folder / "questions.jsonl"
    questions.write_text(
        "".join(
            json.dumps(
                {"id": f"{i:02d}", "question": f"What is {i} plus {i}?", "answer": str(2 * i)}
            )
            + "\n"
            for i in range(QUESTIONS)
        )
    )
    reference = Stub(folder, "reference", RIGHT)
    candidate = Stub(folder, "candidate", (RIGHT - lost) | gained)
    data = {
        "name": "accuracy",
        "model": {"name": "stub/model"},
        "reference": {"url": reference.url},
        "candidate": {"url": candidate.url},
        "workload": {
            "prompts": [{"path": "prompts/prompts.jsonl", "limit": 2}],
            "concurrency": [1],
            "max_tokens": 8,
            "warmup_requests": 0,
        },
        "drift": {"max_requests": 4},
        "accuracy": {"path": str(questions), "shots": 2, "concurrency": 4, **block},
        "results_dir": str(folder / "results"),
    }
    scenario = folder / "accuracy.yaml"
    scenario.write_text(yaml.safe_dump(data))
    try:
        argv = [str(scenario), "--no-cache", "--run-id", "acc"]
        return LiveRig(argv, folder / "results" / "acc").finish()
    finally:
        reference.stop()
        candidate.stop()


@pytest.fixture(scope="module")
def equal_run(tmp_path_factory) -> RigRun:
    """Nine lost, five gained: 30 vs 26 right, McNemar p = 2 * 3473 / 2^14."""
    return accuracy_run(tmp_path_factory.mktemp("equal"), set(range(9)), {30, 31, 32, 33, 34})


@pytest.fixture(scope="module")
def loss_run(tmp_path_factory) -> RigRun:
    """Twelve lost, none gained, the questions alone: p = 2 / 2^12, a loss beyond 0 pt."""
    return accuracy_run(
        tmp_path_factory.mktemp("loss"), set(range(12)), set(), replace_timed_levels=True
    )


def test_planted_flips_give_exact_counts_and_p_value(equal_run):
    run = equal_run
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    table = pd.read_csv(run.run_dir / "accuracy.csv", keep_default_na=False)
    assert len(table) == QUESTIONS
    assert table["reference_right"].sum() == 30 and table["candidate_right"].sum() == 26
    assert sorted(table.loc[table.flip == "lost", "question_id"]) == [
        f"questions-{i:02d}" for i in range(9)
    ]
    assert (table.flip == "gained").sum() == 5
    flips = table[table.flip != ""]
    assert len(flips) == 14 and (flips.div_char_index != "").all()  # each a divergent pair
    assert set(flips.pair_label) <= {"substantive", "near-tie", "unclassified"}
    line = (
        "accuracy: 75.0 % vs 65.0 % (-10.0 pt), flips 9 / 5, McNemar p = 0.42: "
        "no significant change"
    )
    assert line.removeprefix("accuracy: ") in run.read("summary.md")
    gate = run.gate("accuracy")
    assert gate["passed"] and line in gate["detail"]


def test_every_flip_links_to_its_request_pair(equal_run):
    page = equal_run.read("report.html")
    assert '<section id="accuracy">' in page
    for i in range(9):
        request = f"acc-questions-{i:02d}"
        assert f'href="#pair-{request}"' in page and f'id="pair-{request}"' in page


def test_questions_are_records_of_their_own_and_never_timed(equal_run):
    records = equal_run.records()
    questions = [r for r in records if r["task"] is not None]
    assert len(questions) == 2 * QUESTIONS
    assert {(r["level"], r["repeat"]) for r in questions} == {(4, -1)}
    assert len({r["cache_salt"] for r in questions}) == 2 * QUESTIONS
    assert set(pd.read_csv(equal_run.run_dir / "perf.csv")["level"]) == {1}


def test_a_significant_loss_fails_the_accuracy_gate(loss_run):
    run = loss_run
    gate = run.gate("accuracy")
    assert not gate["passed"]
    assert "flips 12 / 0, McNemar p = 0.00049: significant loss" in gate["detail"]
    assert "FAIL" in run.read("summary.md")
    assert {r["task"] is not None for r in run.records()} == {True}  # no timed level ran
