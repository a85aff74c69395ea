"""The load phase without servers: how a level is sharded, and what it leaves on record."""

import pytest

import rig.run.load_phase
from rig.load.prefix_cache import PrefixCacheCounters
from rig.records import REQUESTS_FILE
from rig.run.load_phase import (
    failed_requests,
    level_jobs,
    prefix_cache_delta,
    run_load,
    run_one_level,
    server_targets,
)
from rig.run.state import FAULTS_FILE, PREFIX_CACHE_FILE
from rig.serve.hardware import Hardware
from rig.serve.servers import ServerError
from tests.run_fakes import FakeServer, open_journal, run_context

FOUR_GPUS = Hardware(gpu_count=4, cpu_ids=(0, 1), gpu_ids=("0", "1", "2", "3"))
WORKLOAD = {"prompts": [{"long_tokens": [100, 120, 140, 160, 180]}], "concurrency": [3]}


def test_a_level_is_sharded_over_replica_pairs_keeping_request_pairs_together(tmp_path):
    ctx = run_context(tmp_path, FOUR_GPUS, workload=WORKLOAD)
    assert ctx.plan.replicas == 2
    servers = {label: FakeServer(plan) for label, plan in ctx.plan.servers.items()}
    jobs = level_jobs(ctx, server_targets(servers), level=3, repeat=0)
    shares = {
        (job.target.side, job.target.replica): (
            [s.request_id[-4:] for s in job.specs],
            job.concurrency,
        )
        for job in jobs
    }
    assert shares == {
        (side, replica): (ids, concurrency)
        for side in ("reference", "candidate")
        for replica, ids, concurrency in (
            (0, ["0000", "0002", "0004"], 2),
            (1, ["0001", "0003"], 1),
        )
    }


def test_failed_requests_names_one_servers_failures_and_counts_the_rest(make_record):
    records = [make_record("candidate", f"q{i}", error="HTTP 500") for i in range(23)]
    records += [make_record("reference", "r0", error="HTTP 500"), make_record("candidate", "ok")]
    named = failed_requests(records, "candidate", 0)
    assert named.startswith("q0,q1,") and named.endswith("q19 (+3)")
    assert failed_requests(records, "reference", 0) == "r0"
    assert failed_requests(records, "candidate", 1) == ""


def test_prefix_cache_delta_has_no_call_count_unless_both_readings_have_one():
    before, after = PrefixCacheCounters(10, 2, 5), PrefixCacheCounters(30, 2, 9)
    delta = prefix_cache_delta("candidate", 4, 1, before, after)
    assert (delta.queries, delta.hits, delta.gdn_prefill_calls) == (20, 0, 4)
    assert prefix_cache_delta("c", 4, 1, PrefixCacheCounters(1, 0), after).gdn_prefill_calls is None


@pytest.fixture
def level_run(tmp_path, monkeypatch, make_record):
    """run_one_level against fake servers: every request answered, counters that advance."""
    ctx = run_context(tmp_path, workload={**WORKLOAD, "warmup_requests": 2})
    sent: list = []

    def fake_run_level(jobs, concurrency, *, timeout_s, on_record=None, **options):
        sent.append((concurrency, [(j.target.side, len(j.specs)) for j in jobs]))
        results = {}
        for job in jobs:
            records = [
                make_record(job.target.side, s.request_id, level=concurrency) for s in job.specs
            ]
            for record in records if on_record else ():
                on_record(record)
            results[job.target.side] = records
        return results

    readings = iter([PrefixCacheCounters(0, 0, 0)] * 2 + [PrefixCacheCounters(8, 1, 6)] * 2)
    monkeypatch.setattr(rig.run.load_phase, "run_level", fake_run_level)
    monkeypatch.setattr(
        rig.run.load_phase,
        "read_counters",
        lambda targets: {label: next(readings) for label in targets},
    )
    servers = {label: FakeServer(plan) for label, plan in ctx.plan.servers.items()}
    journal = open_journal(tmp_path)
    yield ctx, journal, servers, sent
    journal.sink.close()


def test_a_level_keeps_its_records_faults_and_prefix_cache_deltas(level_run):
    ctx, journal, servers, sent = level_run
    servers["reference"].log = "Traceback (most recent call last)\n"  # before the level
    servers["candidate"].logged_in_level = "Traceback (most recent call last)\n"
    run_load(ctx, journal, servers, [(3, 0)])
    assert sent[0] == (3, [("reference", 2), ("candidate", 2)])  # the warm-up at min(C)
    assert sent[1] == (3, [("reference", 5), ("candidate", 5)])
    state = journal.state
    assert len(state.records) == 10  # the warm-up's are not kept
    assert (ctx.run_dir / REQUESTS_FILE).read_text().count("\n") == 10
    assert [(f.server, f.kind) for f in state.faults] == [("candidate", "traceback")]
    assert [(d.server, d.queries, d.hits, d.gdn_prefill_calls) for d in state.prefix_cache] == [
        ("reference", 8, 1, 6),
        ("candidate", 8, 1, 6),
    ]
    assert (ctx.run_dir / PREFIX_CACHE_FILE).read_text().count("\n") == 2
    assert state.peak_rss_mb == {"reference": 1024.0, "candidate": 1024.0}


def test_a_server_that_died_in_a_level_stops_the_run_with_its_fault_on_disk(level_run):
    ctx, journal, servers, _ = level_run
    servers["candidate"].exit_code = -9
    with pytest.raises(ServerError, match="candidate server died during level C=3"):
        run_one_level(ctx, journal, servers, server_targets(servers), 3, 0)
    assert "server_died" in (ctx.run_dir / FAULTS_FILE).read_text()
    assert len(journal.state.records) == 10  # what finished is kept
