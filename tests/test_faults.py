"""Faults injected into whole runs of `python -m rig.run` against paced stub servers attached by
url: what only a stub does on demand (HTTP 409/429/500 mid-level, a stream that stops sending,
malformed SSE, a request that is never answered, a dropped connection), SIGINT and SIGTERM
during the load, the teacher-forced replay (a stub that answers it slowly) and the report (the
rig frozen there), each followed by --resume, results that cannot be written, and a port taken
between plan and start. Real servers failing: tests/e2e/test_faults.py.

For every fault: the exit code, one `rig: error:` line when the run could not be made, every
finished record on disk, nothing left in the rig's process group. A run attached to servers it
did not start has no kernel proof and is INVALID whatever happens, so the verdict word is not
what these tests check; the gate the fault should fail is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

from rig.interrupts import HOLD_VARIABLE
from rig.report.files import REPORT_FILES
from rig.scenario.config import Scenario
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
from rig.serve.servers import ServerError, ServerSet
from tests.rig_process import (
    LiveRig,
    RigRun,
    assert_could_not_be_made,
    group_members,
    read_records,
)

PROMPTS = "prompts/prompts.jsonl"


class StubProcess:
    """`python -m rig.stub.server` in a session of its own, with faults by arrival index."""

    def __init__(
        self, *faults: str, itl_ms: float = 10, tokens: int = 8, replay_delay_ms: float = 0
    ) -> None:
        argv = [sys.executable, "-m", "rig.stub.server", "--port", "0", "--ttft-ms", "20"]
        argv += ["--itl-ms", str(itl_ms), "--tokens", str(tokens)]
        argv += ["--replay-delay-ms", str(replay_delay_ms)]
        for fault in faults:
            argv += ["--fault", fault]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        self.url = re.search(r"http://\S+", line)[0]  # type: ignore[index]

    def request_ids(self) -> set[str]:
        """The X-Request-Id of every load request the stub received."""
        return {
            entry["key"] for entry in self._log() if "prompt_logprobs" not in (entry["body"] or {})
        }

    def replays_received(self) -> int:
        """Teacher-forced replay requests received so far, answered or not."""
        return sum("prompt_logprobs" in (entry["body"] or {}) for entry in self._log())

    def _log(self) -> list[dict]:
        with urllib.request.urlopen(self.url + "/stub/log", timeout=10) as response:
            return json.loads(response.read())["requests"]

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=10)


@contextlib.contextmanager
def stub_pair(*candidate_faults: str, **pacing):
    reference, candidate = StubProcess(**pacing), StubProcess(*candidate_faults, **pacing)
    try:
        yield reference, candidate
    finally:
        reference.stop()
        candidate.stop()


def scenario_file(
    folder: Path, reference_url: str, candidate_url: str, drift_requests: int = 0, **workload
) -> Path:
    """Drift replay off unless `drift_requests` (its `max_requests`) says how many."""
    data = {
        "name": "faults",
        "model": {"name": "stub/model"},
        "reference": {"url": reference_url},
        "candidate": {"url": candidate_url},
        "workload": {
            "prompts": [{"path": PROMPTS, "limit": 4}],
            "concurrency": [1],
            "max_tokens": 8,
            "top_logprobs": 2,
            "timeout_s": 2,
            "warmup_requests": 0,  # the stub's faults and these counts are by arrival order
            **workload,
        },
        "drift": {"enabled": drift_requests > 0, "max_requests": drift_requests or None},
        "results_dir": str(folder / "results"),
    }
    path = folder / "faults.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def start(scenario: Path, run_id: str, *args: str, **options) -> LiveRig:
    """The run as a user starts it; `options` go to LiveRig (preexec_fn, env)."""
    results = Path(yaml.safe_load(scenario.read_text())["results_dir"])
    return LiveRig(
        [str(scenario), "--no-cache", "--run-id", run_id, *args], results / run_id, **options
    )


def by_side(records: list[dict], side: str) -> dict[str, dict]:
    return {r["request_id"]: r for r in records if r["side"] == side}


# -- HTTP errors, a stalled stream, malformed SSE, no answer, a dropped connection -----------------

TRANSPORT_FAULTS = {  # candidate request index -> (stub fault, error kind in the record)
    1: ("http_409", "http_409"),
    2: ("http_429", "http_429"),
    3: ("http_500", "http_500"),
    4: ("malformed_sse", "malformed_sse"),
    5: ("stall", "timeout"),  # the stream stops sending after its first token
    6: ("hang", "timeout"),  # the request is never answered
    7: ("drop", "connection"),
}


@pytest.fixture(scope="module")
def transport_faults(tmp_path_factory) -> RigRun:
    faults = [f"{index}={fault}" for index, (fault, _) in TRANSPORT_FAULTS.items()]
    with stub_pair(*faults) as (reference, candidate):
        scenario = scenario_file(
            tmp_path_factory.mktemp("transport"),
            reference.url,
            candidate.url,
            prompts=[{"path": PROMPTS, "limit": 8}],
            timeout_s=1,
        )
        return start(scenario, "transport").finish()


@pytest.mark.parametrize("index", sorted(TRANSPORT_FAULTS))
def test_each_transport_fault_is_a_record_of_its_kind(transport_faults, index):
    fault, kind = TRANSPORT_FAULTS[index]
    request_id = f"c1-r0-{index:04d}"
    records = transport_faults.records()
    assert by_side(records, "candidate")[request_id]["error"].startswith(f"{kind}:"), fault
    assert by_side(records, "reference")[request_id]["error"] is None


def test_transport_faults_keep_every_record_and_fail_the_pathologies_gate(transport_faults):
    run = transport_faults
    assert run.returncode == 3, run.stderr[-2000:]  # made; a stub proves no kernel: INVALID
    assert run.error_lines() == [] and "Traceback" not in run.stderr
    keys = Counter((r["side"], r["request_id"]) for r in run.records())
    assert len(keys) == 16 and set(keys.values()) == {1}
    pathologies = run.gate("pathologies")
    assert not pathologies["passed"]
    assert pathologies["detail"].startswith(f"{len(TRANSPORT_FAULTS)} candidate-only or transport")
    assert run.left_in_group == ()


# -- SIGINT (Ctrl-C) and SIGTERM during the load, then --resume ----------------------------------

LEVELS = [1, 2]
PER_LEVEL = 6
LOG_FAULT = "Traceback (most recent call last):\n"


@dataclasses.dataclass
class Interrupted:
    interrupted: RigRun
    records_then: list[dict]  # the interrupted run's files, before the resume rewrote them
    gates_then: dict[str, dict]
    pairs_then: int
    sent: dict[str, set[str]]  # side -> request ids its stub received before the resume
    resumed: RigRun


def _finished_pair_in_level(rig: LiveRig, level: int) -> bool:
    records = [r for r in rig.records() if r["level"] == level and r["error"] is None]
    ids = Counter(r["request_id"] for r in records)
    return any(count == 2 for count in ids.values())


@pytest.fixture(scope="module", params=[signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def interrupted(request, tmp_path_factory) -> Interrupted:
    """A fault line lands in the candidate's server log during level 1 (an attached server has
    no log of the rig's; the rig reads that file all the same), the signal comes in level 2
    once a pair has finished there, then the run is resumed."""
    with stub_pair(itl_ms=40, tokens=12) as (reference, candidate):
        scenario = scenario_file(
            tmp_path_factory.mktemp("signals"),
            reference.url,
            candidate.url,
            prompts=[{"path": PROMPTS, "limit": PER_LEVEL}],
            concurrency=LEVELS,
            max_tokens=12,
        )
        rig = start(scenario, "interrupted")
        rig.wait_for(lambda: len(rig.records()) >= 1, "a first record")
        with open(rig.run_dir / "server-candidate.log", "a", encoding="utf-8") as log:
            log.write(LOG_FAULT)
        rig.wait_for(lambda: _finished_pair_in_level(rig, 2), "a finished pair in level 2")
        rig.interrupt(request.param)
        interrupted = rig.finish()
        records_then = interrupted.records()
        verdict = interrupted.manifest()["verdict"]
        gates_then = {gate["name"]: gate for gate in verdict["gates"]}
        sent = {"reference": reference.request_ids(), "candidate": candidate.request_ids()}
        resumed = start(scenario, "interrupted", "--resume").finish()
    return Interrupted(
        interrupted, records_then, gates_then, verdict["counts"]["pairs"], sent, resumed
    )


def test_an_interrupted_run_exits_2_with_one_error_line_and_leaves_nothing(interrupted):
    assert_could_not_be_made(interrupted.interrupted, "interrupted")
    assert (interrupted.interrupted.run_dir / "summary.md").exists()


def test_an_interrupted_run_keeps_a_record_of_every_request_it_sent(interrupted):
    for side, sent in interrupted.sent.items():
        on_disk = by_side(interrupted.records_then, side)
        assert sent <= set(on_disk), side
        assert {r["level"] for r in on_disk.values()} == set(LEVELS)


def test_the_log_fault_of_level_1_counts_in_the_interrupted_run(interrupted):
    """Guards the resume test below: the fault is seen before the interrupt."""
    assert "1 server-log faults" in interrupted.gates_then["pathologies"]["detail"]


def test_an_interrupted_level_compares_the_pairs_that_finished(interrupted):
    finished = Counter(
        r["request_id"]
        for r in interrupted.records_then
        if not (r["error"] or "").startswith("cancelled")
    )
    both = sum(1 for count in finished.values() if count == 2)
    assert interrupted.pairs_then == both


def test_resume_after_an_interrupt_has_every_record_once(interrupted):
    run = interrupted.resumed
    assert run.returncode == 3, run.stderr[-2000:]  # completed; attached stubs are INVALID
    assert "1 finished level(s) kept" in run.stdout
    keys = Counter((r["side"], r["level"], r["request_id"]) for r in run.records())
    assert len(keys) == 2 * len(LEVELS) * PER_LEVEL and set(keys.values()) == {1}
    kept = [r for r in interrupted.records_then if r["level"] == LEVELS[0]]
    assert [r for r in run.records() if r["level"] == LEVELS[0]] == kept
    assert run.left_in_group == ()


def test_resume_keeps_the_faults_of_the_kept_levels(interrupted):
    assert "1 server-log faults" in interrupted.resumed.gate("pathologies")["detail"]


# -- SIGINT and SIGTERM during the teacher-forced replay, then --resume ---------------------------

REPLAY_DELAY_MS = 1500  # per replay request: the signal lands while the rig waits for one
REPLAYED = 2  # drift.max_requests


@dataclasses.dataclass
class InterruptedPhase:
    interrupted: RigRun
    records_then: list[dict]
    verdict_then: dict  # manifest.json's verdict, before the resume rewrote it
    resumed: RigRun


def _verdict_gates(run: RigRun) -> dict[str, dict]:
    return {gate["name"]: gate for gate in run.manifest()["verdict"]["gates"]}


def _resumed_after(interrupted: RigRun, scenario: Path, run_id: str) -> InterruptedPhase:
    records_then, verdict_then = interrupted.records(), interrupted.manifest()["verdict"]
    resumed = start(scenario, run_id, "--resume").finish()
    return InterruptedPhase(interrupted, records_then, verdict_then, resumed)


@pytest.fixture(scope="module", params=[signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def interrupted_replay(request, tmp_path_factory) -> InterruptedPhase:
    """The load finishes; the signal comes once the candidate has received a replay request."""
    with stub_pair(replay_delay_ms=REPLAY_DELAY_MS) as (reference, candidate):
        scenario = scenario_file(
            tmp_path_factory.mktemp("replay"), reference.url, candidate.url, REPLAYED
        )
        rig = start(scenario, "replay")
        rig.wait_for(lambda: candidate.replays_received() > 0, "a replay request")
        rig.interrupt(request.param)
        return _resumed_after(rig.finish(), scenario, "replay")


def test_an_interrupted_replay_exits_2_with_one_error_line_and_leaves_nothing(
    interrupted_replay,
):
    run = interrupted_replay.interrupted
    assert_could_not_be_made(run, "interrupted")
    # the reference replays every completion it wrote (4 prompts), the candidate its sample
    assert "rig: teacher-forced replay of 4 sequences (reference 4, candidate 2)" in run.stdout


def test_an_interrupted_replay_keeps_every_record_and_compares_every_pair(interrupted_replay):
    keys = Counter((r["side"], r["request_id"]) for r in interrupted_replay.records_then)
    assert len(keys) == 8 and set(keys.values()) == {1}
    assert all(r["error"] is None for r in interrupted_replay.records_then)
    verdict = interrupted_replay.verdict_then
    assert verdict["counts"]["pairs"] == 4 and verdict["word"] == "INVALID"
    gates = {gate["name"]: gate for gate in verdict["gates"]}
    assert not gates["run completed"]["passed"] and "teacher-forced drift" not in gates


def test_resume_after_an_interrupted_replay_replays_and_keeps_the_records(interrupted_replay):
    run = interrupted_replay.resumed
    assert run.returncode == 3, run.stderr[-2000:]  # completed; attached stubs are INVALID
    assert "1 finished level(s) kept (8 records)" in run.stdout
    assert run.records() == interrupted_replay.records_then
    drift = _verdict_gates(run)["teacher-forced drift"]
    assert drift["passed"] and drift["detail"].startswith("mean abs Δlogprob 0.0000")
    assert "run completed" not in _verdict_gates(run)
    assert run.left_in_group == ()


# -- SIGINT and SIGTERM at each phase a stub pair goes through -------------------------------------

# The run holds at the phase (RIG_HOLD_AT) until the signal comes; the phases with real servers
# (install probe, server start, warm-up) are in tests/e2e/test_faults.py.
STUB_PHASES = ("preflight", "warm-up", "load", "replay", "report")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", STUB_PHASES)
def test_an_interrupt_at_each_phase_stops_the_run_and_never_passes(tmp_path, phase, signum):
    with stub_pair() as (reference, candidate):
        scenario = scenario_file(
            tmp_path, reference.url, candidate.url, REPLAYED, warmup_requests=1
        )
        rig = start(scenario, f"hold-{phase}", env={HOLD_VARIABLE: phase})
        rig.wait_for_line(f"rig: holding at {phase}")
        rig.interrupt(signum)
        run = rig.finish()
    assert run.returncode == 2, run.stderr[-2000:]
    (line,) = run.error_lines()
    assert "interrupted" in line and "Traceback" not in run.stderr
    assert run.left_in_group == ()
    if phase == "preflight":  # nothing started, nothing to report
        assert not (run.run_dir / "manifest.json").exists()
        return
    verdict = run.manifest()["verdict"]
    assert verdict["word"] in ("INVALID", "INCOMPLETE") and not verdict["passed"]
    completed = next(g for g in verdict["gates"] if g["name"] == "run completed")
    assert not completed["passed"]
    measured = [r for r in run.records() if r["error"] is None and not r["warmup"]]
    assert len(measured) == (8 if phase in ("replay", "report") else 0)  # 4 prompts, 2 sides


# -- SIGINT and SIGTERM while the report is written ------------------------------------------------


def _stopped_in_the_report(rig: LiveRig) -> None:
    """Freeze the rig (SIGSTOP) between its report's first file and report.html, so a signal
    sent now is delivered in the report phase whatever the machine's speed."""
    rig.wait_for(lambda: (rig.run_dir / "requests.csv").exists(), "the report's first file")
    os.kill(rig.process.pid, signal.SIGSTOP)
    assert not (rig.run_dir / "report.html").exists(), "the report was written before the stop"


def _continue(rig: LiveRig) -> None:
    os.kill(rig.process.pid, signal.SIGCONT)


@pytest.fixture(scope="module", params=[signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def interrupted_report(request, tmp_path_factory) -> InterruptedPhase:
    with stub_pair() as (reference, candidate):
        scenario = scenario_file(
            tmp_path_factory.mktemp("report"), reference.url, candidate.url, REPLAYED
        )
        rig = start(scenario, "report")
        _stopped_in_the_report(rig)
        rig.interrupt(request.param)
        _continue(rig)
        return _resumed_after(rig.finish(), scenario, "report")


def test_an_interrupt_while_the_report_is_written_finishes_the_report(interrupted_report):
    """The report is finished, then written again as a run that did not complete: an
    interrupt never leaves a PASS behind."""
    run = interrupted_report.interrupted
    assert_could_not_be_made(run, "interrupted while the report was written")
    assert "rig: interrupted while the report is written: finishing it" in run.stdout
    assert run.read("report.html").rstrip().endswith("</html>")
    assert interrupted_report.verdict_then["word"] == "INVALID"
    gates = {gate["name"]: gate for gate in interrupted_report.verdict_then["gates"]}
    assert gates["teacher-forced drift"]["passed"] and not gates["run completed"]["passed"]
    assert gates["run completed"]["detail"].startswith("interrupted while the report was written")


def test_an_interrupt_while_the_report_is_written_loses_no_record(interrupted_report):
    keys = Counter((r["side"], r["request_id"]) for r in interrupted_report.records_then)
    assert len(keys) == 8 and set(keys.values()) == {1}


def test_resume_after_an_interrupted_report_keeps_every_record(interrupted_report):
    run = interrupted_report.resumed
    assert run.returncode == 3, run.stderr[-2000:]
    assert run.records() == interrupted_report.records_then
    then = interrupted_report.verdict_then
    completed = [g for g in then["gates"] if g["name"] != "run completed"]
    assert run.manifest()["verdict"] == {**then, "gates": completed}
    assert run.left_in_group == ()


def test_a_second_interrupt_while_the_report_is_written_stops_it_and_keeps_no_report(tmp_path):
    """Both signals are pending when the frozen rig continues: the first is noted, the second
    stops the writing; a resumed run writes the whole report."""
    with stub_pair() as (reference, candidate):
        scenario = scenario_file(tmp_path, reference.url, candidate.url, REPLAYED)
        rig = start(scenario, "twice")
        _stopped_in_the_report(rig)
        rig.interrupt(signal.SIGINT)
        rig.interrupt(signal.SIGTERM)
        _continue(rig)
        run = rig.finish()
        assert_could_not_be_made(run, "interrupted twice while the report was written")
        assert [name for name in REPORT_FILES if (run.run_dir / name).exists()] == []
        records = run.records()
        assert len(records) == 8 and all(r["error"] is None for r in records)
        resumed = start(scenario, "twice", "--resume").finish()
    assert resumed.returncode == 3, resumed.stderr[-2000:]
    assert resumed.records() == records
    assert all((resumed.run_dir / name).exists() for name in REPORT_FILES)
    assert resumed.left_in_group == ()


# -- a bug of the rig's own ------------------------------------------------------------------------


def test_a_bug_in_the_rigs_own_parsing_ends_the_run_and_blames_no_server(tmp_path):
    """A KeyError in the SSE parser (planted through sitecustomize in every interpreter of the
    run) is the rig's: exit 2, one error line, its traceback in the results folder, every
    server stopped; no request becomes a malformed_sse pathology of either side."""
    with stub_pair() as (reference, candidate):
        scenario = scenario_file(tmp_path, reference.url, candidate.url)
        bug = str(Path(__file__).parent / "parse_bug")
        run = start(scenario, "bug", env={"PYTHONPATH": bug}).finish()
    assert_could_not_be_made(run, "the rig failed (")
    (line,) = run.error_lines()
    assert "KeyError" in line and "rig-error.txt" in line
    assert "planted bug" in (run.run_dir / "rig-error.txt").read_text()
    assert not [r for r in read_records(run.run_dir) if "malformed_sse" in (r["error"] or "")]
    gates = {g["name"]: g for g in run.manifest()["verdict"]["gates"]}
    assert gates["pathologies"]["passed"] and not gates["run completed"]["passed"]


# -- results that cannot be written ----------------------------------------------------------------


def test_a_results_folder_that_cannot_be_created_is_one_error_line(tmp_path):
    (tmp_path / "results").write_text("a file where the results folder should be")
    scenario = scenario_file(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9")
    assert_could_not_be_made(start(scenario, "blocked").finish(), str(tmp_path / "results"))


def _disk_of(size: int):
    """The rig's files stop growing at `size` bytes (EFBIG, as a full disk's ENOSPC)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def test_a_full_disk_mid_level_is_one_error_line_and_whole_records(tmp_path):
    with stub_pair() as (reference, candidate):
        scenario = scenario_file(
            tmp_path, reference.url, candidate.url, prompts=[{"path": PROMPTS, "limit": 8}]
        )
        run = start(scenario, "full", preexec_fn=_disk_of(12_000)).finish()
    assert 0 < len(read_records(run.run_dir)) < 16  # whole lines only, or this raises
    assert_could_not_be_made(run, "File too large")


# -- a port taken between plan and start -------------------------------------------------------


def test_a_port_taken_after_planning_stops_what_was_started(tmp_path):
    """The reference is started (a stand-in process, no vLLM), then the candidate's own port
    (the scenario's `port`) turns out taken: one clear error, and the reference's process group
    is gone. A port the rig picked is picked again instead (tests/serve/test_servers.py)."""
    scenario = Scenario.model_validate(
        {"name": "t", "workload": {"prompts": [{"long_tokens": [10]}], "concurrency": [1]}}
    )
    plan = plan_servers(scenario, "/m", tmp_path, Hardware(gpu_count=0, cpu_ids=(0, 1)))
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    reference = dataclasses.replace(plan.servers["reference"], argv=sleeper)
    candidate = dataclasses.replace(plan.servers["candidate"], port_fixed=True)
    servers = ServerSet([reference, candidate], startup_timeout_s=5)
    with socket_on(candidate.port), pytest.raises(ServerError) as raised, servers:
        pass
    assert str(raised.value) == f"port {candidate.port} on 127.0.0.1 is already in use"
    started = servers.servers["reference"].process
    assert started is not None and started.returncode is not None
    assert group_members(started.pid) == ()


@contextlib.contextmanager
def socket_on(port: int):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield
