"""vLLM's prefix-cache counters, scraped from its Prometheus /metrics before and after each
level: any hit means some prefill never ran the kernel under test. The same scrape reads the rig
plugin's GDN prefill call count, which sizes a planted slowdown (`ref+delay-<N>ms`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import aiohttp
from pydantic import SecretStr

from kernels.proof import read_kernel_proof_from_metrics
from rig.secrets import auth_headers


@dataclass(frozen=True)
class PrefixCacheCounters:
    queries: float
    hits: float
    gdn_prefill_calls: int | None = None  # None: no rig plugin evidence on /metrics


_COUNTER_LINE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


async def read_prefix_cache_counters(
    base_url: str, api_key: SecretStr | None = None
) -> PrefixCacheCounters:
    """vLLM's prefix-cache counters from /metrics, summed over label sets (engines, models)."""
    headers = auth_headers(api_key)
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(base_url.rstrip("/") + "/metrics", headers=headers) as response,
    ):
        response.raise_for_status()
        text = await response.text()
    return parse_prefix_cache_counters(text)


def parse_prefix_cache_counters(metrics_text: str) -> PrefixCacheCounters:
    totals = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    found = set()
    for line in metrics_text.splitlines():
        match = _COUNTER_LINE.match(line)
        if match and match["name"] in totals:
            totals[match["name"]] += float(match["value"])
            found.add(match["name"])
    if len(found) != len(totals):
        missing = ", ".join(sorted(set(totals) - found))
        raise ValueError(f"/metrics has no {missing} (is this a vLLM server with prefix caching?)")
    proof = read_kernel_proof_from_metrics(metrics_text)
    return PrefixCacheCounters(
        queries=totals["vllm:prefix_cache_queries_total"],
        hits=totals["vllm:prefix_cache_hits_total"],
        gdn_prefill_calls=proof.calls if proof.marker_kernels else None,
    )
