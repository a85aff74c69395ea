"""Each side's cache folders: its own where it serves differently, shared where the sides
serve alike, the same from one run to the next; eager servers keep inductor's code there too."""

from rig.scenario.config import Scenario
from rig.serve.hardware import Hardware
from rig.serve.placement import ClusterNode
from rig.serve.plan import plan_servers

CPU = Hardware(gpu_count=0, cpu_ids=(0, 1))
GPUS = Hardware(gpu_count=2, cpu_ids=(0,))


def scenario(**overrides) -> Scenario:
    data = {
        "name": "t",
        "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]},
        "candidate": {"kernel": "ns4"},
    }
    data.update(overrides)
    return Scenario.model_validate(data)


def env_of(plan, key: str) -> dict[str, str | None]:
    return {label: server.env.get(key) for label, server in plan.servers.items()}


def test_compiled_sides_get_their_own_compile_cache_unless_they_serve_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    roots = env_of(plan_servers(scenario(), "/m", tmp_path, GPUS), "VLLM_CACHE_ROOT")
    assert roots["reference"] != roots["candidate"]
    assert all(root.startswith(str(tmp_path / "vllm" / "rig")) for root in roots.values())
    again = plan_servers(scenario(), "/m", tmp_path / "other", GPUS)
    assert env_of(again, "VLLM_CACHE_ROOT") == roots
    aa = plan_servers(scenario(candidate={}), "/m", tmp_path, GPUS)
    assert len(set(env_of(aa, "VLLM_CACHE_ROOT").values())) == 1
    # compiled, vLLM points inductor into its own graph folder itself
    assert set(env_of(again, "TORCHINDUCTOR_CACHE_DIR").values()) == {None}


def test_eager_sides_keep_inductors_code_in_their_own_folder(tmp_path, monkeypatch):
    """Not in the server's private TMPDIR, where every server would compile vLLM's logprob
    gathering again on its first replay."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    plan = plan_servers(scenario(), "/m", tmp_path, CPU)
    roots, inductor = env_of(plan, "VLLM_CACHE_ROOT"), env_of(plan, "TORCHINDUCTOR_CACHE_DIR")
    assert inductor == {side: f"{root}/inductor_cache" for side, root in roots.items()}
    assert inductor["reference"] != inductor["candidate"]
    assert (
        env_of(plan_servers(scenario(), "/m", tmp_path / "next", CPU), "VLLM_CACHE_ROOT") == roots
    )


def test_a_users_inductor_folder_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    plan = plan_servers(scenario(), "/m", tmp_path, CPU)
    assert set(env_of(plan, "TORCHINDUCTOR_CACHE_DIR").values()) == {None}  # inherited as is
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    side_set = scenario(candidate={"kernel": "ns4", "env": {"TORCHINDUCTOR_CACHE_DIR": "/x"}})
    planned = env_of(plan_servers(side_set, "/m", tmp_path, CPU), "TORCHINDUCTOR_CACHE_DIR")
    assert planned["candidate"] == "/x" and planned["reference"].endswith("/inductor_cache")


def test_attached_and_eager_ray_servers_get_no_cache_folder(tmp_path):
    """An attached server is not the rig's to configure; an eager one on a Ray node may not
    share this machine's home."""
    attached = scenario(reference={"url": "http://127.0.0.1:9"})
    plan = plan_servers(attached, "/m", tmp_path, CPU, sides=("reference",))
    assert "VLLM_CACHE_ROOT" not in plan.servers["reference"].env
    nodes = (ClusterNode("a" * 56, "10.0.0.1", 2, 0),)
    on_ray = scenario(
        model={"name": "org/m"}, placement={"backend": "ray"}, candidate={"kernel": "ns4"}
    )
    ray_plan = plan_servers(on_ray, "/m", tmp_path, CPU, nodes=nodes)
    assert set(env_of(ray_plan, "VLLM_CACHE_ROOT").values()) == {None}
