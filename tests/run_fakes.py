"""Runs without servers, for the run stages' unit tests: scenarios, their resolved context, and
servers that only say what a test tells them (tests/e2e/ drives real ones)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rig.records import REQUESTS_FILE
from rig.run.state import RecordSink, RunContext, RunJournal, RunState
from rig.scenario.config import Scenario
from rig.scenario.workload import resolve_prompts
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
from rig.serve.servers import Server


def scenario(**overrides) -> Scenario:
    data = {"name": "t", "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1]}}
    data.update(overrides)
    return Scenario.model_validate(data)


def run_context(run_dir: Path, hardware: Hardware | None = None, **overrides) -> RunContext:
    """A context on a 2-core machine (both sides at once) unless `hardware` says otherwise."""
    run = scenario(**overrides)
    machine = hardware or Hardware(gpu_count=0, cpu_ids=(0, 1))
    plan = plan_servers(run, "/m", run_dir, machine)
    return RunContext(run, "r", run_dir, plan, "/m", resolve_prompts(run.workload))


def open_journal(run_dir: Path, state: RunState | None = None) -> RunJournal:
    """A journal on run_dir's files; the caller closes its sink."""
    return RunJournal(run_dir, state or RunState(), RecordSink.open(run_dir / REQUESTS_FILE))


@dataclass
class FakeServer(Server):
    """A server that never ran: its log, exit code and memory are what the test set; where it
    answers (`target`) is the real Server's."""

    log: str = ""  # before a level starts
    logged_in_level: str = ""  # what the log gains once it has been sized
    exit_code: int | None = None
    rss: int = 2**30

    def log_size(self) -> int:
        return len(self.log)

    def log_text(self, start: int = 0) -> str:
        return (self.log + self.logged_in_level)[start:]

    def log_tail(self) -> str:
        return self.log_text()[-200:]

    def rss_bytes(self) -> int:
        return self.rss

    def exited(self) -> int | None:
        return self.exit_code
