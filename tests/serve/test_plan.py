"""Server planning without vLLM: argv/env identical except declared differences, placement on
disjoint cores or GPUs, replica pairs, and the API key kept off the command line."""

from pathlib import Path

from rig.scenario.config import Scenario
from rig.scenario.loader import load_scenario
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
from rig.serve.servers import ServerSet


def scenario(**overrides) -> Scenario:
    data = {
        "name": "t",
        "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]},
        "candidate": {"kernel": "ns4", "env": {"EXTRA": "1"}, "serve_args": ["--foo"]},
    }
    data.update(overrides)
    return Scenario.model_validate(data)


def test_sides_differ_only_in_what_the_scenario_declares(tmp_path):
    plan = plan_servers(scenario(), "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    ref, cand = plan.servers["reference"], plan.servers["candidate"]
    strip = {"--port"}

    def without_port(argv):
        out, skip = [], False
        for arg in argv:
            if skip:
                skip = False
                continue
            if arg in strip:
                skip = True
                continue
            out.append(arg)
        return out

    assert without_port(cand.argv) == [*without_port(ref.argv), "--foo"]
    own = ("RIG_GDN_STATS_DIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")  # per side
    ref_env = {k: v for k, v in ref.env.items() if k not in own}
    cand_env = {k: v for k, v in cand.env.items() if k not in own}
    assert {k: v for k, v in cand_env.items() if ref_env.get(k) != v} == {
        "EXTRA": "1",
        "RIG_GDN_KERNEL": "ns4",
        "VLLM_CPU_OMP_THREADS_BIND": "1",
    }
    assert ref.env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "127.0.0.1" in ref.argv and ref.port != cand.port
    assert plan.simultaneous


def test_one_core_runs_sides_one_after_the_other(tmp_path):
    plan = plan_servers(scenario(), "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(3,)))
    assert plan.phases == (("reference",), ("candidate",))


def test_gpus_are_split_by_tensor_parallel_size(tmp_path):
    tp2 = scenario(model={"name": "x", "tensor_parallel_size": 2})
    plan = plan_servers(tp2, "/m", tmp_path, Hardware(gpu_count=4, cpu_ids=(0,)))
    assert plan.servers["reference"].env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plan.servers["candidate"].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    short = plan_servers(tp2, "/m", tmp_path, Hardware(gpu_count=3, cpu_ids=(0,)))
    assert not short.simultaneous


def test_cpu_servers_get_a_bounded_kv_cache(tmp_path):
    hardware = Hardware(gpu_count=0, cpu_ids=(0, 1), memory_gib=24.0)
    plan = plan_servers(scenario(), "/m", tmp_path, hardware)
    assert plan.servers["reference"].env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert plan.servers["candidate"].env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    explicit = scenario(model={"name": "x", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}})
    plan = plan_servers(explicit, "/m", tmp_path, hardware)
    assert plan.servers["candidate"].env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_replica_pairs_get_their_own_servers_logs_and_gpus(tmp_path):
    hardware = Hardware(
        gpu_count=2, cpu_ids=(0,), gpu_ids=("4", "5"), gpu_free_mib=(140_000, 140_000)
    )
    plan = plan_servers(scenario(placement={"replicas": 2}), "/m", tmp_path, hardware, copies=4)
    assert set(plan.servers) == {"reference", "candidate", "reference-1", "candidate-1"}
    assert plan.phases == (("reference", "candidate", "reference-1", "candidate-1"),)
    logs = {p.log_path.name for p in plan.servers.values()}
    assert len(logs) == 4 and "server-reference-1.log" in logs
    # indices into this process's CUDA_VISIBLE_DEVICES become the physical ids the child needs
    assert plan.servers["reference-1"].env["CUDA_VISIBLE_DEVICES"] == "4"
    assert plan.servers["candidate-1"].env["CUDA_VISIBLE_DEVICES"] == "5"
    servers = ServerSet(list(plan.servers.values()), startup_timeout_s=1).servers
    assert set(servers) == set(plan.servers)
    assert [p.replica for p in plan.side_servers("candidate")] == [0, 1]


def test_the_api_key_reaches_vllm_through_its_environment_never_argv(tmp_path):
    plans = plan_servers(
        scenario(candidate={"api_key": "sk-secret"}),
        "/m",
        tmp_path,
        Hardware(gpu_count=0, cpu_ids=(0, 1)),
    ).servers
    candidate = plans["candidate"]
    assert not any("sk-secret" in arg for arg in candidate.argv)
    assert "--api-key" not in candidate.argv
    assert candidate.env["VLLM_API_KEY"] == "sk-secret"
    assert candidate.redacted_env()["VLLM_API_KEY"] == "<redacted>"
    assert "sk-secret" not in repr(candidate.api_key)
    assert "VLLM_API_KEY" not in plans["reference"].env


def test_prefix_caching_is_asked_for_only_where_hits_are_the_test(tmp_path):
    """vLLM's CUDA build leaves it off for hybrid models; a user's serve_args still win."""
    hardware = Hardware(gpu_count=0, cpu_ids=(0, 1))
    plain = plan_servers(scenario(), "/m", tmp_path, hardware)
    assert "--enable-prefix-caching" not in plain.servers["reference"].argv
    turns = load_scenario(
        Path("scenarios/multi-turn.yaml"),
        ['candidate.serve_args=["--no-enable-prefix-caching"]'],
    )
    plan = plan_servers(turns, "/m", tmp_path, hardware)
    ref, cand = plan.servers["reference"].argv, plan.servers["candidate"].argv
    assert "--enable-prefix-caching" in ref and "--no-enable-prefix-caching" not in ref
    assert cand.index("--no-enable-prefix-caching") > cand.index("--enable-prefix-caching")


def test_eager_on_cpu_compiled_on_a_gpu_unless_the_scenario_says(tmp_path):
    cpu = plan_servers(scenario(), "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    gpu = plan_servers(scenario(), "/m", tmp_path, Hardware(gpu_count=2, cpu_ids=(0,)))
    assert all("--enforce-eager" in s.argv for s in cpu.servers.values())
    assert not any("--enforce-eager" in s.argv for s in gpu.servers.values())
    asked = scenario(model={"name": "x", "enforce_eager": True})
    eager_gpu = plan_servers(asked, "/m", tmp_path, Hardware(gpu_count=2, cpu_ids=(0,)))
    assert all("--enforce-eager" in s.argv for s in eager_gpu.servers.values())
