"""A checkpoint on disk, looked at before any server loads it: where a hub id's snapshot lies in
the Hugging Face cache, how big the weights are, and whether a download finished. A download cut
short leaves a folder that looks like a checkpoint, and vLLM would find the missing shard only
minutes into loading it; the safetensors index names every shard, so preflight can say so in
seconds. Nothing here downloads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

INDEX_FILE = "model.safetensors.index.json"


def hf_hub_cache() -> Path:
    """Where the Hugging Face cache keeps models: HF_HUB_CACHE, else HF_HOME/hub."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit)
    home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
    return Path(home) / "hub"


def hf_cache_snapshot(hub_id: str) -> Path | None:
    """The newest snapshot of `hub_id` in the Hugging Face cache that has a config.json."""
    snapshots = hf_hub_cache() / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    found = [s for s in snapshots.glob("*") if (s / "config.json").is_file()]
    return max(found, key=lambda s: s.stat().st_mtime) if found else None


def _index(folder: Path) -> dict | None:
    """The folder's safetensors index, or None where it has none or it cannot be read."""
    try:
        data = json.loads((folder / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def checkpoint_bytes(folder: Path) -> int | None:
    """Size of a checkpoint's weights: its safetensors index's total, else the files' sizes."""
    try:
        return int((_index(folder) or {})["metadata"]["total_size"])
    except (KeyError, TypeError, ValueError):
        pass
    files = list(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) if files else None


@dataclass(frozen=True)
class MissingShards:
    """The shards a checkpoint's index names that are not there (a link into the cache whose
    blob never arrived counts as not there)."""

    missing: tuple[str, ...]
    named: int

    def describe(self) -> str:
        return (
            f"{len(self.missing)} of {self.named} shards its {INDEX_FILE} names are missing "
            f"(e.g. {self.missing[0]})"
        )


def missing_shards(folder: Path) -> MissingShards | None:
    """What a finished download would have and this folder lacks; None when nothing is."""
    weight_map = (_index(folder) or {}).get("weight_map")
    if not isinstance(weight_map, dict):
        return None
    named = sorted({str(shard) for shard in weight_map.values()})
    missing = tuple(shard for shard in named if not (folder / shard).is_file())
    return MissingShards(missing, len(named)) if missing else None
