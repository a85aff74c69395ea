"""The run's command line and its setting up, without servers (tests/e2e/ drives whole runs;
each stage has its own tests/run/test_<stage>.py)."""

from types import SimpleNamespace

import pytest

import rig.serve.installs as installs_module
from rig import PROJECT_ROOT
from rig.records import REQUESTS_FILE, ExitCode, ForcedSequence
from rig.run.cache import GoldenCache
from rig.run.golden import lookup_golden, store_golden
from rig.run.pipeline import Runner, _check_resumable, main
from rig.run.state import RunState
from rig.scenario.config import ScenarioError
from rig.serve.installs import InstallFacts
from rig.verdict.evidence import SideKernel
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


@pytest.fixture
def own_vllm(monkeypatch):
    """The rig's own install as its probe would find it, without probing."""
    found = InstallFacts(python="/venv/bin/python", vllm="0.32.0+cpu", plugin="installed")
    monkeypatch.setattr(installs_module, "own_facts", lambda: found)


LOWCONC = str(PROJECT_ROOT / "scenarios" / "lowconc.yaml")
PLAN_397B = [LOWCONC, "--set", "model=Qwen3.5-397B", "--plan", "--assume-gpus", "8"]


def test_plan_sizes_the_preset_to_the_assumed_gpus(own_vllm, capsys):
    assert main([*PLAN_397B, "--assume-gpu-gib", "140"]) == ExitCode.PASS
    out = capsys.readouterr().out
    assert "tensor parallel: TP4 per server (sized:" in out
    assert "placement: simultaneous (8 GPUs make 2 groups of TP4, one per server" in out
    assert main([*PLAN_397B, "--assume-gpu-gib", "80"]) == ExitCode.PASS
    out = capsys.readouterr().out
    assert "TP8 per server" in out and "phases: [reference] then [candidate]" in out


def test_plan_refuses_what_fits_no_size_in_one_line(own_vllm, capsys):
    assert main([*PLAN_397B, "--assume-gpu-gib", "24"]) == ExitCode.ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("rig: error: Qwen/Qwen3.5-397B-A17B-FP8 (preset ")
    assert "fit no tensor-parallel size on 8 GPU(s) of 24 GiB" in captured.err


def test_assumed_gpu_memory_needs_assumed_gpus(capsys):
    assert main([LOWCONC, "--plan", "--assume-gpu-gib", "80"]) == ExitCode.ERROR
    assert capsys.readouterr().err == (
        "rig: error: --assume-gpu-gib is each assumed GPU's memory: use it with --assume-gpus\n"
    )
    assert main([*PLAN_397B, "--assume-gpu-gib", "0"]) == ExitCode.ERROR
    assert "--assume-gpu-gib must be more than 0" in capsys.readouterr().err


def test_profile_flag_adds_the_profilers_flag_to_both_sides_plan(own_vllm, capsys):
    assert main([*PLAN_397B, "--assume-gpu-gib", "140", "--profile"]) == ExitCode.PASS
    assert capsys.readouterr().out.count("--profiler-config") == 2
    assert main([*PLAN_397B, "--assume-gpu-gib", "140"]) == ExitCode.PASS
    assert "--profiler-config" not in capsys.readouterr().out


class _PhasesRaising:
    """A runner whose phases raise `error`: what _run_phases makes of each way they stop."""

    def __init__(self, error: BaseException, run_dir) -> None:
        self.error, self.closed = error, False
        self.ctx = SimpleNamespace(run_dir=run_dir)
        self.journal = SimpleNamespace(sink=SimpleNamespace(close=self._close))

    def _close(self) -> None:
        self.closed = True

    def run_phases(self) -> None:
        raise self.error


def test_the_phases_stopping_becomes_the_reports_error_and_the_sink_is_closed(tmp_path):
    from rig.run.pipeline import INTERRUPTED, RIG_ERROR_FILE, _run_phases
    from rig.serve.servers import ServerError

    runner = _PhasesRaising(ServerError("candidate server died"), tmp_path)
    assert _run_phases(runner) == "candidate server died" and runner.closed
    assert _run_phases(_PhasesRaising(KeyboardInterrupt(), tmp_path)) == INTERRUPTED
    bug = _run_phases(_PhasesRaising(ZeroDivisionError("x"), tmp_path))
    assert bug.startswith("the rig failed (ZeroDivisionError: x)")
    assert "ZeroDivisionError" in (tmp_path / RIG_ERROR_FILE).read_text()


def test_unwritable_results_say_where_the_records_are_and_exit_without_a_report(tmp_path, capsys):
    from rig.run.pipeline import _ResultsUnwritable, _run_phases

    runner = _PhasesRaising(OSError(28, "No space left on device"), tmp_path)
    with pytest.raises(_ResultsUnwritable):
        _run_phases(runner)
    assert runner.closed
    err = capsys.readouterr().err
    assert "writing the results failed" in err and str(tmp_path / REQUESTS_FILE) in err
