"""Golden cache: reference results keyed by everything that determines them, so the next
candidate iteration starts one server instead of two.

The key covers the model (and a digest of its files), the vLLM version, the reference side's
argv and environment (less ports, pinning and per-run paths; secrets as digests, since the key's
fields are stored with the entry), the prompts, the sampling
parameters and the concurrency levels. A hit restores the reference's records, its
teacher-forced replay of every completion it wrote (logprobs and top-k: the margins behind any
divergence a later candidate shows) and the proof of which kernel it ran.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kernels.proof import STATS_DIR_ENV
from rig.records import RequestRecord, read_records
from rig.scenario.config import Scenario
from rig.scenario.prompts import Prompt
from rig.secrets import digest, redact_argv, redact_env
from rig.serve.plan import ServerPlan
from rig.verdict.drift import ForcedLogprobs, ForcedSequence
from rig.verdict.gates import SideKernel

DEFAULT_ROOT = Path(".cache/golden")
SMALL_FILE_BYTES = 64 * 1024 * 1024
RUN_SPECIFIC_ENV = {STATS_DIR_ENV, "VLLM_CPU_OMP_THREADS_BIND", "CUDA_VISIBLE_DEVICES"}
RUN_SPECIFIC_ARGS = {"--port", "--host"}
# How the speed half is measured; the reference's texts and replay do not depend on them.
SPEED_ONLY_KEYS = {"schedule", "speed_resolution_pct", "speed_budget_s", "warmup_requests"}
ENTRY_FORMAT = 2  # 2: the replay keeps each position's top-k (the verdict's margins)


def model_digest(model_path: str) -> str:
    """Contents of small files (config, tokenizer), name+size+mtime of large ones (weights)."""
    root = Path(model_path)
    if not root.is_dir():
        return f"hub:{model_path}"
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(str(path.relative_to(root)).encode())
        if stat.st_size <= SMALL_FILE_BYTES:
            digest.update(path.read_bytes())
        else:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _portable_argv(reference: ServerPlan) -> list[str]:
    """The reference's argv without what differs between runs and machines: the interpreter's
    path, a container's per-server name, host and port."""
    install = reference.install
    launcher = list(install.serve_prefix[1:]) if install is not None else []
    kept, skip = launcher, False
    for arg in reference.serve_args:
        if skip:
            skip = False
        elif arg in RUN_SPECIFIC_ARGS:
            skip = True
        else:
            kept.append(arg)
    return kept


def golden_key(
    scenario: Scenario, reference: ServerPlan, model_path: str, prompts: list[Prompt]
) -> tuple[str, dict]:
    workload = scenario.workload
    install = reference.install
    added = set(install.env) if install is not None else set()
    fields = {
        "model": scenario.model.name,
        "model_digest": model_digest(model_path),
        "vllm": install.facts.key_fields() if install is not None else None,
        "argv": redact_argv(_portable_argv(reference), mask=digest),
        "env": redact_env(
            {
                k: v
                for k, v in sorted(reference.env.items())
                if k not in RUN_SPECIFIC_ENV and (k, v) not in added
            },
            mask=digest,
        ),
        "prompts": [[p.id, p.text, p.messages_as_dicts()] for p in prompts],
        "workload": workload.model_dump(
            mode="json",
            exclude={"prompts", "timeout_s", "level_timeout_s", "request_rate", "burstiness"}
            | SPEED_ONLY_KEYS,
        ),
        "drift": scenario.drift.model_dump(mode="json"),
        "entry_format": ENTRY_FORMAT,
    }
    blob = json.dumps(fields, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:24], fields


@dataclass
class GoldenEntry:
    """A reference side's results, as a later run needs them."""

    source_run: str
    records: list[RequestRecord]
    sequences: list[ForcedSequence]
    forced: dict[int, ForcedLogprobs]  # by index into sequences: every one, with its top-k
    kernel: SideKernel
    timings: dict[str, float]
    stored_at: str | None = None  # when it was stored (UTC), for the report's "not comparable"


class GoldenCache:
    def __init__(self, root: Path = DEFAULT_ROOT) -> None:
        self.root = root

    def load(self, key: str) -> GoldenEntry | None:
        folder = self.root / key
        meta_path = folder / "entry.json"
        if not meta_path.exists():
            return None
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        records = read_records(folder / "records.jsonl")
        sequences = [
            ForcedSequence(
                s["prompt_id"], tuple(s["prompt_token_ids"]), tuple(s["completion_token_ids"])
            )
            for s in meta["sequences"]
        ]
        forced = {f["index"]: ForcedLogprobs.from_json(f) for f in meta["forced"]}
        return GoldenEntry(
            source_run=meta["source_run"],
            records=records,
            sequences=sequences,
            forced=forced,
            kernel=SideKernel(
                **(
                    meta["kernel"]
                    | {"source_sha256": tuple(meta["kernel"].get("source_sha256", ()))}
                )
            ),
            timings=meta["timings"],
            stored_at=meta.get("stored_at"),
        )

    def store(self, key: str, fields: dict, entry: GoldenEntry) -> Path:
        """Write into a temporary folder, then rename: a half-written entry is never read."""
        folder = self.root / key
        staging = self.root / f".{key}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        with open(staging / "records.jsonl", "w", encoding="utf-8") as handle:
            for record in entry.records:
                handle.write(record.to_json() + "\n")
        meta = {
            "source_run": entry.source_run,
            "key_fields": fields,
            "sequences": [asdict(s) for s in entry.sequences],
            "forced": [{"index": i, **f.to_json()} for i, f in sorted(entry.forced.items())],
            "kernel": asdict(entry.kernel),
            "timings": entry.timings,
            "stored_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        (staging / "entry.json").write_text(json.dumps(meta), encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        return folder
