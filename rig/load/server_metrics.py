"""A server's own counters, scraped from its Prometheus /metrics before and after each block:
vLLM's prefix-cache counters (any hit means some prefill never ran the kernel under test), its
per-request prefill / decode / queue time histograms (the server's side of the timings), and
the rig plugin's GDN prefill calls, their time and the JIT compilations it saw (a planted
slowdown's size, the kernel's time per call, and a block that compiled)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import aiohttp
from pydantic import SecretStr

from kernels.proof import read_plugin_counters
from rig.secrets import auth_headers

PREFIX_CACHE = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
# vLLM's histograms of time per request in each phase (seconds): their _sum and _count.
PHASE_HISTOGRAMS = {
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "queue": "vllm:request_queue_time_seconds",
}


class MetricsUnreadable(Exception):
    """A server's /metrics did not answer (it died, or is not a vLLM server)."""


@dataclass(frozen=True)
class PhaseTime:
    """One of vLLM's per-request phase histograms, as totals: seconds over requests."""

    seconds: float
    requests: float


@dataclass(frozen=True)
class ServerCounters:
    """One reading of a server's /metrics; None where the server does not publish a value."""

    queries: float
    hits: float
    gdn_prefill_calls: int | None = None  # None: no rig plugin evidence on /metrics
    gdn_timed_calls: int | None = None
    gdn_seconds: float | None = None
    jit_compiles: int | None = None
    prefill: PhaseTime | None = None
    decode: PhaseTime | None = None
    queue: PhaseTime | None = None


_SAMPLE_LINE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


async def read_server_counters(base_url: str, api_key: SecretStr | None = None) -> ServerCounters:
    """One reading of the server's /metrics, summed over label sets (engines, models);
    MetricsUnreadable when it does not answer."""
    headers = auth_headers(api_key)
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.get(base_url.rstrip("/") + "/metrics", headers=headers) as response,
        ):
            response.raise_for_status()
            text = await response.text()
    except (OSError, TimeoutError, aiohttp.ClientError) as exc:
        raise MetricsUnreadable(f"{base_url}/metrics: {type(exc).__name__}: {exc}") from None
    return parse_server_counters(text)


def _totals(metrics_text: str, names: set[str]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE_LINE.match(line)
        if match and match["name"] in names:
            totals[match["name"]] = totals.get(match["name"], 0.0) + float(match["value"])
    return totals


def parse_server_counters(metrics_text: str) -> ServerCounters:
    phase_names = {f"{h}{part}" for h in PHASE_HISTOGRAMS.values() for part in ("_sum", "_count")}
    totals = _totals(metrics_text, set(PREFIX_CACHE) | phase_names)
    missing = [name for name in PREFIX_CACHE if name not in totals]
    if missing:
        raise ValueError(
            f"/metrics has no {', '.join(missing)} (is this a vLLM server with prefix caching?)"
        )

    def phase(name: str) -> PhaseTime | None:
        histogram = PHASE_HISTOGRAMS[name]
        seconds, requests = totals.get(f"{histogram}_sum"), totals.get(f"{histogram}_count")
        return None if seconds is None or requests is None else PhaseTime(seconds, requests)

    plugin = read_plugin_counters(metrics_text)
    return ServerCounters(
        queries=totals[PREFIX_CACHE[0]],
        hits=totals[PREFIX_CACHE[1]],
        gdn_prefill_calls=plugin.calls if plugin else None,
        gdn_timed_calls=plugin.timed_calls if plugin else None,
        gdn_seconds=plugin.seconds if plugin else None,
        jit_compiles=plugin.compiles if plugin else None,
        prefill=phase("prefill"),
        decode=phase("decode"),
        queue=phase("queue"),
    )
