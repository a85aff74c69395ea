"""The reference side into and out of the golden cache, without servers."""

from dataclasses import replace

from rig.records import REQUESTS_FILE, ForcedLogprobs, ForcedSequence
from rig.run.cache import GoldenCache
from rig.run.golden import cost_comparison, lookup_golden, store_golden, take_golden
from rig.run.state import RunState
from rig.verdict.evidence import SideKernel
from tests.run_fakes import open_journal, run_context

KERNELS = {"reference": SideKernel("reference", "vllm-cpu-native", 4)}


def test_cost_comparison_puts_both_runs_side_by_side():
    first = {"wall_s": 100.0, "reference_server_s": 90.0, "candidate_server_s": 90.0}
    now = {"wall_s": 50.0, "candidate_server_s": 45.0}
    line = cost_comparison(first, now)
    assert "wall 50.0 s vs 100.0 s" in line and "(0.50x)" in line
    assert "server time 45.0 s vs 180.0 s (0.25x)" in line


def finished_reference(make_record, **fields) -> RunState:
    state = RunState(sequences=[ForcedSequence("p0", (1, 2), (3,))], timings={"wall_s": 9.0})
    state.records = [make_record("reference", "q0", **fields), make_record("candidate", "q0")]
    state.forced["reference"] = {0: ForcedLogprobs((None, -0.5, -0.1))}
    return state


def test_clean_reference_results_come_back_for_the_next_candidate(tmp_path, make_record, capsys):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir(), second_dir.mkdir()
    cache = GoldenCache(tmp_path / "golden")
    ctx = run_context(first_dir, candidate={"kernel": "ns4"})
    lookup = lookup_golden(cache, *lookup_args(ctx))
    assert lookup.entry is None
    journal = open_journal(first_dir, finished_reference(make_record))
    store_golden(cache, lookup, "first", journal, ctx.plan, lambda: KERNELS)
    journal.sink.close()
    assert "stored in the golden cache" in capsys.readouterr().out

    again = lookup_golden(cache, *lookup_args(ctx))
    assert again.key == lookup.key and again.entry.source_run == "first"
    journal = open_journal(second_dir)
    plan = take_golden(journal, again.entry, ctx.plan)
    journal.sink.close()
    assert plan.phases == (("candidate",),)
    assert [r.side for r in journal.state.records] == ["reference"]
    assert (second_dir / REQUESTS_FILE).read_text().count("\n") == 1
    assert journal.state.forced["reference"][0].logprobs == (None, -0.5, -0.1)
    assert journal.state.sequences == [ForcedSequence("p0", (1, 2), (3,))]


def test_only_a_clean_reference_the_rig_ran_itself_is_stored_and_reused(tmp_path, make_record):
    cache = GoldenCache(tmp_path / "golden")
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"})
    lookup = lookup_golden(cache, *lookup_args(ctx))
    failed = open_journal(tmp_path, finished_reference(make_record, error="HTTP 500"))
    store_golden(cache, lookup, "r", failed, ctx.plan, lambda: KERNELS)
    failed.sink.close()
    clean = open_journal(tmp_path, finished_reference(make_record))
    store_golden(cache, lookup, "r", clean, ctx.plan, dict)  # no proof of the reference's kernel
    assert not (tmp_path / "golden").exists()

    def unread() -> dict:
        raise AssertionError("the proofs are read only when the entry would be stored")

    store_golden(None, lookup, "r", clean, ctx.plan, unread)
    store_golden(cache, lookup, "r", clean, ctx.plan, lambda: KERNELS)
    clean.sink.close()
    assert lookup_golden(cache, *lookup_args(ctx)).entry is not None
    assert lookup_golden(None, *lookup_args(ctx)).entry is None
    # the A/A control needs the reference server; an attached one is not what the key describes
    control = run_context(tmp_path, candidate={"kernel": "ns4"}, control={"aa": True})
    reference = replace(ctx.plan.servers["reference"], url="http://127.0.0.1:9")
    attached = replace(
        ctx, plan=replace(ctx.plan, servers={**ctx.plan.servers, "reference": reference})
    )
    for other in (control, attached):
        found = lookup_golden(cache, *lookup_args(other))
        assert found.key == lookup.key and found.entry is None


def lookup_args(ctx) -> tuple:
    return ctx.scenario, ctx.plan, ctx.model_path, ctx.prompts


def test_a_profiled_run_starts_its_reference_and_keys_as_an_unprofiled_one(tmp_path, make_record):
    """The profile needs the reference server; its flag names this run's folder, not the texts."""
    cache = GoldenCache(tmp_path / "golden")
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"})
    lookup = lookup_golden(cache, *lookup_args(ctx))
    clean = open_journal(tmp_path, finished_reference(make_record))
    store_golden(cache, lookup, "r", clean, ctx.plan, lambda: KERNELS)
    clean.sink.close()
    profiled = run_context(tmp_path, candidate={"kernel": "ns4"}, profile={"requests": 2})
    assert "--profiler-config" in profiled.plan.servers["reference"].argv
    found = lookup_golden(cache, *lookup_args(profiled))
    assert found.key == lookup.key and found.entry is None
    assert lookup_golden(cache, *lookup_args(ctx)).entry is not None
