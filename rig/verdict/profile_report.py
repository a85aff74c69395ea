"""The profiled block's verdict: each side's kernel table side by side, the GDN prefill groups'
candidate/reference ratio, and the rows profile.csv holds. Computed from what rig/run hands
it (the block's record and each trace's bytes); it reads no file itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rig.records import Side
from rig.verdict.profile import OTHER, TraceTable, TraceUnreadable, merged, trace_table

BLOCK_FILE = "block.json"
TOP_KERNELS = 10  # the kernels each side's table lists by name; the rest are summed
NOT_TIMED = (
    "the profiled block ran after the timed ones and counts in no speed interval "
    "(a profiler slows what it records)"
)


@dataclass(frozen=True)
class ProfiledBlock:
    """What the profiled block of one server sent, and how long it and the trace took."""

    label: str
    side: str
    level: int
    requests: int
    failed: int
    seconds: float
    trace_write_s: float

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ProfiledBlock:
        return cls(**data)


@dataclass(frozen=True)
class TraceFile:
    """A trace kept under profile/<server>/, as it lies there (gzipped)."""

    path: str  # relative to the run's folder
    size_bytes: int


@dataclass(frozen=True)
class SideProfile:
    """One server's profiled block, its traces and the table they make (None: unreadable)."""

    block: ProfiledBlock
    traces: tuple[TraceFile, ...]
    table: TraceTable | None
    problem: str | None = None  # why there is no table, in one line


@dataclass(frozen=True)
class GroupRow:
    """One kernel group of both sides: time in ms, share of the side's step time, ratio."""

    group: str
    reference_ms: float | None
    candidate_ms: float | None
    reference_share_pct: float | None
    candidate_share_pct: float | None

    @property
    def ratio(self) -> float | None:
        """candidate / reference time."""
        if self.reference_ms and self.candidate_ms is not None:
            return self.candidate_ms / self.reference_ms
        return None


def side_profile(block: ProfiledBlock, traces: list[tuple[TraceFile, bytes]]) -> SideProfile:
    """A server's table from its workers' trace bytes (several ranks add up)."""
    files = tuple(file for file, _ in traces)
    if not traces:
        return SideProfile(block, files, None, f"{block.label} wrote no worker trace")
    try:
        tables = [trace_table(data) for _, data in traces]
    except TraceUnreadable as exc:
        return SideProfile(block, files, None, f"{block.label}'s trace: {exc}")
    return SideProfile(block, files, merged(tables))


@dataclass(frozen=True)
class ProfileResult:
    """Both sides' profiled blocks, as the report shows them."""

    level: int
    sides: tuple[SideProfile, ...]

    def side(self, name: str) -> SideProfile | None:
        return next((s for s in self.sides if s.block.side == name), None)

    def table(self, name: str) -> TraceTable | None:
        found = self.side(name)
        return found.table if found is not None else None

    @property
    def device(self) -> bool:
        return any(s.table is not None and s.table.device for s in self.sides)

    @property
    def time_kind(self) -> str:
        return "device time of GPU kernels" if self.device else "CPU ops' self time"

    def groups(self) -> list[GroupRow]:
        """The GDN prefill groups of either side, then everything else."""
        ref, cand = self.table(Side.REFERENCE), self.table(Side.CANDIDATE)
        ref_groups = ref.groups() if ref else {}
        cand_groups = cand.groups() if cand else {}
        names = sorted(set(ref_groups) | set(cand_groups), key=lambda g: (g == OTHER, g))

        def share(table: TraceTable | None, us: float | None) -> float | None:
            if table is None or us is None or table.step_us <= 0:
                return None
            return 100 * us / table.step_us

        rows = []
        for name in names:
            ref_us, cand_us = ref_groups.get(name), cand_groups.get(name)
            rows.append(
                GroupRow(
                    name,
                    ref_us / 1000 if ref_us is not None else None,
                    cand_us / 1000 if cand_us is not None else None,
                    share(ref, ref_us),
                    share(cand, cand_us),
                )
            )
        return rows

    def gdn_ratio(self) -> float | None:
        """The candidate's GDN prefill time over the reference's, in the profiled block."""
        ref, cand = self.table(Side.REFERENCE), self.table(Side.CANDIDATE)
        if ref is None or cand is None or ref.gdn_us <= 0:
            return None
        return cand.gdn_us / ref.gdn_us

    def gdn_ratio_per_call(self) -> float | None:
        """The candidate's GDN prefill time a call over the reference's, in the profiled block."""
        ref, cand = self.table(Side.REFERENCE), self.table(Side.CANDIDATE)
        if ref is None or cand is None or not ref.gdn_calls or not cand.gdn_calls:
            return None
        if ref.gdn_us <= 0:
            return None
        return (cand.gdn_us / cand.gdn_calls) / (ref.gdn_us / ref.gdn_calls)

    def lines(self) -> list[str]:
        """One line per side: its share, step count and traces with their size."""
        out = []
        for side in self.sides:
            size = sum(t.size_bytes for t in side.traces)
            traces = f"{len(side.traces)} trace(s), {size / 2**20:.2f} MiB gzipped"
            if side.table is None:
                out.append(f"{side.block.label}: {side.problem}; {traces}")
                continue
            table = side.table
            share = table.gdn_share_pct
            steps = f"{table.steps} steps" if table.steps else "no step scopes (kernel total)"
            out.append(
                f"{side.block.label}: GDN prefill {table.gdn_us / 1000:.1f} ms in "
                f"{table.gdn_calls} calls, "
                f"{share:.1f} % of {table.step_us / 1000:.1f} ms of profiled step time "
                f"({steps}); {side.block.requests} requests at C={side.block.level} in "
                f"{side.block.seconds:.1f} s; {traces}"
                if share is not None
                else f"{side.block.label}: no step time; {traces}"
            )
        return out

    def rows(self) -> list[dict]:
        """profile.csv's rows (PROFILE_COLUMNS): per side its top kernels by time (the rest
        summed), then the groups."""
        rows = []
        for side in self.sides:
            table = side.table
            if table is None:
                continue
            shown, rest = table.kernels[:TOP_KERNELS], table.kernels[TOP_KERNELS:]
            for kernel in shown:
                rows.append(
                    _kernel_row(
                        side, table, kernel.name, kernel.group, kernel.time_us, kernel.calls
                    )
                )
            if rest:
                rest_us = sum(k.time_us for k in rest)
                calls = sum(k.calls for k in rest)
                name = f"({len(rest)} more kernels)"
                rows.append(_kernel_row(side, table, name, "", rest_us, calls))
        for group in self.groups():
            rows.append(
                {
                    "kind": "group",
                    "side": "both",
                    "server": "",
                    "name": group.group,
                    "group": group.group,
                    "time_ms": None,
                    "calls": None,
                    "share_pct": None,
                    "reference_ms": group.reference_ms,
                    "candidate_ms": group.candidate_ms,
                    "reference_share_pct": group.reference_share_pct,
                    "candidate_share_pct": group.candidate_share_pct,
                    "ratio": group.ratio,
                }
            )
        return rows


PROFILE_COLUMNS = [
    "kind",
    "side",
    "server",
    "name",
    "group",
    "time_ms",
    "calls",
    "share_pct",
    "reference_ms",
    "candidate_ms",
    "reference_share_pct",
    "candidate_share_pct",
    "ratio",
]


def _kernel_row(
    side: SideProfile, table: TraceTable, name: str, group: str, time_us: float, calls: int
) -> dict:
    return {
        "kind": "kernel",
        "side": side.block.side,
        "server": side.block.label,
        "name": name,
        "group": group,
        "time_ms": time_us / 1000,
        "calls": calls,
        "share_pct": 100 * time_us / table.step_us if table.step_us > 0 else None,
    }
