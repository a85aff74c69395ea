"""What this machine offers the servers: GPUs (honouring CUDA_VISIBLE_DEVICES, with their free
memory), CPU cores and memory; or, with --assume-gpus (and --assume-gpu-gib), what a plan for
another node assumes."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """What this machine offers the servers (or, with --assume-gpus, what a plan assumes)."""

    gpu_count: int
    cpu_ids: tuple[int, ...]
    memory_gib: float = 0.0
    gpu_ids: tuple[str, ...] = ()  # as a child's CUDA_VISIBLE_DEVICES must name them
    gpu_free_mib: tuple[int, ...] = ()  # per GPU, empty when unknown
    assumed: bool = False

    @classmethod
    def detect(cls) -> Hardware:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        gpu_ids, free = visible_gpus()
        return cls(
            gpu_count=len(gpu_ids),
            cpu_ids=tuple(sorted(os.sched_getaffinity(0))),
            memory_gib=pages / 2**30,
            gpu_ids=gpu_ids,
            gpu_free_mib=free,
        )

    @classmethod
    def assume_gpus(cls, count: int, gib: float | None = None) -> Hardware:
        """A node this process is not on: `count` GPUs with `gib` GiB free each (None:
        unknown, so nothing is sized or checked against it)."""
        return cls(
            gpu_count=count,
            cpu_ids=tuple(range(os.cpu_count() or 1)),
            gpu_ids=tuple(str(i) for i in range(count)),
            gpu_free_mib=tuple(int(gib * 1024) for _ in range(count)) if gib else (),
            assumed=True,
        )

    @property
    def gpu_gib(self) -> float | None:
        """The least free memory of any GPU, in GiB (a server may land on any); None when it
        is unknown."""
        return min(self.gpu_free_mib) / 1024 if self.gpu_free_mib else None

    def kv_cache_gib(self, servers: int) -> int:
        """A CPU server's KV cache: a third of the memory shared by the servers, 1..32 GiB."""
        return max(1, min(32, int(self.memory_gib / 3 / max(servers, 1))))

    def visible_devices(self, gpus: tuple[int, ...]) -> str:
        """CUDA_VISIBLE_DEVICES for a child given indices into the GPUs this process sees."""
        ids = self.gpu_ids or tuple(str(i) for i in range(self.gpu_count))
        return ",".join(ids[g] for g in gpus)


def query_gpus(fields: str) -> list[list[str]]:
    """nvidia-smi's answer for `fields` (e.g. "index,memory.free"), one row per GPU of the
    machine; no rows when there is no NVIDIA GPU."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[part.strip() for part in line.split(",")] for line in listing.splitlines() if line]


def visible_gpus() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """GPU ids a child must be given (honouring this process's CUDA_VISIBLE_DEVICES) and their
    free memory in MiB."""
    rows = query_gpus("index,uuid,memory.free")
    by_name = {row[0]: row for row in rows} | {row[1]: row for row in rows}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
    chosen = [by_name[n] for n in names if n in by_name] if names is not None else rows
    return tuple(row[0] for row in chosen), tuple(int(float(row[2])) for row in chosen)
