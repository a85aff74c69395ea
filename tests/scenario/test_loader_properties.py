"""The bad-input sweep of the scenario loader: any file text, any YAML document and any `--set`
ends in a Scenario or in one ScenarioError line, never in another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rig.scenario.config import Scenario, ScenarioError
from rig.scenario.loader import apply_overrides, load_scenario, parse_override

# Keys a scenario has, so that generated documents reach past the first unknown key.
KEYS = (
    "name",
    "model",
    "name",
    "preset",
    "max_model_len",
    "tensor_parallel_size",
    "workload",
    "prompts",
    "path",
    "limit",
    "long_tokens",
    "concurrency",
    "max_tokens",
    "endpoint",
    "conversations",
    "candidate",
    "kernel",
    "gates",
    "max_mean_drift",
    "control",
    "aa",
)
SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text()
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)
DOTTED = st.lists(st.sampled_from(KEYS) | st.text(max_size=6), min_size=1, max_size=4).map(".".join)
OVERRIDES = st.lists(
    st.tuples(DOTTED, st.text(max_size=20)).map("=".join) | st.text(max_size=30), max_size=3
)
VALID = {"workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1]}}


def _load(text: str, overrides: list[str]) -> Scenario | str:
    """The scenario, or the ScenarioError's message; any other exception fails the test."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            return load_scenario(path, overrides)
        except ScenarioError as exc:
            message = str(exc)
    assert message and "\n" not in message.strip(), message
    return message


@settings(max_examples=200)
@given(st.text(max_size=200))
def test_any_override_text_parses_or_says_why(text):
    try:
        path, _ = parse_override(text)
    except ScenarioError as exc:
        assert "--set" in str(exc)
    else:
        assert path and "=" in text


@settings(max_examples=200)
@given(DOCUMENTS.filter(lambda d: isinstance(d, dict)), OVERRIDES)
def test_overrides_on_any_mapping_apply_or_say_why(data, overrides):
    try:
        apply_overrides(data, overrides)
    except ScenarioError as exc:
        assert "--set" in str(exc)


@settings(max_examples=200)
@given(st.text(max_size=300), OVERRIDES)
@example("model: {preset: [a]}\n", [])
@example("model: {name: '~nosuchuser/x'}\n", [])
def test_any_file_text_loads_or_gives_one_line(text, overrides):
    _load(text, overrides)


@settings(max_examples=200)
@given(DOCUMENTS, OVERRIDES)
@example({"model": True}, [])
@example({"\n": None}, [])  # an unknown key that is a line break (found by this property)
@example({"workload": {"a\tb\r": 1}}, [])
def test_any_yaml_document_loads_or_gives_one_line(document, overrides):
    _load(yaml.safe_dump(document, allow_unicode=True), overrides)


@settings(max_examples=200)
@given(st.sampled_from(("model", "workload", "gates", "control")), st.sampled_from(KEYS), DOCUMENTS)
def test_a_valid_scenario_with_one_key_changed_loads_or_gives_one_line(section, key, value):
    data = {**VALID, section: {**VALID.get(section, {}), key: value}}
    loaded = _load(yaml.safe_dump(data, allow_unicode=True), [])
    if isinstance(loaded, Scenario):
        assert loaded.workload.concurrency
