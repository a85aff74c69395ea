"""vLLM's profiler flag on both sides' command lines: the same flag and settings, each server
writing into its own folder under the run's (as each has its own port), none for an attached
server."""

import json

from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
from rig.serve.profiler_flags import profile_dir, profiler_args
from tests.serve.test_plan import scenario


def _config(argv: tuple[str, ...]) -> dict:
    return json.loads(argv[argv.index("--profiler-config") + 1])


def test_both_sides_get_the_same_profiler_settings_in_their_own_folders(tmp_path):
    plan = plan_servers(
        scenario(profile={"requests": 2}), "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1))
    )
    ref, cand = plan.servers["reference"], plan.servers["candidate"]
    ref_config, cand_config = _config(ref.argv), _config(cand.argv)
    assert ref_config.pop("torch_profiler_dir") == str((tmp_path / "profile/reference").resolve())
    assert cand_config.pop("torch_profiler_dir") == str((tmp_path / "profile/candidate").resolve())
    assert ref_config == cand_config == {"profiler": "torch", "torch_profiler_with_stack": False}


def test_no_flag_without_a_profile_or_for_an_attached_server(tmp_path):
    machine = Hardware(gpu_count=0, cpu_ids=(0, 1))
    plan = plan_servers(scenario(), "/m", tmp_path, machine)
    assert all("--profiler-config" not in s.argv for s in plan.servers.values())
    attached = scenario(profile={}, reference={"url": "http://127.0.0.1:9"})
    plan = plan_servers(attached, "/m", tmp_path, machine)
    assert "--profiler-config" not in plan.servers["reference"].argv
    assert "--profiler-config" in plan.servers["candidate"].argv


def test_the_flag_names_an_absolute_folder(tmp_path):
    flag, value = profiler_args(profile_dir(tmp_path, "candidate-1"))
    assert flag == "--profiler-config"
    assert json.loads(value)["torch_profiler_dir"].endswith("/profile/candidate-1")
