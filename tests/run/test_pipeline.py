"""The run's command line and its setting up, without servers (tests/e2e/ drives whole runs;
each stage has its own tests/run/test_<stage>.py)."""

import pytest

from rig.load.replay_records import ForcedSequence
from rig.records import REQUESTS_FILE, ExitCode
from rig.run.cache import GoldenCache
from rig.run.golden import lookup_golden, store_golden
from rig.run.pipeline import Runner, _check_resumable, main
from rig.run.state import RunState
from rig.scenario.config import ScenarioError
from rig.verdict.gates import SideKernel
from tests.run_fakes import open_journal, run_context, scenario


def test_resume_only_continues_the_same_scenario(tmp_path):
    with pytest.raises(ScenarioError, match="no interrupted run"):
        _check_resumable(tmp_path, scenario())
    (tmp_path / "scenario.resolved.json").write_text(scenario().model_dump_json())
    _check_resumable(tmp_path, scenario())
    with pytest.raises(ScenarioError, match=r"differs.*'candidate'"):
        _check_resumable(tmp_path, scenario(candidate={"kernel": "ns3"}))


@pytest.fixture
def filled_cache(tmp_path, make_record):
    """A golden cache holding the reference side of the run `run_context` describes."""
    cache = GoldenCache(tmp_path / "golden")
    (tmp_path / "first").mkdir()
    ctx = run_context(tmp_path / "first", candidate={"kernel": "ns4"})
    state = RunState(sequences=[ForcedSequence("p0", (1,), (2,))], timings={"wall_s": 1.0})
    state.records.append(make_record("reference", "c1-r0-0000"))
    journal = open_journal(tmp_path / "first", state)
    lookup = lookup_golden(cache, ctx.scenario, ctx.plan, ctx.model_path, ctx.prompts)
    kernels = {"reference": SideKernel("reference", "vllm-cpu-native", 1)}
    store_golden(cache, lookup, "first", journal, ctx.plan, lambda: kernels)
    journal.sink.close()
    return cache, ctx


def test_prepare_takes_the_reference_from_the_cache_and_starts_only_the_candidate(
    tmp_path, filled_cache
):
    cache, first = filled_cache
    run_dir = tmp_path / "second"
    run_dir.mkdir()
    runner = Runner.prepare(
        first.scenario, "second", run_dir, first.plan, "/m", first.prompts, cache
    )
    runner.journal.sink.close()
    assert runner.golden.entry.source_run == "first"
    assert runner.ctx.plan.phases == (("candidate",),)
    assert [r.side for r in runner.state.records] == ["reference"]
    assert (run_dir / REQUESTS_FILE).read_text().count("\n") == 1


def test_prepare_for_resume_keeps_the_interrupted_runs_own_reference(
    tmp_path, filled_cache, make_record
):
    cache, first = filled_cache
    run_dir = tmp_path / "interrupted"
    run_dir.mkdir()
    (run_dir / REQUESTS_FILE).write_text(
        make_record("reference", "c1-r0-0000").to_json() + "\n"  # the candidate never answered
    )
    runner = Runner.prepare(
        first.scenario, "i", run_dir, first.plan, "/m", first.prompts, cache, resume=True
    )
    runner.journal.sink.close()
    assert runner.golden.entry is None and runner.cache is None
    assert runner.done_levels == set() and runner.state.records == []
    assert runner.ctx.plan.phases == first.plan.phases


def test_bad_options_are_one_error_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: t\nresults_dir: {tmp_path}\n"
        "workload: {prompts: [{long_tokens: [100]}], concurrency: [1]}\n"
    )
    assert main([str(path), "--assume-gpus", "2"]) == ExitCode.ERROR
    assert capsys.readouterr().err == (
        "rig: error: --assume-gpus plans for another node: use it with --plan\n"
    )
    assert main([str(path), "--resume"]) == ExitCode.ERROR
    assert "--resume needs --run-id" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [path]  # nothing written
