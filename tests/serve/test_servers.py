"""Server processes without vLLM: port checks, process-group cleanup, a start that fails with
its log tail, and a log that loses the API key."""

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from rig.serve.plan import ServerPlan
from rig.serve.servers import Server, ServerError, ServerSet, ensure_port_free


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
    deadline = time.monotonic() + 10  # SIGKILLed: gone once the kernel has reaped it
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(child)
    assert server.tmpdir is None


def test_ctrl_c_inside_popen_still_stops_the_child(tmp_path, monkeypatch):
    """The interrupt lands after the fork, before Popen returns (CI saw that window leave a
    vLLM server running): the start must still know the child and stop it."""
    started: list[int] = []
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        started.append(process.pid)
        os.kill(os.getpid(), signal.SIGINT)
        return process

    monkeypatch.setattr(subprocess, "Popen", popen_then_ctrl_c)
    plan = _plan(tmp_path, [sys.executable, "-c", "import time; time.sleep(600)"])
    with pytest.raises(KeyboardInterrupt), ServerSet([plan], startup_timeout_s=30):
        pass
    (pid,) = started
    alive = _alive(pid)
    if alive:
        os.killpg(pid, signal.SIGKILL)
    assert not alive


def test_a_server_that_exits_fails_with_its_log_tail(tmp_path):
    script = "print('model weights are missing'); raise SystemExit(3)"
    with (
        pytest.raises(
            ServerError, match=r"before it was ready \(exit code 3\)(.|\n)*weights are missing"
        ),
        ServerSet([_plan(tmp_path, [sys.executable, "-c", script])], startup_timeout_s=30),
    ):
        pass


def test_a_server_log_loses_the_key_when_read_and_when_stopped(tmp_path):
    argv = [sys.executable, "-c", "print('sk-secret')"]
    plan = dataclasses.replace(_plan(tmp_path, argv), api_key=SecretStr("sk-secret"))
    server = Server(plan)
    server.start()
    server.process.wait(timeout=30)
    assert "sk-secret" not in server.log_tail()
    server.stop()
    assert "sk-secret" not in plan.log_path.read_text()


def _health_server(tmp_path: Path, name: str, gpus: str, delay_s: float) -> ServerPlan:
    """A stand-in server that notes when it started and answers /health after `delay_s`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = (
        "import http.server, pathlib, sys, time\n"
        f"pathlib.Path({str(tmp_path / name)!r}).write_text(str(time.monotonic()))\n"
        f"time.sleep({delay_s})\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    plan = _plan(tmp_path, [sys.executable, "-c", script])
    return dataclasses.replace(
        plan,
        side=name,
        port=port,
        env={"CUDA_VISIBLE_DEVICES": gpus} if gpus else {},
        log_path=tmp_path / f"{name}.log",
    )


def test_servers_sharing_a_gpu_start_one_after_the_other(tmp_path):
    """The second server on GPU 0 starts only once the first answers /health; the server on
    GPU 1 starts at once."""
    plans = [
        _health_server(tmp_path, "first", "0", delay_s=1.5),
        _health_server(tmp_path, "other-gpu", "1", delay_s=0.0),
        _health_server(tmp_path, "second", "0", delay_s=0.0),
    ]
    with ServerSet(plans, startup_timeout_s=30) as servers:
        assert all(server.healthy() for server in servers.values())
    started = {
        name: float((tmp_path / name).read_text()) for name in ("first", "other-gpu", "second")
    }
    assert started["second"] - started["first"] >= 1.5
    assert started["other-gpu"] - started["first"] < 1.0


def test_gpu_ids_come_from_the_placement_s_visible_devices(tmp_path):
    plan = _plan(tmp_path, ["true"])
    assert plan.gpu_ids == frozenset()
    assert dataclasses.replace(plan, env={"CUDA_VISIBLE_DEVICES": "2, 3"}).gpu_ids == {"2", "3"}


def test_a_port_the_rig_picked_and_another_took_is_picked_again(tmp_path, capsys):
    """Between the plan and the start another process bound the planned port (a server started
    before this one binds its engine's ports, Ray's workers theirs): the server moves."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        argv = [sys.executable, "-c", "import time; time.sleep(60)", "--port", str(taken)]
        server = Server(dataclasses.replace(_plan(tmp_path, argv), port=taken))
        try:
            server.start()
            assert server.plan.port != taken and server.plan.argv[-1] == str(server.plan.port)
            assert server.base_url.endswith(f":{server.plan.port}")
            assert f"port {taken} was taken since the plan" in capsys.readouterr().out
        finally:
            server.stop(grace_s=1)
