"""The records every pipeline stage passes on: what to send (RequestSpec, SamplingParams,
SideJob, ServerTarget), what came back (RequestRecord, TokenLogprob), the teacher-forced
replay's sequences and answers (ForcedSequence, ForcedLogprobs) and what the servers showed
while it ran (ServerDelta, LevelFault and its advisory kinds); requests.jsonl holds the
records, one per line. The stages that fill them (load/, serve/) and the one that judges them
(verdict/) meet here, so that verdict/ reads no later stage's module for a type.

A failed request is a record with `error` set ("<kind>: <detail>", the kinds in ErrorKind),
never a missing one.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from rig.salts import validate_cache_salt

Endpoint = Literal["completions", "chat"]
CompletionKey = tuple[str, tuple[int, ...]]  # (prompt id, completion token ids)
REQUESTS_FILE = "requests.jsonl"


class Side(StrEnum):
    """The two sides of a comparison. A server's label may add a replica (`reference-1`); a
    record's side may be another run's (`rig compare`) or the A/A replay's."""

    REFERENCE = "reference"
    CANDIDATE = "candidate"


class ErrorKind(StrEnum):
    """Why a request failed: the `<kind>` of RequestRecord.error, written "<kind>: <detail>"."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    MALFORMED_SSE = "malformed_sse"
    CANCELLED = "cancelled"  # the run was interrupted; not the server's failure
    HTTP = "http"  # written http_<status>

    def error(self, detail: str, status: int | None = None) -> str:
        """The record's error string for this kind (an HTTP error names its status)."""
        kind = f"{self.value}_{status}" if self is ErrorKind.HTTP else self.value
        return f"{kind}: {detail}"


def error_kind(error: str) -> str:
    """The `<kind>` of an error string: an ErrorKind's value, `http_<status>`, or "error"."""
    return error.split(":", 1)[0].strip() or "error"


_TRANSPORT_KINDS = frozenset(ErrorKind) - {ErrorKind.HTTP}


def is_transport_error(kind: str) -> bool:
    """A kind the wire or the client produced (an ErrorKind), not one a response showed."""
    return kind in _TRANSPORT_KINDS or kind.startswith(f"{ErrorKind.HTTP}_")


def server_label(side: str, replica: int) -> str:
    """A server's name in logs, files and progress: the side, and its replica pair from 1 on."""
    return side if replica == 0 else f"{side}-{replica}"


def side_of(label: str) -> str:
    """The side a server label names (server_label's inverse, without the replica)."""
    return label.split("-", 1)[0]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    seed: int = 0
    top_logprobs: int = 0  # 0: do not ask for logprobs
    ignore_eos: bool = False  # True: always max_tokens (vllm bench serve --ignore-eos)
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": False}
    extra_body: dict = field(default_factory=dict)  # merged into the JSON body last


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
    conversation_id: str | None = None  # workload.conversations: the conversation it belongs to
    turn: int | None = None  # its turn there, from 0 (rig.scenario.conversations)
    task: str | None = None  # a graded question of this task (the accuracy block), not timed

    def __post_init__(self) -> None:
        validate_cache_salt(self.cache_salt)
        if self.endpoint == "completions" and self.prompt is None:
            raise ValueError(f"request {self.request_id}: a completions request needs a prompt")
        if self.endpoint == "chat" and not self.messages:
            raise ValueError(f"request {self.request_id}: a chat request needs messages")


class ExitCode(IntEnum):
    """What every rig command exits with (`python -m rig.run`, `rig compare`, `rig bisect`, the
    helpers), so CI tells a broken setup from a broken kernel: one table, in the README."""

    PASS = 0  # every gate holds (compare: no substantive divergence; bisect: a call found)
    FAILED = 1  # NOT equivalent, or a gate on the candidate failed (bisect: no call diverged)
    ERROR = 2  # the run could not be made (bad input, a server that would not start or died)
    INVALID = 3  # the comparison is not valid (no kernel proof, wrong reference, cache hits)


@dataclass(frozen=True)
class ServerTarget:
    """Where one server of a side answers: its URL, served name and API key. Built by
    rig.serve.servers.Server.target, from the server's plan."""

    side: str  # a Side, or a label beyond them (`reference (A/A)`)
    base_url: str  # http://127.0.0.1:PORT
    model: str  # served model name
    api_key: SecretStr | None = None  # masked in repr and dumps
    replica: int = 0  # which reference/candidate pair this server belongs to

    @property
    def label(self) -> str:
        return server_label(self.side, self.replica)


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the token there (sampled, or forced by the replay), its logprob (None when
    the server gave none) and the top-k."""

    token_id: int
    logprob: float | None
    top: dict[int, float]  # top-k alternatives: token id -> logprob


@dataclass(frozen=True)
class ForcedSequence:
    """One sequence to replay: the reference's prompt and greedy completion, as token ids."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]

    @property
    def key(self) -> CompletionKey:
        return (self.prompt_id, self.completion_token_ids)


@dataclass(frozen=True)
class ForcedLogprobs:
    """One side's answer along one forced sequence, or why there is none: the forced token's
    logprob at every position (index i: token i given tokens < i) and the side's top-k at every
    completion position."""

    logprobs: tuple[float | None, ...] = ()
    top: tuple[dict[int, float], ...] = ()
    error: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "top": [{str(t): v for t, v in top.items()} for top in self.top]}

    @classmethod
    def from_json(cls, data: dict) -> ForcedLogprobs:
        top = tuple({int(t): v for t, v in position.items()} for position in data["top"])
        return cls(tuple(data["logprobs"]), top, data["error"])


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
    # The longest the client left received data unread. Time stamps are exact while it stays
    # below the server's inter-token gap; beyond that the kernel may merge two tokens' reads
    # and the earlier token takes the later one's time: the client was overloaded.
    client_lag_s: float | None = None
    replica: int = 0  # the replica pair that served it; a request pair never spans two
    # arrival: waves: how long the paused server held it before its wave was released; its
    # sent_at, TTFT and E2EL count from the release (rig.load.waves)
    held_s: float | None = None
    conversation_id: str | None = None  # workload.conversations: its conversation and turn
    turn: int | None = None
    # prompt tokens the server took from its prefix cache (usage.prompt_tokens_details, which
    # vLLM sends with --enable-prompt-tokens-details); None: not reported
    cached_tokens: int | None = None
    task: str | None = None  # a graded question of this task (the accuracy block), not timed

    @property
    def cancelled(self) -> bool:
        """Sent but cut off by an interrupted run: no measurement, and no server failure."""
        return self.error is not None and error_kind(self.error) == ErrorKind.CANCELLED

    @property
    def completed(self) -> bool:
        """Answered without an error, whatever it wrote (an empty output included): the
        requests throughput counts, `vllm bench serve`'s "completed"; TTFT, TPOT and the
        finish time only where a token came."""
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """`vllm bench serve`'s TPOT, (E2EL - TTFT)/(tokens - 1): completed requests of at least
        two tokens only."""
        if not self.completed or self.ttft_s is None or (self.output_tokens or 0) < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def finished_at(self) -> float | None:
        """Wall-clock time of the last token, on `sent_at`'s clock; None unless completed with
        a token."""
        return self.sent_at + self.e2el_s if self.completed and self.e2el_s is not None else None

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
    concurrency: int | None = None  # this server's share of the level's C; None: all of it


def empty_record(target: ServerTarget, spec: RequestSpec) -> RequestRecord:
    """The record of `spec` before any answer: nothing measured, sent now."""
    return RequestRecord(
        side=target.side,
        replica=target.replica,
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
        conversation_id=spec.conversation_id,
        turn=spec.turn,
        task=spec.task,
    )


def duration_s(records: list[RequestRecord]) -> float | None:
    """A block's or level's duration, as `vllm bench serve` takes it for throughput: from the
    first request sent to the last completed one finished; None when none completed."""
    finished = [r.finished_at for r in records if r.finished_at is not None]
    return max(finished) - min(r.sent_at for r in records) if finished else None


def read_records(path: Path) -> list[RequestRecord]:
    """Every record of a requests.jsonl-style file (blank lines skipped); [] when it is absent."""
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [RequestRecord.from_json(line) for line in handle if line.strip()]


@dataclass(frozen=True)
class ServerDelta:
    """What one server's /metrics counted during one block (its share of one level and
    repeat): prefix-cache queries and hits, and, where the server publishes them, the rig
    plugin's GDN prefill calls, their time and the JIT compilations it saw, and vLLM's own
    per-request prefill, decode and queue time (histogram sums and counts). None: not
    published."""

    server: str  # server_label: the side, and its replica pair from 1 on
    level: int
    repeat: int
    queries: float
    hits: float
    gdn_prefill_calls: int | None = None
    gdn_timed_calls: int | None = None
    gdn_seconds: float | None = None
    jit_compiles: int | None = None
    prefill_seconds: float | None = None
    prefill_requests: float | None = None
    decode_seconds: float | None = None
    decode_requests: float | None = None
    queue_seconds: float | None = None
    queue_requests: float | None = None
    started_at: float | None = None  # wall clock (time.time()) of the block's start and end
    ended_at: float | None = None

    @property
    def compiled(self) -> bool:
        """A JIT compilation happened in the server while this block ran."""
        return bool(self.jit_compiles)


# A LevelFault's kind for a kernel compiled while serving (rig.serve.logs reads it in the log):
# not a fault of the kernel, but the block's time holds the compilation.
JIT_COMPILE = "jit_compile"
ADVISORY_LOG_KINDS = frozenset({JIT_COMPILE})  # flagged in the report, no gate counts them


@dataclass(frozen=True)
class LevelFault:
    """A server-log fault (OOM, CUDA error, traceback, death) attributed to the level it hit."""

    server: str  # server_label of the server whose log showed it
    level: int | None
    kind: str
    line: str
    failed_requests: str = ""  # ids of that server's requests that failed in that level
    repeat: int = 0
