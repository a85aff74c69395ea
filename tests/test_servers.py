"""Server planning and lifecycle without vLLM: argv/env identical except declared differences,
placement on disjoint cores or GPUs, port checks, and process-group cleanup."""

import socket
import sys
import time
from pathlib import Path

import pytest

from rig.scenario import Scenario
from rig.servers import (
    ADVISORY_LOG_KINDS,
    JIT_COMPILE,
    Hardware,
    Server,
    ServerError,
    ServerPlan,
    ServerSet,
    ensure_port_free,
    plan_servers,
    root_cause,
    scan_log,
)


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
    ref_env = {k: v for k, v in ref.env.items() if k not in ("RIG_GDN_STATS_DIR",)}
    cand_env = {k: v for k, v in cand.env.items() if k not in ("RIG_GDN_STATS_DIR",)}
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


def test_port_in_use_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {port}.*in use"):
            ensure_port_free(port)


def _plan(tmp_path: Path, argv: list[str]) -> ServerPlan:
    return ServerPlan(
        side="reference",
        argv=tuple(argv),
        env={},
        host="127.0.0.1",
        port=0,
        log_path=tmp_path / "server.log",
        stats_dir=tmp_path / "stats",
        served_model="m",
        kernel=None,
    )


def _alive(pid: int) -> bool:
    """Running or sleeping; a killed orphan may linger as a zombie until init reaps it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "zombie" not in state


def test_stop_kills_the_whole_process_group(tmp_path):
    """A server's children (vLLM's engine core and worker) must not outlive it, even when
    they ignore SIGTERM."""
    child_pid_file = tmp_path / "child.pid"
    script = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(child_pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    server = Server(_plan(tmp_path, [sys.executable, "-c", script]))
    server.start()
    deadline = time.monotonic() + 20
    while not child_pid_file.exists() or not child_pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(child_pid_file.read_text())
    assert _alive(child)
    server.stop(grace_s=1)
    time.sleep(0.2)
    assert not _alive(child)
    assert server.tmpdir is None


def test_a_server_that_exits_fails_with_its_log_tail(tmp_path):
    script = "print('model weights are missing'); raise SystemExit(3)"
    with (
        pytest.raises(ServerError, match="exited with code 3(.|\n)*model weights are missing"),
        ServerSet([_plan(tmp_path, [sys.executable, "-c", script])], startup_timeout_s=30),
    ):
        pass


def test_scan_log_finds_faults():
    text = (
        "INFO ok\nRuntimeError: CUDA error: an illegal memory access\n"
        "Traceback (most recent call last):\n"
    )
    kinds = [fault.kind for fault in scan_log("candidate", text)]
    assert kinds == ["cuda_error", "traceback"]
    assert scan_log("reference", "INFO all fine\n") == []


def test_scan_log_flags_jit_compilation_during_inference():
    # the warning vllm.utils.jit_monitor logs, as a server writes it
    line = (
        "(EngineCore pid=7) WARNING 11-30 23:01:02 [jit_monitor.py:137] triton compile during "
        "inference: chunk_fwd_kernel (BT=64). This causes a latency spike; consider extending "
        "warmup to cover this shape/config."
    )
    (fault,) = scan_log("candidate", f"INFO ok\n{line}\n")
    assert fault.kind == JIT_COMPILE and JIT_COMPILE in ADVISORY_LOG_KINDS


def test_root_cause_names_the_first_real_exception():
    log = (
        "WARNING ulimit ... `OSError: [Errno 24] Too many open files`. Consider ...\n"
        "(VllmWorker-0 pid=4) ERROR [x.py:9] ValueError: Available memory on node 0 is low\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert root_cause(log) == ": ValueError: Available memory on node 0 is low"
    assert root_cause("INFO all good\n") == ""


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


def test_a_server_log_loses_the_key_when_read_and_when_stopped(tmp_path):
    plan = plan_servers(
        scenario(candidate={"api_key": "sk-secret"}),
        "/m",
        tmp_path,
        Hardware(gpu_count=0, cpu_ids=(0, 1)),
    ).servers["candidate"]
    plan = ServerPlan(**{**plan.__dict__, "argv": (sys.executable, "-c", "print('sk-secret')")})
    server = Server(plan)
    server.start()
    server.process.wait(timeout=30)
    assert "sk-secret" not in server.log_tail()
    server.stop()
    assert "sk-secret" not in plan.log_path.read_text()
