"""Where a profiled block's time went: a torch profiler trace (Chrome trace JSON, gzipped or not,
as vLLM's workers write it) read into a per-kernel table per side.

On a GPU a kernel's time is its device time (the trace's `kernel` events); on a CPU, where no
device events exist, an op's self time (its `cpu_op` events, less the ops nested in them on the
same thread; a scope's own time, the Python between its ops, is a row of its own, so that a
side's rows add up to its step time). The GDN prefill is what ran inside the plugin's
`rig_gdn_prefill[<kernel>]` scope (kernels/prefill_counter.py): on a CPU the ops nested in it,
on a GPU the kernels launched from it (a kernel's `correlation` names its launch, on the scope's
thread). Each GDN kernel is grouped by whose it is: FLA's (`chunk_*` and the rest of its GDN
forward), ns4's own Triton kernels (`wy_kernel`, `walk_kernel`), or, for anything else the scope
ran, the side's kernel by name (a user's function). The step time is the sum of vLLM's per-step
scopes (`execute_context_<n>(<tokens>)_generation_<n>(<tokens>)`, written while its profiler
runs): on a GPU their device spans (`gpu_user_annotation`: from a step's first kernel to its
last, which the host's span need not cover when vLLM schedules asynchronously), on a CPU the
host's. A trace without them falls back to the sum of every kernel's time, and says so.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from dataclasses import dataclass

GDN_SCOPE = re.compile(r"^rig_gdn_prefill\[(?P<kernel>.*)\]$")
STEP_SCOPE = re.compile(r"^execute_")
# FLA's GDN forward (vllm/model_executor/layers/fla/ops): chunk_* and the kernels around them
FLA_KERNELS = re.compile(
    r"^(chunk_|solve_tril|merge_16x16|solve_16x16|recompute_w_u|l2norm_fwd|fused_recurrent)"
)
NS_KERNELS = re.compile(r"^(wy_kernel|walk_kernel)")
OTHER = "other"
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation"})  # a scope's self time counts too
STEP_NAME = "vLLM step"
OUTSIDE_OPS = "(outside ops)"


class TraceUnreadable(ValueError):
    """A trace that is not a torch profiler Chrome trace; the message is one line."""


@dataclass(frozen=True)
class KernelTime:
    """One kernel (or CPU op) of a trace: its time in the profiled block and how often it ran."""

    name: str
    group: str  # `GDN prefill: FLA`, `GDN prefill: ns4 (Triton)`, `GDN prefill: <kernel>`, other
    time_us: float
    calls: int

    @property
    def gdn(self) -> bool:
        return self.group != OTHER


@dataclass(frozen=True)
class TraceTable:
    """A side's profiled block: every kernel's time, the step time, and what was measured."""

    kernels: tuple[KernelTime, ...]  # longest first
    step_us: float
    steps: int
    device: bool  # device time of GPU kernels; False: CPU ops' self time
    gdn_calls: int  # scopes of the plugin seen

    @property
    def gdn_us(self) -> float:
        return sum(k.time_us for k in self.kernels if k.gdn)

    @property
    def kernel_us(self) -> float:
        return sum(k.time_us for k in self.kernels)

    @property
    def gdn_share_pct(self) -> float | None:
        return 100 * self.gdn_us / self.step_us if self.step_us > 0 else None

    def groups(self) -> dict[str, float]:
        """Time by group, microseconds."""
        totals: dict[str, float] = {}
        for kernel in self.kernels:
            totals[kernel.group] = totals.get(kernel.group, 0.0) + kernel.time_us
        return totals


def trace_events(data: bytes) -> list[dict]:
    """The complete events of a trace file's bytes (gzip or plain JSON)."""
    try:
        text = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        trace = json.loads(text)
    except (OSError, EOFError, ValueError) as exc:
        raise TraceUnreadable(f"not a gzip or JSON trace: {exc}") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise TraceUnreadable("no traceEvents list: not a Chrome trace")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]


def gdn_group(name: str, kernel: str) -> str:
    """Whose a GDN kernel is: FLA's, the nsR Triton kernels, or the scope's kernel by name."""
    if FLA_KERNELS.match(name):
        return "GDN prefill: FLA"
    if NS_KERNELS.match(name):
        return "GDN prefill: nsR (Triton)"
    return f"GDN prefill: {kernel}"


class _Scopes:
    """The plugin's GDN scopes of one thread, by start: which one (if any) holds a moment."""

    def __init__(self, scopes: list[dict]) -> None:
        self.scopes = sorted(scopes, key=lambda e: e["ts"])
        self.starts = [e["ts"] for e in self.scopes]

    def holding(self, ts: float) -> str | None:
        index = bisect.bisect_right(self.starts, ts) - 1
        if index < 0:
            return None
        scope = self.scopes[index]
        if ts <= scope["ts"] + scope["dur"]:
            return GDN_SCOPE.match(scope["name"])["kernel"]
        return None


def _scopes_by_thread(events: list[dict]) -> dict[tuple, _Scopes]:
    found: dict[tuple, list[dict]] = {}
    for event in events:
        if event.get("cat") == "user_annotation" and GDN_SCOPE.match(str(event.get("name"))):
            found.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    return {thread: _Scopes(scopes) for thread, scopes in found.items()}


def _self_times(ops: list[dict]) -> list[tuple[dict, float]]:
    """Each op with its self time: its duration less its direct children's, on one thread."""
    ordered = sorted(ops, key=lambda e: (e["ts"], -e["dur"]))
    self_time = {id(op): float(op["dur"]) for op in ordered}
    stack: list[dict] = []
    for op in ordered:
        while stack and op["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        if stack:
            self_time[id(stack[-1])] -= op["dur"]
        stack.append(op)
    return [(op, max(0.0, self_time[id(op)])) for op in ordered]


def _timed_kernels(
    events: list[dict], scopes: dict[tuple, _Scopes]
) -> list[tuple[str, str, float]]:
    """(name, GDN kernel or "", time) per kernel: device kernels where the trace has them, else
    CPU ops' self time."""
    device = [e for e in events if e.get("cat") == "kernel"]
    timed = []
    if device:
        launches = {
            e.get("args", {}).get("correlation"): e
            for e in events
            if e.get("cat") in LAUNCH_CATEGORIES
        }
        for kernel in device:
            launch = launches.get(kernel.get("args", {}).get("correlation"))
            held = None
            if launch is not None and (
                thread := scopes.get((launch.get("pid"), launch.get("tid")))
            ):
                held = thread.holding(launch["ts"])
            timed.append((str(kernel["name"]), held or "", float(kernel["dur"])))
        return timed
    threads: dict[tuple, list[dict]] = {}
    for event in events:
        if event.get("cat") in CPU_CATEGORIES:
            threads.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    for thread, ops in threads.items():
        held_by = scopes.get(thread)
        for op, self_us in _self_times(ops):
            held = held_by.holding(op["ts"]) if held_by is not None else None
            timed.append((_cpu_name(op), held or "", self_us))
    return timed


def _cpu_name(event: dict) -> str:
    """An op by name; a scope's own time (the Python between its ops) by what the scope is."""
    name = str(event["name"])
    if event.get("cat") != "user_annotation":
        return name
    if STEP_SCOPE.match(name):
        return f"{STEP_NAME} {OUTSIDE_OPS}"
    return f"{name} {OUTSIDE_OPS}"


def _steps(events: list[dict], category: str) -> list[dict]:
    return [e for e in events if e.get("cat") == category and STEP_SCOPE.match(str(e.get("name")))]


def trace_table(data: bytes) -> TraceTable:
    """One worker's trace, read into its kernel table."""
    events = trace_events(data)
    scopes = _scopes_by_thread(events)
    totals: dict[tuple[str, str], list[float]] = {}
    for name, held, time_us in _timed_kernels(events, scopes):
        group = gdn_group(name, held) if held else OTHER
        entry = totals.setdefault((name, group), [0.0, 0])
        entry[0] += time_us
        entry[1] += 1
    kernels = sorted(
        (
            KernelTime(name, group, time_us, int(calls))
            for (name, group), (time_us, calls) in totals.items()
        ),
        key=lambda k: -k.time_us,
    )
    device = any(e.get("cat") == "kernel" for e in events)
    steps = _steps(events, "gpu_user_annotation" if device else "user_annotation")
    if device and not steps:  # a device trace whose step scopes ran no kernel
        steps = _steps(events, "user_annotation")
    step_us = sum(float(e["dur"]) for e in steps) or sum(k.time_us for k in kernels)
    gdn_calls = sum(len(s.scopes) for s in scopes.values())
    return TraceTable(tuple(kernels), step_us, len(steps), device, gdn_calls)


def merged(tables: list[TraceTable]) -> TraceTable:
    """One side's workers' tables as one (tensor-parallel ranks: their times add up)."""
    totals: dict[tuple[str, str], list[float]] = {}
    for table in tables:
        for k in table.kernels:
            entry = totals.setdefault((k.name, k.group), [0.0, 0])
            entry[0] += k.time_us
            entry[1] += k.calls
    kernels = sorted(
        (KernelTime(n, g, t, int(c)) for (n, g), (t, c) in totals.items()), key=lambda k: -k.time_us
    )
    return TraceTable(
        tuple(kernels),
        sum(t.step_us for t in tables),
        sum(t.steps for t in tables),
        any(t.device for t in tables),
        sum(t.gdn_calls for t in tables),
    )
