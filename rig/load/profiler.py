"""vLLM's profiler on the wire: `POST /start_profile` and `POST /stop_profile`.

vLLM serves both only when it was started with a profiler config (`--profiler-config`); the
worker writes its torch profiler trace when the profile stops, before `/stop_profile` answers.
"""

from __future__ import annotations

from rig.records import ServerTarget
from rig.secrets import auth_headers
from rig.untimed_http import NoAnswer, call

# Writing a trace takes a while: a GPU worker's can be tens of MB of JSON, gzipped.
PROFILE_CALL_TIMEOUT_S = 600.0


class ProfilerUnavailable(RuntimeError):
    """The server did not start or stop its profiler; the message is one line."""


def _post(target: ServerTarget, path: str, timeout_s: float) -> None:
    url = target.base_url.rstrip("/") + path
    try:
        answer = call("POST", url, timeout_s=timeout_s, headers=auth_headers(target.api_key))
    except NoAnswer as exc:
        what = f"{exc.kind}: {exc.reason}"
        raise ProfilerUnavailable(f"{target.label}: POST {path} failed: {what}") from None
    if not answer.ok:
        hint = " (was it started with --profiler-config?)" if answer.status == 404 else ""
        raise ProfilerUnavailable(
            f"{target.label}: POST {path} answered HTTP {answer.status}{hint}"
        )


def start_profile(target: ServerTarget, timeout_s: float = PROFILE_CALL_TIMEOUT_S) -> None:
    _post(target, "/start_profile", timeout_s)


def stop_profile(target: ServerTarget, timeout_s: float = PROFILE_CALL_TIMEOUT_S) -> None:
    """Stop the profiler; vLLM has written the trace when this returns."""
    _post(target, "/stop_profile", timeout_s)
