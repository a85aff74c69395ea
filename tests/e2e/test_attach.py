"""A side attached by URL (a server someone else started, e.g. on another node) is proven the
same way as a server the rig starts: from the plugin's evidence on its /metrics."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from rig.serve.plan import free_port

from .conftest import RigRun, rig_processes

pytestmark = pytest.mark.soak  # a foreign server beside the rig's pair


@pytest.fixture(scope="module")
def foreign_reference(tiny_model, tmp_path_factory):
    """vLLM's own kernel served by a process the rig did not start, with the smoke flags."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("foreign") / "server.log", "wb")  # noqa: SIM115
    argv = [
        sys.executable, "-m", "rig.serve.vllm_entry", "serve", str(tiny_model),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "rig-tiny",
        "--dtype", "bfloat16", "--tensor-parallel-size", "1", "--seed", "0",
        "--gdn-prefill-backend", "triton", "--max-model-len", "8192", "--enforce-eager",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    env.pop("RIG_GDN_STATS_DIR", None)
    process = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            assert process.poll() is None, "the foreign server exited"
            assert time.monotonic() < deadline, "the foreign server never became ready"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # the engine and worker may outlive it
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()


@pytest.fixture(scope="module")
def attached_run(foreign_reference, run_rig) -> RigRun:
    return run_rig("--set", f"reference.url={foreign_reference}", name="attached-reference")


def test_an_attached_reference_is_proven_through_its_metrics(attached_run):
    run = attached_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = run.manifest()
    assert manifest["verdict"]["word"] == "identical"
    reference = manifest["kernels"]["reference"]
    assert reference["kernel"] == "vllm-cpu-native" and reference["calls"] > 0
    assert "(metrics)" in reference["detail"]
    assert manifest["kernels"]["candidate"]["kernel"] == "ns4"
    assert manifest["servers"]["reference"]["devices"] == "attached"
    assert not (run.run_dir / "server-reference.log").exists()


def test_an_attached_reference_never_fills_the_golden_cache(attached_run):
    """The cache key describes the rig's own reference server, not a foreign one."""
    assert "stored in the golden cache" not in attached_run.stdout


def test_the_rig_stops_only_what_it_started(attached_run, foreign_reference):
    with urllib.request.urlopen(f"{foreign_reference}/health", timeout=5) as response:
        assert response.status == 200
    candidate_url = attached_run.manifest()["servers"]["candidate"]["base_url"]
    port = candidate_url.rsplit(":", 1)[1]
    assert not [p for p in rig_processes() if f"--port {port} " in p]
    foreign_port = foreign_reference.rsplit(":", 1)[1]  # alive, and this session's: counted
    assert [p for p in rig_processes() if f"--port {foreign_port} " in p]
