import math
import time
from dataclasses import replace

import numpy as np
import pytest

from rig.verdict.intervals import TimingDesign
from rig.verdict.perf import compare_levels, perf_result, word
from rig.verdict.perf_records import (
    CLIENT_METRICS,
    FASTER,
    NOISE,
    ONE_BLOCK,
    SLOWER,
    UNEQUAL,
    Comparison,
    Metric,
    MetricComparison,
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
    (row,) = compare_levels(reference, candidate)
    ttft = row.get(Metric.MEAN_TTFT)
    assert ttft.word == SLOWER
    assert ttft.interval_pct[0] < 15.0 < ttft.interval_pct[1]
    assert ttft.interval[0] > 1  # the ratio's interval, same bounds
    assert ttft.change_pct == pytest.approx((ttft.ratio - 1) * 100)
    assert row.get(Metric.MEAN_ITL).word == NOISE  # decode untouched: ratio exactly 1
    assert row.get(Metric.MEAN_ITL).ratio == pytest.approx(1.0)
    assert row.repeats == 2 and row.requests == 400


def test_the_same_distribution_on_both_sides_is_within_noise(level):
    reference = two_repeats(level, "reference", 100, 0.1, 5)
    candidate = two_repeats(level, "candidate", 100, 0.1, 7)
    (row,) = compare_levels(reference, candidate)
    for metric in ("mean_ttft_ms", "median_ttft_ms", "mean_e2el_ms", "mean_tpot_ms"):
        assert row.get(metric).word == NOISE, metric
        assert row.get(metric).interval_pct[0] <= 0 <= row.get(metric).interval_pct[1]


def test_throughput_higher_is_faster(level):
    """The candidate answers in the same time but is sent twice as densely: twice the
    requests per second, oriented the other way from latency."""
    reference = level("reference", [0.1] * 50, gap_s=0.2) + level(
        "reference", [0.1] * 50, repeat=1, gap_s=0.21
    )
    candidate = level("candidate", [0.1] * 50, gap_s=0.1) + level(
        "candidate", [0.1] * 50, repeat=1, gap_s=0.11
    )
    (row,) = compare_levels(reference, candidate)
    assert row.get(Metric.REQUEST_THROUGHPUT).ratio > 1.8
    assert row.get(Metric.REQUEST_THROUGHPUT).word == FASTER
    assert row.get(Metric.OUTPUT_THROUGHPUT).word == FASTER


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


def test_the_least_slowdown_is_the_bound_nearest_to_no_change():
    ttft = MetricComparison(1, Metric.MEAN_TTFT, 1.06, (1.04, 1.09), SLOWER)
    tokens = MetricComparison(1, Metric.OUTPUT_THROUGHPUT, 0.94, (0.91, 0.96), SLOWER)
    assert ttft.least_slowdown_pct == pytest.approx(4.0)  # at least 4% slower
    assert tokens.least_slowdown_pct == pytest.approx(4.0)  # at least 4% fewer tok/s
    assert ttft.most_slowdown_pct == pytest.approx(9.0)
    assert tokens.most_slowdown_pct == pytest.approx(9.0)
    assert ttft.half_width_pct == pytest.approx(3.0)
    assert ttft.unit == "ms" and ttft.lower_is_better and not tokens.lower_is_better
    unmeasured = MetricComparison(1, Metric.MEAN_TTFT, 1.06, None, ONE_BLOCK)
    assert math.isnan(unmeasured.least_slowdown_pct) and unmeasured.interval_pct is None


def test_levels_are_compared_separately_and_warmup_is_left_out(level, make_record):
    reference = level("reference", [0.1] * 20) + level("reference", [0.1] * 20, level=4)
    candidate = level("candidate", [0.1] * 20) + level("candidate", [0.3] * 20, level=4)
    warm = make_record("candidate", "w", level=1, ttft_s=30.0, e2el_s=31.0, warmup=True)
    first, fourth = compare_levels(reference, candidate + [warm])
    assert (first.level, fourth.level) == (1, 4)
    assert first.get(Metric.MEAN_TTFT).ratio == pytest.approx(1.0)
    assert fourth.get(Metric.MEAN_TTFT).ratio == pytest.approx(3.0)


def test_cancelled_requests_and_one_sided_levels_are_left_out(level, make_record):
    reference = level("reference", [0.1] * 10)
    cancelled = make_record("candidate", "c", ttft_s=9.0, e2el_s=9.5, error="cancelled: stop")
    perf = perf_result(reference + level("candidate", [0.1] * 10) + [cancelled])
    assert perf.get(1, Metric.MEAN_TTFT).ratio == pytest.approx(1.0)
    assert perf_result(reference).levels == ()


def test_a_200_request_level_with_repeats_is_fast(level):
    reference = [r for k in range(3) for r in level("reference", jittered(200, 0.1, k), repeat=k)]
    candidate = [r for k in range(3) for r in level("candidate", jittered(200, 0.1, k + 9), k)]
    started = time.perf_counter()
    (compared,) = compare_levels(reference, candidate)
    assert time.perf_counter() - started < 1.0
    assert [m.metric for m in compared.metrics] == list(CLIENT_METRICS)


def test_the_aa_floor_compares_the_replay_with_the_level_it_ran_at(level):
    """The A/A replay carries the first level's labels but ran at C=4: it is compared with the
    reference's C=4 level, as its own row that the gate does not read."""
    reference = level("reference", [0.1] * 20) + level("reference", [0.2] * 20, level=4)
    candidate = level("candidate", [0.1] * 20) + level("candidate", [0.2] * 20, level=4)
    replay = level("reference-aa", [0.2] * 20)
    perf = perf_result(reference + candidate, replay, aa_concurrency=4)
    assert [(lc.comparison, lc.level) for lc in perf.levels] == [
        (Comparison.CANDIDATE, 1),
        (Comparison.CANDIDATE, 4),
        (Comparison.AA, 4),
    ]
    assert perf.get(4, Metric.MEAN_TTFT, Comparison.AA).ratio == pytest.approx(1.0)
    assert [lc.level for lc in perf.candidate] == [1, 4] and len(perf.aa) == 1
    no_floor = perf_result(reference + candidate, replay, aa_concurrency=8)  # no C=8 level
    assert len(no_floor.levels) == 2 and no_floor.aa == ()


def test_one_block_pair_is_a_ratio_without_an_interval(level):
    """Requests inside one block share its moment on the machine: they are not independent
    units, so one block pair gives the ratio and no interval, whatever the request count."""
    ttfts = [0.01] * 5 + [1.0]
    (row,) = compare_levels(level("reference", ttfts), level("candidate", [t * 1.1 for t in ttfts]))
    ttft = row.get(Metric.MEAN_TTFT)
    assert ttft.ratio == pytest.approx(1.1)
    assert ttft.word == ONE_BLOCK
    assert ttft.interval is None and row.unit == "block"


def test_unequal_work_gets_no_interval_and_no_word(level):
    """One pair whose outputs differ in length (an empty or a longer answer) makes the level's
    comparison one of unequal work: ratios shown, no interval, no word."""
    reference = two_repeats(level, "reference", 20, 0.1, 1)
    candidate = two_repeats(level, "candidate", 20, 0.1, 1)
    candidate[3] = replace(candidate[3], output_tokens=1, itl_s=[], e2el_s=candidate[3].ttft_s)
    (row,) = compare_levels(reference, candidate)
    assert row.unequal_pairs == 1
    assert {row.get(m).word for m in CLIENT_METRICS} == {UNEQUAL}
    assert row.get(Metric.MEAN_TTFT).interval is None


def test_blocks_with_a_compilation_are_left_out(level):
    """A block whose time holds a JIT compilation (here 10x the TTFT) never reaches the
    interval: the design names it and the level compares the blocks kept."""
    reference = [r for k in range(3) for r in level("reference", [0.1] * 10, repeat=k)]
    candidate = [
        r for k, ttft in enumerate((1.0, 0.1, 0.1))
        for r in level("candidate", [ttft] * 10, repeat=k)
    ]  # fmt: skip
    timing = TimingDesign(excluded=frozenset({(1, 0)}))
    (row,) = compare_levels(reference, candidate, timing=timing)
    assert (row.repeats, row.excluded_blocks) == (2, 1)
    assert row.get(Metric.MEAN_TTFT).ratio == pytest.approx(1.0)


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
    (row,) = compare_levels(reference, candidate, timing=timing)
    influence = cand_ttft / cand_ttft.mean() - ref_ttft / ref_ttft.mean()
    centre = math.log(cand_ttft.sum() / ref_ttft.sum())
    half = t_quantile(0.975, 39) * influence.std(ddof=1) / math.sqrt(40)
    assert row.unit == "pair"
    assert row.get(Metric.MEAN_TTFT).ratio == pytest.approx(math.exp(centre))
    assert row.get(Metric.MEAN_TTFT).interval[0] == pytest.approx(math.exp(centre - half), rel=1e-6)
    assert row.get(Metric.MEAN_TTFT).interval[1] == pytest.approx(math.exp(centre + half), rel=1e-6)


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
    (row,) = compare_levels(reference, candidate, timing=resolved)
    ttft = row.get(Metric.MEAN_TTFT)
    half = t_quantile(0.975, 2) * logs[:3].std(ddof=1) / math.sqrt(6)
    assert ttft.ratio == pytest.approx(math.exp(logs.mean()))
    assert ttft.interval[1] == pytest.approx(math.exp(logs.mean() + half), rel=1e-6)
    budget_ended = TimingDesign(stage_one_blocks=3, resolution_pct=0.1)
    (again,) = compare_levels(reference, candidate, timing=budget_ended)
    assert again.get(Metric.MEAN_TTFT).interval[1] == ttft.interval[1]


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
    perf = perf_result(reference + candidate + batched, planted=planted)
    row = perf.level(1)
    assert (row.planted.calls_per_request, row.planted.ms_per_request) == (2.0, 40.0)
    ttft, e2el_change = row.planted.changes
    assert ttft.metric == Metric.MEAN_TTFT and e2el_change.metric == Metric.MEAN_E2EL
    assert ttft.planted_pct == pytest.approx(40.0, rel=0.01)
    assert row.get(Metric.MEAN_TTFT).word == SLOWER and ttft.inside_interval
    e2el = 100 + 9 * 10  # ms: TTFT and nine 10-ms gaps
    assert e2el_change.planted_pct == pytest.approx(100 * 40 / e2el, rel=0.01)
    assert perf.level(4).planted is None


def test_a_planted_change_outside_the_interval_is_said_to_be_outside(level):
    reference = two_repeats(level, "reference", 100, 0.100, 1)
    candidate = two_repeats(level, "candidate", 100, 0.100, 1)  # the delay never happened
    planted = PlantedDelay("ref+delay-20ms", 20.0, {(1, 0): 200, (1, 1): 200})
    (row,) = perf_result(reference + candidate, planted=planted).levels
    assert row.get(Metric.MEAN_TTFT).word == NOISE
    assert not row.planted.changes[0].inside_interval


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
    trials, false_positives, detected = 200, dict.fromkeys(CLIENT_METRICS, 0), 0
    for trial in range(trials):
        rng = np.random.default_rng(trial)
        base = 0.03 * np.exp(0.3 * rng.standard_normal(32))
        reference = simulated_side(make_record, rng, "reference", 5, base)
        candidate = simulated_side(make_record, rng, "candidate", 5, base)
        (row,) = compare_levels(reference, candidate)
        for metric in CLIENT_METRICS:
            false_positives[metric] += row.get(metric).word != NOISE
        slowed = simulated_side(make_record, rng, "candidate", 5, base + 0.040)
        (planted,) = compare_levels(reference, slowed)
        detected += planted.get(Metric.MEAN_TTFT).word == SLOWER
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
    (row,) = compare_levels(reference, candidate)
    ttft = row.get(Metric.MEAN_TTFT)
    logs = np.log([1.2, 1.25, 1.3])
    half = 4.303 * logs.std(ddof=1) / math.sqrt(3)
    assert ttft.ratio == pytest.approx(math.exp(logs.mean()))
    assert ttft.interval[0] == pytest.approx(math.exp(logs.mean() - half), rel=1e-4)
    assert ttft.interval[1] == pytest.approx(math.exp(logs.mean() + half), rel=1e-4)
    assert ttft.word == SLOWER
