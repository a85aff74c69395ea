"""The load phase without servers: how a level is sharded, and what it leaves on record."""

import pytest

import rig.run.load_phase
import rig.run.pair_load
from rig.load.server_metrics import MetricsUnreadable, PhaseTime, ServerCounters
from rig.records import REQUESTS_FILE
from rig.run.load_phase import (
    failed_requests,
    level_jobs,
    run_block,
    run_load,
    server_delta,
    server_targets,
    timing_design,
)
from rig.run.state import FAULTS_FILE, SERVER_COUNTERS_FILE
from rig.serve.hardware import Hardware
from rig.serve.servers import ServerError
from rig.verdict.speed import LevelResolution
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


def test_server_delta_has_no_call_count_unless_both_readings_have_one():
    before, after = ServerCounters(10, 2, 5), ServerCounters(30, 2, 9)
    delta = server_delta("candidate", 4, 1, before, after)
    assert (delta.queries, delta.hits, delta.gdn_prefill_calls) == (20, 0, 4)
    assert server_delta("c", 4, 1, ServerCounters(1, 0), after).gdn_prefill_calls is None


def test_server_delta_takes_the_servers_own_timings_and_compilations():
    before = ServerCounters(0, 0, 10, 10, 0.5, 7, PhaseTime(2.0, 4), PhaseTime(1.0, 4), None)
    after = ServerCounters(0, 0, 16, 16, 0.8, 9, PhaseTime(2.6, 6), PhaseTime(1.4, 6), None)
    delta = server_delta("reference", 1, 0, before, after)
    assert (delta.gdn_timed_calls, delta.jit_compiles, delta.compiled) == (6, 2, True)
    assert delta.gdn_seconds == pytest.approx(0.3)
    assert (delta.prefill_seconds, delta.prefill_requests) == (pytest.approx(0.6), 2)
    assert (delta.queue_seconds, delta.queue_requests) == (None, None)


class FakeMetrics:
    """Counters that advance by one block's worth at every reading after the first; a
    server listed in `compile_on` shows a JIT compilation in the readings given."""

    def __init__(self, compile_on: dict[str, set[int]] | None = None):
        self.readings = 0
        self.compile_on = compile_on or {}
        self.compiles: dict[str, int] = {}

    def __call__(self, targets):
        self.readings += 1
        answers = {}
        for label in targets:
            if self.readings in self.compile_on.get(label, set()):
                self.compiles[label] = self.compiles.get(label, 0) + 1
            step = self.readings
            answers[label] = ServerCounters(8 * step, 1, 6 * step, 6 * step, 0.1 * step,
                                            self.compiles.get(label, 0))  # fmt: skip
        return answers


@pytest.fixture
def level_run(tmp_path, monkeypatch, make_record):
    """run_load against fake servers: every request answered, counters that advance."""

    def start(workload=None, metrics=None, **overrides):
        ctx = run_context(
            tmp_path, workload={**WORKLOAD, "warmup_requests": 2, **(workload or {})}, **overrides
        )
        sent: list = []

        def fake_run_level(jobs, concurrency, *, timeout_s, on_record=None, **options):
            sent.append(
                (concurrency, [(j.target.side, len(j.specs)) for j in jobs], on_record is None)
            )
            results = {}
            for job in jobs:
                records = [
                    make_record(job.target.side, s.request_id, level=concurrency, repeat=s.repeat,
                                index=s.index, ttft_s=0.01, e2el_s=0.02, output_tokens=2)
                    for s in job.specs
                ]  # fmt: skip
                for record in records if on_record else ():
                    on_record(record)
                results[job.target.side] = records
            return results

        monkeypatch.setattr(rig.run.pair_load, "run_level", fake_run_level)
        monkeypatch.setattr(rig.run.load_phase, "read_counters", metrics or FakeMetrics())
        servers = {label: FakeServer(plan) for label, plan in ctx.plan.servers.items()}
        journal = open_journal(tmp_path)
        opened.append(journal)
        return ctx, journal, servers, sent

    opened: list = []
    yield start
    for journal in opened:
        journal.sink.close()


def test_a_level_keeps_its_records_faults_and_server_deltas(level_run):
    ctx, journal, servers, sent = level_run()
    servers["reference"].log = "Traceback (most recent call last)\n"  # before the level
    servers["candidate"].logged_in_level = "Traceback (most recent call last)\n"
    run_load(ctx, journal, servers, [(3, 0)])
    assert sent[0] == (3, [("reference", 3), ("candidate", 3)], True)  # warm-up: max(2, C)
    assert sent[1] == (3, [("reference", 5), ("candidate", 5)], False)
    state = journal.state
    assert len(state.records) == 10  # the warm-up's are not kept
    assert (ctx.run_dir / REQUESTS_FILE).read_text().count("\n") == 10
    assert [(f.server, f.kind) for f in state.faults] == [("candidate", "traceback")]
    assert [(d.server, d.queries, d.gdn_prefill_calls) for d in state.server_deltas] == [
        ("reference", 8, 6),
        ("candidate", 8, 6),
    ]
    assert (ctx.run_dir / SERVER_COUNTERS_FILE).read_text().count("\n") == 2
    assert state.peak_rss_mb == {"reference": 1024.0, "candidate": 1024.0}


def test_the_warm_up_runs_again_while_a_server_compiles(level_run):
    """Readings 1-2 frame the first warm-up pass, 3-4 the second: the candidate compiles in
    the first, nothing in the second, so there are two passes and then the block."""
    ctx, journal, servers, sent = level_run(metrics=FakeMetrics({"candidate": {2}}))
    run_load(ctx, journal, servers, [(3, 0)])
    assert [untimed for _, _, untimed in sent] == [True, True, False]


def test_sides_that_alternate_are_timed_one_at_a_time_in_abba_order(level_run):
    ctx, journal, servers, sent = level_run(workload={"schedule": "alternate", "repeats": 3})
    assert ctx.plan.load_schedule(ctx.scenario.workload).kind == "alternate"
    run_load(ctx, journal, servers, [(3, 0), (3, 1), (3, 2)])
    timed = [sides[0][0] for _, sides, untimed in sent if not untimed]
    assert timed == ["reference", "candidate", "candidate", "reference", "reference", "candidate"]
    assert all(len(sides) == 1 for _, sides, untimed in sent if not untimed)
    blocks = [(d.server, d.repeat) for d in journal.state.server_deltas]
    assert blocks == [("reference", 0), ("candidate", 0), ("candidate", 1), ("reference", 1),
                      ("reference", 2), ("candidate", 2)]  # fmt: skip


def test_a_block_that_compiled_is_run_again_under_a_new_repeat(level_run):
    """Readings: 1-2 warm-up, 3-4 block 0 (the reference compiles at 4), 5-6 block 1."""
    metrics = FakeMetrics({"reference": {4}})
    ctx, journal, servers, _ = level_run(metrics=metrics)
    run_load(ctx, journal, servers, [(3, 0)])
    assert sorted({r.repeat for r in journal.state.records}) == [0, 1]
    timing = timing_design(ctx, journal.state.server_deltas, journal.state.faults)
    assert timing.excluded == {(3, 0)}


def test_blocks_are_added_until_the_level_is_resolved(level_run, monkeypatch):
    """With a resolution asked for, the level gets blocks until level_resolution says it is
    resolved (here: after 5 block pairs)."""

    def resolution(reference, candidate, level, timing, confidence):
        blocks = len({r.repeat for r in reference})
        return LevelResolution(level, blocks, 5)

    monkeypatch.setattr(rig.run.load_phase, "level_resolution", resolution)
    workload = {"repeats": 4, "speed_resolution_pct": 3}
    ctx, journal, servers, _ = level_run(workload=workload)
    run_load(ctx, journal, servers, [(3, r) for r in range(4)])
    assert sorted({r.repeat for r in journal.state.records}) == [0, 1, 2, 3, 4]


def test_the_budget_ends_the_added_blocks(level_run, monkeypatch):
    monkeypatch.setattr(
        rig.run.load_phase,
        "level_resolution",
        lambda reference, *args: LevelResolution(3, len({r.repeat for r in reference}), 99),
    )
    workload = {"repeats": 4, "speed_resolution_pct": 3, "speed_budget_s": 1e-6}
    ctx, journal, servers, _ = level_run(workload=workload)
    run_load(ctx, journal, servers, [(3, r) for r in range(4)])
    assert sorted({r.repeat for r in journal.state.records}) == [0, 1, 2, 3]


def test_a_server_that_died_in_a_level_stops_the_run_with_its_fault_on_disk(level_run):
    ctx, journal, servers, _ = level_run()
    servers["candidate"].exit_code = -9
    with pytest.raises(ServerError, match="candidate server died during level C=3"):
        run_block(ctx, journal, servers, 3, 0)
    assert "server_died" in (ctx.run_dir / FAULTS_FILE).read_text()
    assert len(journal.state.records) == 10  # what finished is kept


def test_a_server_whose_metrics_stop_answering_because_it_died_is_named(level_run, monkeypatch):
    """The candidate dies after its block's requests: its /metrics no longer answers. The run
    stops on the dead server, named, with its fault on disk: not on a connection error."""
    metrics = FakeMetrics()
    ctx, journal, servers, _ = level_run(metrics=metrics)

    def unreadable(targets):
        if metrics.readings >= 1:
            servers["candidate"].exit_code = -9
            raise MetricsUnreadable("http://127.0.0.1:1/metrics: ClientConnectorError")
        return metrics(targets)

    monkeypatch.setattr(rig.run.load_phase, "read_counters", unreadable)
    monkeypatch.setattr(rig.run.load_phase, "DEATH_WAIT_S", 0.2)
    with pytest.raises(ServerError, match="candidate server died during level C=3"):
        run_block(ctx, journal, servers, 3, 0)
    assert "server_died" in (ctx.run_dir / FAULTS_FILE).read_text()


def test_a_live_server_whose_metrics_cannot_be_parsed_is_said_so(level_run, monkeypatch):
    """Every server runs but one's /metrics lacks the prefix-cache counters: the run stops
    saying /metrics could not be read, not that a server stopped answering."""
    ctx, journal, servers, _ = level_run(metrics=FakeMetrics())

    def unparseable(targets):
        raise MetricsUnreadable("/metrics has no vllm:prefix_cache_queries")

    monkeypatch.setattr(rig.run.load_phase, "read_counters", unparseable)
    monkeypatch.setattr(rig.run.load_phase, "DEATH_WAIT_S", 0.2)
    with pytest.raises(ServerError, match=r"/metrics could not be read during level C=3: /metrics"):
        run_block(ctx, journal, servers, 3, 0)
