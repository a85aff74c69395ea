"""Proof of which GDN prefill kernel a vLLM server really ran.

The plugin (kernels/vllm_plugin.py) leaves two kinds of evidence:
  - a marker line in the server log from every vLLM process it loads in:
        [rig-gdn] kernel=ns4 source_sha256=<64 hex> pid=1234 platform=cpu
  - with RIG_GDN_STATS_DIR set, `gdn-calls-<pid>.json` = {kernel, source_sha256, calls, pid},
    kept current by each process that executes GDN prefill.
`read_kernel_proof` joins them: only stats files whose pid has a marker in this log count, so
a stats folder shared by both sides, or left over from an earlier run, cannot vouch for a server.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

KERNEL_ENV = "RIG_GDN_KERNEL"  # which candidate the plugin installs; unset: vLLM's own kernel
STATS_DIR_ENV = "RIG_GDN_STATS_DIR"  # where each process keeps its gdn-calls-<pid>.json
MARKER_PREFIX = "[rig-gdn]"
MARKER_PATTERN = re.compile(
    re.escape(MARKER_PREFIX)
    + r" kernel=(?P<kernel>\S+) source_sha256=(?P<sha>[0-9a-f]{64}) pid=(?P<pid>\d+)"
)
VLLM_BACKEND_PATTERN = re.compile(r"Using \S.* GDN prefill kernel.*")
STATS_GLOB = "gdn-calls-*.json"


def format_marker(kernel: str, source_sha256: str, pid: int, platform: str) -> str:
    return (
        f"{MARKER_PREFIX} kernel={kernel} source_sha256={source_sha256} pid={pid} "
        f"platform={platform}"
    )


def stats_file_name(pid: int) -> str:
    return f"gdn-calls-{pid}.json"


@dataclass(frozen=True)
class PrefillStats:
    """Contents of one gdn-calls-<pid>.json."""

    kernel: str
    source_sha256: str
    calls: int
    pid: int


@dataclass(frozen=True)
class KernelProof:
    """What one server's log and stats folder say about its GDN prefill kernel.

    marker_kernels: kernel names in the plugin's marker lines (every process, in log order).
    executed_kernels: kernel names of the processes that ran GDN prefill at least once.
    source_sha256: distinct hashes from markers and counted stats files.
    prefill_calls: GDN prefill calls summed over counted stats files.
    pids: processes that ran GDN prefill at least once.
    vllm_backend_line: vLLM's own "Using <X> GDN prefill kernel ..." line, or None. With a
    candidate on CUDA it names the backend that the plugin replaced.
    """

    marker_kernels: tuple[str, ...]
    executed_kernels: tuple[str, ...]
    source_sha256: tuple[str, ...]
    prefill_calls: int
    pids: tuple[int, ...]
    vllm_backend_line: str | None

    @property
    def kernel(self) -> str:
        """The kernel(s) that served GDN prefill, else the one(s) installed, else "unknown"."""
        names = self.executed_kernels or self.marker_kernels
        return "+".join(names) if names else "unknown"

    @property
    def calls(self) -> int:
        return self.prefill_calls

    def describe(self) -> str:
        if not self.marker_kernels:
            return "no rig GDN plugin marker in the log (plugin not loaded?)"
        hashes = ", ".join(h[:12] for h in self.source_sha256)
        text = (
            f"{self.kernel}: {self.prefill_calls} GDN prefill calls in pids "
            f"{list(self.pids)}; installed {'+'.join(self.marker_kernels)}; source sha256 {hashes}"
        )
        return f"{text}; vLLM: {self.vllm_backend_line}" if self.vllm_backend_line else text


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


def read_kernel_proof(log_path: Path, stats_dir: Path) -> KernelProof:
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    markers = [m.groupdict() for m in MARKER_PATTERN.finditer(text)]
    marker_pids = {int(m["pid"]) for m in markers}
    counted = [s for s in read_stats(stats_dir) if s.pid in marker_pids and s.calls > 0]
    backend = VLLM_BACKEND_PATTERN.search(text)
    return KernelProof(
        marker_kernels=_unique([m["kernel"] for m in markers]),
        executed_kernels=_unique([s.kernel for s in counted]),
        source_sha256=_unique([m["sha"] for m in markers] + [s.source_sha256 for s in counted]),
        prefill_calls=sum(s.calls for s in counted),
        pids=_unique([s.pid for s in counted]),
        vllm_backend_line=backend.group(0).strip() if backend else None,
    )
