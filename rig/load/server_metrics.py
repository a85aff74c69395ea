"""What a running server says about itself, read untimed: its Prometheus /metrics before and
after each block, vLLM's prefix-cache counters (any hit means some prefill never ran the kernel
under test), its per-request prefill / decode / queue time histograms (the server's side of the
timings), the rig plugin's GDN prefill calls, their time and the JIT compilations it saw (a
planted slowdown's size, the kernel's time per call, and a block that compiled), and the
plugin's kernel proof; and its vLLM version (GET /version). server_delta is what one server
counted during one block.

This is the one client and the one parser of /metrics: kernels/proof.py says what the plugin's
own families mean, given the samples parsed here."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import NamedTuple

from pydantic import SecretStr

from kernels.proof import PLUGIN_METRICS, KernelProof, plugin_counters, proof_from_samples
from rig.records import ServerDelta
from rig.secrets import auth_headers
from rig.untimed_http import AsyncClient, NoAnswer, call

PREFIX_CACHE = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
# vLLM's histograms of time per request in each phase (seconds): their _sum and _count.
PHASE_HISTOGRAMS = {
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "queue": "vllm:request_queue_time_seconds",
}


class MetricsUnreadable(Exception):
    """A server's /metrics did not answer (it died), or lacks what a vLLM server publishes."""


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


_SAMPLE_LINE = re.compile(
    r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)
_LABEL = re.compile(r'(?P<key>[A-Za-z_]\w*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"')
_LABEL_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class MetricSample(NamedTuple):
    """One sample of a Prometheus text exposition: its family, labels (unescaped) and value."""

    name: str
    labels: dict[str, str]
    value: float


def _labels(text: str | None) -> dict[str, str]:
    return {
        match["key"]: re.sub(r"\\[\\\"n]", lambda m: _LABEL_ESCAPES[m.group(0)], match["value"])
        for match in _LABEL.finditer(text or "")
    }


def metric_samples(metrics_text: str, names: Collection[str]) -> list[MetricSample]:
    """The samples of the families `names` in a /metrics text; a sample whose value is not a
    finite number (NaN, +Inf: no count or total is) is left out."""
    samples = []
    for line in metrics_text.split("\n"):  # a label value may hold \x1e or U+2028 as it is
        match = _SAMPLE_LINE.match(line)
        if match is None or match["name"] not in names:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        samples.append(MetricSample(match["name"], _labels(match["labels"]), value))
    return samples


def _get_text(base_url: str, path: str, api_key: SecretStr | None, timeout_s: float) -> str:
    """GET <base_url><path> (base_url as the rig keeps it: http://host:port, no /v1); NoAnswer,
    or ValueError for a status other than 2xx."""
    answer = call(
        "GET", base_url.rstrip("/") + path, timeout_s=timeout_s, headers=auth_headers(api_key)
    )
    if not answer.ok:
        raise ValueError(f"{base_url}{path} answered HTTP {answer.status}")
    return answer.text()


def metrics_text(base_url: str, api_key: SecretStr | None = None, timeout_s: float = 30) -> str:
    """The server's /metrics text; MetricsUnreadable when it does not answer."""
    try:
        return _get_text(base_url, "/metrics", api_key, timeout_s)
    except NoAnswer as exc:
        raise MetricsUnreadable(f"{base_url}/metrics: {exc.kind}: {exc.reason}") from None
    except ValueError as exc:
        raise MetricsUnreadable(str(exc)) from None


async def read_metrics_text(
    base_url: str, api_key: SecretStr | None = None, timeout_s: float = 30
) -> str:
    """metrics_text from an event loop (on a thread, so that the servers are read at once)."""
    return await AsyncClient(1).run(metrics_text, base_url, api_key, timeout_s)


async def read_server_counters(base_url: str, api_key: SecretStr | None = None) -> ServerCounters:
    """One reading of the server's /metrics, summed over label sets (engines, models);
    MetricsUnreadable when it does not answer."""
    return parse_server_counters(await read_metrics_text(base_url, api_key))


def parse_server_counters(metrics_text: str) -> ServerCounters:
    phase_names = {f"{h}{part}" for h in PHASE_HISTOGRAMS.values() for part in ("_sum", "_count")}
    samples = metric_samples(metrics_text, {*PREFIX_CACHE, *phase_names, *PLUGIN_METRICS})
    totals: dict[str, float] = {}
    for sample in samples:
        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    missing = [name for name in PREFIX_CACHE if name not in totals]
    if missing:
        raise MetricsUnreadable(
            f"/metrics has no {', '.join(missing)} (is this a vLLM server with prefix caching?)"
        )

    def phase(name: str) -> PhaseTime | None:
        histogram = PHASE_HISTOGRAMS[name]
        seconds, requests = totals.get(f"{histogram}_sum"), totals.get(f"{histogram}_count")
        return None if seconds is None or requests is None else PhaseTime(seconds, requests)

    plugin = plugin_counters(samples)
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


def kernel_proof_from_metrics(metrics_text: str) -> KernelProof:
    """The kernel proof a server's /metrics text holds (kernels.proof says what it means)."""
    return proof_from_samples(metric_samples(metrics_text, PLUGIN_METRICS))


def fetch_kernel_proof(
    base_url: str, api_key: SecretStr | None = None, timeout_s: float = 10
) -> KernelProof:
    """The proof a running server publishes; read it before the server stops.
    MetricsUnreadable when /metrics does not answer."""
    return kernel_proof_from_metrics(metrics_text(base_url, api_key, timeout_s))


def served_version(
    base_url: str, api_key: SecretStr | None = None, timeout_s: float = 10
) -> str | None:
    """What a running server says its vLLM is (GET /version), None when it does not say."""
    try:
        return str(json.loads(_get_text(base_url, "/version", api_key, timeout_s))["version"])
    except (NoAnswer, ValueError, KeyError, TypeError):
        return None


def _difference(before: float | None, after: float | None):
    return after - before if before is not None and after is not None else None


def server_delta(
    label: str,
    level: int,
    repeat: int,
    before: ServerCounters,
    after: ServerCounters,
    started_at: float | None = None,
    ended_at: float | None = None,
) -> ServerDelta:
    """What one server counted during one block."""
    phases = {}
    for name in ("prefill", "decode", "queue"):
        first, last = getattr(before, name), getattr(after, name)
        phases[f"{name}_seconds"] = _difference(first and first.seconds, last and last.seconds)
        phases[f"{name}_requests"] = _difference(first and first.requests, last and last.requests)
    return ServerDelta(
        label,
        level,
        repeat,
        queries=after.queries - before.queries,
        hits=after.hits - before.hits,
        gdn_prefill_calls=_difference(before.gdn_prefill_calls, after.gdn_prefill_calls),
        gdn_timed_calls=_difference(before.gdn_timed_calls, after.gdn_timed_calls),
        gdn_seconds=_difference(before.gdn_seconds, after.gdn_seconds),
        jit_compiles=_difference(before.jit_compiles, after.jit_compiles),
        **phases,
        started_at=started_at,
        ended_at=ended_at,
    )
