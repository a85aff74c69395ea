"""RunManifest: what produced a run's results (the scenario, both sides' servers, versions, the
rig's tree, the machine, the numerics knobs of the environment), as one typed record. Built once
by rig/run/manifest.py, completed after the run by rig/run/conclude.py, carried by the RunOutcome
and written by the report as manifest.json, with the verdict added."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rig.scenario.config import Scenario


@dataclass(frozen=True)
class ServerManifest:
    """One server as the plan started it (or attached it), secrets redacted."""

    side: str
    replica: int
    devices: str
    argv: list[str]
    env: dict[str, str]
    base_url: str
    log: str
    kernel: str | None
    install: dict[str, Any] | None  # rig.serve.installs.ServingInstall.record()


@dataclass(frozen=True)
class PlacementFacts:
    mode: str
    replicas: int
    phases: list[list[str]]  # server labels started together, in order
    description: str


@dataclass(frozen=True)
class GitState:
    """The rig's commit, and whether its tree had uncommitted changes (with a hash of them, so
    two runs can be told apart without storing the diff)."""

    sha: str | None
    dirty: bool
    diff_sha256: str | None


@dataclass(frozen=True)
class MachineFacts:
    platform: str
    python: str
    cpus: int | None
    gpus: list[str]  # "name, driver" per GPU
    cuda_runtime: str | None


@dataclass(frozen=True)
class RunManifest:
    scenario: Scenario  # as resolved (preset, file, --set)
    model_path: str
    servers: dict[str, ServerManifest]  # by server label
    placement: PlacementFacts
    simultaneous: bool  # both sides' timed loads ran at once
    versions: dict[str, str | None]  # distribution -> version
    rig_git: GitState
    kernel_file_sha256: dict[str, str]  # kernels/*.py
    machine: MachineFacts
    environment: dict[str, str]  # VLLM_*, CUDA_*, TRITON_*, FLA_*, ... redacted
    # What the run itself found, added by rig/run/conclude.py:
    server_peak_rss_mb: dict[str, float] = field(default_factory=dict)
    gdn_backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    served_vllm: dict[str, str] = field(default_factory=dict)  # GET /version, by label
    schedule: list[dict[str, Any]] = field(default_factory=list)  # each start of servers
    load_schedule: str = ""  # LoadSchedule.describe()
    excluded_blocks: list[list[int]] = field(default_factory=list)  # (level, repeat) left out
    pair_levels: list[int] = field(default_factory=list)  # timed request pair by pair
    stage_one_blocks: int | None = None  # a sequential design's first blocks (Stein)
    golden_run: str | None = None  # the run the reference came from, via the golden cache
    golden_stored_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        """manifest.json's fields, the scenario in its JSON form."""
        data = asdict(replace(self, scenario=None))
        data["scenario"] = json.loads(self.scenario.model_dump_json())
        return data
