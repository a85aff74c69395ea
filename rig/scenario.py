"""Scenario files: what to serve, what differs between the two sides, what load to send, and
which gates decide the verdict.

A scenario is YAML validated into pydantic models. Unknown keys and wrong types are errors
that name the file, the key and the problem; `--set dotted.key=value` overrides beat the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

TINY_MODEL = "tiny"
EMBEDDED_MODELS = (TINY_MODEL, "tiny-lm")  # built locally by rig.tiny_lm.ensure_embedded_model
SIDES = ("reference", "candidate")


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message is one line meant for the user."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """What both servers serve, with the flags they share."""

    name: str = Field(
        TINY_MODEL,
        description="HF id, local path, 'tiny' or 'tiny-lm' (the embedded models)",
    )
    served_name: str | None = None
    dtype: str = "bfloat16"
    max_model_len: int | None = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = True
    startup_timeout_s: float = Field(900.0, gt=0)
    serve_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def is_tiny(self) -> bool:
        return self.name == TINY_MODEL

    @property
    def is_embedded(self) -> bool:
        """A model the rig builds itself (rig.tiny_lm.EMBEDDED_MODELS), not a path or hub id."""
        return self.name in EMBEDDED_MODELS


class SideConfig(_Strict):
    """One side of the comparison. Only what is declared here may differ between the sides."""

    kernel: str | None = Field(None, description="candidate kernel name (sets RIG_GDN_KERNEL)")
    serve_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    gpus: list[int] | None = None
    url: str | None = Field(None, description="attach to a server someone else started")
    port: int | None = Field(None, gt=0, lt=65536, description="default: a free port")
    api_key: str | None = None

    @field_validator("kernel")
    @classmethod
    def _kernel_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("kernel must be a non-empty name or null")
        return value


class PromptSource(_Strict):
    """Prompts from a file (JSONL/ShareGPT, see rig.prompts) or generated long prompts."""

    path: Path | None = None
    limit: int | None = Field(None, gt=0)
    long_tokens: list[Annotated[int, Field(gt=0)]] = Field(default_factory=list)
    seed: int = 0

    @model_validator(mode="after")
    def _one_kind(self) -> PromptSource:
        if (self.path is None) == (not self.long_tokens):
            raise ValueError("a prompt source needs exactly one of 'path' or 'long_tokens'")
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
    warmup_requests: int = Field(0, ge=0)
    request_rate: float | None = Field(None, gt=0)
    burstiness: float = Field(1.0, gt=0)
    timeout_s: float = Field(600.0, gt=0)
    level_timeout_s: float | None = Field(None, gt=0, description="deadline for a whole level")
    top_logprobs: int = Field(5, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)


class DriftConfig(_Strict):
    """Teacher-forced replay of the reference completions on both sides (not timed)."""

    enabled: bool = True
    max_requests: int | None = Field(None, gt=0)


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
    workload: WorkloadConfig
    drift: DriftConfig = DriftConfig()
    control: ControlConfig = ControlConfig()
    gates: GatesConfig = GatesConfig()
    results_dir: Path = Path("results")
    run_id: str | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model_shorthand(cls, value: Any) -> Any:
        """`model: Qwen/Qwen3.5-397B-A17B-FP8` (or --set model=...) means the name alone."""
        return {"name": value} if isinstance(value, str) else value

    def side(self, name: str) -> SideConfig:
        return getattr(self, name)


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
    data = apply_overrides(data, overrides or [])
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
    project_root = Path(__file__).resolve().parent.parent
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
