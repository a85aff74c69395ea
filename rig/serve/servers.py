"""Real `vllm serve` processes for the two sides, started from their plans (rig/serve/plan.py)
on loopback, health-polled, logged to the run folder, and always stopped.

Each server runs in its own process group (vLLM forks an engine core and a worker), so stopping
a side stops its whole tree.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rig.interrupts import hold_at, interrupts_held
from rig.records import ServerTarget
from rig.secrets import auth_headers, redact_file, redact_text
from rig.serve.logs import root_cause, startup_phase
from rig.serve.plan import ServerPlan, free_port
from rig.untimed_http import NoAnswer, call

LOG_TAIL_LINES = 40
PROGRESS_EVERY_S = 15.0  # a line on a start still under way this often, or at a new phase


class ServerError(RuntimeError):
    """A server that cannot be started or used; the message includes its log tail."""


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ensure_port_free(port: int, host: str = "127.0.0.1") -> None:
    if not port_is_free(port, host):
        raise ServerError(f"port {port} on {host} is already in use")


@dataclass
class Server:
    """One running (or attached) side."""

    plan: ServerPlan
    process: subprocess.Popen | None = None
    tmpdir: Path | None = None
    _log_file: object | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return self.plan.base_url

    def target(self, side: str | None = None) -> ServerTarget:
        """Where the load engine and the replay reach this server, with its API key; `side`
        names the records it answers when that is not its own side (the A/A replay)."""
        plan = self.plan
        return ServerTarget(
            side or plan.side, self.base_url, plan.served_model, plan.api_key, plan.replica
        )

    def start(self) -> None:
        """Start the server. A port the rig picked at planning time and another process has
        taken since (a server started before this one binds ports of its own for its engine,
        Ray's workers bind theirs) is picked again; the scenario's own `port` is refused."""
        if self.plan.url is not None:
            return
        if self.plan.port_fixed:
            ensure_port_free(self.plan.port, self.plan.host)
        elif not port_is_free(self.plan.port, self.plan.host):
            taken = self.plan.port
            self.plan = self.plan.with_port(free_port(self.plan.host))
            print(
                f"rig: {self.plan.label}: port {taken} was taken since the plan; serving on "
                f"{self.plan.port}",
                flush=True,
            )
        self.plan.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.plan.stats_dir.mkdir(parents=True, exist_ok=True)
        # vLLM's IPC sockets and vllm_dist_* files go to TMPDIR; a private one is removed on stop.
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"rig-{self.plan.side[:3]}-"))
        env = {**os.environ, **self.plan.env, "TMPDIR": str(self.tmpdir)}
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log_file = open(self.plan.log_path, "ab")  # noqa: SIM115 - closed in stop()
        with interrupts_held():  # a Ctrl-C comes after self.process holds the child, never before
            self.process = subprocess.Popen(
                list(self.plan.argv),
                env=env,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def exit_reason(self, code: int) -> str:
        """How the server that exited with `code` ended, for a fault's line (a Ray server names
        its actor or node)."""
        return f"exit code {code}"

    def log_text(self, start: int = 0) -> str:
        try:
            with open(self.plan.log_path, "rb") as handle:
                handle.seek(start)
                text = handle.read().decode("utf-8", errors="replace")
            return redact_text(text, self.plan.secrets)
        except FileNotFoundError:
            return ""

    def log_size(self) -> int:
        try:
            return self.plan.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the server's whole process group (API server, engine, worker)."""
        if self.process is None:
            return 0
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # after the command: state ppid pgrp ...; rss (pages) is field 24 of the full line
            if int(fields[2]) == self.process.pid:
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return total

    def wait_ready(self, timeout_s: float) -> None:
        """Poll /health until it answers 200; fail with the log tail if the server dies first.
        A start that takes long says how far it got: a line at each new phase of its log, and
        every PROGRESS_EVERY_S seconds."""
        started = time.monotonic()
        deadline = started + timeout_s
        said, said_at = "starting", started
        while time.monotonic() < deadline:
            code = self.exited()
            if code is not None:
                raise ServerError(
                    f"{self.plan.side} server ended before it was ready ({self.exit_reason(code)})"
                    f"{root_cause(self.log_text())}; log {self.plan.log_path}:\n{self.log_tail()}"
                )
            if self.healthy():
                return
            now = time.monotonic()
            phase = startup_phase(self.log_text()) if self.plan.url is None else "starting"
            if phase != said or now - said_at >= PROGRESS_EVERY_S:
                print(f"rig: {self.plan.label} server: {phase}, {now - started:.0f} s", flush=True)
                said, said_at = phase, now
            time.sleep(0.5)
        raise ServerError(
            f"{self.plan.side} server not ready after {timeout_s:.0f} s; "
            f"log {self.plan.log_path}:\n{self.log_tail()}"
        )

    def healthy(self) -> bool:
        try:
            answer = call(
                "GET",
                f"{self.base_url}/health",
                timeout_s=2,
                headers=auth_headers(self.plan.api_key),
            )
        except NoAnswer:
            return False
        return answer.status == 200

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after the grace period."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        if self.process is not None:
            # The group may outlive its leader (engine core, worker): always sweep it.
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
            if self.plan.cleanup:  # a container outlives its client
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(list(self.plan.cleanup), capture_output=True, timeout=60)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
            redact_file(self.plan.log_path, self.plan.secrets)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ServerSet:
    """Starts a phase's servers together and guarantees they are stopped on every exit path."""

    def __init__(self, plans: list[ServerPlan], startup_timeout_s: float) -> None:
        self.servers = {plan.label: Server(plan) for plan in plans}
        self.startup_timeout_s = startup_timeout_s

    def __enter__(self) -> dict[str, Server]:
        """Servers on disjoint GPUs (or CPUs) start together; a server that shares a GPU with
        one started before it waits until that one is ready. vLLM sizes its KV cache from a
        memory profile taken at start-up, and two engines profiling one GPU at once each count
        the other's peak: on an H200 the second of two A/A servers saw -0.62 GiB and exited."""
        last_on_gpu: dict[str, Server] = {}
        try:
            for server in self.servers.values():
                for gpu in sorted(server.plan.gpu_ids):
                    if gpu in last_on_gpu:
                        last_on_gpu[gpu].wait_ready(self.startup_timeout_s)
                server.start()
                last_on_gpu.update(dict.fromkeys(server.plan.gpu_ids, server))
                hold_at("server-start")
            for server in self.servers.values():
                server.wait_ready(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.servers

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()
