"""The performance verdict as typed records: per level and metric the candidate/reference ratio,
its interval, the change in percent and the word. rig/verdict/perf.py computes them once; the
gates, the speed word and every report file read them, none by a column name. The metrics are
named here, once, each with its unit and which way is better."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

FASTER, SLOWER, NOISE = "faster", "slower", "within noise"
UNEQUAL = "not comparable: outputs differ"
ONE_BLOCK = "not measured (one block)"
NOT_JUDGED = "not judged"  # the word of a metric outside the family
BLOCK, PAIR = "block", "pair"  # the unit of a level's interval (rig/verdict/intervals.py)


class Comparison(StrEnum):
    """What a level's row compares: the candidate against the reference, or the A/A floor (the
    reference server replaying a level's requests against its first repeat)."""

    CANDIDATE = "candidate/reference"
    AA = "A/A"


class Metric(StrEnum):
    """`vllm bench serve`'s metric names (perf.csv's column stems), each with its unit, whether
    lower is better, its header in the report, and whether the servers measured it (their
    /metrics, shown beside the client's, never judged)."""

    unit: str
    lower_is_better: bool
    label: str
    server_side: bool

    def __new__(
        cls, value: str, unit: str, lower_is_better: bool, label: str, server_side: bool = False
    ) -> Metric:
        member = str.__new__(cls, value)
        member._value_ = value
        member.unit = unit
        member.lower_is_better = lower_is_better
        member.label = label
        member.server_side = server_side
        return member

    MEAN_TTFT = "mean_ttft_ms", "ms", True, "TTFT mean"
    MEDIAN_TTFT = "median_ttft_ms", "ms", True, "TTFT median"
    P99_TTFT = "p99_ttft_ms", "ms", True, "TTFT p99"
    MEAN_TPOT = "mean_tpot_ms", "ms", True, "TPOT mean"
    MEAN_ITL = "mean_itl_ms", "ms", True, "ITL mean"
    MEAN_E2EL = "mean_e2el_ms", "ms", True, "E2EL mean"
    REQUEST_THROUGHPUT = "request_throughput", "req/s", False, "requests/s"
    OUTPUT_THROUGHPUT = "output_throughput", "tok/s", False, "output tok/s"
    TOTAL_TOKEN_THROUGHPUT = "total_token_throughput", "tok/s", False, "total tok/s"
    GDN_MS_PER_CALL = "gdn_ms_per_call", "ms", True, "GDN prefill per call", True
    SERVER_PREFILL = "server_prefill_ms", "ms", True, "prefill per request", True
    SERVER_DECODE = "server_decode_ms", "ms", True, "decode per request", True
    SERVER_QUEUE = "server_queue_ms", "ms", True, "queue per request", True


CLIENT_METRICS = tuple(m for m in Metric if not m.server_side)  # what the client timed
SERVER_METRICS = tuple(m for m in Metric if m.server_side)
# The metrics that get a word, and so make up the family (rig/verdict/speed.py): latency at
# first token, per token and end to end, and the throughput of the whole level.
HEADLINE_METRICS = (
    Metric.MEAN_TTFT,
    Metric.MEAN_TPOT,
    Metric.MEAN_E2EL,
    Metric.TOTAL_TOKEN_THROUGHPUT,
)


def _pct(ratio: float) -> float:
    return (ratio - 1) * 100


@dataclass(frozen=True)
class MetricComparison:
    """One metric at one level: the candidate/reference ratio, its interval (None where there
    is none: one block, unequal work) and the word; for a server metric each side's mean over
    the blocks too."""

    level: int
    metric: Metric
    ratio: float
    interval: tuple[float, float] | None
    word: str
    reference: float | None = None
    candidate: float | None = None

    @classmethod
    def from_bounds(
        cls, level: int, metric: Metric, ratio: float, low: float, high: float, word: str, **sides
    ) -> MetricComparison:
        """From an estimate's ratio and bounds: NaN bounds (no interval) become None."""
        interval = None if math.isnan(low) or math.isnan(high) else (low, high)
        return cls(level, metric, ratio, interval, word, **sides)

    @property
    def unit(self) -> str:
        return self.metric.unit

    @property
    def lower_is_better(self) -> bool:
        return self.metric.lower_is_better

    @property
    def change_pct(self) -> float:
        """Candidate − reference in percent of the reference: a positive latency change is
        slower, a positive throughput change faster."""
        return _pct(self.ratio)

    @property
    def interval_pct(self) -> tuple[float, float] | None:
        return None if self.interval is None else (_pct(self.interval[0]), _pct(self.interval[1]))

    @property
    def half_width_pct(self) -> float:
        """The wider half of the interval, in percent of the reference; NaN without one."""
        if self.interval_pct is None:
            return math.nan
        low, high = self.interval_pct
        return max(high - self.change_pct, self.change_pct - low)

    @property
    def least_slowdown_pct(self) -> float:
        """The smallest slowdown, in percent, the interval allows (its bound nearest to no
        change, oriented so that positive = slower); NaN without an interval. The performance
        gate fails only when this exceeds the allowed regression."""
        if self.interval_pct is None:
            return math.nan
        low, high = self.interval_pct
        return low if self.lower_is_better else -high

    @property
    def most_slowdown_pct(self) -> float:
        """The largest slowdown, in percent, the interval leaves open; NaN without one."""
        if self.interval_pct is None:
            return math.nan
        low, high = self.interval_pct
        return high if self.lower_is_better else -low


@dataclass(frozen=True)
class PlantedChange:
    """What a planted delay adds to one metric, in percent of the reference, and whether the
    measured interval holds it."""

    metric: Metric
    planted_pct: float
    inside_interval: bool


@dataclass(frozen=True)
class PlantedShare:
    """A planted slowdown at one level (rig/verdict/planted.py): the delay per GDN prefill
    call, the calls per request, their product, and the change it plants per metric."""

    delay_ms: float
    ms_per_request: float
    calls_per_request: float
    changes: tuple[PlantedChange, ...]


@dataclass(frozen=True)
class Prediction:
    """One metric's predicted change beside its measured one."""

    metric: Metric
    predicted_pct: float
    measured: MetricComparison

    @property
    def inside(self) -> bool:
        """The measured interval holds the prediction."""
        interval = self.measured.interval_pct
        return interval is not None and interval[0] <= self.predicted_pct <= interval[1]

    def describe(self) -> str:
        measured = self.measured.interval_pct
        shown = f"[{measured[0]:+.1f}, {measured[1]:+.1f}]" if measured else "no interval"
        return (
            f"{self.metric.label} predicted {self.predicted_pct:+.1f} %, measured "
            f"{self.measured.change_pct:+.1f} % {shown}"
        )


@dataclass(frozen=True)
class KernelSensitivity:
    """A level's kernel time, its share, the end-to-end change it predicts and what came."""

    level: int
    kernel: MetricComparison  # GDN prefill per call, reference and candidate ms
    calls_per_request: float
    gdn_share_pct: float  # of the reference's wall time, C requests in flight
    predictions: tuple[Prediction, ...]

    @property
    def kernel_direction(self) -> str | None:
        """`slower` or `faster` where the per-call interval excludes no change, else None."""
        interval = self.kernel.interval
        if interval is None:
            return None
        if interval[0] > 1:
            return SLOWER
        if interval[1] < 1:
            return FASTER
        return None

    @property
    def hides_kernel(self) -> bool:
        """The kernel's time moved and a headline metric neither followed nor held the
        prediction."""
        direction = self.kernel_direction
        return direction is not None and any(
            not p.inside and p.measured.interval is not None and p.measured.word != direction
            for p in self.predictions
        )

    def describe(self) -> str:
        k = self.kernel
        interval = k.interval_pct
        moved = f" [{interval[0]:+.1f}, {interval[1]:+.1f}]" if interval else ""
        parts = [
            f"kernel at C{self.level}: GDN prefill {k.reference:.3g} -> {k.candidate:.3g} ms a "
            f"call ({k.change_pct:+.1f} %{moved}), {self.calls_per_request:.3g} calls a request, "
            f"{self.gdn_share_pct:.1f} % of the reference's time"
        ]
        text = "; ".join([*parts, *(p.describe() for p in self.predictions)])
        if self.hides_kernel:
            text += (
                ": this served configuration hides the kernel (host-bound): its speed word "
                "does not speak for the kernel"
            )
        return text


@dataclass(frozen=True)
class LevelComparison:
    """One level of one comparison: its unit, the block pairs it kept and left out (a JIT
    compilation), the candidate's requests, the request pairs that did unequal work, and every
    metric's comparison (the client's, then the servers' own where they published them)."""

    comparison: Comparison
    level: int
    unit: str
    repeats: int
    excluded_blocks: int
    requests: int
    unequal_pairs: int
    metrics: tuple[MetricComparison, ...]
    planted: PlantedShare | None = None
    sensitivity: KernelSensitivity | None = None  # what the kernel's own time predicts

    def get(self, metric: Metric) -> MetricComparison | None:
        return next((m for m in self.metrics if m.metric == metric), None)


@dataclass(frozen=True)
class PerfResult:
    """A run's performance verdict: the candidate's levels, then the A/A floor's."""

    levels: tuple[LevelComparison, ...] = ()

    @property
    def candidate(self) -> tuple[LevelComparison, ...]:
        return tuple(lc for lc in self.levels if lc.comparison == Comparison.CANDIDATE)

    @property
    def aa(self) -> tuple[LevelComparison, ...]:
        return tuple(lc for lc in self.levels if lc.comparison == Comparison.AA)

    def level(
        self, level: int, comparison: Comparison = Comparison.CANDIDATE
    ) -> LevelComparison | None:
        return next(
            (lc for lc in self.levels if lc.level == level and lc.comparison == comparison), None
        )

    def get(
        self, level: int, metric: Metric, comparison: Comparison = Comparison.CANDIDATE
    ) -> MetricComparison | None:
        found = self.level(level, comparison)
        return found.get(metric) if found is not None else None
