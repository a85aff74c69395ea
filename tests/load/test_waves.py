"""Gated waves against the stub, which imitates vLLM's /pause (keep) and /resume: when each
request was let go is the stub's own record, so the release and the timing from it can be
checked exactly."""

from __future__ import annotations

import http.server
import threading
import urllib.request
from dataclasses import replace

import pytest

from rig.load.waves import GateUnavailable, ServerGate
from rig.records import ServerTarget
from rig.stub.server import serve_in_thread
from tests.stub_requests import FAST, one_side, spec


def _paused(stub) -> bool:
    with urllib.request.urlopen(stub.url + "/is_paused", timeout=5) as response:
        return b"true" in response.read()


def test_each_wave_is_released_at_once_and_timed_from_the_release():
    with serve_in_thread(FAST) as stub:
        records = one_side(stub, [spec(i) for i in range(8)], concurrency=4, waves=True)
        log = {entry.key: entry for entry in stub.log}
        assert not _paused(stub)
    waves = [records[:4], records[4:]]
    for wave in waves:
        reads = [log[r.request_id].read for r in wave]
        assert max(reads) - min(reads) < 0.005  # let go together
        assert all(log[r.request_id].held for r in wave)
        release = wave[0].sent_monotonic
        assert all(r.sent_monotonic == release for r in wave)
        # every request was in (and held) before the release, which came before the stub let go
        assert all(log[r.request_id].arrived < release <= log[r.request_id].read for r in wave)
        for record in wave:
            assert record.error is None and record.held_s > 0
            assert FAST.ttft_s <= record.ttft_s < FAST.ttft_s + 0.05  # from the release
            assert record.e2el_s == pytest.approx(record.ttft_s + sum(record.itl_s))
    # the last token's send stamp, not the stub's `finished`, which comes after the [DONE]
    # that frees the client (tests/load/test_engine.py's warm-up test says why)
    first_done = max(log[r.request_id].sent[-1] for r in waves[0])
    assert all(log[r.request_id].arrived > first_done for r in waves[1])


def test_a_level_cut_short_inside_a_wave_leaves_the_server_running():
    """A wave that never gets all its heads (a request hangs before answering) is cut by the
    level deadline; the server is resumed on the way out, not left paused for the next level."""
    with serve_in_thread(replace(FAST, faults={1: "hang"})) as stub:
        records = one_side(stub, [spec(0), spec(1)], concurrency=2, waves=True, level_timeout_s=0.5)
        assert not _paused(stub)
    assert all(r.error is not None and r.error.startswith("timeout") for r in records)


class _NoPause(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the handler's name)
        self.send_error(404)

    def log_message(self, *args):
        pass


def test_a_server_without_pause_is_refused_in_one_line():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoPause)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(GateUnavailable, match="VLLM_SERVER_DEV_MODE=1"):
            ServerGate(ServerTarget("candidate", url, "m")).check()
    finally:
        server.shutdown()
