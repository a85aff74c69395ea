"""What one vLLM process proves about its GDN prefill: the counter the plugin wraps around the op.

kernels/vllm_plugin.py decides which op runs and installs it; this file is the evidence that op
leaves, whatever it is: `PrefillCounter` counts (and, with RIG_GDN_TIME=1, times) every prefill
call and mirrors the count to the stats folder and, where vLLM serves /metrics from
PROMETHEUS_MULTIPROC_DIR, to multiprocess gauges (kernels/proof_metrics.py); `new_counter`
prints the process's marker line. `share_evidence_folder` gives one server's processes one
stats folder and one server id. kernels/proof.py reads all of it back.
"""

import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.proof import STATS_DIR_ENV, PrefillStats, format_marker, stats_file_name
from kernels.proof_metrics import MultiprocessGauges, multiprocess_gauges_from_env

SERVER_ENV = "RIG_GDN_SERVER_ID"  # set by the first process, inherited by the rest of a server
TIME_ENV = "RIG_GDN_TIME"

_private_stats_dir: tempfile.TemporaryDirectory | None = None


@dataclass
class PrefillCounter:
    """This process's evidence: the kernel it installed, vLLM's own backend choice and its GDN
    prefill calls, mirrored to the stats folder and, where vLLM serves /metrics from
    PROMETHEUS_MULTIPROC_DIR, to multiprocess gauges."""

    kernel: str
    source_sha256: str
    platform: str
    stats_dir: Path | None
    server: str = ""
    vllm_backend: str = ""
    requested_backend: str = ""
    calls: int = 0
    seconds: float = 0.0
    timed: bool = False
    gauges: MultiprocessGauges | None = None

    def snapshot(self) -> PrefillStats:
        return PrefillStats(
            kernel=self.kernel,
            source_sha256=self.source_sha256,
            calls=self.calls,
            pid=os.getpid(),
            platform=self.platform,
            vllm_backend=self.vllm_backend,
            requested_backend=self.requested_backend,
            server=self.server,
            seconds=self.seconds,
        )

    def publish(self) -> None:
        record = self.snapshot()
        if self.stats_dir is not None:
            path = self.stats_dir / stats_file_name(record.pid)
            temporary = path.with_name(f".{path.name}.tmp")
            try:
                temporary.write_text(record.to_json())
                os.replace(temporary, path)
            except OSError as error:  # the folder went away: keep serving, say so once
                print(f"rig GDN plugin: stats not kept: {error}", file=sys.stderr, flush=True)
                self.stats_dir = None
        if self.gauges is not None:
            self.gauges.publish(record)

    def record(self) -> None:
        self.calls += 1
        self.publish()

    def call(self, op: Callable, *args, **kwargs):
        """Run one prefill call and count it; with RIG_GDN_TIME, time it between two device
        synchronisations (CPU tensors need none)."""
        if not self.timed:
            result = op(*args, **kwargs)
            self.record()
            return result
        synchronize = torch.cuda.synchronize if torch.cuda.is_initialized() else lambda: None
        synchronize()
        started = time.perf_counter()
        result = op(*args, **kwargs)
        synchronize()
        self.seconds += time.perf_counter() - started
        self.record()
        return result

    def built_op(self, kernel: str, vllm_backend: str, requested_backend: str) -> None:
        """The GDN op was built: vLLM chose `vllm_backend` when asked for `requested_backend`."""
        if kernel != self.kernel:
            _emit_marker(kernel, self.source_sha256, self.platform)
        self.kernel, self.vllm_backend, self.requested_backend = (
            kernel,
            vllm_backend,
            requested_backend,
        )
        self.publish()


def share_evidence_folder() -> None:
    """Give the processes of this server one stats folder and one server id before vLLM starts
    its engine core and workers, which inherit the environment."""
    global _private_stats_dir
    if not os.environ.get(STATS_DIR_ENV):
        _private_stats_dir = tempfile.TemporaryDirectory(prefix="rig-gdn-stats-")
        os.environ[STATS_DIR_ENV] = _private_stats_dir.name
    if not os.environ.get(SERVER_ENV):
        os.environ[SERVER_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _stats_dir() -> Path | None:
    directory = os.environ.get(STATS_DIR_ENV)
    if not directory:
        return None
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _emit_marker(kernel: str, source_sha256: str, platform: str) -> None:
    print(format_marker(kernel, source_sha256, os.getpid(), platform), file=sys.stderr, flush=True)


def new_counter(kernel: str, source_sha256: str, platform: str) -> PrefillCounter:
    """This process's counter for `kernel`, from the environment; its marker is printed and its
    stats (0 calls) published at once, so a process that never runs a prefill still shows."""
    counter = PrefillCounter(
        kernel=kernel,
        source_sha256=source_sha256,
        platform=platform,
        stats_dir=_stats_dir(),
        server=os.environ.get(SERVER_ENV, ""),
        timed=os.environ.get(TIME_ENV, "") == "1",
        gauges=multiprocess_gauges_from_env(),
    )
    _emit_marker(kernel, source_sha256, platform)
    counter.publish()
    return counter
