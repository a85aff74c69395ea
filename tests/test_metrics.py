import math

import numpy as np
import pandas as pd
import pytest

from rig.compare import PairResult
from rig.metrics import DELTA_METRICS, delta_frame, request_frame, summary_frame


def timed(make_record, side, request_id, sent_at, ttft, e2el, out, prompt, itl, **fields):
    return make_record(
        side,
        request_id,
        sent_at=sent_at,
        ttft_s=ttft,
        e2el_s=e2el,
        output_tokens=out,
        prompt_tokens=prompt,
        itl_s=itl,
        **fields,
    )


@pytest.fixture
def level_records(make_record):
    """Four answered requests and one failed one on the reference at C=1, repeat 0."""
    return [
        timed(make_record, "reference", "q0", 1000.0, 0.010, 1.0, 5, 10, [0.1, 0.2]),
        timed(make_record, "reference", "q1", 1000.5, 0.020, 2.0, 3, 20, [0.3]),
        timed(make_record, "reference", "q2", 1000.25, 0.030, 0.5, 4, 5, [0.4, 0.5]),
        timed(make_record, "reference", "q3", 1001.0, 0.040, 1.0, 2, 5, []),
        timed(
            make_record,
            "reference",
            "q4",
            1000.75,
            5.0,
            None,
            None,
            None,
            [9.0],
            error="http_500: boom",
            text="",
        ),
    ]


# --- one row per request -----------------------------------------------------------------------


def test_request_frame_tpot_excludes_the_first_token(make_record):
    frame = request_frame(
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


# --- one row per side, level and repeat --------------------------------------------------------


def test_summary_percentiles_and_throughput(level_records):
    (row,) = summary_frame(level_records).to_dict("records")
    assert (row["side"], row["level"], row["repeat"]) == ("reference", 1, 0)
    assert (row["requests"], row["ok"], row["failed"]) == (5, 4, 1)
    # TTFT 10, 20, 30, 40 ms (the failed request's 5 s is left out)
    assert row["ttft_mean_ms"] == pytest.approx(25.0)
    assert row["ttft_p50_ms"] == pytest.approx(25.0)
    assert row["ttft_p90_ms"] == pytest.approx(37.0)  # 30 + 0.7 * 10
    assert row["ttft_p99_ms"] == pytest.approx(39.7)
    # E2EL 500, 1000, 1000, 2000 ms
    assert row["e2el_mean_ms"] == pytest.approx(1125.0)
    assert row["e2el_p50_ms"] == pytest.approx(1000.0)
    assert row["e2el_p90_ms"] == pytest.approx(1700.0)
    assert row["e2el_p99_ms"] == pytest.approx(1970.0)
    # TPOT (E2EL - TTFT) / (out - 1): 990/4, 1980/2, 470/3, 960/1 ms
    tpots = [990 / 4, 1980 / 2, 470 / 3, 960 / 1]
    assert row["tpot_mean_ms"] == pytest.approx(sum(tpots) / 4)
    # ITL: every gap of the answered requests, 100 ... 500 ms
    assert row["itl_mean_ms"] == pytest.approx(300.0)
    assert row["itl_p90_ms"] == pytest.approx(460.0)
    assert row["itl_p99_ms"] == pytest.approx(496.0)
    # first send 1000.0, last finish 1000.5 + 2.0: 2.5 s for 4 answers, 14 out + 40 prompt tokens
    assert row["duration_s"] == pytest.approx(2.5)
    assert row["request_throughput"] == pytest.approx(4 / 2.5)
    assert row["output_throughput"] == pytest.approx(14 / 2.5)
    assert row["total_throughput"] == pytest.approx(54 / 2.5)


def test_summary_has_one_row_per_side_level_and_repeat(level_records, make_record):
    more = [
        timed(make_record, "candidate", "q0", 1000.0, 0.01, 1.0, 5, 10, [0.1]),
        timed(make_record, "candidate", "x0", 2000.0, 0.01, 1.0, 5, 10, [0.1], level=4),
        timed(make_record, "candidate", "x1", 3000.0, 0.01, 1.0, 5, 10, [0.1], level=4, repeat=1),
    ]
    summary = summary_frame(level_records + more)
    keys = list(zip(summary["side"], summary["level"], summary["repeat"], strict=True))
    assert sorted(keys) == [("candidate", 1, 0), ("candidate", 4, 0), ("candidate", 4, 1)] + [
        ("reference", 1, 0)
    ]
    assert summary["requests"].sum() == 8


def test_summary_of_an_all_failed_level_has_no_throughput(make_record):
    failed = [make_record("reference", "q0", error="timeout: x", e2el_s=None, ttft_s=None)]
    (row,) = summary_frame(failed).to_dict("records")
    assert (row["ok"], row["failed"]) == (0, 1)
    assert math.isnan(row["ttft_mean_ms"]) and math.isnan(row["request_throughput"])


def test_summary_of_nothing_is_empty():
    assert summary_frame([]).empty


def pair(request_id: str, level: int, repeat: int, identical: bool) -> PairResult:
    return PairResult(request_id, "p", level, repeat, 0, identical, None, ())


def test_match_counts_are_merged_per_level_and_repeat(make_record):
    records = [
        timed(make_record, side, f"q{i}", 1000.0, 0.01, 1.0, 3, 3, [], level=level)
        for side in ("reference", "candidate")
        for i, level in enumerate((1, 1, 1, 1, 4))
    ]
    pairs = [pair(f"q{i}", 1, 0, i != 2) for i in range(4)] + [pair("q4", 4, 0, True)]
    summary = summary_frame(records, pairs)
    candidate = summary[summary["side"] == "candidate"].set_index("level")
    assert (candidate.loc[1, "matches"], candidate.loc[1, "pairs"]) == (3, 4)
    assert (candidate.loc[4, "matches"], candidate.loc[4, "pairs"]) == (1, 1)


# --- candidate vs reference --------------------------------------------------------------------


def summary_rows(side: str, level: int, values: dict[str, list[float]]) -> list[dict]:
    """One row per repeat; `values` gives each metric's per-repeat values (others: 1.0)."""
    repeats = len(next(iter(values.values())))
    rows = []
    for repeat in range(repeats):
        row = {"side": side, "level": level, "repeat": repeat}
        row.update({metric: 1.0 for metric in DELTA_METRICS})
        row.update({metric: series[repeat] for metric, series in values.items()})
        rows.append(row)
    return rows


def test_delta_sign_is_positive_when_the_candidate_is_better():
    summary = pd.DataFrame(
        summary_rows("reference", 1, {"ttft_mean_ms": [100.0], "output_throughput": [10.0]})
        + summary_rows("candidate", 1, {"ttft_mean_ms": [90.0], "output_throughput": [9.0]})
    )
    (row,) = delta_frame(summary).to_dict("records")
    assert row["ttft_mean_ms_delta_pct"] == pytest.approx(10.0)  # 10% faster first token
    assert row["output_throughput_delta_pct"] == pytest.approx(-10.0)  # 10% fewer tokens/s
    assert row["e2el_mean_ms_delta_pct"] == pytest.approx(0.0)
    assert row["ttft_mean_ms_verdict"] == "single run"
    assert row["repeats"] == 1


def test_with_repeats_a_change_beyond_the_spread_is_better_or_worse():
    summary = pd.DataFrame(
        summary_rows(
            "reference", 8, {"ttft_mean_ms": [100.0, 102.0], "total_throughput": [10.0, 10.2]}
        )
        + summary_rows(
            "candidate", 8, {"ttft_mean_ms": [90.0, 92.0], "total_throughput": [9.0, 9.2]}
        )
    )
    (row,) = delta_frame(summary).to_dict("records")
    assert row["repeats"] == 2
    assert row["ttft_mean_ms_delta_pct"] == pytest.approx(10 / 101 * 100)
    assert row["ttft_mean_ms_spread_pct"] == pytest.approx(2 / 91 * 100)  # the wider side
    assert row["ttft_mean_ms_verdict"] == "better"
    assert row["total_throughput_delta_pct"] == pytest.approx(-1 / 10.1 * 100)
    assert row["total_throughput_verdict"] == "worse"


def test_with_repeats_a_change_inside_the_spread_is_noise():
    summary = pd.DataFrame(
        summary_rows("reference", 2, {"e2el_mean_ms": [100.0, 110.0]})
        + summary_rows("candidate", 2, {"e2el_mean_ms": [98.0, 108.0]})
    )
    (row,) = delta_frame(summary).to_dict("records")
    assert row["e2el_mean_ms_delta_pct"] == pytest.approx(2 / 105 * 100)  # 1.9% better ...
    assert row["e2el_mean_ms_spread_pct"] == pytest.approx(10 / 103 * 100)  # ... inside 9.7%
    assert row["e2el_mean_ms_verdict"] == "noise"
    assert row["request_throughput_verdict"] == "noise"  # 0% change, 0% spread


def test_delta_per_level():
    summary = pd.DataFrame(
        summary_rows("reference", 1, {"tpot_mean_ms": [10.0]})
        + summary_rows("candidate", 1, {"tpot_mean_ms": [20.0]})
        + summary_rows("reference", 4, {"tpot_mean_ms": [10.0]})
        + summary_rows("candidate", 4, {"tpot_mean_ms": [5.0]})
    )
    deltas = delta_frame(summary).set_index("level")
    assert deltas.loc[1, "tpot_mean_ms_delta_pct"] == pytest.approx(-100.0)
    assert deltas.loc[4, "tpot_mean_ms_delta_pct"] == pytest.approx(50.0)


@pytest.mark.parametrize("reference_value", [0.0, np.nan])
def test_delta_against_zero_or_missing_is_not_available(reference_value):
    summary = pd.DataFrame(
        summary_rows("reference", 1, {"ttft_mean_ms": [reference_value]})
        + summary_rows("candidate", 1, {"ttft_mean_ms": [5.0]})
    )
    (row,) = delta_frame(summary).to_dict("records")
    assert math.isnan(row["ttft_mean_ms_delta_pct"])
    assert row["ttft_mean_ms_verdict"] == "n/a"


def test_no_deltas_without_both_sides():
    only_reference = pd.DataFrame(summary_rows("reference", 1, {"ttft_mean_ms": [1.0]}))
    assert delta_frame(only_reference).empty
    assert delta_frame(pd.DataFrame()).empty


def test_deltas_from_real_records(level_records, make_record):
    """summary_frame feeds delta_frame: a candidate twice as fast to the first token."""
    candidate = [
        make_record(
            "candidate",
            r.request_id,
            sent_at=r.sent_at,
            ttft_s=None if r.ttft_s is None else r.ttft_s / 2,
            e2el_s=r.e2el_s,
            output_tokens=r.output_tokens,
            prompt_tokens=r.prompt_tokens,
            itl_s=r.itl_s,
            error=r.error,
        )
        for r in level_records
    ]
    (row,) = delta_frame(summary_frame(level_records + candidate)).to_dict("records")
    assert row["ttft_mean_ms_delta_pct"] == pytest.approx(50.0)
    assert row["e2el_mean_ms_delta_pct"] == pytest.approx(0.0)
    assert row["request_throughput_delta_pct"] == pytest.approx(0.0)
