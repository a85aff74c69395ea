"""pandas frames from the request records: one row per request, one per (side, level), and the
candidate-vs-reference deltas, using vLLM's benchmark definitions so numbers line up with
`vllm bench serve` (TTFT at the first non-empty choices; TPOT = (E2EL - TTFT)/(tokens - 1)).

Column names are `vllm bench serve`'s (mean_ttft_ms, median_ttft_ms, p99_ttft_ms, ...,
request_throughput, output_throughput, total_token_throughput, completed, failed, duration), one
row per (side, level, repeat); the candidate-vs-reference comparison lives in rig.verdict.perf.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np
import pandas as pd

from rig.manifest_record import RunManifest
from rig.records import RequestRecord, duration_s
from rig.verdict.compare import PairResult

PERCENTILES = (90, 99)
# `vllm bench serve --backend` for each endpoint the rig sends to
BENCH_BACKENDS = {"completions": "openai", "chat": "openai-chat"}


def request_frame(records: Iterable[RequestRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        rows.append(
            {
                "side": r.side,
                "replica": r.replica,
                "level": r.level,
                "repeat": r.repeat,
                "index": r.index,
                "request_id": r.request_id,
                "prompt_id": r.prompt_id,
                "cache_salt": r.cache_salt,
                "ok": r.completed,
                "error": r.error or "",
                "http_status": r.http_status,
                "finish_reason": r.finish_reason,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "sent_at": r.sent_at,
                "ttft_ms": _ms(r.ttft_s),
                "tpot_ms": _ms(r.tpot_s),
                "itl_mean_ms": _ms(float(np.mean(r.itl_s))) if r.itl_s else None,
                "e2el_ms": _ms(r.e2el_s),
                "finished_at": r.finished_at,
                "text": r.text,
            }
        )
    return pd.DataFrame(rows)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _distribution(stats: dict, name: str, values: np.ndarray) -> None:
    """mean/median/std/p90/p99 of one metric, as `vllm bench serve` names them."""
    empty = not values.size
    stats[f"mean_{name}_ms"] = np.nan if empty else float(values.mean())
    stats[f"median_{name}_ms"] = np.nan if empty else float(np.median(values))
    stats[f"std_{name}_ms"] = np.nan if empty else float(values.std())
    for p in PERCENTILES:
        stats[f"p{p}_{name}_ms"] = np.nan if empty else float(np.percentile(values, p))


def _level_stats(group: pd.DataFrame, records: list[RequestRecord]) -> dict:
    """One (side, level, repeat): `group` its rows of request_frame, `records` its records."""
    ok = group[group["ok"]]
    stats: dict = {
        "requests": len(group),
        "completed": int(ok.shape[0]),
        "failed": int((~group["ok"]).sum()),
    }
    for metric in ("ttft", "tpot", "e2el"):
        _distribution(stats, metric, ok[f"{metric}_ms"].dropna().to_numpy(dtype=float))
    itl_ms = [gap * 1000 for r in records if r.completed for gap in r.itl_s]
    _distribution(stats, "itl", np.asarray(itl_ms, dtype=float))
    duration = duration_s(records)
    output_tokens = float(ok["output_tokens"].fillna(0).sum())
    prompt_tokens = float(ok["prompt_tokens"].fillna(0).sum())
    per_s = duration if duration and duration > 0 else np.nan
    stats["duration"] = np.nan if duration is None else duration
    stats["total_input_tokens"] = int(prompt_tokens)
    stats["total_output_tokens"] = int(output_tokens)
    stats["request_throughput"] = ok.shape[0] / per_s
    stats["output_throughput"] = output_tokens / per_s
    stats["total_token_throughput"] = (output_tokens + prompt_tokens) / per_s
    return stats


def summary_frame(
    records: list[RequestRecord], pairs: list[PairResult] | None = None
) -> pd.DataFrame:
    """One row per (side, level, repeat), with match counts on the candidate rows."""
    frame = request_frame(records)
    if frame.empty:
        return pd.DataFrame()
    by_key: dict[tuple, list[RequestRecord]] = {}
    for r in records:
        by_key.setdefault((r.side, r.level, r.repeat), []).append(r)
    rows = []
    for (side, level, repeat), group in frame.groupby(["side", "level", "repeat"], sort=True):
        row = {"side": side, "level": level, "repeat": repeat}
        row.update(_level_stats(group, by_key[(side, level, repeat)]))
        rows.append(row)
    summary = pd.DataFrame(rows)
    if pairs:
        matches = pd.DataFrame(
            [{"level": p.level, "repeat": p.repeat, "identical": p.identical} for p in pairs]
        )
        counts = matches.groupby(["level", "repeat"])["identical"].agg(["sum", "count"])
        summary = summary.merge(
            counts.rename(columns={"sum": "matches", "count": "pairs"}).reset_index(),
            on=["level", "repeat"],
            how="left",
        )
    return summary


def bench_results(
    records: list[RequestRecord], summary: pd.DataFrame, manifest: RunManifest
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
    if summary.empty:
        return {}
    workload = manifest.scenario.workload
    backend = BENCH_BACKENDS[workload.endpoint]
    many = int(summary["repeat"].max()) > 0
    results = {}
    for row in summary.to_dict("records"):
        side, level, repeat = row["side"], int(row["level"]), int(row["repeat"])
        chosen = sorted(
            (
                r
                for r in records
                if (r.side, r.level, r.repeat) == (side, level, repeat) and not r.warmup
            ),
            key=lambda r: r.sent_at,
        )
        stats = {
            k: (None if isinstance(v, float) and np.isnan(v) else v)
            for k, v in row.items()
            if k not in ("side", "level", "repeat", "requests", "matches", "pairs")
        }
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
