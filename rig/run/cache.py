"""Golden cache: reference results keyed by everything that determines them, so the next
candidate iteration starts one server instead of two.

The key covers the model (by what its files hold, not where or when they were written), the
vLLM version, the reference side's
argv and environment (less ports, pinning and per-run paths; secrets as digests, since the key's
fields are stored with the entry), the prompts, the sampling
parameters and the concurrency levels. A hit restores the reference's records, its
teacher-forced replay of every completion it wrote (logprobs and top-k: the margins behind any
divergence a later candidate shows) and the proof of which kernel it ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kernels.proof import STATS_DIR_ENV, InitialStateCounts
from rig.records import ForcedLogprobs, ForcedSequence, RequestRecord, read_records
from rig.scenario.config import Scenario
from rig.scenario.prompts import Prompt
from rig.secrets import digest, redact_argv, redact_env
from rig.serve.plan import GATE_ENV, ServerPlan
from rig.serve.side_caches import CACHE_ROOT_ENV, INDUCTOR_CACHE_ENV
from rig.verdict.evidence import SideKernel

DEFAULT_ROOT = Path(".cache/golden")
SMALL_FILE_BYTES = 64 * 1024 * 1024
RUN_SPECIFIC_ENV = {
    STATS_DIR_ENV,
    "VLLM_CPU_OMP_THREADS_BIND",
    "CUDA_VISIBLE_DEVICES",
    GATE_ENV,  # vLLM's /pause and /resume, for arrival: waves; the texts do not depend on it
    CACHE_ROOT_ENV,  # where the side's compile cache is: a path of this machine's
    INDUCTOR_CACHE_ENV,
}
RUN_SPECIFIC_ARGS = {"--port", "--host", "--profiler-config"}  # its value: this run's folder
MODEL_PLACEHOLDER = "<model>"  # a local folder's path in the key: the digest says what it holds
# How the speed half is measured; the reference's texts and replay do not depend on them.
SPEED_ONLY_KEYS = {
    "schedule",
    "arrival",
    "speed_resolution_pct",
    "speed_budget_s",
    "warmup_requests",
}
ENTRY_FORMAT = 2  # 2: the replay keeps each position's top-k (the verdict's margins)


_SHA256_NAME = re.compile(r"[0-9a-f]{64}")
DIGESTS_FILE = "file-digests.json"  # in the cache root: content hashes by path, size, mtime


def model_digest(model_path: str, memo: Path | None = None) -> str:
    """The model by what its files hold, never by where or when they were made: small files
    (config, tokenizer) by their bytes, large ones (weights) by their content hash: the blob
    name a Hugging Face hub snapshot's link points at (the sha256 of the file), else a sha256
    of the file kept in `memo` (by path, size and modification time, so a file is read once)."""
    root = Path(model_path)
    if not root.is_dir():
        return f"hub:{model_path}"
    known = _read_memo(memo)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        if path.stat().st_size <= SMALL_FILE_BYTES:
            digest.update(path.read_bytes())
        else:
            digest.update(_content_hash(path, known).encode())
    if memo is not None and known:
        _write_memo(memo, known)
    return digest.hexdigest()


def _content_hash(path: Path, known: dict[str, str]) -> str:
    blob = path.resolve()
    if path.is_symlink() and blob.parent.name == "blobs" and _SHA256_NAME.fullmatch(blob.name):
        return blob.name
    stat = blob.stat()
    seen = f"{blob}:{stat.st_size}:{stat.st_mtime_ns}"
    if seen not in known:
        hasher = hashlib.sha256()
        with open(blob, "rb") as handle:
            while chunk := handle.read(16 * 2**20):
                hasher.update(chunk)
        known[seen] = hasher.hexdigest()
    return known[seen]


def _read_memo(memo: Path | None) -> dict[str, str]:
    try:
        return json.loads(memo.read_text()) if memo is not None and memo.exists() else {}
    except (OSError, ValueError):
        return {}  # a memo that cannot be read costs a re-hash, never a wrong key


def _write_memo(memo: Path, known: dict[str, str]) -> None:
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        staging = memo.with_name(f".{memo.name}.{os.getpid()}")
        staging.write_text(json.dumps(known))
        os.replace(staging, memo)
    except OSError:
        pass  # the next run hashes again


def _portable_argv(reference: ServerPlan, model_path: str) -> list[str]:
    """The reference's argv without what differs between runs and machines: the interpreter's
    path, a container's per-server name, host and port, and the model's folder (its files are
    in the key by content)."""
    install = reference.install
    launcher = list(install.serve_prefix[1:]) if install is not None else []
    kept, skip = launcher, False
    for arg in reference.serve_args:
        if skip:
            skip = False
        elif arg in RUN_SPECIFIC_ARGS:
            skip = True
        else:
            kept.append(MODEL_PLACEHOLDER if arg == model_path else arg)
    return kept


def golden_key(
    scenario: Scenario,
    reference: ServerPlan,
    model_path: str,
    prompts: list[Prompt],
    memo: Path | None = None,
) -> tuple[str, dict]:
    """The key of the reference's results and the fields it hashes; `memo` keeps the content
    hashes of large model files between runs (the cache root's DIGESTS_FILE)."""
    workload = scenario.workload
    install = reference.install
    added = set(install.env) if install is not None else set()
    fields = {
        "model": MODEL_PLACEHOLDER if Path(scenario.model.name).is_dir() else scenario.model.name,
        "model_digest": model_digest(model_path, memo),
        "vllm": install.facts.key_fields() if install is not None else None,
        "argv": redact_argv(_portable_argv(reference, model_path), mask=digest),
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
    if scenario.accuracy is not None:  # its questions are part of the reference's results
        fields["accuracy"] = scenario.accuracy.model_dump(mode="json")
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


def side_kernel_from_json(fields: dict) -> SideKernel:
    """The stored reference proof; entries from before initial states were counted have none."""
    counts = fields.get("initial_state")
    return SideKernel(
        **fields
        | {
            "source_sha256": tuple(fields.get("source_sha256", ())),
            "initial_state": InitialStateCounts(**counts) if counts is not None else None,
        }
    )


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
            kernel=side_kernel_from_json(meta["kernel"]),
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
