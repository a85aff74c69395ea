"""What the kernel's own time predicts end to end (rig.verdict.sensitivity), and the sentence
that says a served configuration hides the kernel: where kernel and end-to-end time disagree,
and not where they agree."""

from dataclasses import replace

import pytest

from rig.records import ServerDelta
from rig.verdict.perf_records import FASTER, NOISE, SLOWER, Metric, PerfResult
from rig.verdict.sensitivity import level_sensitivity
from rig.verdict.speed import SpeedDesign, speed_headline
from tests.perf_builders import changed, perf_level

HIDES = "hides the kernel"


def block(make_record, level, sends_s, e2els_ms, repeat=0, ttft_ms=None):
    """One reference block at `level`: request i sent at sends_s[i] (s), its E2EL e2els_ms[i]
    (ms), its TTFT `ttft_ms` (default half its E2EL)."""
    return [
        make_record(
            "reference",
            f"c{level}-r{repeat}-{i:04d}",
            level=level,
            repeat=repeat,
            sent_at=1000.0 + sent,
            ttft_s=(e2el / 2 if ttft_ms is None else ttft_ms) / 1000,
            e2el_s=e2el / 1000,
        )
        for i, (sent, e2el) in enumerate(zip(sends_s, e2els_ms, strict=True))
    ]


def timed(make_record, level: int, ttft_ms: float, e2el_ms: float, repeats=(0, 1)):
    """Four reference requests a block, sent together, each with the given TTFT and E2EL."""
    return [
        record
        for repeat in repeats
        for record in block(make_record, level, [0.0] * 4, [e2el_ms] * 4, repeat, ttft_ms)
    ]


def deltas(level: int, calls_per_block: int, repeats=(0, 1)) -> list[ServerDelta]:
    return [
        ServerDelta(side, level, repeat, 0.0, 0.0, gdn_prefill_calls=calls_per_block)
        for repeat in repeats
        for side in ("reference", "candidate")
    ]


def level_with(gdn, ttft, throughput, level=1):
    """A level: GDN per call (ms ref, ms cand, interval %), TTFT and throughput (point %,
    interval %, word)."""
    ref_ms, cand_ms, interval = gdn
    change = 100 * (cand_ms / ref_ms - 1)
    return perf_level(
        level,
        changed(level, Metric.MEAN_TTFT, *ttft),
        changed(level, Metric.TOTAL_TOKEN_THROUGHPUT, *throughput),
        changed(level, Metric.GDN_MS_PER_CALL, change, interval, sides=(ref_ms, cand_ms)),
    )


# A kernel 1.4 ms a call slower on the GPU, 3 calls a request (three GDN layers), at C=1 with a
# 35 ms TTFT and a 60 ms E2EL: 4.2 ms more a request, TTFT +12 %, throughput -6.5 %.
SLOWER_KERNEL = (0.98, 2.38, (140.0, 148.0))


def test_a_slower_kernel_headlined_faster_gets_the_sentence(make_record):
    """The shape of the host-bound H200 run: GDN +143 % a call, TTFT and throughput faster."""
    level = level_with(SLOWER_KERNEL, (-6.8, (-8.8, -4.7), FASTER), (6.5, (3.8, 9.2), FASTER))
    found = level_sensitivity(level, timed(make_record, 1, 35.0, 60.0), deltas(1, 12))
    assert found.calls_per_request == 3
    ttft, throughput = found.predictions
    assert ttft.predicted_pct == pytest.approx(100 * 3 * 1.4 / 35.0)
    assert throughput.predicted_pct == pytest.approx(-100 * (4.2 / 60) / (1 + 4.2 / 60))
    assert found.gdn_share_pct == pytest.approx(100 * 3 * 0.98 / 60)
    assert found.kernel_direction == SLOWER and found.hides_kernel
    assert found.describe().endswith("its speed word does not speak for the kernel")
    perf = PerfResult((replace(level, sensitivity=found),))
    headline = speed_headline(perf, SpeedDesign(True))
    assert "faster at C1" in headline and f"{HIDES} at C1" in headline


def test_a_slower_kernel_that_shows_end_to_end_gets_no_sentence(make_record):
    """GPU-bound: the TTFT grew by what the kernel predicts, throughput fell."""
    level = level_with(SLOWER_KERNEL, (11.0, (9.5, 12.6), SLOWER), (-6.0, (-7.2, -4.9), SLOWER))
    found = level_sensitivity(level, timed(make_record, 1, 35.0, 60.0), deltas(1, 12))
    assert not found.hides_kernel and all(p.inside for p in found.predictions)
    perf = PerfResult((replace(level, sensitivity=found),))
    assert HIDES not in speed_headline(perf, SpeedDesign(True))


def test_within_noise_where_the_interval_holds_the_prediction_is_no_contradiction(make_record):
    """Too few blocks to resolve the effect is not the configuration hiding the kernel."""
    level = level_with(SLOWER_KERNEL, (4.0, (-9.0, 17.0), NOISE), (-2.0, (-9.0, 5.0), NOISE))
    found = level_sensitivity(level, timed(make_record, 1, 35.0, 60.0), deltas(1, 12))
    assert not found.hides_kernel


def test_within_noise_where_a_tight_interval_excludes_the_prediction_hides_it(make_record):
    level = level_with(SLOWER_KERNEL, (0.2, (-1.0, 1.4), NOISE), (-0.1, (-1.1, 0.9), NOISE))
    found = level_sensitivity(level, timed(make_record, 1, 35.0, 60.0), deltas(1, 12))
    assert found.hides_kernel


def test_a_kernel_within_its_own_noise_predicts_but_claims_nothing(make_record):
    level = level_with(
        (1.0, 1.01, (-2.0, 4.0)), (-6.0, (-8.0, -4.0), FASTER), (5.0, (3, 7), FASTER)
    )
    found = level_sensitivity(level, timed(make_record, 1, 35.0, 60.0), deltas(1, 12))
    assert found.kernel_direction is None and not found.hides_kernel


def test_above_c1_every_step_stretches_by_the_calls_time(make_record):
    """C=16 held throughout: four waves of 16 back to back, 2 s E2EL each, 0.5 calls a request
    (prefills batched): 125 ms of wall time a request, E2EL / C."""
    level = level_with(SLOWER_KERNEL, (1.0, (0, 2), NOISE), (-1.0, (-2, 0), NOISE), level=16)
    records = [
        r
        for repeat in (0, 1)
        for r in block(make_record, 16, [2.0 * (i // 16) for i in range(64)], [2000.0] * 64, repeat)
    ]
    found = level_sensitivity(level, records, deltas(16, 32))
    stretch = 0.5 * 1.4 / 125.0
    assert stretch == pytest.approx(16 * 0.5 * 1.4 / 2000.0)
    ttft, throughput = found.predictions
    assert ttft.predicted_pct == pytest.approx(100 * stretch)
    assert throughput.predicted_pct == pytest.approx(-100 * stretch / (1 + stretch))
    assert found.gdn_share_pct == pytest.approx(100 * 0.5 * 0.98 / 125.0)


def test_a_block_sent_at_once_drains_and_is_predicted_from_its_span(make_record):
    """The H100 run's shape at C=200 (2026-12-07): 200 requests sent at once, answered one
    after another every 34.4 ms, so about 100 are in flight on average, not 200. The span
    (6.88 s, 34.4 ms a request) predicts the stretch; E2EL / C (17.3 ms) predicted twice it."""
    level = level_with((1.91, 2.57, (33.0, 35.5)), (2.9, (0.6, 5.3), SLOWER),
                       (-3.0, (-4.0, -2.0), SLOWER), level=200)  # fmt: skip
    records = block(make_record, 200, [0.0] * 200, [34.4 * (i + 1) for i in range(200)])
    found = level_sensitivity(level, records, deltas(200, 396, repeats=(0,)))
    added_ms = 1.98 * (2.57 - 1.91)
    ttft, throughput = found.predictions
    assert ttft.predicted_pct == pytest.approx(100 * added_ms / 34.4)
    assert throughput.predicted_pct == pytest.approx(
        -100 * (added_ms / 34.4) / (1 + added_ms / 34.4)
    )
    mean_e2el_ms = 34.4 * 100.5
    assert ttft.predicted_pct == pytest.approx(0.5 * 100 * 200 * added_ms / mean_e2el_ms, rel=0.01)
    assert ttft.inside and throughput.inside and not found.hides_kernel


def test_no_gdn_time_no_sensitivity(make_record):
    level = perf_level(1, changed(1, Metric.MEAN_TTFT, 1.0, (0, 2), NOISE))
    assert level_sensitivity(level, timed(make_record, 1, 35.0, 60.0), deltas(1, 12)) is None


def test_a_run_whose_timings_are_not_comparable_shows_no_sensitivity(make_record):
    from rig.verdict.speed import apply_design

    level = level_with(SLOWER_KERNEL, (-6.8, (-8.8, -4.7), FASTER), (6.5, (3.8, 9.2), FASTER))
    found = level_sensitivity(level, timed(make_record, 1, 35.0, 60.0), deltas(1, 12))
    perf = PerfResult((replace(level, sensitivity=found),))
    golden = SpeedDesign(False, "not comparable (reference from the golden cache)")
    assert apply_design(perf, golden).candidate[0].sensitivity is None
