"""The typed perf records: each metric named once with its unit and direction, and the lookups
every reader uses in place of column names."""

import math

import pytest

from rig.verdict.perf_records import (
    CLIENT_METRICS,
    HEADLINE_METRICS,
    NOT_JUDGED,
    SERVER_METRICS,
    SLOWER,
    Comparison,
    Metric,
    MetricComparison,
    PerfResult,
)
from tests.perf_builders import changed, perf_level


def test_each_metric_carries_its_name_unit_and_direction():
    assert Metric.MEAN_TTFT == "mean_ttft_ms" and f"{Metric.MEAN_TTFT}_word" == "mean_ttft_ms_word"
    assert (Metric.MEAN_TTFT.unit, Metric.MEAN_TTFT.lower_is_better) == ("ms", True)
    assert Metric.TOTAL_TOKEN_THROUGHPUT.unit == "tok/s"
    assert not Metric.TOTAL_TOKEN_THROUGHPUT.lower_is_better
    assert Metric.REQUEST_THROUGHPUT.label == "requests/s"
    assert len(CLIENT_METRICS) == 9 and set(HEADLINE_METRICS) <= set(CLIENT_METRICS)
    assert Metric("gdn_ms_per_call") in SERVER_METRICS
    assert not set(CLIENT_METRICS) & set(SERVER_METRICS)


def test_a_comparison_gives_its_change_and_interval_in_percent():
    slower = MetricComparison(4, Metric.MEAN_E2EL, 1.10, (1.05, 1.20), SLOWER)
    assert slower.change_pct == pytest.approx(10.0)
    assert slower.interval_pct == pytest.approx((5.0, 20.0))
    assert slower.half_width_pct == pytest.approx(10.0)
    faster = MetricComparison(4, Metric.OUTPUT_THROUGHPUT, 1.10, (1.05, 1.20), "faster")
    assert faster.least_slowdown_pct == pytest.approx(-20.0)  # faster: a negative slowdown
    assert faster.most_slowdown_pct == pytest.approx(-5.0)
    none = MetricComparison(4, Metric.MEAN_E2EL, 1.10, None, "not measured (one block)")
    assert none.interval_pct is None and math.isnan(none.half_width_pct)
    assert math.isnan(none.most_slowdown_pct)


def level(number: int, comparison: Comparison, ttft_pct: float):
    ttft = changed(number, Metric.MEAN_TTFT, ttft_pct, (ttft_pct - 10, ttft_pct + 10))
    gdn = changed(number, Metric.GDN_MS_PER_CALL, 100.0, None, NOT_JUDGED, (1.0, 2.0))
    return perf_level(number, ttft, gdn, comparison=comparison, repeats=3)


def test_a_result_is_looked_up_by_level_metric_and_comparison():
    perf = PerfResult(
        (
            level(1, Comparison.CANDIDATE, 0.0),
            level(4, Comparison.CANDIDATE, 20.0),
            level(4, Comparison.AA, -10.0),
        )
    )
    assert [lc.level for lc in perf.candidate] == [1, 4]
    assert [lc.level for lc in perf.aa] == [4]
    assert perf.get(4, Metric.MEAN_TTFT).ratio == pytest.approx(1.2)
    assert perf.get(4, Metric.MEAN_TTFT, Comparison.AA).ratio == pytest.approx(0.9)
    server = perf.get(1, Metric.GDN_MS_PER_CALL)
    assert (server.reference, server.candidate, server.word) == (1.0, 2.0, NOT_JUDGED)
    assert perf.get(16, Metric.MEAN_TTFT) is None  # no such level
    assert perf.get(1, Metric.MEAN_ITL) is None  # not measured there
    assert perf.level(1, Comparison.AA) is None
    assert PerfResult().candidate == () and PerfResult().get(1, Metric.MEAN_TTFT) is None
