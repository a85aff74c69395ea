"""How busy the GPU was while each timed block ran: is the served workload GPU-bound?

`gpu_speed_session.sh` samples nvidia-smi's utilization every 0.5 s into gpu-busy.csv for the
whole device job; each run's server_counters.jsonl holds every block's wall-clock start and
end. This joins the two: per run, level and side, the mean utilization over the samples inside
that side's blocks, the lowest and highest block mean, and the share of samples at 90 % or more.
Utilization is the fraction of time a kernel ran, not how much of the GPU it used: a workload
near 100 % here is one whose pace the GPU's queue sets; well under it, the host's.

    python benchmarks/gpu_busy.py RESULTS/gpu-busy.csv RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rig.records import ServerDelta  # noqa: E402
from rig.run.state import SERVER_COUNTERS_FILE, read_jsonl  # noqa: E402

BUSY = 90  # % utilization counted as busy


def read_samples(path: Path) -> pd.DataFrame:
    """nvidia-smi's `timestamp, utilization.gpu, memory.used` lines (csv, noheader, UTC clock):
    columns `epoch_s` and `busy` (%); lines it could not read (an error, a header) are
    left out."""
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 2 or not fields[1].endswith("%"):
            continue
        try:
            stamp = datetime.datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f")
            busy = float(fields[1].rstrip("%"))
        except ValueError:
            continue
        rows.append((stamp.replace(tzinfo=datetime.UTC).timestamp(), busy))
    return pd.DataFrame(rows, columns=["epoch_s", "busy"])


def block_busy(samples: pd.DataFrame, run_dir: Path) -> pd.DataFrame:
    """One row per timed block of the run that has samples inside it."""
    rows = []
    for delta in read_jsonl(run_dir / SERVER_COUNTERS_FILE, ServerDelta):
        if delta.started_at is None or delta.ended_at is None:
            continue
        inside = samples.busy[
            (samples.epoch_s >= delta.started_at) & (samples.epoch_s <= delta.ended_at)
        ]
        if inside.empty:
            continue
        rows.append(
            {
                "run": run_dir.name,
                "level": delta.level,
                "server": delta.server,
                "repeat": delta.repeat,
                "samples": len(inside),
                "busy_pct": inside.mean(),
                "at_90_pct": 100 * (inside >= BUSY).mean(),
            }
        )
    return pd.DataFrame(rows)


def busy_table(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per run, level and server: blocks, samples, the mean over samples and the block range."""
    grouped = blocks.groupby(["run", "level", "server"])
    table = grouped.agg(
        blocks=("repeat", "count"),
        samples=("samples", "sum"),
        lowest_block_pct=("busy_pct", "min"),
        highest_block_pct=("busy_pct", "max"),
    )
    weighted = blocks.assign(busy_sum=blocks.busy_pct * blocks.samples)
    weighted = weighted.assign(at_90_sum=blocks.at_90_pct * blocks.samples)
    sums = weighted.groupby(["run", "level", "server"])[["busy_sum", "at_90_sum"]].sum()
    table["busy_pct"] = sums.busy_sum / table.samples
    table["at_90_pct"] = sums.at_90_sum / table.samples
    return table.round(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="gpu-busy.csv (nvidia-smi, every 0.5 s)")
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (server_counters.jsonl)")
    args = parser.parse_args(argv)
    samples = read_samples(args.samples)
    if samples.empty:
        print(f"gpu-busy: no utilization samples in {args.samples}", file=sys.stderr)
        return 2
    blocks = [block_busy(samples, run) for run in args.runs]
    blocks = [frame for frame in blocks if not frame.empty]
    if not blocks:
        print("gpu-busy: no timed block of these runs has a sample inside it", file=sys.stderr)
        return 2
    print(busy_table(pd.concat(blocks)).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
