"""What one vLLM process proves about its GDN prefill: the counter the plugin wraps around the op.

kernels/vllm_plugin.py decides which op runs and installs it; this file is the evidence that op
leaves, whatever it is: `PrefillCounter` counts and times every prefill call, tallies the
sequences that start from a non-zero state (kernels/initial_state.py), counts the process's JIT
compilations (kernels/compile_counter.py), and mirrors all of it to the stats
folder and, where vLLM serves /metrics from PROMETHEUS_MULTIPROC_DIR, to multiprocess gauges
(kernels/proof_metrics.py); `new_counter` prints the process's marker line.
`share_evidence_folder` gives one server's processes one stats folder and one server id.
kernels/proof.py reads all of it back.
"""

import os
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels.proof import (
    STATS_DIR_ENV,
    TALLY_FIELDS,
    PrefillStats,
    format_marker,
    stats_file_name,
)
from kernels.proof_metrics import MultiprocessGauges, multiprocess_gauges_from_env
from kernels.registry import runs_on_cuda

SERVER_ENV = "RIG_GDN_SERVER_ID"  # set by the first process, inherited by the rest of a server
TIME_ENV = "RIG_GDN_TIME"  # "1": time calls between two device synchronisations
PENDING_LIMIT = 1024  # CUDA event pairs waiting for the GPU; beyond, the oldest go untimed
# The scope a profiler trace shows around every GDN prefill call (rig/verdict/profile.py reads it)
PROFILE_SCOPE = "rig_gdn_prefill"

_private_stats_dir: tempfile.TemporaryDirectory | None = None


@dataclass
class PrefillCounter:
    """This process's evidence: the kernel it installed, vLLM's own backend choice, its GDN
    prefill calls and their time, and its JIT compilations, mirrored to the stats folder and,
    where vLLM serves /metrics from PROMETHEUS_MULTIPROC_DIR, to multiprocess gauges."""

    kernel: str
    source_sha256: str
    platform: str
    stats_dir: Path | None
    server: str = ""
    vllm_backend: str = ""
    requested_backend: str = ""
    calls: int = 0
    timed_calls: int = 0
    seconds: float = 0.0
    compiles: int = 0
    # initial-state tallies summed (kernels/initial_state.py, in TALLY_FIELDS' order)
    tally: list[int] = field(default_factory=lambda: [0] * len(TALLY_FIELDS))
    synchronised: bool = False  # RIG_GDN_TIME=1
    gauges: MultiprocessGauges | None = None
    # (start, end) events of CUDA calls the GPU may not have finished, oldest first
    pending: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = field(
        default_factory=lambda: deque(maxlen=PENDING_LIMIT)
    )
    # (host copy, copied event) of CUDA tallies on their way back, oldest first
    pending_tallies: deque[tuple[torch.Tensor, torch.cuda.Event]] = field(
        default_factory=lambda: deque(maxlen=PENDING_LIMIT)
    )
    # compile hooks can fire on a compiler's thread while a prefill call publishes
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

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
            timed_calls=self.timed_calls,
            compiles=self.compiles,
            **{
                f"initial_state_{name}": value
                for name, value in zip(TALLY_FIELDS, self.tally, strict=True)
            },
        )

    def publish(self) -> None:
        with self.lock:
            self._drain()
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
        with self.lock:
            self.calls += 1
            self.publish()

    def compiled(self) -> None:
        """One JIT compilation in this process, published at once: a block of load that
        compiled is told from one that did not by the readings around it."""
        with self.lock:
            self.compiles += 1
            self.publish()

    def saw_states(self, tally: torch.Tensor | None) -> None:
        """Add one call's initial-state tally (kernels/initial_state.py), made before the call.
        A CUDA tally is copied to the host without waiting and added once the GPU has passed
        its copy (on a later call or publish); none is taken during a graph capture."""
        if tally is None:
            return
        if not tally.is_cuda:
            self._add_tally(tally.tolist())
            return
        if torch.cuda.is_current_stream_capturing():
            return
        host = torch.empty(tally.shape, dtype=tally.dtype, pin_memory=True)
        host.copy_(tally, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        with self.lock:
            self.pending_tallies.append((host, copied))

    def _add_tally(self, values: list[int]) -> None:
        with self.lock:
            self.tally = [a + int(b) for a, b in zip(self.tally, values, strict=True)]

    def call(self, op: Callable, *args, **kwargs):
        """Run one prefill call, count it and time it without making the server wait: on CPU
        tensors the op is synchronous, so the wall clock around it; on CUDA, events around it on
        the current stream, read once the GPU has passed them (on a later call or publish).
        RIG_GDN_TIME=1: between two device synchronisations instead. While a torch profiler
        records, the call runs inside a `rig_gdn_prefill[<kernel>]` scope: what a trace's GDN
        prefill time is, whichever kernels the op launches."""
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function(f"{PROFILE_SCOPE}[{self.kernel}]"):
                return self._counted_call(op, args, kwargs)
        return self._counted_call(op, args, kwargs)

    def _counted_call(self, op: Callable, args: tuple, kwargs: dict):
        if self.synchronised:
            result = self._synchronised_call(op, args, kwargs)
        elif runs_on_cuda(args, kwargs):
            result = self._event_timed_call(op, args, kwargs)
        else:
            started = time.perf_counter()
            result = op(*args, **kwargs)
            self._timed(time.perf_counter() - started)
        self.record()
        return result

    def _timed(self, seconds: float) -> None:
        self.seconds += seconds
        self.timed_calls += 1

    def _synchronised_call(self, op: Callable, args: tuple, kwargs: dict):
        synchronize = torch.cuda.synchronize if torch.cuda.is_initialized() else lambda: None
        synchronize()
        started = time.perf_counter()
        result = op(*args, **kwargs)
        synchronize()
        self._timed(time.perf_counter() - started)
        return result

    def _event_timed_call(self, op: Callable, args: tuple, kwargs: dict):
        """Untimed while a CUDA graph is captured: its events would only time the capture."""
        if torch.cuda.is_current_stream_capturing():
            return op(*args, **kwargs)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = op(*args, **kwargs)
        end.record()
        with self.lock:  # a full deque drops the oldest pair, which a drain may be reading
            self.pending.append((start, end))
        return result

    def _drain(self) -> None:
        """Add the time and the initial-state tallies of the calls the GPU has finished, oldest
        first (one stream finishes its work in order). Querying an event is not allowed during
        a graph capture."""
        if not (self.pending or self.pending_tallies) or torch.cuda.is_current_stream_capturing():
            return
        while self.pending and self.pending[0][1].query():
            start, end = self.pending.popleft()
            self._timed(start.elapsed_time(end) / 1000)
        while self.pending_tallies and self.pending_tallies[0][1].query():
            self._add_tally(self.pending_tallies.popleft()[0].tolist())

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
        synchronised=os.environ.get(TIME_ENV, "") == "1",
        gauges=multiprocess_gauges_from_env(),
    )
    _emit_marker(kernel, source_sha256, platform)
    counter.publish()
    return counter
