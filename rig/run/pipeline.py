"""`python -m rig.run SCENARIO [--set key=value ...]`: the whole pipeline, and its exit code.

scenario -> servers -> load (paired, level by level) -> drift (teacher-forced, untimed)
-> compare -> metrics -> report. Exit 0 only when every gate holds; 1 when the candidate is
NOT equivalent or a gate on it fails; 2 when the run could not be made (bad input, a server
that would not start); 3 when the comparison is INVALID (no kernel proof, the wrong reference
backend, prefix-cache hits).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import NoReturn

from rig.interrupts import InterruptsDeferred, hold_at, interrupts_raise
from rig.load.replay_records import REPLAY_FILE, write_replay
from rig.records import REQUESTS_FILE, ExitCode
from rig.report.files import remove_report, write_report
from rig.run.accuracy import load_and_questions
from rig.run.cache import GoldenCache
from rig.run.conclude import build_outcome, model_decoder, side_kernels
from rig.run.golden import GoldenLookup, cost_comparison, lookup_golden, store_golden, take_golden
from rig.run.phases import PhaseSteps, read_proofs, run_phases
from rig.run.profile_phase import run_profiled_block
from rig.run.replay import run_aa, run_drift
from rig.run.self_check import run_self_check
from rig.run.state import (
    RecordSink,
    RunContext,
    RunJournal,
    RunState,
    resume_from_disk,
)
from rig.scenario.accuracy_tasks import load_questions
from rig.scenario.config import Scenario, ScenarioError
from rig.scenario.loader import load_scenario
from rig.scenario.profile_config import ProfileConfig
from rig.scenario.prompts import Prompt, PromptFileError
from rig.scenario.workload import WorkloadError, resolve_conversations, resolve_prompts
from rig.serve.hardware import Hardware
from rig.serve.plan import LaunchPlan
from rig.serve.plan_text import render_plan
from rig.serve.preflight import PreflightError, preflight
from rig.serve.ray_pairs import RayPairs
from rig.serve.servers import ServerError, ServerSet
from rig.verdict.evidence import SideKernel
from rig.verdict.outcome import RunOutcome

RIG_ERROR_FILE = "rig-error.txt"  # the traceback of a failure of the rig's own
REPORT_NOTICE = "rig: interrupted while the report is written: finishing it (again to stop at once)"
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM); servers stopped, partial results kept"
REPORT_INTERRUPTED = (
    "interrupted while the report was written; every measurement had finished, the report is "
    "whole and its word says the run did not complete"
)


@dataclass
class Runner:
    """The stages of one run, bound to its inputs: `prepare` does the I/O of setting it up
    (resume, golden cache), the rest hands each stage what it needs."""

    ctx: RunContext
    journal: RunJournal
    done_levels: frozenset[tuple[int, int]]
    cache: GoldenCache | None
    golden: GoldenLookup

    @classmethod
    def prepare(
        cls,
        scenario: Scenario,
        run_id: str,
        run_dir: Path,
        plan: LaunchPlan,
        model_path: str,
        prompts: list[Prompt],
        cache: GoldenCache | None,
        resume: bool = False,
    ) -> Runner:
        """Resume an interrupted run's finished levels, open the record sink, and take the
        reference from the golden cache when it holds it."""
        done_levels: frozenset[tuple[int, int]] = frozenset()
        state = RunState()
        block = scenario.accuracy
        questions = tuple(load_questions(block)) if block is not None else ()
        if resume:
            expected = scenario.workload.requests_per_level or len(prompts)
            resumed = resume_from_disk(run_dir, expected, len(questions))
            done_levels, state = resumed.done_levels, resumed.state
            cache = None  # the interrupted run's own reference results are what count
        journal = RunJournal(run_dir, state, RecordSink.open(run_dir / REQUESTS_FILE))
        golden = lookup_golden(cache, scenario, plan, model_path, prompts)
        if golden.entry is not None:
            plan = take_golden(journal, golden.entry, plan)
        conversations = tuple(resolve_conversations(scenario.workload))
        ctx = RunContext(
            scenario, run_id, run_dir, plan, model_path, prompts, conversations, questions
        )
        return cls(ctx, journal, done_levels, cache, golden)

    @property
    def state(self) -> RunState:
        return self.journal.state

    def run_phases(self) -> None:
        ctx, state = self.ctx, self.state
        on_ray = ctx.scenario.placement.backend == "ray"
        steps = PhaseSteps(
            start=partial(RayPairs, ctx.plan.placement) if on_ray else ServerSet,
            load=partial(load_and_questions, ctx, self.journal),
            drift=partial(run_drift, ctx, state),
            aa=partial(run_aa, ctx, state),
            self_check=partial(run_self_check, ctx, state),
            proofs=partial(read_proofs, state),
            profile=partial(run_profiled_block, ctx),
        )
        run_phases(ctx, self.done_levels, state, steps)

    @cached_property
    def kernels(self) -> dict[str, SideKernel]:
        """Which kernel each side ran; read once, after the phases."""
        return side_kernels(self.ctx.plan, self.state.proofs, self.golden.entry)

    def store_golden(self) -> None:
        ctx = self.ctx
        store_golden(
            self.cache, self.golden, ctx.run_id, self.journal, ctx.plan, lambda: self.kernels
        )

    def outcome(self, error: str | None) -> RunOutcome:
        return build_outcome(
            self.ctx, self.state, self.kernels, error, self.golden.entry, self.golden.key
        )


def _check_resumable(run_dir: Path, scenario: Scenario) -> None:
    """Resume only the same scenario: mixing results of two scenarios would mean nothing."""
    stored = run_dir / "scenario.resolved.json"
    if not stored.exists():
        raise ScenarioError(f"--resume: {run_dir} holds no interrupted run (no {stored.name})")
    before = json.loads(stored.read_text())
    now = json.loads(scenario.model_dump_json())
    if before != now:
        changed = sorted(k for k in now if before.get(k) != now.get(k))
        raise ScenarioError(f"--resume: the scenario differs from the interrupted run's: {changed}")


def _stop_reporting(run_dir: Path) -> NoReturn:
    """A second interrupt while the report is written: a report cut short is no report."""
    remove_report(run_dir)
    sys.stdout.flush()
    print(
        "rig: error: interrupted twice while the report was written: no report kept; every "
        f"record is in {run_dir / 'requests.jsonl'} (--resume writes the report)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(ExitCode.ERROR)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rig.run", description=__doc__)
    parser.add_argument("scenario", type=Path, help="scenario YAML file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a scenario key (dotted path), e.g. --set workload.max_tokens=32",
    )
    parser.add_argument("--run-id", help="name of the results folder (default: time + scenario)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run named by --run-id: finished levels are kept",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="run the reference server even when the golden cache holds its results",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="run the preflight checks, print the resolved plan and exit without starting anything",
    )
    parser.add_argument(
        "--assume-gpus",
        type=int,
        metavar="N",
        help="with --plan: plan for a node with N GPUs (this machine's GPUs are not looked at)",
    )
    parser.add_argument(
        "--assume-gpu-gib",
        type=float,
        metavar="G",
        help="with --assume-gpus: each assumed GPU's memory in GiB, to size tensor parallelism "
        "and check the weights against (e.g. 140 for an H200, 80 for an H100)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more block, untimed, with vLLM's torch profiler on both sides (the "
        "scenario's profile: key, else its first level): per-kernel tables in the report",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".cache/golden"),
        help="golden cache of reference results (default: .cache/golden)",
    )
    return parser.parse_args(argv)


def _hardware(args: argparse.Namespace) -> Hardware:
    """This machine's, or with --assume-gpus the node a plan is for."""
    if args.assume_gpus is not None and not args.plan:
        raise ScenarioError("--assume-gpus plans for another node: use it with --plan")
    if args.assume_gpus is not None and args.assume_gpus < 0:
        raise ScenarioError("--assume-gpus must be 0 or more")
    if args.assume_gpu_gib is not None and args.assume_gpus is None:
        raise ScenarioError(
            "--assume-gpu-gib is each assumed GPU's memory: use it with --assume-gpus"
        )
    if args.assume_gpu_gib is not None and args.assume_gpu_gib <= 0:
        raise ScenarioError("--assume-gpu-gib must be more than 0")
    if args.assume_gpus is not None:
        return Hardware.assume_gpus(args.assume_gpus, args.assume_gpu_gib)
    return Hardware.detect()


def _run_dir(args: argparse.Namespace, scenario: Scenario) -> tuple[str, Path]:
    run_id = args.run_id or scenario.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{scenario.name}"
    run_dir = scenario.results_dir / run_id
    if args.resume:
        if not (args.run_id or scenario.run_id):
            raise ScenarioError("--resume needs --run-id naming the interrupted run")
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise ScenarioError(
            f"results folder {run_dir} already exists and is not empty (--resume continues it)"
        )
    return run_id, run_dir


def _prepare(args: argparse.Namespace) -> Runner | None:
    """Preflight, then the runner of the run with the servers' sizes in its scenario; None
    after printing the plan (--plan)."""
    scenario = load_scenario(args.scenario, args.overrides)
    if args.profile and scenario.profile is None:  # the scenario's own profile: wins
        scenario = scenario.model_copy(update={"profile": ProfileConfig()})
    run_id, run_dir = _run_dir(args, scenario)
    hardware = _hardware(args)
    prompts = resolve_prompts(scenario.workload)
    hold_at("preflight")
    checked = preflight(scenario, run_dir, hardware, build_model=not args.plan)
    if args.plan:
        print(render_plan(checked, len(prompts)))
        return None
    scenario = checked.scenario  # as sized: what the run records and --resume compares
    if args.resume:
        _check_resumable(run_dir, scenario)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        cache = None if args.no_cache else GoldenCache(args.cache_dir)
        runner = Runner.prepare(
            scenario,
            run_id,
            run_dir,
            checked.plan,
            checked.model.path,
            prompts,
            cache,
            resume=args.resume,
        )
        (run_dir / "scenario.resolved.json").write_text(scenario.model_dump_json(indent=2))
        servers = runner.ctx.manifest.to_json()["servers"]
        (run_dir / "servers.json").write_text(json.dumps(servers, indent=2))
    except OSError as exc:
        raise ScenarioError(f"results folder {run_dir}: {exc.strerror or exc}") from None
    return runner


def main(argv: list[str] | None = None) -> int:
    """The run's stages: set up (nothing starts on bad input), the phases, the report."""
    args = parse_args(argv)
    interrupts_raise()
    wall_start = time.monotonic()
    runner = _set_up(args)
    if not isinstance(runner, Runner):
        return runner
    try:
        error = _run_phases(runner)
    except _ResultsUnwritable:  # no report can follow
        return ExitCode.ERROR
    return _report(runner, error, time.monotonic() - wall_start)


def _set_up(args: argparse.Namespace) -> Runner | ExitCode:
    """The runner, or the exit code of a run that stops before any server starts."""
    try:
        runner = _prepare(args)
        if runner is None:
            return ExitCode.PASS
    except (ScenarioError, PromptFileError, WorkloadError, PreflightError, ServerError) as exc:
        print(f"rig: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except OSError as exc:  # a file the setup reads
        print(f"rig: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        print("rig: error: interrupted before any server started; nothing ran", file=sys.stderr)
        return ExitCode.ERROR
    scenario, run_id, run_dir = runner.ctx.scenario, runner.ctx.run_id, runner.ctx.run_dir
    mode = runner.ctx.plan.placement.describe()
    if runner.golden.entry is not None:
        mode = f"reference from the golden cache (run {runner.golden.entry.source_run})"
    print(
        f"rig: run {run_id}: {len(runner.ctx.prompts)} prompts, levels "
        f"{scenario.workload.concurrency}, sides {mode}; results in {run_dir}",
        flush=True,
    )
    return runner


class _ResultsUnwritable(Exception):
    """The results folder stopped taking writes during the phases (said where it happened)."""


def _run_phases(runner: Runner) -> str | None:
    """The phases; what stopped them (None when nothing did), as the report's error."""
    run_dir = runner.ctx.run_dir
    try:
        runner.run_phases()
    except ServerError as exc:
        return str(exc)
    except KeyboardInterrupt:
        return INTERRUPTED
    except OSError as exc:
        print(
            f"rig: error: writing the results failed ({exc}); servers stopped, the records "
            f"written so far are whole lines in {run_dir / 'requests.jsonl'}",
            file=sys.stderr,
        )
        raise _ResultsUnwritable from exc
    except Exception as exc:  # the rig's own bug: its run could not be made, no server's fault
        (run_dir / RIG_ERROR_FILE).write_text(traceback.format_exc())
        return (
            f"the rig failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            f"); servers stopped, traceback in {run_dir / RIG_ERROR_FILE}"
        )
    finally:
        runner.journal.sink.close()
    return None


def _report(runner: Runner, error: str | None, wall_s: float) -> int:
    """Write the report (again, as not completed, after an interrupt), print it; the exit code."""
    run_dir, golden = runner.ctx.run_dir, runner.golden.entry
    with InterruptsDeferred(REPORT_NOTICE, lambda: _stop_reporting(run_dir)) as deferred:
        hold_at("report", released=lambda: deferred.received is not None)
        runner.state.timings["wall_s"] = wall_s
        if error is None:
            runner.store_golden()
        try:
            write_replay(run_dir / REPLAY_FILE, runner.state.sequences, runner.state.forced)
            decode = model_decoder(runner.ctx.model_path)
            outcome = runner.outcome(error)
            paths = write_report(outcome, decode)
            if deferred.received is not None and error is None:
                # Never PASS after an interrupt: the report is written again as not completed.
                error = REPORT_INTERRUPTED
                outcome = runner.outcome(error)
                paths = write_report(outcome, decode)
        except Exception as exc:  # the raw results are on disk; say where, keep the traceback
            (run_dir / "report-error.txt").write_text(traceback.format_exc())
            print(
                f"rig: error: building the report failed ({type(exc).__name__}: {exc}); raw "
                f"results kept in {run_dir / 'requests.jsonl'}, traceback in "
                f"{run_dir / 'report-error.txt'}",
                file=sys.stderr,
            )
            return ExitCode.ERROR
        if golden is not None:
            print(cost_comparison(golden.timings, runner.state.timings), flush=True)
        print((run_dir / "summary.md").read_text(encoding="utf-8"))
        print(f"rig: report: {paths['report.html']}")
        if error is not None:
            print(f"rig: error: {error}", file=sys.stderr)
            return ExitCode.ERROR
    return outcome.verdict.exit_code()
