"""`vllm bench serve`'s numbers per block, as typed records: one BlockSummary per (side, level,
repeat), computed once here with vLLM's benchmark definitions so that numbers line up with
`vllm bench serve` (TTFT at the first non-empty choices; TPOT = (E2EL - TTFT)/(tokens - 1)), and
one LevelSide per (level, side) over its repeats. The report renders these; summary.csv and the
bench/ files carry them under vLLM's names (BlockSummary.bench_stats). The candidate-vs-reference
comparison lives in rig.verdict.perf.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from rig.manifest_record import RunManifest
from rig.records import RequestRecord, duration_s
from rig.verdict.compare import PairResult

PERCENTILES = (90, 99)
DISTRIBUTIONS = ("ttft", "tpot", "e2el", "itl")  # vLLM's stems, in summary.csv's order
# `vllm bench serve --backend` for each endpoint the rig sends to
BENCH_BACKENDS = {"completions": "openai", "chat": "openai-chat"}


@dataclass(frozen=True)
class Distribution:
    """One metric over a block's requests, in ms: mean, median, std, p90, p99 (NaN: none)."""

    mean: float
    median: float
    std: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        array = np.asarray(list(values), dtype=float)
        if not array.size:
            return cls(math.nan, math.nan, math.nan, math.nan, math.nan)
        p90, p99 = (float(np.percentile(array, p)) for p in PERCENTILES)
        return cls(float(array.mean()), float(np.median(array)), float(array.std()), p90, p99)

    def named(self, stem: str) -> dict[str, float]:
        """vLLM's names: mean_<stem>_ms, median_, std_, p90_, p99_."""
        values = (self.mean, self.median, self.std, self.p90, self.p99)
        names = ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))
        return {f"{name}_{stem}_ms": value for name, value in zip(names, values, strict=True)}


@dataclass(frozen=True)
class BlockSummary:
    """One side's block at one (level, repeat), by `vllm bench serve`'s definitions, and on
    both sides the request pairs of that (level, repeat) and how many were identical (None
    without pairs there)."""

    side: str
    level: int
    repeat: int
    requests: int
    completed: int
    failed: int
    ttft: Distribution
    tpot: Distribution
    e2el: Distribution
    itl: Distribution
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    matches: int | None = None
    pairs: int | None = None

    def bench_stats(self) -> dict[str, float | int]:
        """The block's numbers under `vllm bench serve`'s names, in its result file's order:
        summary.csv's columns and the bench/ files' fields."""
        stats: dict[str, float | int] = {"completed": self.completed, "failed": self.failed}
        for stem in DISTRIBUTIONS:
            stats |= getattr(self, stem).named(stem)
        return stats | {
            "duration": self.duration,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def block_summary(side: str, level: int, repeat: int, records: list[RequestRecord]) -> BlockSummary:
    """One (side, level, repeat) from its records, warm-ups and all, as they were sent."""
    ok = [r for r in records if r.completed]

    def distribution(values: Iterable[float | None]) -> Distribution:
        return Distribution.of(v for v in values if v is not None and not math.isnan(v))

    duration = duration_s(records)
    output_tokens = float(sum(r.output_tokens or 0 for r in ok))
    prompt_tokens = float(sum(r.prompt_tokens or 0 for r in ok))
    per_s = duration if duration and duration > 0 else math.nan
    return BlockSummary(
        side=side,
        level=level,
        repeat=repeat,
        requests=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        ttft=distribution(_ms(r.ttft_s) for r in ok),
        tpot=distribution(_ms(r.tpot_s) for r in ok),
        e2el=distribution(_ms(r.e2el_s) for r in ok),
        itl=Distribution.of(gap * 1000 for r in ok for gap in r.itl_s),
        duration=math.nan if duration is None else duration,
        total_input_tokens=int(prompt_tokens),
        total_output_tokens=int(output_tokens),
        request_throughput=len(ok) / per_s,
        output_throughput=output_tokens / per_s,
        total_token_throughput=(output_tokens + prompt_tokens) / per_s,
    )


def block_summaries(
    records: list[RequestRecord], pairs: list[PairResult] | None = None
) -> tuple[BlockSummary, ...]:
    """One BlockSummary per (side, level, repeat), in that order, with the pairs' match counts
    of its (level, repeat) on both sides."""
    by_key: dict[tuple[str, int, int], list[RequestRecord]] = {}
    for r in records:
        by_key.setdefault((r.side, r.level, r.repeat), []).append(r)
    matched: dict[tuple[int, int], list[int]] = {}
    for p in pairs or ():
        counts = matched.setdefault((p.level, p.repeat), [0, 0])
        counts[0] += int(p.identical)
        counts[1] += 1
    blocks = []
    for (side, level, repeat), group in sorted(by_key.items()):
        block = block_summary(side, level, repeat, group)
        if (level, repeat) in matched:
            matches, count = matched[(level, repeat)]
            block = replace(block, matches=matches, pairs=count)
        blocks.append(block)
    return tuple(blocks)


Value = Callable[[BlockSummary], float]


def _finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


@dataclass(frozen=True)
class LevelSide:
    """One side at one level: its blocks, in repeat order, and what the report shows of them
    (sums, the mean over repeats and its spread)."""

    level: int
    side: str
    blocks: tuple[BlockSummary, ...]

    @property
    def requests(self) -> int:
        return sum(b.requests for b in self.blocks)

    @property
    def completed(self) -> int:
        return sum(b.completed for b in self.blocks)

    @property
    def matches(self) -> int | None:
        """Identical pairs over the level's blocks; None where no block had pairs."""
        known = [b.matches for b in self.blocks if b.matches is not None]
        return sum(known) if known else None

    @property
    def pairs(self) -> int | None:
        known = [b.pairs for b in self.blocks if b.pairs is not None]
        return sum(known) if known else None

    def mean(self, value: Value) -> float:
        """The mean over the repeats that have the value; NaN where none has."""
        finite = _finite(value(b) for b in self.blocks)
        return float(np.mean(finite)) if finite else math.nan

    def spread(self, value: Value) -> float | None:
        """max − min over the repeats, in percent of their mean; None under two repeats."""
        finite = _finite(value(b) for b in self.blocks)
        mean = float(np.mean(finite)) if finite else math.nan
        if len(finite) < 2 or mean == 0:
            return None
        return (max(finite) - min(finite)) / abs(mean) * 100.0

    def values(self, value: Value) -> list[float]:
        return [value(b) for b in self.blocks]


def level_sides(blocks: Iterable[BlockSummary]) -> tuple[LevelSide, ...]:
    """The blocks gathered per (level, side), in that order."""
    grouped: dict[tuple[int, str], list[BlockSummary]] = {}
    for block in blocks:
        grouped.setdefault((block.level, block.side), []).append(block)
    return tuple(
        LevelSide(level, side, tuple(sorted(found, key=lambda b: b.repeat)))
        for (level, side), found in sorted(grouped.items())
    )


def _none_for_nan(value: float | int) -> float | int | None:
    return None if isinstance(value, float) and math.isnan(value) else value


def bench_results(
    records: list[RequestRecord], blocks: tuple[BlockSummary, ...], manifest: RunManifest
) -> dict[str, dict]:
    """Per side and level (and repeat, when there are several), a result in the layout of
    `vllm bench serve --save-result`: file name -> JSON object. Scripts written for vLLM's
    result files read these; warm-up requests are not in them.

    What differs from the file `vllm bench serve --save-result` writes (vLLM 0.26-0.33):
    `backend` and `endpoint_type` name the endpoint as its `--backend` does (`openai` for
    completions, `openai-chat` for chat); `date` is the UTC time of the block's first request,
    not the local time the benchmark ended; `label` is the side (`reference`, `candidate`), not
    the backend; `model_id` is the scenario's model name, `tokenizer_id` the served model's
    path; the per-request lists (`input_lens`, `output_lens`, `ttfts`, `itls`, `latencies`,
    `generated_texts`, `errors`) are always there, as with `--save-detailed`; mean, median,
    std, p90 and p99 are given for ttft, tpot, itl and e2el alike (vLLM's defaults: ttft, tpot,
    itl at p99); and `start_times`, `queue_times`, `request_goodput`,
    `max_output_tokens_per_s`, `max_concurrent_requests` and `rtfx` are not written. Under
    `workload.arrival: waves`, TTFT and E2EL count from a wave's release."""
    if not blocks:
        return {}
    workload = manifest.scenario.workload
    backend = BENCH_BACKENDS[workload.endpoint]
    many = max(b.repeat for b in blocks) > 0
    results = {}
    for block in blocks:
        side, level, repeat = block.side, block.level, block.repeat
        chosen = sorted(
            (
                r
                for r in records
                if (r.side, r.level, r.repeat) == (side, level, repeat) and not r.warmup
            ),
            key=lambda r: r.sent_at,
        )
        stats = {k: _none_for_nan(v) for k, v in block.bench_stats().items()}
        name = f"{side}-c{level}" + (f"-r{repeat}" if many else "") + ".json"
        results[name] = {
            "date": time.strftime("%Y%m%d-%H%M%S", time.gmtime(chosen[0].sent_at))
            if chosen
            else None,
            "endpoint_type": backend,
            "backend": backend,
            "label": side,
            "model_id": manifest.scenario.model.name or manifest.model_path,
            "tokenizer_id": manifest.model_path,
            "num_prompts": len(chosen),
            "request_rate": workload.request_rate or "inf",
            "burstiness": workload.burstiness,
            "max_concurrency": level,
            **stats,
            "input_lens": [r.prompt_tokens for r in chosen],
            "output_lens": [r.output_tokens for r in chosen],
            "ttfts": [r.ttft_s for r in chosen],
            "itls": [list(r.itl_s) for r in chosen],
            "latencies": [r.e2el_s for r in chosen],
            "generated_texts": [r.text for r in chosen],
            "errors": [r.error or "" for r in chosen],
        }
    return results
