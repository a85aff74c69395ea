"""Load: send the same ordered greedy requests to every side at once and time each token.

Each side (reference, candidate, ...) is driven by its own process with its own event loop
(spawned, so it shares nothing with the caller), because one loop driving two sides at C=200
lets one side's parsing delay the other's timestamps (benchmarks/README.md has the numbers).
The HTTP client is aiohttp: httpx falls behind well below 200 concurrent streams.

Timing follows `vllm bench serve`, on the monotonic clock (`time.perf_counter`):
TTFT = first SSE message with non-empty `choices` minus the send time, ITL = gaps between
such messages, E2EL = last such message minus the send time. Every message in one network read
gets that read's time stamp, so parsing cost never leaks into the numbers.

A failed request becomes a record with `error` set ("<kind>: <detail>", kinds: timeout,
http_<status>, connection, malformed_sse, cancelled); only a crash of the client itself raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import queue
import re
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np

Endpoint = Literal["completions", "chat"]

MAX_CACHE_SALT_CHARS = 128
CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
_ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    seed: int = 0
    top_logprobs: int = 0  # 0: do not ask for logprobs
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": False}
    extra_body: dict = field(default_factory=dict)  # merged into the JSON body last


def validate_cache_salt(salt: str) -> None:
    """vLLM's rules (vllm.entrypoints.generate.base.protocol.validate_cache_salt)."""
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}")
    if len(salt) > MAX_CACHE_SALT_CHARS:
        raise ValueError(f"cache_salt {salt!r} is longer than {MAX_CACHE_SALT_CHARS} characters")
    if any(char in salt for char in CACHE_SALT_FORBIDDEN):
        raise ValueError(f"cache_salt {salt!r} contains one of '@', '/', '\\', NUL")


@dataclass(frozen=True)
class RequestSpec:
    request_id: str  # unique within the run
    prompt_id: str
    level: int  # the concurrency level this request belongs to
    repeat: int
    index: int  # position in the level's ordered list
    endpoint: Endpoint
    prompt: str | list[int] | None  # completions: text or token ids
    messages: tuple[dict, ...] | None  # chat
    cache_salt: str  # the caller guarantees uniqueness; vLLM's rules are checked here
    sampling: SamplingParams
    warmup: bool = False  # sent before the measured requests of its side; flagged in the record

    def __post_init__(self) -> None:
        validate_cache_salt(self.cache_salt)
        if self.endpoint == "completions" and self.prompt is None:
            raise ValueError(f"request {self.request_id}: a completions request needs a prompt")
        if self.endpoint == "chat" and not self.messages:
            raise ValueError(f"request {self.request_id}: a chat request needs messages")


@dataclass(frozen=True)
class ServerTarget:
    side: str  # "reference" | "candidate" | ...
    base_url: str  # http://127.0.0.1:PORT
    model: str  # served model name
    api_key: str | None = None


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float]  # top-k alternatives: token id -> logprob


@dataclass
class RequestRecord:
    side: str
    request_id: str
    prompt_id: str
    level: int
    repeat: int
    index: int
    cache_salt: str
    sent_at: float  # wall clock (time.time()) when sent, for reports
    ttft_s: float | None
    itl_s: list[float]
    e2el_s: float | None
    text: str
    token_ids: list[int] | None
    finish_reason: str | None
    prompt_tokens: int | None
    output_tokens: int | None
    logprobs: list[TokenLogprob] | None
    http_status: int | None
    error: str | None  # None on success, else "<kind>: <detail>"
    sent_monotonic: float | None = None  # perf_counter when sent; same clock as the timings
    warmup: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        data = json.loads(line)
        if data["logprobs"] is not None:
            data["logprobs"] = [
                TokenLogprob(
                    token_id=p["token_id"],
                    logprob=p["logprob"],
                    top={int(k): v for k, v in p["top"].items()},
                )
                for p in data["logprobs"]
            ]
        return cls(**data)


@dataclass(frozen=True)
class SideJob:
    target: ServerTarget
    specs: list[RequestSpec]  # sent in order, at most `concurrency` in flight


@dataclass(frozen=True)
class PrefixCacheCounters:
    queries: float
    hits: float


# -- one request ---------------------------------------------------------------------------------


def request_body(spec: RequestSpec, model: str) -> dict[str, Any]:
    """The JSON body for one request: greedy, streamed, salted, token ids and usage returned."""
    sampling = spec.sampling
    body: dict[str, Any] = {"model": model}
    if spec.endpoint == "chat":
        body["messages"] = list(spec.messages or ())
        body["max_completion_tokens"] = sampling.max_tokens
    else:
        body["prompt"] = spec.prompt
        body["max_tokens"] = sampling.max_tokens
    body.update(
        temperature=0.0,
        seed=sampling.seed,
        stream=True,
        stream_options={"include_usage": True},
        cache_salt=spec.cache_salt,
        return_token_ids=True,
    )
    if sampling.top_logprobs > 0:
        body["return_tokens_as_token_ids"] = True
        if spec.endpoint == "chat":
            body.update(logprobs=True, top_logprobs=sampling.top_logprobs)
        else:
            body["logprobs"] = sampling.top_logprobs
    if spec.endpoint == "chat" and sampling.chat_template_kwargs is not None:
        body["chat_template_kwargs"] = sampling.chat_template_kwargs
    body.update(sampling.extra_body)
    return body


def _endpoint_url(target: ServerTarget, spec: RequestSpec) -> str:
    path = "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
    return target.base_url.rstrip("/") + path


def _headers(target: ServerTarget, spec: RequestSpec) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "X-Request-Id": spec.request_id}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    return headers


class _MalformedStream(Exception):
    """The server broke the SSE / JSON protocol; the request fails as malformed_sse."""


class _StreamAccumulator:
    """Folds the SSE messages of one response into a RequestRecord."""

    def __init__(self, record: RequestRecord, start: float, want_logprobs: bool) -> None:
        self.record = record
        self.start = start
        self.last_token_at: float | None = None
        self.buffer = b""
        self.text_parts: list[str] = []
        self.token_ids: list[int] = []
        self.saw_token_ids = False
        self.logprobs: list[TokenLogprob] | None = [] if want_logprobs else None
        self.done = False
        self.problem: str | None = None  # first protocol problem seen; the stream is still read

    def feed(self, data: bytes, received: float) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\n\n")) >= 0:
            event, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            self._event(event, received)

    def finish(self) -> None:
        rest = self.buffer.strip()
        if rest:  # a last event without its blank line
            self.buffer = b""
            self._event(rest, self.last_token_at or self.start)
        record = self.record
        record.text = "".join(self.text_parts)
        record.token_ids = self.token_ids if self.saw_token_ids else None
        record.logprobs = self.logprobs
        if self.last_token_at is not None:
            record.e2el_s = self.last_token_at - self.start

    def _event(self, event: bytes, received: float) -> None:
        for line in event.split(b"\n"):
            line = line.rstrip(b"\r")
            if not line.startswith(b"data:"):
                continue  # comments (pings), event names, ids
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                message = json.loads(payload)
            except UnicodeDecodeError:
                self._problem("malformed_sse: invalid UTF-8 in an event")
                message = json.loads(payload.decode("utf-8", errors="replace"))
            except ValueError as exc:
                self._problem(f"malformed_sse: event is not JSON ({exc}): {payload[:80]!r}")
                continue
            self._message(message, received)

    def _problem(self, detail: str) -> None:
        if self.problem is None:
            self.problem = detail

    def _message(self, message: dict, received: float) -> None:
        if not isinstance(message, dict):
            raise _MalformedStream(f"event is not a JSON object: {message!r:.80}")
        if error := message.get("error"):
            code = error.get("code") if isinstance(error, dict) else None
            detail = error.get("message") if isinstance(error, dict) else error
            kind = f"http_{code}" if isinstance(code, int) else "malformed_sse"
            self._problem(f"{kind}: error event in the stream: {detail}")
            return
        if usage := message.get("usage"):
            self.record.prompt_tokens = usage.get("prompt_tokens")
            self.record.output_tokens = usage.get("completion_tokens")
        choices = message.get("choices")
        if not choices:
            return
        record = self.record
        if self.last_token_at is None:
            record.ttft_s = received - self.start
        else:
            record.itl_s.append(received - self.last_token_at)
        self.last_token_at = received
        choice = choices[0]
        delta = choice.get("delta")
        text = choice.get("text") if delta is None else delta.get("content")
        if text:
            self.text_parts.append(text)
        if (ids := choice.get("token_ids")) is not None:
            self.saw_token_ids = True
            self.token_ids.extend(ids)
        if choice.get("finish_reason") is not None:
            record.finish_reason = choice["finish_reason"]
        if self.logprobs is not None and (logprobs := choice.get("logprobs")):
            self.logprobs.extend(_parse_logprobs(logprobs))


def _token_id(name: str) -> int:
    """vLLM names tokens "token_id:<id>" when asked with return_tokens_as_token_ids."""
    prefix, _, number = name.partition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise _MalformedStream(f"logprob token {name!r} is not of the form 'token_id:<id>'")
    return int(number)


def _parse_logprobs(logprobs: dict) -> list[TokenLogprob]:
    if "content" in logprobs:  # chat
        return [
            TokenLogprob(
                token_id=_token_id(entry["token"]),
                logprob=entry["logprob"],
                top={_token_id(alt["token"]): alt["logprob"] for alt in entry["top_logprobs"]},
            )
            for entry in logprobs["content"] or []
        ]
    return [  # completions
        TokenLogprob(
            token_id=_token_id(token),
            logprob=logprob,
            top={_token_id(name): value for name, value in (top or {}).items()},
        )
        for token, logprob, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        )
    ]


def _empty_record(side: str, spec: RequestSpec) -> RequestRecord:
    return RequestRecord(
        side=side,
        request_id=spec.request_id,
        prompt_id=spec.prompt_id,
        level=spec.level,
        repeat=spec.repeat,
        index=spec.index,
        cache_salt=spec.cache_salt,
        sent_at=time.time(),
        ttft_s=None,
        itl_s=[],
        e2el_s=None,
        text="",
        token_ids=None,
        finish_reason=None,
        prompt_tokens=None,
        output_tokens=None,
        logprobs=None,
        http_status=None,
        error=None,
        warmup=spec.warmup,
    )


class _WireStamp:
    """Filled by the session's trace hook just before the request body is written."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at: float | None = None


async def _stamp_body_write(session, context, params) -> None:
    stamp = context.trace_request_ctx
    if isinstance(stamp, _WireStamp) and stamp.at is None:
        stamp.at = time.perf_counter()


def client_session(concurrency: int) -> aiohttp.ClientSession:
    """A session with `concurrency` connections whose requests are time-stamped when their
    body goes to the socket (see send_request). aiohttp's default pool holds 100."""
    tracing = aiohttp.TraceConfig()
    tracing.on_request_chunk_sent.append(_stamp_body_write)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=None),
        trace_configs=[tracing],
    )


async def send_request(
    session: aiohttp.ClientSession, target: ServerTarget, spec: RequestSpec, timeout_s: float
) -> RequestRecord:
    """One streamed request; every failure ends up in the record's `error`, never raised.

    The clock starts when the request body is written to the socket (a trace hook of
    `client_session`), not when aiohttp is called: on Python < 3.12 aiohttp writes the body
    from a task of its own, one whole event-loop pass later, and under load that wait (and
    waiting for a connection) is the client's delay, not the server's. Without the hook
    (a plain session) the clock starts at the call, as in `vllm bench serve`.

    Cancellation is the exception to "never raised": the record is completed with a
    "cancelled" error and attached to the CancelledError (`.record`) for the caller to emit.
    """
    record = _empty_record(target.side, spec)
    payload = json.dumps(request_body(spec, target.model)).encode()
    headers = _headers(target, spec)
    url = _endpoint_url(target, spec)
    wire = _WireStamp()
    record.sent_at = time.time()
    called = time.perf_counter()
    stream = _StreamAccumulator(record, called, spec.sampling.top_logprobs > 0)
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(
                url, data=payload, headers=headers, trace_request_ctx=wire
            ) as response:
                stream.start = wire.at if wire.at is not None else called
                record.http_status = response.status
                if response.status != 200:
                    body = await response.text(errors="replace")
                    record.error = f"http_{response.status}: {body[:_ERROR_BODY_CHARS]}"
                    return record
                while data := await response.content.readany():
                    stream.feed(data, time.perf_counter())
        stream.finish()
        if stream.problem is not None:
            record.error = stream.problem
        elif not stream.done:
            record.error = "connection: the stream ended before data: [DONE]"
    except TimeoutError:
        stream.finish()
        record.error = f"timeout: no complete response within {timeout_s:g} s"
    except (aiohttp.ClientError, OSError) as exc:
        stream.finish()
        record.error = f"connection: {type(exc).__name__}: {exc}"
    except (_MalformedStream, KeyError, TypeError, ValueError, AttributeError) as exc:
        stream.finish()
        record.error = f"malformed_sse: {type(exc).__name__}: {exc}"
    except asyncio.CancelledError as exc:
        stream.finish()
        record.error = "cancelled: the run was interrupted"
        exc.record = record  # type: ignore[attr-defined]
        raise
    finally:
        record.sent_monotonic = wire.at if wire.at is not None else called
    return record


# -- one side -----------------------------------------------------------------------------------


def arrival_offsets(
    count: int, request_rate: float | None, burstiness: float, seed: int
) -> list[float] | None:
    """Send times relative to the first request, gamma-distributed gaps (Poisson at
    burstiness 1, like `vllm bench serve`); None means send as fast as concurrency allows.
    The same seed gives every side the same schedule."""
    if request_rate is None or request_rate == float("inf") or count == 0:
        return None
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError("request_rate and burstiness must be positive")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=count)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


async def drive_side(
    job: SideJob,
    concurrency: int,
    timeout_s: float,
    emit: Callable[[RequestRecord], None],
    *,
    offsets: list[float] | None = None,
    level_timeout_s: float | None = None,
    before_measured: Callable[[], Any] | None = None,
) -> None:
    """Send one side's specs in order with at most `concurrency` in flight; warm-up specs
    first, then `before_measured()` (awaited if it returns an awaitable: a start barrier
    across sides), then the measured specs, paced by `offsets` when given.

    Every spec yields exactly one record through `emit`; when `level_timeout_s` runs out the
    requests in flight and those never sent get a "timeout" record.
    """
    warmups = [s for s in job.specs if s.warmup]
    measured = [s for s in job.specs if not s.warmup]
    deadline = None if level_timeout_s is None else time.perf_counter() + level_timeout_s
    slots = asyncio.Semaphore(concurrency)
    in_flight: dict[asyncio.Task, RequestSpec] = {}
    emitted: set[str] = set()
    level_expired = False

    def finish(record: RequestRecord) -> None:
        emitted.add(record.request_id)
        emit(record)

    async def one(session: aiohttp.ClientSession, spec: RequestSpec) -> None:
        try:
            finish(await send_request(session, job.target, spec, timeout_s))
        except asyncio.CancelledError as exc:
            cancelled = getattr(exc, "record", None)
            if cancelled is not None:
                if level_expired:
                    cancelled.error = f"timeout: level deadline of {level_timeout_s:g} s passed"
                finish(cancelled)
            raise
        finally:
            slots.release()

    async def dispatch(session: aiohttp.ClientSession, specs: list[RequestSpec], paced: bool):
        began = time.perf_counter()
        for i, spec in enumerate(specs):
            if paced and offsets is not None:
                await asyncio.sleep(max(0.0, began + offsets[i] - time.perf_counter()))
            await slots.acquire()
            task = asyncio.create_task(one(session, spec))
            in_flight[task] = spec
            task.add_done_callback(in_flight.pop)
        while in_flight:
            await asyncio.wait(list(in_flight))

    async def run_all(session: aiohttp.ClientSession) -> None:
        await dispatch(session, warmups, paced=False)
        if before_measured is not None:
            ready = before_measured()
            if asyncio.iscoroutine(ready) or isinstance(ready, asyncio.Future):
                await ready
        await dispatch(session, measured, paced=True)

    async with client_session(concurrency) as session:
        try:
            if deadline is None:
                await run_all(session)
            else:
                async with asyncio.timeout_at(_loop_time(deadline)):
                    await run_all(session)
        except TimeoutError:
            level_expired = True
            _cancel_all(in_flight)
            await asyncio.gather(*in_flight, return_exceptions=True)
            for spec in job.specs:
                if spec.request_id not in emitted:
                    record = _empty_record(job.target.side, spec)
                    record.error = f"timeout: level deadline of {level_timeout_s:g} s passed"
                    finish(record)
        finally:
            _cancel_all(in_flight)
            await asyncio.gather(*in_flight, return_exceptions=True)


def _cancel_all(tasks: dict[asyncio.Task, RequestSpec]) -> None:
    for task in list(tasks):
        task.cancel()


def _loop_time(perf_deadline: float) -> float:
    """Translate a perf_counter deadline to the running loop's clock."""
    return asyncio.get_running_loop().time() + (perf_deadline - time.perf_counter())


# -- a level: all sides at once -----------------------------------------------------------------


def run_level(
    jobs: list[SideJob],
    concurrency: int,
    *,
    timeout_s: float,
    request_rate: float | None = None,
    burstiness: float = 1.0,
    on_record: Callable[[RequestRecord], None] | None = None,
    progress: bool = True,
    level_timeout_s: float | None = None,
    seed: int = 0,
    isolation: Literal["process", "inline"] = "process",
) -> dict[str, list[RequestRecord]]:
    """Drive every side at the same time; records come back per side in spec order.

    `on_record` runs in the caller's process as each record completes (warm-up records
    included, flagged `warmup`). Ctrl-C cancels the requests in flight (their records get a
    "cancelled" error and still reach `on_record`), stops the workers and re-raises
    KeyboardInterrupt.
    """
    _check_jobs(jobs, concurrency)
    measured_counts = {len([s for s in job.specs if not s.warmup]) for job in jobs}
    offsets = arrival_offsets(max(measured_counts, default=0), request_rate, burstiness, seed)
    total = sum(len(job.specs) for job in jobs)
    records: dict[str, dict[str, RequestRecord]] = {job.target.side: {} for job in jobs}
    bar = _progress_bar(total, concurrency, progress)

    def collect(record: RequestRecord) -> None:
        records[record.side][record.request_id] = record
        if on_record is not None:
            on_record(record)
        if bar is not None:
            bar.update(1)

    try:
        if isolation == "inline":
            _run_inline(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect)
        else:
            _run_in_processes(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect)
    finally:
        if bar is not None:
            bar.close()
    return {
        job.target.side: [records[job.target.side][s.request_id] for s in job.specs] for job in jobs
    }


def _check_jobs(jobs: list[SideJob], concurrency: int) -> None:
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    sides = [job.target.side for job in jobs]
    if len(set(sides)) != len(sides):
        raise ValueError(f"each side may appear once per level, got {sides}")
    for job in jobs:
        for attribute in ("request_id", "cache_salt"):
            values = [getattr(spec, attribute) for spec in job.specs]
            if len(set(values)) != len(values):
                duplicate = next(v for v in values if values.count(v) > 1)
                raise ValueError(f"{job.target.side}: {attribute} {duplicate!r} is not unique")


def _progress_bar(total: int, concurrency: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"C={concurrency}", unit="req", leave=False)


def _run_inline(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect) -> None:
    async def main() -> None:
        barrier = asyncio.Barrier(len(jobs))
        await asyncio.gather(
            *(
                drive_side(
                    job,
                    concurrency,
                    timeout_s,
                    collect,
                    offsets=offsets,
                    level_timeout_s=level_timeout_s,
                    before_measured=barrier.wait,
                )
                for job in jobs
            )
        )

    _event_loop_runner()(main())


def _event_loop_runner() -> Callable:
    """uvloop where installed (vLLM depends on it): it roughly halves the client's per-event
    cost and so its timing error under load."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


def _run_in_processes(jobs, concurrency, timeout_s, offsets, level_timeout_s, collect) -> None:
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    stop = context.Event()
    barrier = context.Barrier(len(jobs))
    workers = [
        context.Process(
            target=_side_worker,
            args=(job, concurrency, timeout_s, offsets, level_timeout_s, messages, stop, barrier),
            name=f"rig-load-{job.target.side}",
            daemon=True,
        )
        for job in jobs
    ]
    for worker in workers:
        worker.start()
    running = {job.target.side for job in jobs}
    failure: str | None = None
    interrupted = False
    try:
        while running:
            try:
                kind, side, payload = messages.get(timeout=0.2)
            except queue.Empty:
                dead = [w for w in workers if w.exitcode not in (None, 0)]
                if dead and failure is None:
                    failure = f"load worker {dead[0].name} died with exit code {dead[0].exitcode}"
                    stop.set()
                    barrier.abort()
                if dead and all(w.exitcode is not None for w in workers):
                    break
                continue
            except KeyboardInterrupt:
                interrupted = True
                stop.set()
                continue
            if kind == "record":
                collect(payload)
            elif kind == "failed":
                failure = failure or f"load worker for {side} failed:\n{payload}"
                stop.set()
                barrier.abort()
                running.discard(side)
            else:
                running.discard(side)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    if interrupted:
        raise KeyboardInterrupt
    if failure is not None:
        raise RuntimeError(failure)


def _side_worker(job, concurrency, timeout_s, offsets, level_timeout_s, messages, stop, barrier):
    """One side in its own process: Ctrl-C is the parent's to handle, it tells us via `stop`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    side = job.target.side

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def wait_for_peers() -> None:
            await loop.run_in_executor(None, barrier.wait)

        drive = asyncio.create_task(
            drive_side(
                job,
                concurrency,
                timeout_s,
                lambda record: messages.put(("record", side, record)),
                offsets=offsets,
                level_timeout_s=level_timeout_s,
                before_measured=wait_for_peers,
            )
        )
        while not drive.done():
            await asyncio.wait([drive], timeout=0.05)
            if stop.is_set() and not drive.done():
                drive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drive

    try:
        _event_loop_runner()(main())
    except Exception:
        messages.put(("failed", side, traceback.format_exc()))
    else:
        messages.put(("done", side, None))


# -- prefix cache counters -----------------------------------------------------------------------

_COUNTER_LINE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


async def read_prefix_cache_counters(
    base_url: str, api_key: str | None = None
) -> PrefixCacheCounters:
    """vLLM's prefix-cache counters from /metrics, summed over label sets (engines, models)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(base_url.rstrip("/") + "/metrics", headers=headers) as response,
    ):
        response.raise_for_status()
        text = await response.text()
    return parse_prefix_cache_counters(text)


def parse_prefix_cache_counters(metrics_text: str) -> PrefixCacheCounters:
    totals = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    found = set()
    for line in metrics_text.splitlines():
        match = _COUNTER_LINE.match(line)
        if match and match["name"] in totals:
            totals[match["name"]] += float(match["value"])
            found.add(match["name"])
    if len(found) != len(totals):
        missing = ", ".join(sorted(set(totals) - found))
        raise ValueError(f"/metrics has no {missing} (is this a vLLM server with prefix caching?)")
    return PrefixCacheCounters(
        queries=totals["vllm:prefix_cache_queries_total"],
        hits=totals["vllm:prefix_cache_hits_total"],
    )
