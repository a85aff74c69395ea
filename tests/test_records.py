"""The records between stages: spec checks and the JSON round trip of a real answer."""

from __future__ import annotations

import pytest

from rig.records import RequestRecord, RequestSpec, SamplingParams, TokenLogprob
from rig.stub.server import serve_in_thread
from tests.stub_requests import FAST, one_side, spec


def test_a_chat_spec_needs_messages():
    with pytest.raises(ValueError, match="messages"):
        RequestSpec("r", "p", 1, 0, 0, "chat", None, None, "s", SamplingParams(1))


def test_records_round_trip_through_json():
    with serve_in_thread(FAST) as stub:
        (record,) = one_side(stub, [spec(0, top_logprobs=2)])
    line = record.to_json()
    assert "\n" not in line
    again = RequestRecord.from_json(line)
    assert again == record and isinstance(again.logprobs[0], TokenLogprob)
