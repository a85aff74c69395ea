"""Gated waves (`workload.arrival: waves`): at C>1 a block's requests go C at a time, and the
server's scheduler is paused while a wave's requests arrive and released once all of them are in.

Sent continuously, C concurrent requests reach the scheduler over a few milliseconds, and which
of them the next step takes decides the batches: on an H200 at C=16 (tiny-qwen35, 2K-10K-token
prompts) the same first request's TTFT ranged 53-87 ms between blocks, and a block's mean TTFT
by ±20 %, more than any kernel change the rig must resolve. Released together, every wave
schedules the same batches in the same steps on both sides. Each request's TTFT and E2EL then
count from the release (`held_s` says how long the server held it).

The gate is vLLM's own: `POST /pause?mode=keep` freezes the scheduler and queues what arrives,
`POST /resume` lets it go (served with VLLM_SERVER_DEV_MODE=1). vLLM sends a streamed
response's head before it queues the request in the engine, so a wave is in once every
request's head came back (or the request ended), plus a moment for the engine to take it.

The calls block the event loop for their millisecond or two on purpose: they must also run in a
`finally` of a cancelled task (a paused server left behind would hang every later request), and
no request of the side is streaming tokens while they run.
"""

from __future__ import annotations

import time

from rig.records import RequestRecord, ServerTarget
from rig.secrets import auth_headers
from rig.untimed_http import NoAnswer, call

SETTLE_S = 0.02  # after the last head: the API server hands the request to the engine
HEADS_WAIT_S = 30.0  # a wave is released after this long even if some heads never came
GATE_TIMEOUT_S = 30.0


class GateUnavailable(RuntimeError):
    """The server cannot be paused (no /pause: not served with VLLM_SERVER_DEV_MODE=1)."""


class ServerGate:
    """vLLM's scheduler pause, for one server."""

    def __init__(self, target: ServerTarget) -> None:
        self.target = target
        self.base_url = target.base_url.rstrip("/")

    def _call(self, method: str, path: str) -> dict:
        try:
            answer = call(
                method,
                self.base_url + path,
                timeout_s=GATE_TIMEOUT_S,
                headers=auth_headers(self.target.api_key),
            )
        except NoAnswer as exc:
            raise GateUnavailable(
                f"{self.target.label}: {method} {path} failed: {exc.kind}: {exc.reason}"
            ) from None
        if answer.status == 404:
            raise GateUnavailable(
                f"{self.target.label} at {self.base_url} has no {path.split('?')[0]}: "
                "arrival: waves needs vLLM's /pause and /resume (serve it with "
                "VLLM_SERVER_DEV_MODE=1)"
            )
        if not answer.ok:
            raise GateUnavailable(
                f"{self.target.label}: {method} {path} answered HTTP {answer.status}"
            )
        return answer.json()

    def check(self) -> None:
        """GateUnavailable unless the server can be paused; a server left paused is resumed."""
        if self._call("GET", "/is_paused").get("is_paused"):
            self.resume()

    def pause(self) -> None:
        """Freeze the scheduler; requests that arrive are queued, not scheduled."""
        self._call("POST", "/pause?mode=keep&clear_cache=false")

    def resume(self) -> float:
        """Release the queued requests; the perf_counter time right before the release."""
        released = time.perf_counter()
        self._call("POST", "/resume")
        return released


def count_from_release(record: RequestRecord, released: float) -> None:
    """Move a held request's start to its wave's release: the time the server held it is not
    the server's to answer for."""
    if record.sent_monotonic is None or record.sent_monotonic >= released:
        return
    held = released - record.sent_monotonic
    record.held_s = held
    record.sent_monotonic = released
    record.sent_at += held
    if record.ttft_s is not None:
        record.ttft_s -= held
    if record.e2el_s is not None:
        record.e2el_s -= held
