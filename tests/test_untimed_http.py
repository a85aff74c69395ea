"""The untimed client against a small threaded HTTP server: any status is an answer, no answer
is one line, servers are reached past any proxy, and the event loop's
calls run at once on threads."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import threading
import time

import pytest

from rig.untimed_http import AsyncClient, NoAnswer, call


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /ok, /missing (404 with a body), /slow (0.2 s); POST echoes its JSON and headers."""

    in_flight = most_in_flight = 0
    lock = threading.Lock()

    def do_GET(self):  # noqa: N802 (the handler's name)
        if self.path == "/slow":
            with self.lock:
                _Handler.in_flight += 1
                _Handler.most_in_flight = max(_Handler.most_in_flight, _Handler.in_flight)
            time.sleep(0.2)
            with self.lock:
                _Handler.in_flight -= 1
        status, body = (404, b"no such page") if self.path == "/missing" else (200, b"fine")
        self._answer(status, body)

    def do_POST(self):  # noqa: N802
        sent = self.rfile.read(int(self.headers["Content-Length"]))
        echo = {"body": sent.decode(), "type": self.headers.get("Content-Type")}
        echo["auth"] = self.headers.get("Authorization")
        self._answer(200, json.dumps(echo).encode())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_any_status_is_an_answer_with_its_body(server_url):
    ok = call("GET", f"{server_url}/ok", timeout_s=5)
    missing = call("GET", f"{server_url}/missing", timeout_s=5)
    assert (ok.status, ok.ok, ok.text()) == (200, True, "fine")
    assert (missing.status, missing.ok, missing.text()) == (404, False, "no such page")


def test_a_json_body_goes_with_its_type_and_headers(server_url):
    answer = call(
        "POST", f"{server_url}/echo", timeout_s=5, body={"a": 1}, headers={"Authorization": "k"}
    )
    assert answer.json() == {"body": '{"a": 1}', "type": "application/json", "auth": "k"}


def test_no_answer_is_one_line_naming_what_failed():
    url = f"http://127.0.0.1:{_closed_port()}/health"
    with pytest.raises(NoAnswer) as caught:
        call("GET", url, timeout_s=5)
    assert caught.value.kind == "URLError" and "refused" in str(caught.value.reason).lower()
    assert str(caught.value).startswith(f"GET {url}: URLError: ") and "\n" not in str(caught.value)


def test_a_server_is_reached_past_a_proxy(server_url, monkeypatch):
    dead_proxy = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("http_proxy", dead_proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert call("GET", f"{server_url}/ok", timeout_s=5).status == 200


def test_calls_from_an_event_loop_run_at_once_on_threads(server_url):
    _Handler.most_in_flight = 0

    async def four() -> list:
        client = AsyncClient(4)
        return await asyncio.gather(
            *(client.call("GET", f"{server_url}/slow", timeout_s=5) for _ in range(4))
        )

    started = time.monotonic()
    answers = asyncio.run(four())
    assert [a.status for a in answers] == [200] * 4
    assert _Handler.most_in_flight == 4 and time.monotonic() - started < 0.7


def test_an_event_loop_call_raises_what_its_thread_raised():
    url = f"http://127.0.0.1:{_closed_port()}/"
    with pytest.raises(NoAnswer):
        asyncio.run(AsyncClient(1).call("GET", url, timeout_s=5))


def test_a_cancelled_call_leaves_the_loop_at_once(server_url):
    async def cancel_one() -> None:
        task = asyncio.ensure_future(AsyncClient(1).call("GET", f"{server_url}/slow", timeout_s=5))
        await asyncio.sleep(0.02)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    started = time.monotonic()
    asyncio.run(cancel_one())
    assert time.monotonic() - started < 0.15
