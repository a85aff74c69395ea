"""The records between stages: spec checks, the JSON round trip of a real answer, the error
kinds and the one reader of requests.jsonl."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rig.records import (
    REQUESTS_FILE,
    ErrorKind,
    RequestRecord,
    RequestSpec,
    SamplingParams,
    TokenLogprob,
    duration_s,
    error_kind,
    is_transport_error,
    read_records,
)
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


def test_a_turns_fields_reach_the_record_and_older_lines_still_read():
    """A conversation turn's spec names its conversation and turn; a requests.jsonl line from
    before those fields (an interrupted run, a golden-cache entry) reads with them unset."""
    turn = replace(spec(1), conversation_id="talk", turn=2)
    with serve_in_thread(FAST) as stub:
        (record,) = one_side(stub, [turn])
    assert (record.conversation_id, record.turn) == ("talk", 2)
    older = json.loads(record.to_json())
    for field in ("conversation_id", "turn", "cached_tokens"):
        del older[field]
    again = RequestRecord.from_json(json.dumps(older))
    assert (again.conversation_id, again.turn, again.cached_tokens) == (None, None, None)


@pytest.mark.parametrize(
    ("kind", "status", "written"),
    [
        (ErrorKind.TIMEOUT, None, "timeout: t"),
        (ErrorKind.HTTP, 503, "http_503: t"),
        (ErrorKind.CANCELLED, None, "cancelled: t"),
    ],
)
def test_an_error_is_written_and_read_back_by_its_kind(kind, status, written):
    error = kind.error("t", status)
    assert error == written
    assert is_transport_error(error_kind(error))


def test_only_a_cancelled_record_is_cancelled_and_the_reader_skips_blank_lines(tmp_path):
    with serve_in_thread(FAST) as stub:
        ok, timed_out = one_side(stub, [spec(0), spec(1)])
    timed_out.error = ErrorKind.TIMEOUT.error("slow")
    cancelled = RequestRecord(**{**ok.__dict__, "error": ErrorKind.CANCELLED.error("Ctrl-C")})
    assert [r.cancelled for r in (ok, timed_out, cancelled)] == [False, False, True]
    path = tmp_path / REQUESTS_FILE
    path.write_text(ok.to_json() + "\n\n" + cancelled.to_json() + "\n")
    assert read_records(path) == [ok, cancelled]
    assert read_records(tmp_path / "absent.jsonl") == []
    assert not is_transport_error("empty_output") and error_kind(": odd") == "error"


def test_completed_tpot_and_duration_are_defined_once(make_record):
    """vLLM bench's definitions, shared by the summary frame and the speed verdict: an empty
    answer is completed without a TTFT; TPOT needs two tokens; the duration runs from the first
    send to the last token."""
    three = make_record("reference", "a", sent_at=10.0, ttft_s=0.1, e2el_s=0.5, output_tokens=3)
    one = make_record("reference", "b", sent_at=10.2, ttft_s=0.2, e2el_s=0.2, output_tokens=1)
    empty = make_record("reference", "c", text="", sent_at=9.5, ttft_s=None, e2el_s=None)
    failed = make_record("reference", "d", error="timeout: x", sent_at=12.0, e2el_s=5.0)
    assert [r.completed for r in (three, one, empty, failed)] == [True, True, True, False]
    assert three.tpot_s == pytest.approx(0.2)
    assert one.tpot_s is None and empty.tpot_s is None and failed.tpot_s is None
    assert empty.finished_at is None and failed.finished_at is None
    assert duration_s([three, one, empty, failed]) == pytest.approx(10.5 - 9.5)
    assert duration_s([empty, failed]) is None
