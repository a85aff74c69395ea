"""`python -m rig.run` as a user runs it, watched from outside: its records as they are written,
signals as a terminal sends them, and the processes it leaves behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rig.records import REQUESTS_FILE

REPO = Path(__file__).resolve().parents[1]
GROUP_EXIT_S = 10.0  # how long a finished run's leftover children may take to exit


@dataclass
class RigRun:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path
    left_in_group: tuple[int, ...] = ()  # processes of the rig's process group still alive

    def manifest(self) -> dict:
        return json.loads((self.run_dir / "manifest.json").read_text())

    def read(self, name: str) -> str:
        return (self.run_dir / name).read_text(encoding="utf-8")

    def records(self) -> list[dict]:
        return read_records(self.run_dir)

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("rig: error:")]

    def gate(self, name: str) -> dict:
        return next(g for g in self.manifest()["verdict"]["gates"] if g["name"] == name)


def assert_could_not_be_made(run: RigRun, message: str) -> None:
    """Exit 2, one `rig: error:` line saying `message`, no traceback, no process left behind
    (in the rig's process group, or writing into its results folder)."""
    assert run.returncode == 2, run.stderr[-3000:]
    (line,) = run.error_lines()
    assert message in line, line
    assert "Traceback" not in run.stderr
    assert run.left_in_group == () and processes_logging_into(run.run_dir) == []


def read_records(run_dir: Path) -> list[dict]:
    """Every line of requests.jsonl as JSON: a line cut short fails here."""
    path = run_dir / REQUESTS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def group_members(pgid: int) -> tuple[int, ...]:
    """Live (not zombie) processes of a process group."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return tuple(members)


def processes_logging_into(folder: Path) -> list[int]:
    """Processes whose stdout is a file in `folder`: a run's servers and everything they forked,
    whatever process group or session they moved to."""
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/1"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(f"{folder}/"):
            found.append(int(fd.parent.parent.name))
    return found


class LiveRig:
    """A running `python -m rig.run`, in a session of its own as from a terminal; its output
    is read line by line as it comes, so a test can wait for a line."""

    def __init__(
        self,
        argv: list[str],
        run_dir: Path,
        preexec_fn: Callable[[], None] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rig.run", *argv],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=preexec_fn,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._readers = [
            threading.Thread(target=self._read, args=(stream, name), daemon=True)
            for name, stream in (("stdout", self.process.stdout), ("stderr", self.process.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, name: str) -> None:
        for line in stream:
            self.lines[name].append(line)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
        """Until `condition` holds (the timeout only bounds a run that never gets there)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the run ended (code {self.process.returncode}) before {what}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout_s} s")
            time.sleep(0.02)

    def wait_for_line(self, text: str, timeout_s: float = 120) -> None:
        """Until the run has printed a line holding `text`."""
        self.wait_for(
            lambda: any(text in line for line in list(self.lines["stdout"])), repr(text), timeout_s
        )

    def records(self) -> list[dict]:
        """The complete lines written so far (the last one may be half written)."""
        path = self.run_dir / REQUESTS_FILE
        lines = path.read_text(encoding="utf-8").split("\n")[:-1] if path.exists() else []
        return [json.loads(line) for line in lines]

    def interrupt(self, signum: int) -> None:
        """SIGINT goes to the whole process group, as Ctrl-C does; other signals to the rig."""
        if signum == signal.SIGINT:
            os.killpg(self.process.pid, signum)
        else:
            self.process.send_signal(signum)

    def finish(self, timeout_s: float = 300) -> RigRun:
        """Wait for the run to end, then for every process of its group to be gone (a child it
        did not wait for may still be exiting; bounded, so one that never goes is reported)."""
        try:
            self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for reader in self._readers:
            reader.join(timeout=GROUP_EXIT_S)  # a child still holding the pipe keeps it open
        deadline = time.monotonic() + GROUP_EXIT_S
        while group_members(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        return RigRun(
            self.process.returncode,
            "".join(self.lines["stdout"]),
            "".join(self.lines["stderr"]),
            self.run_dir,
            group_members(self.process.pid),
        )
