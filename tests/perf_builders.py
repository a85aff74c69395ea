"""Typed perf records built for tests: a metric changed by a given percent with its interval,
and a level of such metrics, as rig/verdict/perf.py would hand them on."""

from rig.verdict.perf_records import (
    NOISE,
    Comparison,
    KernelSensitivity,
    LevelComparison,
    Metric,
    MetricComparison,
    PlantedChange,
    PlantedShare,
    Prediction,
)


def changed(
    level: int,
    metric: Metric,
    point: float,
    interval: tuple[float, float] | None = None,
    word: str = NOISE,
    sides: tuple[float, float] | None = None,
) -> MetricComparison:
    """`metric` at `level` changed by `point` percent, its interval [low, high] in percent
    (None: no interval), and for a server metric each side's mean."""
    ratio_interval = None if interval is None else tuple(1 + bound / 100 for bound in interval)
    reference, candidate = sides if sides is not None else (None, None)
    return MetricComparison(
        level, metric, 1 + point / 100, ratio_interval, word, reference, candidate
    )


def perf_level(
    level: int,
    *metrics: MetricComparison,
    comparison: Comparison = Comparison.CANDIDATE,
    repeats: int = 2,
    excluded: int = 0,
) -> LevelComparison:
    return LevelComparison(comparison, level, "block", repeats, excluded, 10 * repeats, 0, metrics)


def planted(*changes: tuple[Metric, float, bool], delay_ms: float = 50.0) -> PlantedShare:
    """A delay of `delay_ms` per call at 2 calls a request, planting (metric, percent, inside
    the measured interval) each."""
    return PlantedShare(delay_ms, 2 * delay_ms, 2.0, tuple(PlantedChange(*c) for c in changes))


def sensitivity(kernel: MetricComparison, *measured: tuple[float, MetricComparison]):
    """The GDN time per call `kernel` at 3 calls a request and 12.5 % of the reference's time,
    predicting (percent, the measured comparison) each."""
    predictions = tuple(Prediction(m.metric, pct, m) for pct, m in measured)
    return KernelSensitivity(kernel.level, kernel, 3.0, 12.5, predictions)
