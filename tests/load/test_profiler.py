"""vLLM's /start_profile and /stop_profile on the wire: posted with the side's key, and a server
without them (no --profiler-config) named in one line."""

import pytest
from aiohttp import web
from pydantic import SecretStr

from rig.load.profiler import ProfilerUnavailable, start_profile, stop_profile
from rig.records import ServerTarget
from tests.aiohttp_thread import serve_app_in_thread


def _app(calls: list) -> web.Application:
    async def noted(request: web.Request) -> web.Response:
        calls.append((request.method, request.path, request.headers.get("Authorization")))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/start_profile", noted)
    app.router.add_post("/stop_profile", noted)
    return app


def test_start_and_stop_are_posted_with_the_sides_key():
    calls: list = []
    with serve_app_in_thread(_app(calls)) as url:
        target = ServerTarget("candidate", url, "m", SecretStr("k"))
        start_profile(target)
        stop_profile(target)
    assert calls == [
        ("POST", "/start_profile", "Bearer k"),
        ("POST", "/stop_profile", "Bearer k"),
    ]


def test_a_server_without_the_profiler_is_one_line():
    with (
        serve_app_in_thread(web.Application()) as url,
        pytest.raises(ProfilerUnavailable) as raised,
    ):
        start_profile(ServerTarget("reference", url, "m"))
    message = str(raised.value)
    assert message.startswith("reference: POST /start_profile answered HTTP 404")
    assert "--profiler-config" in message and "\n" not in message


def test_a_server_that_is_gone_is_one_line():
    with pytest.raises(ProfilerUnavailable) as raised:
        stop_profile(ServerTarget("candidate", "http://127.0.0.1:9", "m"), timeout_s=5)
    assert "candidate: POST /stop_profile failed" in str(raised.value)
