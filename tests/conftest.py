"""Shared fixtures for the unit tests: synthetic request records, built field by field."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings

from rig.records import RequestRecord

# The bad-input sweep runs the same inputs every time (derandomized, no example database), so a
# failure in CI is a failure here; each property sets its own max_examples (docs/ci.md).
settings.register_profile(
    "rig",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("rig")


def _record(
    side: str = "reference",
    request_id: str = "c1-r0-0000",
    text: str = "hello world",
    **fields,
) -> RequestRecord:
    """A successful response unless `fields` say otherwise (error=..., token_ids=..., ...)."""
    values = {
        "side": side,
        "request_id": request_id,
        "prompt_id": "p0",
        "level": 1,
        "repeat": 0,
        "index": 0,
        "cache_salt": f"run.{side}.{request_id}",
        "sent_at": 1000.0,
        "ttft_s": 0.1,
        "itl_s": [0.01],
        "e2el_s": 0.2,
        "text": text,
        "token_ids": None,
        "finish_reason": "stop",
        "prompt_tokens": 4,
        "output_tokens": 2,
        "logprobs": None,
        "http_status": 200,
        "error": None,
    }
    values.update(fields)
    return RequestRecord(**values)


@pytest.fixture(scope="session")
def make_record() -> Callable[..., RequestRecord]:
    """`make_record(side, request_id, text, **fields)` -> RequestRecord."""
    return _record
