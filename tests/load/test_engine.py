"""The load engine against the paced stub: timing fields, parsing, faults, order, limits, cancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from rig.load.engine import arrival_offsets, progress_bar, run_level
from rig.records import RequestRecord, RequestSpec, ServerTarget, SideJob
from rig.stub.server import StubConfig, serve_in_thread
from tests.stub_requests import FAST, one_side, spec

# -- timing and parsing ---------------------------------------------------------------------------


def test_timings_are_bounded_by_what_the_stub_did():
    """Causality on one clock: the client sent before the stub saw the request and received
    each token after the stub sent it, and not long after on an idle loopback. (Kernel stamps
    come from the wall clock; moving them onto the monotonic one costs about a microsecond.)"""
    with serve_in_thread(FAST) as stub:
        records = one_side(stub, [spec(i) for i in range(6)])
        log = {entry.key: entry for entry in stub.log}
    for record in records:
        entry = log[record.request_id]
        receipts = record.sent_monotonic + record.ttft_s + np.cumsum([0.0, *record.itl_s])
        assert record.sent_monotonic <= entry.arrived + 5e-5
        assert len(receipts) == len(entry.sent) == 5
        assert np.all(receipts >= np.array(entry.sent) - 5e-5)
        assert np.all(receipts <= np.array(entry.sent) + 0.5)
        assert record.e2el_s == pytest.approx(record.ttft_s + sum(record.itl_s))
        assert record.ttft_s >= FAST.ttft_s
        assert 0 <= record.client_lag_s < 0.5
        assert abs(record.sent_at - time.time()) < 60


def test_text_token_ids_usage_and_finish_reason_are_parsed():
    with serve_in_thread(FAST) as stub:
        completions, chat = one_side(stub, [spec(0), spec(1, "chat")])
    for record in (completions, chat):
        assert record.error is None and record.http_status == 200
        assert record.text == "".join(f" w{t}" for t in record.token_ids)
        assert len(record.token_ids) == 5 and record.output_tokens == 5
        assert record.finish_reason == "length" and record.prompt_tokens >= 1
        assert record.logprobs is None
    assert len(chat.itl_s) == 5  # the role chunk counts as the first, like vllm bench serve


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_logprobs_are_keyed_by_token_id(endpoint):
    with serve_in_thread(FAST) as stub:
        (record,) = one_side(stub, [spec(0, endpoint, top_logprobs=3)])
    assert [p.token_id for p in record.logprobs] == record.token_ids
    for position in record.logprobs:
        assert len(position.top) == 3 and position.token_id in position.top
        assert all(isinstance(token_id, int) for token_id in position.top)
        assert position.logprob == position.top[position.token_id]


# -- faults ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("http_409", "http_409"),
        ("http_429", "http_429"),
        ("http_500", "http_500"),
        ("hang", "timeout"),
        ("stall", "timeout"),
        ("malformed_sse", "malformed_sse"),
        ("drop", "connection"),
        ("invalid_utf8", "malformed_sse"),
    ],
)
def test_each_fault_becomes_an_error_record_of_its_kind(fault, kind):
    with serve_in_thread(FAST) as stub:
        failing = spec(1, extra_body={"stub_fault": fault})
        records = one_side(stub, [spec(0), failing, spec(2)], concurrency=1, timeout_s=1.0)
    assert [r.request_id for r in records] == ["r0", "r1", "r2"]
    assert records[0].error is None and records[2].error is None
    assert records[1].error.split(":", 1)[0] == kind
    if kind.startswith("http_"):
        assert records[1].http_status == int(kind[5:]) and "stub fault" in records[1].error


def test_partial_output_is_kept_when_a_stream_fails():
    with serve_in_thread(FAST) as stub:
        (dropped,) = one_side(stub, [spec(0, extra_body={"stub_fault": "drop"})])
        (invalid,) = one_side(stub, [spec(1, extra_body={"stub_fault": "invalid_utf8"})])
    assert dropped.text.count(" w") == 2 and dropped.ttft_s is not None
    assert "\ufffd" in invalid.text and invalid.text.count(" w") == 5


@pytest.mark.parametrize("fault", ["replacement_char", "repetition", "empty"])
def test_content_faults_are_not_transport_errors(fault):
    with serve_in_thread(FAST) as stub:
        (record,) = one_side(stub, [spec(0, max_tokens=9, extra_body={"stub_fault": fault})])
    assert record.error is None
    if fault == "replacement_char":
        assert record.text.startswith("\ufffd")
    elif fault == "repetition":
        assert record.output_tokens == 9 and len(set(record.token_ids)) == 1
    else:
        assert record.text == "" and record.ttft_s is not None


def test_a_server_that_is_not_there_is_a_connection_error():
    job = SideJob(ServerTarget("reference", "http://127.0.0.1:9", "stub"), [spec(0)])
    (record,) = run_level([job], 1, timeout_s=5, progress=False)["reference"]
    assert record.error.startswith("connection:") and record.http_status is None


# -- order, concurrency, salts, warm-up, pacing ----------------------------------------------


def test_at_most_c_in_flight_in_order_with_salts_passed_through():
    concurrency, count = 4, 16
    with serve_in_thread(FAST) as stub:
        records = one_side(stub, [spec(i) for i in range(count)], concurrency=concurrency)
        log = list(stub.log)
    assert [r.request_id for r in records] == [f"r{i}" for i in range(count)]
    # In flight from arrival to the last token's send stamp: the client frees a slot only after
    # the [DONE] that follows it. (The stub's `finished` stamp comes later, from a busy event
    # loop, so the next request's kernel arrival stamp can precede it.)
    intervals = [(e.arrived, e.sent[-1]) for e in log]
    peak = max(sum(a <= t < f for a, f in intervals) for t, _ in intervals)
    assert peak == concurrency
    arrival_rank = {e.key: rank for rank, e in enumerate(log)}
    for i in range(count):  # only requests in flight together can overtake each other
        assert abs(arrival_rank[f"r{i}"] - i) < concurrency
    assert {e.key: e.cache_salt for e in log} == {r.request_id: r.cache_salt for r in records}


def test_both_sides_run_at_the_same_time():
    slow = StubConfig(ttft_s=0.2, itl_s=0.05, output_tokens=4)
    with serve_in_thread(slow) as one, serve_in_thread(slow) as two:
        jobs = [
            SideJob(ServerTarget("reference", one.url, "stub"), [spec(i) for i in range(2)]),
            SideJob(ServerTarget("candidate", two.url, "stub"), [spec(i) for i in range(2)]),
        ]
        seen: list[RequestRecord] = []
        results = run_level(jobs, 2, timeout_s=10, on_record=seen.append, progress=False)
        starts = [min(e.arrived for e in stub.log) for stub in (one, two)]
    assert abs(starts[0] - starts[1]) < 0.15  # each side takes 0.35 s
    assert sorted(r.request_id + r.side for r in seen) == sorted(
        r.request_id + r.side for side in results.values() for r in side
    )


def test_warmup_requests_go_first_and_are_flagged():
    specs = [spec(i) for i in range(4)]
    specs[0] = RequestSpec(**{**specs[0].__dict__, "warmup": True})
    specs[3] = RequestSpec(**{**specs[3].__dict__, "warmup": True})
    with serve_in_thread(FAST) as stub:
        records = one_side(stub, specs, concurrency=4)
        log = {e.key: e for e in stub.log}
    assert [r.warmup for r in records] == [True, False, False, True]
    # a warm-up is over for the client at its [DONE], which follows its last token's send
    # stamp; the stub's `finished` stamp comes after the [DONE], so a measured request's kernel
    # arrival stamp may precede it (it did, once in a `make test` run here)
    warm_end = max(log[k].sent[-1] for k in ("r0", "r3"))
    assert all(log[k].arrived >= warm_end for k in ("r1", "r2"))


def test_arrival_offsets_are_seeded_and_gamma_shaped():
    poisson = np.diff(arrival_offsets(4000, 50.0, 1.0, seed=3))
    regular = np.diff(arrival_offsets(4000, 50.0, 20.0, seed=3))
    assert arrival_offsets(10, 50.0, 1.0, seed=3) == arrival_offsets(10, 50.0, 1.0, seed=3)
    assert poisson.mean() == pytest.approx(1 / 50, rel=0.1)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.1)
    assert regular.std() / regular.mean() < 0.3
    assert arrival_offsets(10, None, 1.0, seed=0) is None


def test_the_progress_bar_names_its_level_and_the_time_left():
    """Rendered from the bar's own format: half of 40 requests in 30 s leaves 30 s."""
    from tqdm import tqdm

    bar = progress_bar(40, 16, enabled=True)
    try:
        meter = {**bar.format_dict, "n": 20, "elapsed": 30.0, "rate": None}
        line = tqdm.format_meter(**meter)
    finally:
        bar.close()
    assert line.startswith("C=16:  50%|")
    assert "20/40 req [00:30 elapsed, ETA 00:30]" in line
    assert progress_bar(40, 16, enabled=False) is None


def test_request_rate_paces_the_sends():
    warmup = RequestSpec(**{**spec(9).__dict__, "warmup": True})  # first connection, cold code
    offsets = arrival_offsets(5, 20.0, 1.0, seed=0)
    with serve_in_thread(FAST) as stub:
        records = one_side(
            stub, [warmup] + [spec(i) for i in range(5)], concurrency=5, request_rate=20.0, seed=0
        )
    sent = np.array([r.sent_monotonic for r in records[1:]])
    assert np.all(sent - sent[0] >= np.array(offsets) - 0.005)


def test_level_deadline_gives_every_spec_a_record():
    slow = StubConfig(ttft_s=0.05, itl_s=0.2, output_tokens=20)
    with serve_in_thread(slow) as stub:
        records = one_side(stub, [spec(i, max_tokens=20) for i in range(4)], level_timeout_s=0.5)
    assert [r.request_id for r in records] == ["r0", "r1", "r2", "r3"]
    assert all(r.error.startswith("timeout: level deadline") for r in records)
    assert records[0].ttft_s is not None and records[3].sent_monotonic is None


@pytest.mark.parametrize(
    ("jobs_of", "message"),
    [
        (lambda url: [SideJob(ServerTarget("a", url, "m"), [spec(0), spec(0)])], "request_id"),
        (lambda url: [SideJob(ServerTarget("a", "https://x", "m"), [spec(0)])], "plain http"),
        (lambda url: [SideJob(ServerTarget("a", url, "m"), [])] * 2, "once per level"),
    ],
)
def test_bad_jobs_are_refused_before_anything_is_sent(jobs_of, message):
    with pytest.raises(ValueError, match=message):
        run_level(jobs_of("http://127.0.0.1:9"), 1, timeout_s=1, progress=False)


def test_concurrency_must_be_positive():
    with pytest.raises(ValueError, match="concurrency"):
        run_level([], 0, timeout_s=1, progress=False)


def test_inline_isolation_gives_the_same_records():
    with serve_in_thread(FAST) as stub:
        inline = one_side(stub, [spec(i) for i in range(3)], isolation="inline")
        spawned = one_side(stub, [spec(i) for i in range(3)], side="b", isolation="process")
    assert [(r.text, r.token_ids, r.error) for r in inline] == [
        (r.text, r.token_ids, r.error) for r in spawned
    ]


@pytest.mark.parametrize("isolation", ["inline", "process"])
def test_records_that_cannot_be_kept_stop_the_level_with_the_error(isolation):
    """A full disk under on_record: the level stops sending and the error reaches the caller."""
    kept: list[RequestRecord] = []

    def keep(record: RequestRecord) -> None:
        if len(kept) == 2:
            raise OSError(28, "No space left on device")
        kept.append(record)

    with serve_in_thread(FAST) as stub:
        with pytest.raises(OSError, match="No space left"):
            one_side(stub, [spec(i) for i in range(12)], 1, on_record=keep, isolation=isolation)
        sent = len(stub.log)
    assert [r.request_id for r in kept] == ["r0", "r1"]
    assert sent < 12


# -- Ctrl-C ------------------------------------------------------------------------------------

_INTERRUPTED_RUN = textwrap.dedent(
    """
    import json, signal, sys
    from rig.load.engine import run_level
    from rig.records import RequestSpec, SamplingParams, ServerTarget, SideJob

    if __name__ == "__main__":
        # as in a terminal: a shell's background job (`make test &`) starts with SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        specs = [
            RequestSpec(f"r{i}", "p", 4, 0, i, "completions", "x", None, f"s{i}",
                        SamplingParams(max_tokens=100))
            for i in range(8)
        ]
        job = SideJob(ServerTarget("reference", sys.argv[1], "stub"), specs)
        emit = lambda record: print(json.dumps([record.request_id, record.error]), flush=True)
        try:
            run_level([job], 4, timeout_s=60, on_record=emit, progress=False,
                      isolation=sys.argv[2])
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
    """
)


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_ctrl_c_cancels_in_flight_requests_and_stops_the_workers(isolation):
    slow = StubConfig(ttft_s=0.05, itl_s=0.1, output_tokens=100)
    with serve_in_thread(slow) as stub:
        process = subprocess.Popen(
            [sys.executable, "-c", _INTERRUPTED_RUN, stub.url, isolation],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            deadline = time.time() + 60
            while stub.in_flight < 4 and time.time() < deadline:
                time.sleep(0.05)
            assert stub.in_flight == 4
            os.killpg(process.pid, signal.SIGINT)  # like Ctrl-C: the whole process group
            out, _ = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        deadline = time.time() + 5
        while stub.in_flight and time.time() < deadline:
            time.sleep(0.05)
        assert stub.in_flight == 0  # the workers closed their connections
    lines = out.splitlines()
    assert lines[-1] == "INTERRUPTED" and process.returncode == 0
    cancelled = [json.loads(line) for line in lines[:-1]]
    assert sorted(rid for rid, _ in cancelled) == ["r0", "r1", "r2", "r3"]
    assert all(error.startswith("cancelled:") for _, error in cancelled)
