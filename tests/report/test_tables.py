"""The CSV tables at the report's edge: requests.csv by vLLM's definitions, summary.csv under
`vllm bench serve`'s names from the typed blocks, and perf.csv read back as the very records it
was written from (what benchmarks/perf_control.py reads)."""

import math
from dataclasses import replace

import pandas as pd
import pytest

from rig.report.tables import perf_table, read_perf_table, requests_table, summary_table
from rig.verdict.compare import PairResult
from rig.verdict.metrics import block_summaries
from rig.verdict.perf import perf_result
from rig.verdict.perf_records import (
    NOISE,
    NOT_JUDGED,
    SLOWER,
    Comparison,
    Metric,
    PerfResult,
    PlantedChange,
    PlantedShare,
)
from tests.perf_builders import changed, perf_level, sensitivity
from tests.report_synthetic import synthetic_outcome
from tests.verdict.test_metrics import timed


def test_request_rows_tpot_excludes_the_first_token(make_record):
    frame = requests_table(
        [
            timed(make_record, "reference", "q0", 10.0, 0.2, 1.0, 5, 3, [0.2] * 4),
            timed(make_record, "reference", "q1", 10.0, 0.2, 0.2, 1, 3, []),
            timed(make_record, "reference", "q2", 10.0, 0.2, 1.0, 5, 3, [], error="timeout: x"),
        ]
    ).set_index("request_id")
    # (E2EL - TTFT) / (tokens - 1) = (1.0 - 0.2) / 4 s
    assert frame.loc["q0", "tpot_ms"] == pytest.approx(200.0)
    assert frame.loc["q0", "ttft_ms"] == pytest.approx(200.0)
    assert frame.loc["q0", "e2el_ms"] == pytest.approx(1000.0)
    assert frame.loc["q0", "itl_mean_ms"] == pytest.approx(200.0)
    assert frame.loc["q0", "finished_at"] == pytest.approx(11.0)
    assert pd.isna(frame.loc["q1", "tpot_ms"])  # one token: no time per output token
    assert pd.isna(frame.loc["q2", "tpot_ms"])  # failed
    assert frame["ok"].tolist() == [True, True, False]
    assert frame.loc["q2", "error"] == "timeout: x"


SUMMARY_COLUMNS = [
    "side", "level", "repeat", "requests", "completed", "failed",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "e2el", "itl")
      for s in ("mean", "median", "std", "p90", "p99")),
    "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput",
]  # fmt: skip


def test_summary_csv_keeps_vllm_bench_serves_columns_and_adds_matches_with_pairs(make_record):
    records = [make_record(side, "q0") for side in ("reference", "candidate")]
    plain = summary_table(block_summaries(records))
    assert list(plain.columns) == SUMMARY_COLUMNS
    assert plain["side"].tolist() == ["candidate", "reference"]
    pairs = [PairResult("q0", "p0", 1, 0, 0, True, None, ())]
    paired = summary_table(block_summaries(records, pairs))
    assert list(paired.columns) == [*SUMMARY_COLUMNS, "matches", "pairs"]
    assert paired["matches"].tolist() == [1, 1] and paired["pairs"].tolist() == [1, 1]
    assert summary_table(()).empty


def test_perf_csv_is_rendered_from_the_records_with_its_columns():
    """perf.csv keeps its columns (a user's scripts read them): per metric the ratio, its
    interval, the same in percent and the word; a server metric each side's mean first; a
    planted slowdown its own columns; NaN where there is no interval."""
    ttft = changed(1, Metric.MEAN_TTFT, 10.0, (5.0, 20.0), SLOWER)
    gdn = changed(1, Metric.GDN_MS_PER_CALL, 100.0, None, NOT_JUDGED, (1.5, 3.0))
    planted = PlantedShare(20.0, 40.0, 2.0, (PlantedChange(Metric.MEAN_TTFT, 8.0, True),))
    candidate = replace(perf_level(1, ttft, gdn, repeats=4, excluded=1), planted=planted)
    floor = perf_level(1, replace(ttft, word=NOISE), comparison=Comparison.AA, repeats=1)
    table = perf_table(PerfResult((candidate, floor)))
    assert list(table.columns) == [
        "comparison", "level", "unit", "repeats", "excluded_blocks", "requests",
        "unequal_pairs",
        "mean_ttft_ms_ratio", "mean_ttft_ms_ci_low", "mean_ttft_ms_ci_high",
        "mean_ttft_ms_change_pct", "mean_ttft_ms_ci_low_pct", "mean_ttft_ms_ci_high_pct",
        "mean_ttft_ms_word",
        "gdn_ms_per_call_reference", "gdn_ms_per_call_candidate", "gdn_ms_per_call_ratio",
        "gdn_ms_per_call_ci_low", "gdn_ms_per_call_ci_high", "gdn_ms_per_call_change_pct",
        "gdn_ms_per_call_ci_low_pct", "gdn_ms_per_call_ci_high_pct", "gdn_ms_per_call_word",
        "planted_delay_ms", "planted_ms_per_request", "planted_calls_per_request",
        "mean_ttft_ms_planted_pct", "mean_ttft_ms_planted_inside_ci",
    ]  # fmt: skip
    first, second = table.to_dict("records")
    assert (first["comparison"], second["comparison"]) == ("candidate/reference", "A/A")
    assert first["mean_ttft_ms_ci_low_pct"] == pytest.approx(5.0)
    assert first["mean_ttft_ms_word"] == SLOWER and second["mean_ttft_ms_word"] == NOISE
    assert first["gdn_ms_per_call_change_pct"] == pytest.approx(100.0)
    assert math.isnan(first["gdn_ms_per_call_ci_low"])
    assert first["mean_ttft_ms_planted_inside_ci"] is True
    assert math.isnan(second["gdn_ms_per_call_reference"])
    assert perf_table(PerfResult()).empty


def test_perf_csv_reads_back_as_the_records_it_was_written_from(make_record, tmp_path):
    """Every field, every float exactly, a word pandas would take for NaN ("n/a") kept, a
    metric one level lacks absent there; planted and sensitivity columns rebuilt."""
    outcome, _ = synthetic_outcome(make_record, tmp_path)
    measured = perf_result(outcome.records)
    ttft = changed(1, Metric.MEAN_TTFT, 10.0, (5.0, 20.0), SLOWER)
    odd = changed(1, Metric.MEAN_E2EL, math.nan, None, "n/a")
    gdn = changed(1, Metric.GDN_MS_PER_CALL, 100.0, (40.0, 160.0), NOT_JUDGED, (1.5, 3.0))
    planted = PlantedShare(20.0, 40.0, 2.0, (PlantedChange(Metric.MEAN_TTFT, 8.0, True),))
    level = replace(
        perf_level(1, ttft, odd, gdn, repeats=4, excluded=1),
        planted=planted,
        sensitivity=sensitivity(gdn, (9.0, ttft)),
    )
    floor = perf_level(1, replace(ttft, word=NOISE), comparison=Comparison.AA, repeats=1)
    for perf in (measured, PerfResult((level, floor))):
        path = tmp_path / "perf.csv"
        perf_table(perf).to_csv(path, index=False)
        back = read_perf_table(path)
        assert repr(back) == repr(perf)  # NaN == NaN in a repr, not with ==
    assert read_perf_table(tmp_path / "absent.csv") == PerfResult()
    perf_table(PerfResult()).to_csv(path, index=False)  # a run that compared nothing
    assert read_perf_table(path) == PerfResult()
