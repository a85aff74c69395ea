"""Proof of which GDN prefill kernel a vLLM server really ran, read from its log and stats
folder or from its /metrics.

The plugin (kernels/vllm_plugin.py) leaves three kinds of evidence, one set per vLLM process it
loads in (API server, engine core, workers):
  - a marker line in the server log:
        [rig-gdn] kernel=ns4 source_sha256=<64 hex> pid=1234 platform=cpu
  - `gdn-calls-<pid>.json` in RIG_GDN_STATS_DIR (PrefillStats), written at load (calls 0) and
    kept current as the process runs GDN prefill;
  - gauge families on the API server's /metrics (kernels/proof_metrics.py publishes them):
        rig_gdn_kernel_info{kernel,source_sha256,platform,backend,requested_backend,pid} 1
        rig_gdn_prefill_calls{kernel,source_sha256,pid} <calls>
        rig_gdn_prefill_seconds{kernel,source_sha256,pid} <time of the timed calls>
        rig_gdn_prefill_timed_calls{kernel,source_sha256,pid} <calls timed so far>
        rig_jit_compiles{pid} <JIT compilations seen in the process>
        rig_gdn_initial_state_<calls|sequences|tokens|all_sequences|all_tokens>{...as calls}
    the last: calls with a sequence that started from a non-zero state, those sequences and
    their tokens, and every sequence and token prefilled (kernels/initial_state.py);
    `backend` is the backend vLLM itself chose (triton, flashinfer, cutedsl, cpu-native),
    `requested_backend` what vLLM was asked for (auto unless --gdn-prefill-backend said); both
    are empty in processes that never built the GDN op (API server, engine core).
`read_kernel_proof` joins log and stats: stats of pids with a marker in this log count, and stats
carrying the server id of such a pid (processes of the same server whose stderr vLLM captured,
such as its model-registry inspection subprocess, which loads plugins), so a shared or stale stats
folder cannot vouch for a server; `proof_from_samples` reads the same facts from the /metrics
samples of these families, which also works for servers the rig did not start, and
`plugin_counters` the counters summed over processes. Fetching /metrics and parsing its text
are the rig's (rig/load/server_metrics.py, the one client and parser of /metrics): this module
knows only what the plugin's own families mean.
"""

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kernels.backends import REFERENCE_PREFIX, expected_reference_kernel, reference_kernel_name

KERNEL_ENV = "RIG_GDN_KERNEL"  # which candidate the plugin installs; unset: vLLM's own kernel
STATS_DIR_ENV = "RIG_GDN_STATS_DIR"  # where each process keeps its gdn-calls-<pid>.json
MARKER_PREFIX = "[rig-gdn]"
MARKER_PATTERN = re.compile(
    re.escape(MARKER_PREFIX)
    + r" kernel=(?P<kernel>\S+) source_sha256=(?P<sha>[0-9a-f]{64}) pid=(?P<pid>\d+)"
    + r"(?: platform=(?P<platform>\S+))?"
)
VLLM_BACKEND_PATTERN = re.compile(r"Using \S.* GDN prefill kernel.*")
STATS_GLOB = "gdn-calls-*.json"

INFO_METRIC = "rig_gdn_kernel_info"
CALLS_METRIC = "rig_gdn_prefill_calls"
SECONDS_METRIC = "rig_gdn_prefill_seconds"  # labelled as CALLS_METRIC
TIMED_CALLS_METRIC = "rig_gdn_prefill_timed_calls"  # labelled as CALLS_METRIC
COMPILES_METRIC = "rig_jit_compiles"  # pid only: compilations are the process's, not a kernel's
# kernels/initial_state.py's tally, in order: calls with at least one sequence that started
# from a non-zero state, those sequences, their tokens, and every sequence and token of the calls
TALLY_FIELDS = ("calls", "sequences", "tokens", "all_sequences", "all_tokens")
# PrefillStats field -> family, labelled as CALLS_METRIC (kernels/initial_state.py's tally)
INITIAL_STATE_METRICS = {
    f"initial_state_{name}": f"rig_gdn_initial_state_{name}" for name in TALLY_FIELDS
}
PID_LABEL = "pid"
INFO_LABELS = ("kernel", "source_sha256", "platform", "backend", "requested_backend")
CALLS_LABELS = ("kernel", "source_sha256")
PLUGIN_METRICS = (
    INFO_METRIC,
    CALLS_METRIC,
    SECONDS_METRIC,
    TIMED_CALLS_METRIC,
    COMPILES_METRIC,
    *INITIAL_STATE_METRICS.values(),
)
# (family, labels, value) of one /metrics sample, as rig.load.server_metrics parses them
Samples = Iterable[tuple[str, Mapping[str, str], float]]


def format_marker(kernel: str, source_sha256: str, pid: int, platform: str) -> str:
    return (
        f"{MARKER_PREFIX} kernel={kernel} source_sha256={source_sha256} pid={pid} "
        f"platform={platform}"
    )


def stats_file_name(pid: int) -> str:
    return f"gdn-calls-{pid}.json"


@dataclass(frozen=True)
class PrefillStats:
    """One vLLM process's evidence: gdn-calls-<pid>.json, or its /metrics samples.

    vllm_backend / requested_backend: vLLM's choice and what it was asked for, "" until the
    process built the GDN op. server: the id shared by one server's processes.
    """

    kernel: str
    source_sha256: str
    calls: int
    pid: int
    platform: str = ""
    vllm_backend: str = ""
    requested_backend: str = ""
    server: str = ""
    seconds: float = 0.0  # time in the timed_calls
    timed_calls: int = 0  # calls whose time is in `seconds` (the rest still run on the GPU)
    compiles: int = 0  # Triton and torch.compile JIT compilations seen in this process
    # kernels/initial_state.py's tally, summed over the process's calls
    initial_state_calls: int = 0
    initial_state_sequences: int = 0
    initial_state_tokens: int = 0
    initial_state_all_sequences: int = 0
    initial_state_all_tokens: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @property
    def initial_state(self) -> "InitialStateCounts":
        return InitialStateCounts(
            *(getattr(self, f"initial_state_{name}") for name in TALLY_FIELDS)
        )


@dataclass(frozen=True)
class InitialStateCounts:
    """GDN prefill work that continued a sequence from the state an earlier step left (a
    chunked prefill's later chunks, a prefix-cache hit): the calls with at least one such
    sequence, those sequences and their tokens, out of every sequence and token prefilled."""

    calls: int = 0
    sequences: int = 0
    tokens: int = 0
    all_sequences: int = 0
    all_tokens: int = 0

    def __add__(self, other: "InitialStateCounts") -> "InitialStateCounts":
        return InitialStateCounts(
            *(getattr(self, name) + getattr(other, name) for name in TALLY_FIELDS)
        )

    def describe(self) -> str:
        return (
            f"{self.sequences:,} of {self.all_sequences:,} prefilled sequences started from a "
            f"non-zero state ({self.tokens:,} of {self.all_tokens:,} tokens, {self.calls:,} calls)"
        )


@dataclass(frozen=True)
class KernelProof:
    """What one server's evidence says about its GDN prefill kernel.

    marker_kernels: kernels the plugin installed (every process it loaded in).
    executed_kernels: kernels of the processes that ran GDN prefill at least once.
    source_sha256: distinct hashes of installed and executed kernels.
    prefill_calls: GDN prefill calls summed over processes.
    pids: processes that ran GDN prefill at least once; loaded_pids: every process with evidence.
    vllm_backend_line: vLLM's own "Using <X> GDN prefill kernel ..." log line (log only).
    vllm_backends / requested_backends: what vLLM chose / was asked for, in processes that built
    the GDN op. With a candidate, vllm_backends names the backend the plugin replaced.
    platforms: "cpu" and/or "cuda". origin: "log" or "metrics".
    """

    marker_kernels: tuple[str, ...]
    executed_kernels: tuple[str, ...]
    source_sha256: tuple[str, ...]
    prefill_calls: int
    pids: tuple[int, ...]
    vllm_backend_line: str | None
    vllm_backends: tuple[str, ...] = ()
    requested_backends: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    loaded_pids: tuple[int, ...] = ()
    origin: str = "log"
    initial_state: InitialStateCounts = InitialStateCounts()

    @property
    def kernel(self) -> str:
        """The kernel(s) that served GDN prefill, else the one(s) installed, else "unknown"."""
        names = self.executed_kernels or self.marker_kernels
        return "+".join(names) if names else "unknown"

    @property
    def backend(self) -> str:
        """What ran GDN prefill: vllm-triton, vllm-flashinfer, vllm-cutedsl, vllm-cpu-native or
        the candidate's name; "none" when no process ran it."""
        return "+".join(self.executed_kernels) or "none"

    @property
    def requested_backend(self) -> str:
        """What vLLM was asked for (auto, triton, ...), "unknown" without a process that built
        the GDN op."""
        return "+".join(self.requested_backends) or "unknown"

    @property
    def calls(self) -> int:
        return self.prefill_calls

    def describe(self) -> str:
        if not self.marker_kernels:
            where = "in the log" if self.origin == "log" else "on /metrics"
            return f"no rig GDN plugin evidence {where} (plugin not loaded?)"
        hashes = ", ".join(h[:12] for h in self.source_sha256)
        text = (
            f"{self.kernel}: {self.prefill_calls} GDN prefill calls in pids "
            f"{list(self.pids)}; installed {'+'.join(self.marker_kernels)}; source sha256 {hashes}"
        )
        text += f"; {self.initial_state.describe()}"
        if self.vllm_backends:
            text += (
                f"; vLLM chose {'+'.join(self.vllm_backends)} (requested {self.requested_backend})"
            )
        return f"{text}; vLLM: {self.vllm_backend_line}" if self.vllm_backend_line else text

    def combined_with(self, later: "KernelProof") -> "KernelProof":
        """The evidence of this server and of a later start of it (restarted between
        repeats): the kernels and processes of both, their prefill calls added up."""
        return KernelProof(
            marker_kernels=_unique([*self.marker_kernels, *later.marker_kernels]),
            executed_kernels=_unique([*self.executed_kernels, *later.executed_kernels]),
            source_sha256=_unique([*self.source_sha256, *later.source_sha256]),
            prefill_calls=self.prefill_calls + later.prefill_calls,
            pids=_unique([*self.pids, *later.pids]),
            vllm_backend_line=self.vllm_backend_line or later.vllm_backend_line,
            vllm_backends=_unique([*self.vllm_backends, *later.vllm_backends]),
            requested_backends=_unique([*self.requested_backends, *later.requested_backends]),
            platforms=_unique([*self.platforms, *later.platforms]),
            loaded_pids=_unique([*self.loaded_pids, *later.loaded_pids]),
            origin=self.origin if self.origin == later.origin else f"{self.origin}+{later.origin}",
            initial_state=self.initial_state + later.initial_state,
        )

    def reference_backend_problem(self, requested_backend: str) -> str | None:
        """Why this proof does not show vLLM's own `requested_backend` serving GDN prefill
        (vllm-cpu-native on the CPU build, which ignores the request); None when it does."""
        if not self.marker_kernels:
            return self.describe()
        if not self.executed_kernels:
            return f"no process ran GDN prefill ({self.describe()})"
        platform = "cpu" if "cpu" in self.platforms else "cuda"
        expected = expected_reference_kernel(requested_backend, platform)
        if expected is None and len(self.vllm_backends) == 1:
            expected = reference_kernel_name(self.vllm_backends[0])
        ran_reference = all(k.startswith(REFERENCE_PREFIX) for k in self.executed_kernels)
        if (expected is None and ran_reference) or self.executed_kernels == (expected,):
            return None
        chosen = "+".join(self.vllm_backends) or "unknown"
        return (
            f"GDN prefill backend {requested_backend} was requested, but it ran {self.backend} "
            f"(vLLM chose {chosen}, asked for {self.requested_backend})"
        )


def _unique(items: list) -> tuple:
    return tuple(dict.fromkeys(items))


def read_stats(stats_dir: Path) -> list[PrefillStats]:
    stats = []
    for path in sorted(stats_dir.glob(STATS_GLOB)) if stats_dir.is_dir() else []:
        try:
            stats.append(PrefillStats(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a file being replaced right now, or not ours
    return stats


def _proof(
    loaded: list[PrefillStats], counted: list[PrefillStats], backend_line: str | None, origin: str
) -> KernelProof:
    """loaded: one entry per installed-kernel evidence (marker or info sample); counted: the
    processes' call counts."""
    executed = [s for s in counted if s.calls > 0]
    built_op = [s for s in loaded if s.vllm_backend]
    return KernelProof(
        marker_kernels=_unique([s.kernel for s in loaded]),
        executed_kernels=_unique([s.kernel for s in executed]),
        source_sha256=_unique([s.source_sha256 for s in loaded + executed]),
        prefill_calls=sum(s.calls for s in executed),
        pids=_unique([s.pid for s in executed]),
        vllm_backend_line=backend_line,
        vllm_backends=_unique([s.vllm_backend for s in built_op]),
        requested_backends=_unique([s.requested_backend for s in built_op]),
        platforms=_unique([s.platform for s in loaded if s.platform]),
        loaded_pids=_unique([s.pid for s in loaded]),
        origin=origin,
        initial_state=sum((s.initial_state for s in executed), InitialStateCounts()),
    )


def read_kernel_proof(log_path: Path, stats_dir: Path) -> KernelProof:
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    markers = [m.groupdict() for m in MARKER_PATTERN.finditer(text)]
    stats = {s.pid: s for s in read_stats(stats_dir)}
    loaded = []
    for marker in markers:
        pid = int(marker["pid"])
        record = stats.get(pid, PrefillStats(marker["kernel"], marker["sha"], 0, pid))
        loaded.append(
            PrefillStats(
                kernel=marker["kernel"],
                source_sha256=marker["sha"],
                calls=0,
                pid=pid,
                platform=marker["platform"] or record.platform,
                vllm_backend=record.vllm_backend,
                requested_backend=record.requested_backend,
            )
        )
    marker_pids = {s.pid for s in loaded}
    servers = {stats[pid].server for pid in marker_pids if pid in stats} - {""}
    silent = [s for pid, s in stats.items() if pid not in marker_pids and s.server in servers]
    loaded.extend(replace(s, calls=0) for s in silent)
    counted = [s for pid, s in stats.items() if pid in marker_pids] + silent
    backend = VLLM_BACKEND_PATTERN.search(text)
    return _proof(loaded, counted, backend.group(0).strip() if backend else None, "log")


def _plugin_samples(
    samples: Samples, names: tuple[str, ...]
) -> Iterator[tuple[str, Mapping[str, str], int, float]]:
    """(name, labels, pid, value) of the samples of `names`; samples without a pid are not the
    plugin's."""
    for name, labels, value in samples:
        if name not in names:
            continue
        try:
            pid = int(labels.get(PID_LABEL, ""))
        except ValueError:
            continue
        yield name, labels, pid, value


def proof_from_samples(samples: Samples) -> KernelProof:
    """The proof in a server's /metrics samples: one info sample per process the plugin loaded
    in (value 1; 0 marks a superseded label set), one calls sample per process and kernel."""
    loaded: dict[int, PrefillStats] = {}
    counted: dict[tuple[str, str, int], dict[str, int]] = {}
    field_of = {CALLS_METRIC: "calls"} | {m: f for f, m in INITIAL_STATE_METRICS.items()}
    for name, labels, pid, value in _plugin_samples(samples, (INFO_METRIC, *field_of)):
        kernel, sha = labels.get("kernel", ""), labels.get("source_sha256", "")
        if name in field_of:
            counted.setdefault((kernel, sha, pid), {})[field_of[name]] = int(value)
        elif value == 1:
            loaded[pid] = PrefillStats(
                kernel=kernel,
                source_sha256=sha,
                calls=0,
                pid=pid,
                platform=labels.get("platform", ""),
                vllm_backend=labels.get("backend", ""),
                requested_backend=labels.get("requested_backend", ""),
            )
    stats = [
        PrefillStats(kernel, sha, pid=pid, **{"calls": 0} | values)
        for (kernel, sha, pid), values in counted.items()
    ]
    return _proof([loaded[pid] for pid in sorted(loaded)], stats, None, "metrics")


@dataclass(frozen=True)
class PluginCounters:
    """The plugin's counters on one server's /metrics, summed over its processes: read before
    and after a block of load, their differences are its GDN prefill calls, the time of those
    timed, and whether anything compiled meanwhile."""

    calls: int
    timed_calls: int
    seconds: float
    compiles: int


def plugin_counters(samples: Samples) -> PluginCounters | None:
    """The counters in a server's /metrics samples; None without rig plugin evidence (no
    rig_gdn_kernel_info sample of value 1). Superseded label sets are 0 and add nothing."""
    totals = dict.fromkeys((CALLS_METRIC, TIMED_CALLS_METRIC, SECONDS_METRIC, COMPILES_METRIC), 0.0)
    loaded = False
    for name, _, _, value in _plugin_samples(samples, (INFO_METRIC, *totals)):
        if name == INFO_METRIC:
            loaded = loaded or value == 1
        else:
            totals[name] += value
    if not loaded:
        return None
    return PluginCounters(
        calls=int(totals[CALLS_METRIC]),
        timed_calls=int(totals[TIMED_CALLS_METRIC]),
        seconds=totals[SECONDS_METRIC],
        compiles=int(totals[COMPILES_METRIC]),
    )
