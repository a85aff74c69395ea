"""Reading a scenario file: its YAML, the model's preset underneath (scenarios/presets/), `--set`
overrides on top, validation with one-line errors, and prompt paths resolved."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationError,
)

from rig import PROJECT_ROOT
from rig.scenario.config import Scenario, ScenarioError, model_mapping
from rig.scenario.strict import StrictModel

PRESETS_DIR = PROJECT_ROOT / "scenarios" / "presets"


class CheckpointFacts(StrictModel):
    """What a checkpoint's config.json says of its model: the architecture, the sizes that set
    its weights, and its quantization. A preset's model is known by these, not by the name a
    local copy's folder or `_name_or_path` happens to carry (a download's folder is named by
    whoever made it; `save_pretrained` writes the path it loaded from, or nothing)."""

    architectures: list[str]
    hidden_size: int
    num_hidden_layers: int
    num_experts: int | None = None
    quant_method: str | None = None  # None: unquantized

    def describe(self) -> str:
        experts = f", {self.num_experts} experts" if self.num_experts else ""
        return (
            f"{'+'.join(self.architectures) or 'no architecture'}, hidden {self.hidden_size}, "
            f"{self.num_hidden_layers} layers{experts}, {self.quant_method or 'unquantized'}"
        )


class Preset(StrictModel):
    """A model's serving setup in one YAML file under scenarios/presets/: the name users type
    resolves to the hub id and the flags the seeds served it with; a local checkpoint whose
    config.json shows `checkpoint` gets it too."""

    key: str
    aliases: list[str] = Field(default_factory=list)
    weights_gib: float | None = None
    checkpoint: CheckpointFacts | None = None
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


def checkpoint_facts(folder: Path) -> CheckpointFacts | None:
    """A local checkpoint's facts from its config.json (a multimodal wrapper such as
    Qwen3.5's keeps the language model's sizes in `text_config`); None where it does not say."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    sizes = {**config, **text}
    quant = config.get("quantization_config") or text.get("quantization_config")
    try:
        return CheckpointFacts(
            architectures=config.get("architectures") or [],
            hidden_size=sizes.get("hidden_size"),
            num_hidden_layers=sizes.get("num_hidden_layers"),
            num_experts=sizes.get("num_experts"),
            quant_method=quant.get("quant_method") if isinstance(quant, dict) else None,
        )
    except ValidationError:
        return None


def _local_checkpoint(name: str | None) -> Path | None:
    """The folder a model name is, if it holds a config.json; a name that cannot be a path
    here (`~user` of no such user, a component too long) is none, and is left to validation."""
    if not name:
        return None
    try:
        folder = Path(name).expanduser()
        return folder if (folder / "config.json").is_file() else None
    except (OSError, RuntimeError):
        return None


def _exists(path: Path) -> bool:
    """Whether `path` exists; a path the system cannot even look up (too long) does not."""
    try:
        return path.exists()
    except OSError:
        return False


def preset_for(model: dict[str, Any], directory: Path = PRESETS_DIR) -> Preset | None:
    """The preset under a scenario's model: the one `model.preset` names, else the one its
    name (hub id or alias) names, else the one a local checkpoint's config.json matches."""
    presets = load_presets(directory)
    name = model.get("name") if isinstance(model.get("name"), str) else None
    folder = _local_checkpoint(name)
    facts = checkpoint_facts(folder) if folder is not None else None
    key = model.get("preset")
    if key is not None and not isinstance(key, str):
        raise ScenarioError(f"model.preset: expected a preset's name, got {key!r:.60}")
    if key is not None:
        chosen = presets.get(key)
        if chosen is None:
            raise ScenarioError(f"model.preset {key!r}: no such preset ({', '.join(presets)})")
        if folder is not None and facts != chosen.checkpoint:
            found = facts.describe() if facts else "no architecture and sizes"
            wanted = chosen.checkpoint.describe() if chosen.checkpoint else "none given"
            raise ScenarioError(
                f"model.preset {key}: {folder}'s config.json is another model ({found}; the "
                f"preset's: {wanted})"
            )
        return chosen
    named = find_preset(name, directory)
    if named is not None or facts is None:
        return named
    matches = [p for p in presets.values() if p.checkpoint == facts]
    if len(matches) > 1:
        keys = ", ".join(p.key for p in matches)
        raise ScenarioError(
            f"model {folder}: its config.json matches presets {keys} alike (the same "
            "architecture and sizes): pick one with --set model.preset=KEY"
        )
    return matches[0] if matches else None


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
    model = model_mapping(probe.get("model")) or {}
    if not isinstance(model, dict):
        return probe  # `model: 3`: validation names the key
    preset = preset_for(model)
    if preset is None:
        return probe
    file_data = dict(data)
    if "model" in file_data:
        file_data["model"] = model_mapping(file_data["model"])
    layer = {"model": {**preset.model, "weights_gib": preset.weights_gib}}
    if preset.workload:
        layer["workload"] = preset.workload
    merged = apply_overrides(_deep_merge(layer, file_data), overrides)
    merged["model"] = model_mapping(merged["model"])
    name = model.get("name")
    named = not isinstance(name, str) or name.strip().lower() in preset.names()
    merged["model"] |= {"name": preset.model["name"] if named else name, "preset": preset.key}
    return merged


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What YAML found wrong, in one line: a parser's `problem`, a reader's `reason` (a control
    character: a ReaderError has no `problem`), else the first line of its message."""
    found = getattr(exc, "problem", None) or getattr(exc, "reason", None)
    return found or str(exc).splitlines()[0]


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (['a', 'b', 'c'], value), the value parsed as YAML (so 64 is an int)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {text!r}: expected dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ScenarioError(
            f"--set {text!r}: value is not valid YAML ({_yaml_problem(exc)})"
        ) from None
    return [part for part in key.strip().split(".")], value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        if path == ["model"] and isinstance(value, str):
            path = ["model", "name"]  # --set model=X names the model, keeping its other keys
        if isinstance(data.get("model"), str):
            data["model"] = model_mapping(data["model"])
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


def _one_line(text: str) -> str:
    """`text` as it can stand in a one-line error: control characters (a key that is a line
    break) escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _describe(error: dict[str, Any]) -> str:
    key = _one_line(".".join(str(part) for part in error["loc"])) or "(top level)"
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}'"
    if error["type"] == "missing":
        return f"missing key '{key}'"
    return f"key '{key}': {_one_line(error['msg'])}"


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
        raise ScenarioError(f"{path}: invalid YAML{where}: {_yaml_problem(exc)}") from None
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
    """Prompt and conversation paths are relative to the working directory, else to the
    scenario file's folder, else to the project root (so shipped scenarios work from
    anywhere)."""
    project_root = PROJECT_ROOT
    sources = []
    for source in scenario.workload.prompts:
        if source.path is not None and not source.path.is_absolute() and not _exists(source.path):
            for base in (scenario_dir, project_root):
                if _exists(base / source.path):
                    source = source.model_copy(update={"path": base / source.path})
                    break
        sources.append(source)
    update: dict[str, Any] = {"prompts": sources}
    if (talks := scenario.workload.conversations) is not None and not _exists(talks.path):
        for base in (scenario_dir, project_root):
            if not talks.path.is_absolute() and _exists(base / talks.path):
                update["conversations"] = talks.model_copy(update={"path": base / talks.path})
                break
    workload = scenario.workload.model_copy(update=update)
    return scenario.model_copy(update={"workload": workload})
