"""vLLM's profiler on the wire: `POST /start_profile` and `POST /stop_profile`.

vLLM serves both only when it was started with a profiler config (`--profiler-config`); the
worker writes its torch profiler trace when the profile stops, before `/stop_profile` answers.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from rig.records import ServerTarget
from rig.secrets import auth_headers

# Writing a trace takes a while: a GPU worker's can be tens of MB of JSON, gzipped.
PROFILE_CALL_TIMEOUT_S = 600.0


class ProfilerUnavailable(RuntimeError):
    """The server did not start or stop its profiler; the message is one line."""


def _post(target: ServerTarget, path: str, timeout_s: float) -> None:
    request = urllib.request.Request(
        target.base_url.rstrip("/") + path,
        method="POST",
        headers=auth_headers(target.api_key),
        data=b"",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        hint = " (was it started with --profiler-config?)" if exc.code == 404 else ""
        raise ProfilerUnavailable(
            f"{target.label}: POST {path} answered HTTP {exc.code}{hint}"
        ) from None
    except (OSError, TimeoutError) as exc:
        raise ProfilerUnavailable(
            f"{target.label}: POST {path} failed: {type(exc).__name__}: {exc}"
        ) from None


def start_profile(target: ServerTarget, timeout_s: float = PROFILE_CALL_TIMEOUT_S) -> None:
    _post(target, "/start_profile", timeout_s)


def stop_profile(target: ServerTarget, timeout_s: float = PROFILE_CALL_TIMEOUT_S) -> None:
    """Stop the profiler; vLLM has written the trace when this returns."""
    _post(target, "/stop_profile", timeout_s)
