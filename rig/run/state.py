"""A run's state and its files: what the phases accumulate, kept on disk as it happens so an
interrupted run loses nothing and `--resume` can continue it."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

from kernels.proof import KernelProof
from rig.manifest_record import RunManifest
from rig.records import (
    REQUESTS_FILE,
    CompletionKey,
    ForcedLogprobs,
    ForcedSequence,
    LevelFault,
    RequestRecord,
    ServerDelta,
    TokenLogprob,
    read_records,
)
from rig.run.manifest import build_manifest
from rig.scenario.accuracy_config import ACCURACY_REPEAT
from rig.scenario.accuracy_tasks import Question
from rig.scenario.config import SIDES, Scenario
from rig.scenario.conversations import Conversation
from rig.scenario.prompts import Prompt
from rig.serve.plan import LaunchPlan

SERVER_COUNTERS_FILE = "server_counters.jsonl"
FAULTS_FILE = "faults.jsonl"


@dataclass(frozen=True)
class RunContext:
    """What every stage reads and none changes: the run's inputs, resolved."""

    scenario: Scenario
    run_id: str
    run_dir: Path
    plan: LaunchPlan
    model_path: str
    prompts: list[Prompt]
    conversations: tuple[Conversation, ...] = ()  # workload.conversations, sent turn by turn
    questions: tuple[Question, ...] = ()  # the accuracy block's graded questions

    @functools.cached_property
    def manifest(self) -> RunManifest:
        """What produces this run, gathered once (servers.json before the load, manifest.json
        after it, with what the run found added)."""
        return build_manifest(self.scenario, self.plan, self.model_path)


@dataclass
class RunState:
    """What the phases accumulate for the compare/report stages."""

    records: list[RequestRecord] = field(default_factory=list)
    aa_records: list[RequestRecord] = field(default_factory=list)
    alone_records: list[RequestRecord] = field(default_factory=list)  # control.self_check
    alone_replayed: dict[CompletionKey, list[TokenLogprob]] = field(default_factory=dict)
    server_deltas: list[ServerDelta] = field(default_factory=list)
    faults: list[LevelFault] = field(default_factory=list)
    sequences: list[ForcedSequence] = field(default_factory=list)
    forced: dict[str, dict[int, ForcedLogprobs]] = field(default_factory=dict)  # by sequence
    timings: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    proofs: dict[str, KernelProof] = field(default_factory=dict)  # by server label
    served_versions: dict[str, str] = field(default_factory=dict)  # GET /version, by label
    schedule: list[dict] = field(default_factory=list)  # each start of servers, in order

    def add_timing(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds


class RecordSink:
    """Appends each record to requests.jsonl the moment it completes, so nothing is lost; a
    record the disk cannot take is cut back out, so the file holds whole lines only."""

    def __init__(self, path: Path, handle: BinaryIO) -> None:
        self.path = path
        self.handle = handle

    @classmethod
    def open(cls, path: Path) -> RecordSink:
        return cls(path, open(path, "ab", buffering=0))  # noqa: SIM115 - closed in close()

    def __call__(self, record: RequestRecord) -> None:
        # backslashreplace: a lone surrogate in model output must not lose the record
        data = memoryview((record.to_json() + "\n").encode("utf-8", errors="backslashreplace"))
        end = os.fstat(self.handle.fileno()).st_size
        try:
            while data:
                data = data[self.handle.write(data) :]
        except OSError as exc:
            os.ftruncate(self.handle.fileno(), end)
            raise OSError(exc.errno, f"{self.path}: {exc.strerror}") from None

    def close(self) -> None:
        self.handle.close()


def append_jsonl(path: Path, row: object) -> None:
    """One dataclass as one JSON line (the run's small side files, kept for --resume)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(row)) + "\n")


def read_jsonl(path: Path, kind: type) -> list:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [kind(**json.loads(line)) for line in lines if line]


class RunJournal:
    """The run's state and its files together: a record, fault or prefix-cache delta is on disk
    the moment the state holds it, so an interrupted level still compares the pairs that
    finished and a resumed run still gates on the faults of the levels it keeps."""

    def __init__(self, run_dir: Path, state: RunState, sink: RecordSink) -> None:
        self.run_dir = run_dir
        self.state = state
        self.sink = sink

    def keep_record(self, record: RequestRecord) -> None:
        self.sink(record)
        self.state.records.append(record)

    def record_fault(self, fault: LevelFault) -> None:
        self.state.faults.append(fault)
        append_jsonl(self.run_dir / FAULTS_FILE, fault)

    def record_server_delta(self, delta: ServerDelta) -> None:
        self.state.server_deltas.append(delta)
        append_jsonl(self.run_dir / SERVER_COUNTERS_FILE, delta)


def finished(record: RequestRecord) -> bool:
    """Not cut off by an interrupt: a cancelled request says nothing about either kernel."""
    return not record.cancelled


@dataclass(frozen=True)
class Resumed:
    """What an interrupted run left that a resumed run keeps."""

    done_levels: frozenset[tuple[int, int]]  # (level, repeat) finished on every side
    state: RunState


def resume_from_disk(run_dir: Path, expected: int, questions: int = 0) -> Resumed:
    """Keep the levels an interrupted run finished on every side (`expected` records each, the
    accuracy block `questions`); the others run again. The run's files are cut back to the
    kept levels."""
    records_path = run_dir / REQUESTS_FILE
    records = read_records(records_path)
    groups: dict[tuple[str, int, int], list[RequestRecord]] = {}
    for record in records:
        groups.setdefault((record.side, record.level, record.repeat), []).append(record)
    complete = {
        key
        for key, group in groups.items()
        if len(group) == (questions if key[2] == ACCURACY_REPEAT else expected)
        and all(finished(r) for r in group)
    }
    faults = read_jsonl(run_dir / FAULTS_FILE, LevelFault)
    died = {(f.level, f.repeat) for f in faults if f.kind == "server_died"}
    done_levels = frozenset(
        (level, repeat)
        for (_, level, repeat) in complete
        if all((side, level, repeat) in complete for side in SIDES) and (level, repeat) not in died
    )
    state = RunState()
    state.faults = [f for f in faults if (f.level, f.repeat) in done_levels]
    kept = [r for r in records if (r.level, r.repeat) in done_levels]
    with open(records_path, "w", encoding="utf-8", errors="backslashreplace") as handle:
        handle.writelines(record.to_json() + "\n" for record in kept)
    state.records = kept
    deltas = read_jsonl(run_dir / SERVER_COUNTERS_FILE, ServerDelta)
    state.server_deltas = [d for d in deltas if (d.level, d.repeat) in done_levels]
    for name, rows in ((SERVER_COUNTERS_FILE, deltas), (FAULTS_FILE, faults)):
        kept_rows = [r for r in rows if (r.level, r.repeat) in done_levels]
        (run_dir / name).write_text("".join(json.dumps(asdict(r)) + "\n" for r in kept_rows))
    print(
        f"rig: resuming: {len(done_levels)} finished level(s) kept "
        f"({len(kept)} records), the rest run again",
        flush=True,
    )
    return Resumed(done_levels, state)
