"""Reading a scenario file: YAML and file errors in one line, prompt paths resolved, `--set`
overrides, and the model's preset underneath the file."""

import json
from pathlib import Path

import pytest

from rig import PROJECT_ROOT
from rig.scenario.config import ScenarioError
from rig.scenario.loader import apply_overrides, load_presets, load_scenario, parse_override
from tests.scenario.test_config import MINIMAL, error_of, write


def test_every_problem_is_listed_on_one_line(tmp_path):
    data = {"workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1], "bogus": 1}}
    data["model"] = {"dtype": 16}
    message = error_of(write(tmp_path, data))
    assert "unknown key 'workload.bogus'" in message
    assert "key 'model.dtype'" in message


def test_invalid_yaml_gives_the_line(tmp_path):
    path = write(tmp_path, "workload:\n  prompts: [1, 2\n  concurrency: [1]\n")
    message = error_of(path)
    assert "invalid YAML at line" in message


@pytest.mark.parametrize("text", ["description: \x1b\n", "workload: \x00\n"])
def test_a_control_character_is_invalid_yaml_in_one_line(tmp_path, text):
    message = error_of(write(tmp_path, text))
    assert "special characters are not allowed" in message and "\n" not in message


def test_a_control_character_in_a_set_value_is_one_line():
    with pytest.raises(ScenarioError, match="not valid YAML .special characters") as caught:
        parse_override("0=\x1b")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("preset", [["a"], {"a": 1}])
def test_a_preset_that_is_not_a_name_is_one_line(tmp_path, preset):
    path = write(tmp_path, {**MINIMAL, "model": {"preset": preset}})
    with pytest.raises(ScenarioError, match="model.preset: expected a preset's name"):
        load_scenario(path)


@pytest.mark.parametrize("name", ["~no-such-user-here/model", "m" * 300])
def test_a_model_name_that_cannot_be_a_folder_is_not_a_checkpoint(tmp_path, name):
    scenario = load_scenario(write(tmp_path, {**MINIMAL, "model": {"name": name}}))
    assert scenario.model.name == name


def test_a_prompt_path_too_long_to_look_up_is_a_missing_file(tmp_path):
    data = {"workload": {"prompts": [{"path": "p" * 300}], "concurrency": [1]}}
    scenario = load_scenario(write(tmp_path, data))
    assert scenario.workload.prompts[0].path == Path("p" * 300)


@pytest.mark.parametrize("model", [True, 3, ["a"]])
def test_a_model_that_is_neither_a_name_nor_a_mapping_is_one_line(tmp_path, model):
    assert "key 'model'" in error_of(write(tmp_path, {**MINIMAL, "model": model}))


def test_tab_indentation_is_invalid_yaml(tmp_path):
    message = error_of(write(tmp_path, "workload:\n\tconcurrency: [1]\n"))
    assert "invalid YAML at line 2" in message


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just words\n", "str")])
def test_non_mapping_is_rejected(tmp_path, text, kind):
    message = error_of(write(tmp_path, text))
    assert f"not a {kind}" in message


def test_empty_file_reports_the_missing_workload(tmp_path):
    assert "missing key 'workload'" in error_of(write(tmp_path, ""))


def test_missing_file(tmp_path):
    assert "not found" in error_of(tmp_path / "nope.yaml")


def test_directory_instead_of_a_file(tmp_path):
    assert "cannot read" in error_of(tmp_path)


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("description: caf\xe9\n".encode("latin-1"))
    assert "UTF-8" in error_of(path)


def test_prompt_path_resolves_beside_the_scenario_file(tmp_path, monkeypatch):
    (tmp_path / "mine.jsonl").write_text('{"id": "a", "prompt": "x"}\n', encoding="utf-8")
    data = {"workload": {"prompts": [{"path": "mine.jsonl"}], "concurrency": [1]}}
    path = write(tmp_path, data)
    monkeypatch.chdir(PROJECT_ROOT)  # the prompt file is not under the working directory
    scenario = load_scenario(path)
    assert scenario.workload.prompts[0].path == tmp_path / "mine.jsonl"


def test_model_string_is_the_name(tmp_path):
    scenario = load_scenario(write(tmp_path, {**MINIMAL, "model": "Qwen/Qwen3.5-397B-A17B-FP8"}))
    assert scenario.model.name == "Qwen/Qwen3.5-397B-A17B-FP8"
    assert not scenario.model.is_tiny
    assert scenario.model.dtype == "bfloat16"  # the rest keeps its defaults


def test_model_shorthand_from_the_command_line(tmp_path):
    path = write(tmp_path, {**MINIMAL, "model": {"name": "tiny", "dtype": "float32"}})
    scenario = load_scenario(path, ["model=org/some-model"])
    assert scenario.model.name == "org/some-model"
    # --set model=X names the model: the file's other model keys stay (make e2e MODEL=... TP=2).
    assert scenario.model.dtype == "float32"


def test_parse_override_types_values_as_yaml():
    assert parse_override("workload.max_tokens=64") == (["workload", "max_tokens"], 64)
    assert parse_override("drift.enabled=false") == (["drift", "enabled"], False)
    assert parse_override("workload.concurrency=[1, 8]") == (["workload", "concurrency"], [1, 8])
    assert parse_override("model.name=org/m") == (["model", "name"], "org/m")
    assert parse_override("a.b=") == (["a", "b"], "")
    assert parse_override("x=a=b") == (["x"], "a=b")


@pytest.mark.parametrize("text", ["noequals", "=5", "  =5"])
def test_parse_override_needs_a_key_and_an_equals_sign(text):
    with pytest.raises(ScenarioError, match="expected dotted.key=value"):
        parse_override(text)


def test_parse_override_rejects_invalid_yaml_values():
    with pytest.raises(ScenarioError, match="not valid YAML"):
        parse_override("workload.concurrency=[1, 2")


def test_overrides_beat_the_file(tmp_path):
    path = write(tmp_path, {**MINIMAL, "workload": {**MINIMAL["workload"], "max_tokens": 8}})
    scenario = load_scenario(
        path,
        ["workload.max_tokens=32", "workload.concurrency=[2, 4]", "gates.max_mean_drift=null"],
    )
    assert scenario.workload.max_tokens == 32
    assert scenario.workload.concurrency == [2, 4]
    assert scenario.gates.max_mean_drift is None


def test_later_override_wins():
    data = apply_overrides({}, ["a.b=1", "a.b=2"])
    assert data == {"a": {"b": 2}}


def test_overrides_create_missing_mappings(tmp_path):
    scenario = load_scenario(
        write(tmp_path, MINIMAL), ["candidate.env.RIG_GDN_KERNEL=ns3", "control.aa=true"]
    )
    assert scenario.candidate.env == {"RIG_GDN_KERNEL": "ns3"}
    assert scenario.control.aa is True


def test_override_fills_a_null_section(tmp_path):
    path = write(tmp_path, "drift:\nworkload: {prompts: [{long_tokens: [9]}], concurrency: [1]}\n")
    assert load_scenario(path, ["drift.max_requests=3"]).drift.max_requests == 3


def test_override_through_a_scalar_is_an_error(tmp_path):
    path = write(tmp_path, {**MINIMAL, "description": "text"})
    with pytest.raises(ScenarioError, match="'description' is not a mapping"):
        load_scenario(path, ["description.dtype=float16"])


def test_override_inside_a_model_given_by_name_alone(tmp_path):
    path = write(tmp_path, {**MINIMAL, "model": "org/m"})
    scenario = load_scenario(path, ["model.dtype=float16"])
    assert (scenario.model.name, scenario.model.dtype) == ("org/m", "float16")


def test_override_with_an_unknown_key_is_named(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["workload.max_tokenz=3"])
    assert "unknown key 'workload.max_tokenz'" in message


def test_override_with_a_wrong_type_is_named(tmp_path):
    message = error_of(write(tmp_path, MINIMAL), ["workload.concurrency=[1, 0]"])
    assert "key 'workload.concurrency.1'" in message


def test_every_preset_validates_as_a_scenario_model(tmp_path):
    presets = load_presets()
    assert {"qwen3.5-397b-fp8", "qwen3-next-80b-instruct"} <= set(presets)
    for preset in presets.values():
        scenario = load_scenario(write(tmp_path, MINIMAL), [f"model={preset.model['name']}"])
        assert scenario.model.preset == preset.key


@pytest.mark.parametrize(
    "name", ["Qwen3.5-397B", "qwen3.5-397b", "Qwen/Qwen3.5-397B-A17B-FP8", "Qwen3.5-397B-A17B"]
)
def test_a_preset_name_resolves_to_the_hub_id_and_the_seeds_serving_setup(tmp_path, name):
    scenario = load_scenario(write(tmp_path, MINIMAL), [f"model={name}"])
    model = scenario.model
    assert model.name == "Qwen/Qwen3.5-397B-A17B-FP8"
    assert model.preset == "qwen3.5-397b-fp8"
    assert model.tensor_parallel_size is None  # the plan sizes it to the GPUs
    assert (model.max_num_batched_tokens, model.max_num_seqs) == (10240, 220)
    assert model.api_concurrency_limit == 256
    assert not any("speculative" in arg for arg in model.serve_args)  # MTP off
    assert scenario.workload.chat_template_kwargs == {"enable_thinking": False}


def test_set_beats_the_scenario_file_which_beats_the_preset(tmp_path):
    data = {**MINIMAL, "model": {"name": "Qwen3.5-397B", "max_num_seqs": 64}}
    path = write(tmp_path, data)
    scenario = load_scenario(path)
    assert scenario.model.max_num_seqs == 64 and scenario.model.tensor_parallel_size is None
    scenario = load_scenario(path, ["model.tensor_parallel_size=4", "model.max_num_seqs=8"])
    assert (scenario.model.tensor_parallel_size, scenario.model.max_num_seqs) == (4, 8)
    # --set model=X names the model and keeps the other model keys of the file
    scenario = load_scenario(
        write(tmp_path, {**MINIMAL, "model": {"max_model_len": 512}}), ["model=Qwen3-Next-80B"]
    )
    assert scenario.model.name == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    assert scenario.model.max_model_len == 512


def test_a_model_without_preset_is_taken_as_written(tmp_path):
    scenario = load_scenario(write(tmp_path, MINIMAL), ["model=org/other-model"])
    assert scenario.model.name == "org/other-model" and scenario.model.preset is None
    assert scenario.model.tensor_parallel_size is None


QWEN35_FP8 = {  # the layout of Qwen3.5-397B-A17B-FP8's config.json: a multimodal wrapper
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "text_config": {"hidden_size": 4096, "num_hidden_layers": 60, "num_experts": 512},
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "vision_config": {"hidden_size": 1152, "depth": 27},
}
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_experts": 512,
}


def refusal(path, overrides) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, overrides)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def checkpoint(tmp_path, config: dict, name: str = "weights"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_local_checkpoint_gets_the_preset_its_config_matches(tmp_path):
    """By architecture, sizes and quantization: the folder's name says nothing, and the file
    keeps its own name and the rest of the file's keys."""
    folder = checkpoint(tmp_path, QWEN35_FP8, "x")
    scenario = load_scenario(write(tmp_path, MINIMAL), [f"model={folder}"])
    assert (scenario.model.name, scenario.model.preset) == (str(folder), "qwen3.5-397b-fp8")
    assert scenario.model.max_num_seqs == 220
    assert scenario.workload.chat_template_kwargs == {"enable_thinking": False}
    bf16 = checkpoint(tmp_path, {**QWEN35_FP8, "quantization_config": None}, "bf16")
    assert load_scenario(write(tmp_path, MINIMAL), [f"model={bf16}"]).model.preset is None
    smaller = {**QWEN35_FP8, "text_config": {**QWEN35_FP8["text_config"], "num_experts": 256}}
    other = checkpoint(tmp_path, smaller, "other")
    assert load_scenario(write(tmp_path, MINIMAL), [f"model={other}"]).model.preset is None


def test_a_config_two_presets_share_is_refused_until_one_is_named(tmp_path):
    """Qwen3-Next's Instruct and Thinking checkpoints have one config: the user names one."""
    folder = checkpoint(tmp_path, QWEN3_NEXT)
    path = write(tmp_path, MINIMAL)
    message = refusal(path, [f"model={folder}"])
    assert "matches presets qwen3-next-80b-instruct, qwen3-next-80b-thinking alike" in message
    assert "--set model.preset=KEY" in message
    picked = load_scenario(path, [f"model={folder}", "model.preset=qwen3-next-80b-thinking"])
    assert (picked.model.name, picked.model.preset) == (str(folder), "qwen3-next-80b-thinking")
    assert picked.workload.chat_template_kwargs == {"enable_thinking": False}
    wrong = refusal(path, [f"model={folder}", "model.preset=qwen3.5-397b-fp8"])
    assert "is another model (Qwen3NextForCausalLM, hidden 2048, 48 layers" in wrong
    assert "no such preset" in refusal(path, [f"model={folder}", "model.preset=nope"])
