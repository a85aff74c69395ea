"""Bad input gives one clear error line and exit code 2, no traceback; Ctrl-C/SIGTERM stops
every server and keeps what was measured."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from rig.records import REQUESTS_FILE

from .conftest import REPO, rig_processes


def _run(tmp_path, *args, scenario="scenarios/smoke.yaml"):
    argv = [
        sys.executable,
        "-m",
        "rig.run",
        scenario,
        "--set",
        f"results_dir={tmp_path}",
        *args,
    ]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "workload.bogus=1"], "unknown key 'workload.bogus'"),
        (["--set", "workload.prompts=[{path: prompts/missing.jsonl}]"], "missing.jsonl"),
        (["--set", "workload.concurrency=[0]"], "workload.concurrency.0"),
        (["--set", "model=/nonexistent/model"], "model path /nonexistent/model does not exist"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    done = _run(tmp_path, *args)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("rig: error:") and message in lines[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_missing_scenario_file(tmp_path):
    done = _run(tmp_path, scenario="scenarios/nope.yaml")
    assert done.returncode == 2
    assert "scenarios/nope.yaml: scenario file not found" in done.stderr


def test_port_in_use(tmp_path, tiny_model):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = _run(tmp_path, "--set", f"candidate.port={port}")
    assert done.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert rig_processes() == []


def _line_count(path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


@pytest.mark.soak  # a run stopped mid-level, then resumed
def test_sigterm_stops_servers_keeps_results_and_resume_finishes(tmp_path, tiny_model):
    """SIGTERM during the second level: servers stop, the first level's records stay on disk;
    --resume keeps that level as it was and runs the rest."""
    argv = [
        sys.executable,
        "-m",
        "rig.run",
        "scenarios/smoke.yaml",
        "--no-cache",
        "--set",
        f"results_dir={tmp_path}",
        "--run-id",
        "interrupted",
    ]
    process = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    records = tmp_path / "interrupted" / REQUESTS_FILE
    first_level = 2 * 18  # both sides, 18 prompts at C=1
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and process.poll() is None:
        if _line_count(records) > first_level:
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before the second level started"
    assert rig_processes(), "servers should be running mid-run"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "interrupted" in stderr
    assert (tmp_path / "interrupted" / "summary.md").exists()
    assert rig_processes() == []
    lines = records.read_text(encoding="utf-8").splitlines()
    kept = sorted(line for line in lines if '"level": 1,' in line)
    assert len(kept) == first_level

    resumed = subprocess.run(
        [*argv, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "1 finished level(s) kept" in resumed.stdout
    lines = records.read_text(encoding="utf-8").splitlines()
    assert sorted(line for line in lines if '"level": 1,' in line) == kept
    assert len(lines) == 2 * first_level
    assert rig_processes() == []
