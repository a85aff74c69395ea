"""summary.md: the verdict first, JIT-compiled levels flagged, the A/A floor and a planted slowdown
beside their measurements, gates and mismatches, and a size that fits a pull-request comment."""

import dataclasses

import pytest

from kernels.proof import InitialStateCounts
from rig.report import markdown
from rig.report.markdown import SUMMARY_MD_LIMIT, render_markdown
from rig.verdict.initial_state import ChunkedPrefill, PromptChunks
from rig.verdict.perf import PlantedDelay, perf_result
from tests.report.test_files import huge_run


def test_summary_markdown_starts_with_the_verdict(outcome, written):
    lines = written["summary.md"].read_text(encoding="utf-8").splitlines()
    assert lines[0] == "## rig: unit (run-1)"
    first = next(line for line in lines[1:] if line.strip())
    assert first.startswith(f"**Verdict: {outcome.verdict.word}**")
    assert first.endswith("FAIL")


def test_summary_markdown_flags_levels_with_jit_compilation(written):
    text = written["summary.md"].read_text(encoding="utf-8")
    assert "**JIT compilation during timed blocks:** C=4 repeat 0 (reference): left out" in text


def test_summary_markdown_shows_the_aa_performance_floor(outcome):
    reference = [r for r in outcome.records if r.side == "reference" and r.level == 1]
    replay = [dataclasses.replace(r, side="reference-aa") for r in reference]
    perf = perf_result(outcome.records, replay, aa_concurrency=1)
    text = render_markdown(dataclasses.replace(outcome, perf=perf))
    (line,) = [x for x in text.splitlines() if x.startswith("A/A performance floor")]
    # One replay of one level: a block pair, so a ratio and no interval.
    assert line == (
        "A/A performance floor at C=1: TTFT +0.0 % not measured (one block), E2EL +0.0 % not "
        "measured (one block), tok/s +0.0 % not measured (one block)"
    )


def test_summary_markdown_sets_a_planted_slowdown_next_to_its_measurement(outcome):
    records = [
        r if r.side == "reference" else dataclasses.replace(r, ttft_s=r.ttft_s + 0.05)
        for r in outcome.records
        if r.error is None and r.ttft_s is not None
    ]
    requests = sum(r.side == "candidate" for r in records)
    planted = PlantedDelay("ref+delay-25ms", 25.0, {(1, 0): 2 * requests})
    perf = perf_result(records, planted=planted)
    text = render_markdown(dataclasses.replace(outcome, perf=perf))
    (line,) = [x for x in text.splitlines() if x.startswith("Planted slowdown")]
    assert line.startswith(
        "Planted slowdown at C=1: 2.00 GDN prefill calls per request x 25 ms = 50.0 ms per "
        "request. TTFT planted +"
    )
    assert "E2EL planted +" in line and "nan" not in line


def test_summary_markdown_lists_gates_and_mismatches(outcome, written):
    text = written["summary.md"].read_text(encoding="utf-8")
    for gate in outcome.verdict.gates:
        assert f"| {gate.name} |" in text
    assert "`q1`" in text and "`q4`" in text
    assert "`q0`" not in text  # identical pairs are not listed


def test_summary_markdown_marks_gates_pass_and_fail(outcome, written):
    text = written["summary.md"].read_text(encoding="utf-8")
    for gate in outcome.verdict.gates:
        mark = "✓ pass" if gate.passed else "✗ **FAIL**"
        assert f"| {gate.name} | {mark} |" in text
    assert "True" not in text and "None" not in text and "nan" not in text


@pytest.mark.parametrize(
    ("levels", "per_level", "limit"),
    [(1, 5_000, SUMMARY_MD_LIMIT), (100, 1, 8_000)],
)
def test_summary_markdown_fits_a_pr_comment_whatever_the_run_size(
    make_record, tmp_path, monkeypatch, levels, per_level, limit
):
    monkeypatch.setattr(markdown, "SUMMARY_MD_LIMIT", limit)
    outcome = huge_run(make_record, tmp_path, levels, per_level)
    text = render_markdown(outcome)
    assert len(text) <= limit
    lines = text.splitlines()
    assert lines[0] == "## rig: unit (run-1)"
    assert lines[2] == "**Run error:** server died: traceback line (+19999 lines in manifest.json)"
    for gate in outcome.verdict.gates:
        assert f"| {gate.name} |" in text
    assert f"First mismatches, substantive first ({levels * per_level:,} in all):" in text
    assert "more mismatches: see report.html and mismatches.csv" in text
    assert lines[-1] == "Full detail: report.html and mismatches.csv next to this summary " + (
        "(`results/run-1/`)."
    )
    rows_cut = "more per-level rows: see report.html" in text
    assert rows_cut == (limit < SUMMARY_MD_LIMIT)


def test_summary_markdown_shows_initial_state_counts_and_chunks(outcome):
    counts = InitialStateCounts(3, 5, 700, 9, 1000)
    kernels = {
        side: dataclasses.replace(kernel, initial_state=counts if side == "reference" else None)
        for side, kernel in outcome.kernels.items()
    }
    chunked = ChunkedPrefill(256, (PromptChunks("long", 2410, 10), PromptChunks("s", 40, 1)))
    text = render_markdown(dataclasses.replace(outcome, kernels=kernels, chunked_prefill=chunked))
    (line,) = [x for x in text.splitlines() if x.startswith("Kernels:")]
    assert "(10 prefill calls; 5 of 9 sequences from a non-zero state)" in line
    assert "ns4 (10 prefill calls)" in line  # not counted: nothing claimed
    (chunks,) = [x for x in text.splitlines() if x.startswith("Chunked prefill:")]
    assert "1 of 2 prompts take several prefill steps at a budget of 256 tokens" in chunks
    assert "Chunked prefill" not in render_markdown(outcome)
