"""The one client of the rig's untimed HTTP: a server's /health, /metrics, /version, the
scheduler's pause and resume (rig.load.waves), the teacher-forced replay and /tokenize. Timed
requests go over rig.load.http_client alone.

Why urllib (the standard library), not aiohttp: most of these calls are synchronous by nature
(a health poll, the waves' pause and resume, which block the event loop on purpose),
and aiohttp would need an event loop of its own for each; the waves' release is timed right
before POST /resume, so that call must stay as quick as it was. Callers on an event loop (the
replay, /metrics around a block) run the same call on threads of an AsyncClient; untimed, they
gain nothing from an asynchronous client (benchmarks/untimed_http.py measures both).

A server is reached directly, as the timed client reaches it: proxy variables are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NoAnswer(Exception):
    """No HTTP answer came: refused, reset, timed out, or not HTTP. `reason` is what failed."""

    def __init__(self, method: str, url: str, error: Exception) -> None:
        self.kind = type(error).__name__
        self.reason = getattr(error, "reason", error)
        super().__init__(f"{method} {url}: {self.kind}: {self.reason}")


@dataclass(frozen=True)
class Answer:
    """A server's whole answer, whatever its status."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON, `{}` when empty; ValueError when it is not JSON."""
        return json.loads(self.body or b"{}")


def call(
    method: str,
    url: str,
    *,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    body: dict | None = None,
) -> Answer:
    """One request and its whole answer (JSON `body` when given; POST without one sends an
    empty body); NoAnswer when none came. `timeout_s` bounds each wait on the socket."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with _DIRECT.open(request, timeout=timeout_s) as response:
            return Answer(response.status, response.read())
    except urllib.error.HTTPError as error:  # a status other than 2xx: still an answer
        with error:
            try:
                return Answer(error.code, error.read())
            except (OSError, http.client.HTTPException):
                return Answer(error.code, b"")
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise NoAnswer(method, url, error) from None


class AsyncClient:
    """`call` from an event loop: each call on a daemon thread of its own, at most `size` at
    once, so that as many requests are in flight as the caller lets go. Daemon threads, so that
    a run interrupted mid-replay exits at once, not when a waiting read times out."""

    def __init__(self, size: int) -> None:
        self._slots = asyncio.Semaphore(max(1, size))

    async def run(self, function: Callable[..., T], *args: Any, **options: Any) -> T:
        """`function` (which calls `call`) on a thread; its result or its exception."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def work() -> None:
            try:
                outcome = functools.partial(done.set_result, function(*args, **options))
            except Exception as error:
                outcome = functools.partial(done.set_exception, error)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(_settle, done, outcome)

        async with self._slots:
            threading.Thread(target=work, name="rig-http", daemon=True).start()
            return await done

    async def call(self, method: str, url: str, **options: Any) -> Answer:
        return await self.run(call, method, url, **options)


def _settle(done: asyncio.Future, outcome: Callable[[], None]) -> None:
    if not done.done():  # not cancelled meanwhile
        outcome()
