import math
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from rig.verdict.intervals import TimingDesign
from rig.verdict.perf import (
    AA,
    CANDIDATE,
    FASTER,
    NOISE,
    ONE_BLOCK,
    PERF_METRICS,
    SLOWER,
    UNEQUAL,
    candidate_rows,
    compare_levels,
    perf_frame,
    word,
    worst_slowdown_pct,
)
from rig.verdict.planted import PlantedDelay
from rig.verdict.student_t import t_quantile


@pytest.fixture
def level(make_record):
    """`level(side, ttfts_s, repeat=0, level=1, gap_s=0.1)`: one repeat, requests sent gap_s
    apart, each with its TTFT, 9 tokens 10 ms apart after the first."""

    def build(side, ttfts, repeat=0, level=1, gap_s=0.1, tokens=10):
        return [
            make_record(
                side,
                f"q{i}",
                index=i,
                level=level,
                repeat=repeat,
                sent_at=1000.0 + i * gap_s,
                ttft_s=ttft,
                itl_s=[0.01] * (tokens - 1),
                e2el_s=ttft + 0.01 * (tokens - 1),
                output_tokens=tokens,
                prompt_tokens=20,
            )
            for i, ttft in enumerate(ttfts)
        ]

    return build


def jittered(n: int, base: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(base * (1 + 0.1 * rng.standard_normal(n)))


def two_repeats(level, side: str, n: int, ttft_s: float, seed: int) -> list:
    return level(side, jittered(n, ttft_s, seed)) + level(
        side, jittered(n, ttft_s, seed + 1), repeat=1
    )


def test_a_planted_slowdown_is_slower_and_its_interval_covers_it(level):
    reference = two_repeats(level, "reference", 200, 0.100, 1)
    candidate = two_repeats(level, "candidate", 200, 0.115, 3)
    (row,) = compare_levels(reference, candidate).to_dict("records")
    assert row["mean_ttft_ms_word"] == SLOWER
    assert row["mean_ttft_ms_ci_low_pct"] < 15.0 < row["mean_ttft_ms_ci_high_pct"]
    assert row["mean_ttft_ms_ci_low"] > 1  # the ratio's interval, same bounds
    assert row["mean_ttft_ms_change_pct"] == pytest.approx((row["mean_ttft_ms_ratio"] - 1) * 100)
    assert row["mean_itl_ms_word"] == NOISE  # decode untouched: ratio exactly 1
    assert row["mean_itl_ms_ratio"] == pytest.approx(1.0)
    assert row["repeats"] == 2 and row["requests"] == 400


def test_the_same_distribution_on_both_sides_is_within_noise(level):
    reference = two_repeats(level, "reference", 100, 0.1, 5)
    candidate = two_repeats(level, "candidate", 100, 0.1, 7)
    (row,) = compare_levels(reference, candidate).to_dict("records")
    for metric in ("mean_ttft_ms", "median_ttft_ms", "mean_e2el_ms", "mean_tpot_ms"):
        assert row[f"{metric}_word"] == NOISE, metric
        assert row[f"{metric}_ci_low_pct"] <= 0 <= row[f"{metric}_ci_high_pct"]


def test_throughput_higher_is_faster(level):
    """The candidate answers in the same time but is sent twice as densely: twice the
    requests per second, oriented the other way from latency."""
    reference = level("reference", [0.1] * 50, gap_s=0.2) + level(
        "reference", [0.1] * 50, repeat=1, gap_s=0.21
    )
    candidate = level("candidate", [0.1] * 50, gap_s=0.1) + level(
        "candidate", [0.1] * 50, repeat=1, gap_s=0.11
    )
    (row,) = compare_levels(reference, candidate).to_dict("records")
    assert row["request_throughput_ratio"] > 1.8
    assert row["request_throughput_word"] == FASTER
    assert row["output_throughput_word"] == FASTER


@pytest.mark.parametrize(
    ("lower_is_better", "low", "high", "expected"),
    [
        (True, 0.8, 0.9, FASTER),
        (True, 1.1, 1.2, SLOWER),
        (True, 0.9, 1.1, NOISE),
        (False, 1.1, 1.2, FASTER),
        (False, 0.8, 0.9, SLOWER),
        (False, math.nan, 1.0, "n/a"),
    ],
)
def test_words_are_oriented_by_metric(lower_is_better, low, high, expected):
    assert word(lower_is_better, low, high) == expected


def test_worst_slowdown_is_the_bound_nearest_to_no_change():
    row = pd.Series(
        {
            "mean_ttft_ms_ci_low_pct": 4.0,
            "mean_ttft_ms_ci_high_pct": 9.0,
            "output_throughput_ci_low_pct": -9.0,
            "output_throughput_ci_high_pct": -4.0,
        }
    )
    assert worst_slowdown_pct(row, "mean_ttft_ms") == 4.0  # at least 4% slower
    assert worst_slowdown_pct(row, "output_throughput") == 4.0  # at least 4% fewer tok/s


def test_levels_are_compared_separately_and_warmup_is_left_out(level, make_record):
    reference = level("reference", [0.1] * 20) + level("reference", [0.1] * 20, level=4)
    candidate = level("candidate", [0.1] * 20) + level("candidate", [0.3] * 20, level=4)
    warm = make_record("candidate", "w", level=1, ttft_s=30.0, e2el_s=31.0, warmup=True)
    frame = compare_levels(reference, candidate + [warm]).set_index("level")
    assert frame.loc[1, "mean_ttft_ms_ratio"] == pytest.approx(1.0)
    assert frame.loc[4, "mean_ttft_ms_ratio"] == pytest.approx(3.0)


def test_cancelled_requests_and_one_sided_levels_are_left_out(level, make_record):
    reference = level("reference", [0.1] * 10)
    cancelled = make_record("candidate", "c", ttft_s=9.0, e2el_s=9.5, error="cancelled: stop")
    frame = perf_frame(reference + level("candidate", [0.1] * 10) + [cancelled])
    assert frame.loc[0, "mean_ttft_ms_ratio"] == pytest.approx(1.0)
    assert perf_frame(reference).empty


def test_a_200_request_level_with_repeats_is_fast(level):
    reference = [r for k in range(3) for r in level("reference", jittered(200, 0.1, k), repeat=k)]
    candidate = [r for k in range(3) for r in level("candidate", jittered(200, 0.1, k + 9), k)]
    started = time.perf_counter()
    frame = compare_levels(reference, candidate)
    assert time.perf_counter() - started < 1.0
    assert {f"{m}_word" for m in PERF_METRICS} <= set(frame.columns)


def test_the_aa_floor_compares_the_replay_with_the_level_it_ran_at(level):
    """The A/A replay carries the first level's labels but ran at C=4: it is compared with the
    reference's C=4 level, as its own row that the gate does not read."""
    reference = level("reference", [0.1] * 20) + level("reference", [0.2] * 20, level=4)
    candidate = level("candidate", [0.1] * 20) + level("candidate", [0.2] * 20, level=4)
    replay = level("reference-aa", [0.2] * 20)
    frame = perf_frame(reference + candidate, replay, aa_concurrency=4)
    assert list(zip(frame["comparison"], frame["level"], strict=True)) == [
        (CANDIDATE, 1),
        (CANDIDATE, 4),
        (AA, 4),
    ]
    assert frame.iloc[2]["mean_ttft_ms_ratio"] == pytest.approx(1.0)
    assert list(candidate_rows(frame)["comparison"]) == [CANDIDATE, CANDIDATE]
    assert len(perf_frame(reference + candidate, replay, aa_concurrency=8)) == 2  # no C=8 level


def test_one_block_pair_is_a_ratio_without_an_interval(level):
    """Requests inside one block share its moment on the machine: they are not independent
    units, so one block pair gives the ratio and no interval, whatever the request count."""
    ttfts = [0.01] * 5 + [1.0]
    (row,) = compare_levels(
        level("reference", ttfts), level("candidate", [t * 1.1 for t in ttfts])
    ).to_dict("records")
    assert row["mean_ttft_ms_ratio"] == pytest.approx(1.1)
    assert row["mean_ttft_ms_word"] == ONE_BLOCK
    assert math.isnan(row["mean_ttft_ms_ci_low_pct"]) and row["unit"] == "block"


def test_unequal_work_gets_no_interval_and_no_word(level):
    """One pair whose outputs differ in length (an empty or a longer answer) makes the level's
    comparison one of unequal work: ratios shown, no interval, no word."""
    reference = two_repeats(level, "reference", 20, 0.1, 1)
    candidate = two_repeats(level, "candidate", 20, 0.1, 1)
    candidate[3] = replace(candidate[3], output_tokens=1, itl_s=[], e2el_s=candidate[3].ttft_s)
    (row,) = compare_levels(reference, candidate).to_dict("records")
    assert row["unequal_pairs"] == 1
    assert {row[f"{m}_word"] for m in PERF_METRICS} == {UNEQUAL}
    assert math.isnan(row["mean_ttft_ms_ci_low"])


def test_blocks_with_a_compilation_are_left_out(level):
    """A block whose time holds a JIT compilation (here 10x the TTFT) never reaches the
    interval: the design names it and the level compares the blocks kept."""
    reference = [r for k in range(3) for r in level("reference", [0.1] * 10, repeat=k)]
    candidate = [
        r for k, ttft in enumerate((1.0, 0.1, 0.1))
        for r in level("candidate", [ttft] * 10, repeat=k)
    ]  # fmt: skip
    timing = TimingDesign(excluded=frozenset({(1, 0)}))
    (row,) = compare_levels(reference, candidate, timing=timing).to_dict("records")
    assert (row["repeats"], row["excluded_blocks"]) == (2, 1)
    assert row["mean_ttft_ms_ratio"] == pytest.approx(1.0)


def test_request_pairs_are_the_unit_where_they_ran_back_to_back(level):
    """At a level measured pair by pair, mean TTFT's interval is the ratio of sums over the
    pairs with its linearised spread, t with pairs - 1 degrees of freedom."""
    rng = np.random.default_rng(4)
    base = 0.05 * np.exp(0.5 * rng.standard_normal(40))
    ref_ttft = base * np.exp(0.05 * rng.standard_normal(40))
    cand_ttft = base * 1.04 * np.exp(0.05 * rng.standard_normal(40))
    reference = level("reference", list(ref_ttft[:20])) + level(
        "reference", list(ref_ttft[20:]), repeat=1
    )
    candidate = level("candidate", list(cand_ttft[:20])) + level(
        "candidate", list(cand_ttft[20:]), repeat=1
    )
    timing = TimingDesign(pair_levels=frozenset({1}))
    (row,) = compare_levels(reference, candidate, timing=timing).to_dict("records")
    influence = cand_ttft / cand_ttft.mean() - ref_ttft / ref_ttft.mean()
    centre = math.log(cand_ttft.sum() / ref_ttft.sum())
    half = t_quantile(0.975, 39) * influence.std(ddof=1) / math.sqrt(40)
    assert row["unit"] == "pair"
    assert row["mean_ttft_ms_ratio"] == pytest.approx(math.exp(centre))
    assert row["mean_ttft_ms_ci_low"] == pytest.approx(math.exp(centre - half), rel=1e-6)
    assert row["mean_ttft_ms_ci_high"] == pytest.approx(math.exp(centre + half), rel=1e-6)


def test_a_sequential_design_takes_the_spread_from_stage_one(level):
    """Stein's procedure: the first blocks fix the spread and its degrees of freedom; later
    blocks move the centre and shrink the interval by their count only, also when the budget
    ended before the blocks Stein's rule asked for."""
    slower = (1.20, 1.24, 1.22, 1.10, 1.40, 1.21)
    reference = [r for k in range(6) for r in level("reference", [0.1] * 10, repeat=k)]
    candidate = [
        r for k, factor in enumerate(slower) for r in level("candidate", [0.1 * factor] * 10, k)
    ]
    logs = np.log(slower)
    resolved = TimingDesign(stage_one_blocks=3, resolution_pct=20.0)
    (row,) = compare_levels(reference, candidate, timing=resolved).to_dict("records")
    half = t_quantile(0.975, 2) * logs[:3].std(ddof=1) / math.sqrt(6)
    assert row["mean_ttft_ms_ratio"] == pytest.approx(math.exp(logs.mean()))
    assert row["mean_ttft_ms_ci_high"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-6)
    budget_ended = TimingDesign(stage_one_blocks=3, resolution_pct=0.1)
    (again,) = compare_levels(reference, candidate, timing=budget_ended).to_dict("records")
    assert again["mean_ttft_ms_ci_high"] == row["mean_ttft_ms_ci_high"]


def test_a_planted_delay_is_sized_from_the_calls_counted_and_the_reference_measured(level):
    """2 GDN prefill calls per request x 20 ms on a 100 ms TTFT: +40 % planted; the candidate
    measured 40 ms slower is `slower` with an interval that holds the planted change. The C=4
    level batches prefills, so nothing is claimed there."""
    reference = two_repeats(level, "reference", 100, 0.100, 1)
    candidate = [
        replace(r, ttft_s=r.ttft_s + 0.040, e2el_s=r.e2el_s + 0.040)
        for r in two_repeats(level, "candidate", 100, 0.100, 1)
    ]
    batched = level("reference", [0.1] * 10, level=4) + level("candidate", [0.1] * 10, level=4)
    calls = {(1, 0): 200, (1, 1): 200, (4, 0): 6}
    planted = PlantedDelay("ref+delay-20ms", 20.0, calls)
    frame = perf_frame(reference + candidate + batched, planted=planted).set_index("level")
    row = frame.loc[1]
    assert (row["planted_calls_per_request"], row["planted_ms_per_request"]) == (2.0, 40.0)
    assert row["mean_ttft_ms_planted_pct"] == pytest.approx(40.0, rel=0.01)
    assert row["mean_ttft_ms_word"] == SLOWER and row["mean_ttft_ms_planted_inside_ci"]
    e2el = 100 + 9 * 10  # ms: TTFT and nine 10-ms gaps
    assert row["mean_e2el_ms_planted_pct"] == pytest.approx(100 * 40 / e2el, rel=0.01)
    assert math.isnan(frame.loc[4, "planted_ms_per_request"])


def test_a_planted_change_outside_the_interval_is_said_to_be_outside(level):
    reference = two_repeats(level, "reference", 100, 0.100, 1)
    candidate = two_repeats(level, "candidate", 100, 0.100, 1)  # the delay never happened
    planted = PlantedDelay("ref+delay-20ms", 20.0, {(1, 0): 200, (1, 1): 200})
    (row,) = perf_frame(reference + candidate, planted=planted).to_dict("records")
    assert row["mean_ttft_ms_word"] == NOISE and not row["mean_ttft_ms_planted_inside_ci"]


def simulated_side(make_record, rng, side, repeats, base_s, drift=0.15):
    """C=1 requests of one side: each repeat slowed or sped up as a whole (the machine's state
    on that side's core; `drift` is its log-normal sigma), each request jittered by 10% and one
    in ten stalled by an exponential 200 ms, as on the shared 2-core machine."""
    records = []
    for repeat in range(repeats):
        factor, sent = np.exp(drift * rng.standard_normal()), 1000.0
        for i, base in enumerate(base_s):
            ttft = base * factor * np.exp(0.1 * rng.standard_normal())
            ttft += rng.exponential(0.2) if rng.random() < 0.1 else 0.0
            itl = [0.012 * factor * np.exp(0.1 * rng.standard_normal())] * 15
            e2el = ttft + sum(itl)
            records.append(
                make_record(side, f"q{i}", index=i, repeat=repeat, sent_at=sent, ttft_s=ttft,
                            itl_s=itl, e2el_s=e2el, output_tokens=16, prompt_tokens=20)
            )  # fmt: skip
            sent += e2el + 0.002
    return records


def test_aa_false_positives_stay_near_five_percent_per_metric_with_few_repeats(make_record):
    """200 simulated A/A runs of 5 repeats x 32 requests whose repeats drift as a whole: each
    metric's interval excludes no change in about 5% of them (the bootstrap over repeats it
    replaced did so for ~20% of the throughputs), and a planted +40 ms on a ~30 ms TTFT is
    `slower` in most of them."""
    trials, false_positives, detected = 200, dict.fromkeys(PERF_METRICS, 0), 0
    for trial in range(trials):
        rng = np.random.default_rng(trial)
        base = 0.03 * np.exp(0.3 * rng.standard_normal(32))
        reference = simulated_side(make_record, rng, "reference", 5, base)
        candidate = simulated_side(make_record, rng, "candidate", 5, base)
        (row,) = compare_levels(reference, candidate).to_dict("records")
        for metric in PERF_METRICS:
            false_positives[metric] += row[f"{metric}_word"] != NOISE
        slowed = simulated_side(make_record, rng, "candidate", 5, base + 0.040)
        (planted,) = compare_levels(reference, slowed).to_dict("records")
        detected += planted["mean_ttft_ms_word"] == SLOWER
    assert max(false_positives.values()) <= 0.09 * trials, false_positives
    assert detected >= 0.7 * trials


def test_the_interval_over_repeats_is_students_t_on_log_ratios(level):
    """Three repeats, the candidate 20%, 25% and 30% slower: the interval is the t interval
    (2 degrees of freedom) around the geometric mean of the three ratios."""
    reference = [r for k in range(3) for r in level("reference", [0.1] * 10, repeat=k)]
    candidate = [
        r for k, slower in enumerate((1.2, 1.25, 1.3))
        for r in level("candidate", [0.1 * slower] * 10, repeat=k)
    ]  # fmt: skip
    (row,) = compare_levels(reference, candidate).to_dict("records")
    logs = np.log([1.2, 1.25, 1.3])
    half = 4.303 * logs.std(ddof=1) / math.sqrt(3)
    assert row["mean_ttft_ms_ratio"] == pytest.approx(math.exp(logs.mean()))
    assert row["mean_ttft_ms_ci_low"] == pytest.approx(math.exp(logs.mean() - half), rel=1e-4)
    assert row["mean_ttft_ms_ci_high"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-4)
    assert row["mean_ttft_ms_word"] == SLOWER
