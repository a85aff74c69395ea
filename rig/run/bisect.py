"""`rig bisect RUN_DIR [--request-id ID]` (`python -m rig.run.bisect`): trace a divergent pair
to its first GDN call.

A finished run says *that* the candidate's text differs; this says *where*. It starts both
sides again from the run's own manifest (same model, argv and environment, plus
RIG_GDN_CAPTURE), sends that one request to each, and walks the captured GDN prefill calls in
execution order (call 0 of every layer, then call 1, ...). Each call is replayed through the
kernel that served it on that side, and through the float64 recurrence (kernels/recurrence.py).

A call's numerical bound is what two correct kernels may differ by there: a few times the
reference kernel's own distance from the float64 recurrence on the same inputs, and never less
than BOUND_FLOOR. The first call whose candidate output differs from the reference output by
more than that bound, with inputs that still agree within it, is named, with each side's error
against the float64 recurrence: whichever is closer is the side that computed it right. When
inputs already differ before any output did, the divergence started outside the GDN kernels.

Writes bisect.json and bisect.csv (one row per call) under RUN_DIR/bisect-<request id>/. Exit
0 when a GDN call is named, 1 when none differs beyond its bound, 2 when it cannot run.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kernels.accuracy import tensor_error
from kernels.capture import Capture, list_captures, load_capture
from kernels.gdn_inputs import GdnInputs
from kernels.runners import (
    VLLM_CPU_REFERENCE,
    KernelRunner,
    candidate_runner,
    recurrence_runner,
    reference_runner,
)
from rig.load.engine import run_level
from rig.records import REQUESTS_FILE, ExitCode, RequestRecord, Side, SideJob, read_records
from rig.run.compare_runs import run_pairs
from rig.scenario.config import SIDES, Scenario
from rig.scenario.workload import level_requests, resolve_prompts
from rig.serve.hardware import Hardware
from rig.serve.plan import plan_servers
from rig.serve.servers import ServerError, ServerSet

CAPTURE_ENV = "RIG_GDN_CAPTURE"
CAPTURE_CALLS_ENV = "RIG_GDN_CAPTURE_N"
CAPTURE_CALLS = 10_000  # every prefill call of the request, whatever the server ran before it
BOUND_FLOOR = 0.01  # relative L2 per value head: about two BF16 roundings of an output
BOUND_FACTOR = 4.0  # times the reference kernel's own relative error against float64
INPUT_FIELDS = ("q", "k", "v", "g", "beta", "initial_state")


class BisectError(RuntimeError):
    """The bisect cannot be made; the message is one line meant for the user."""


@dataclass(frozen=True)
class CallComparison:
    """One GDN prefill call of the request, both sides side by side. Differences and errors
    are the worst value head's relative L2 (kernels.accuracy.tensor_error)."""

    order: int
    layer: str
    call: int  # the request's n-th prefill call of this layer
    tokens: int
    reference_kernel: str
    candidate_kernel: str
    input_difference: float  # worst over q, k, v, g, beta and the initial state
    output_difference: float  # candidate's output on its inputs vs reference's on its inputs
    bound: float
    reference_error: float  # reference's output vs float64 recurrence on the reference inputs
    candidate_error: float  # candidate's output vs float64 recurrence on the candidate inputs
    candidate_finite: bool

    @property
    def inputs_agree(self) -> bool:
        return self.input_difference <= self.bound

    @property
    def output_beyond_bound(self) -> bool:
        return not self.candidate_finite or not self.output_difference <= self.bound

    @property
    def closer_to_float64(self) -> str:
        if not self.candidate_finite or not self.candidate_error <= self.reference_error:
            return Side.REFERENCE
        return Side.CANDIDATE


@dataclass(frozen=True)
class BisectResult:
    request_id: str
    prompt_id: str
    texts: dict[str, str]
    calls: list[CallComparison]
    servers: dict[str, list[str]] = field(default_factory=dict)  # argv of each side's server

    @property
    def first_divergent(self) -> CallComparison | None:
        return next((c for c in self.calls if c.output_beyond_bound or not c.inputs_agree), None)

    def verdict(self) -> str:
        first = self.first_divergent
        if first is None:
            return (
                f"no GDN prefill call of {self.request_id} differs beyond its bound "
                f"({len(self.calls)} calls compared): the divergence is not in a GDN kernel"
            )
        where = f"{first.layer} call {first.call} ({first.tokens} tokens)"
        if not first.inputs_agree:
            return (
                f"inputs of {where} already differ ({first.input_difference:.3g} > bound "
                f"{first.bound:.3g}) before any GDN output did: the divergence started upstream, "
                "outside the GDN kernels"
            )
        return (
            f"first divergent GDN call: {where}: candidate {first.candidate_kernel} differs from "
            f"reference {first.reference_kernel} by {first.output_difference:.3g} "
            f"(bound {first.bound:.3g}); error vs float64: candidate "
            f"{first.candidate_error:.3g}, reference {first.reference_error:.3g}: the "
            f"{first.closer_to_float64} is closer"
        )


# --- the run to bisect ---------------------------------------------------------------------


@dataclass(frozen=True)
class FinishedRun:
    run_dir: Path
    scenario: Scenario
    model_path: str

    @classmethod
    def load(cls, run_dir: Path) -> FinishedRun:
        manifest_path = run_dir / "manifest.json"
        if not manifest_path.exists():
            raise BisectError(f"{run_dir}: no manifest.json (not a finished rig run)")
        manifest = json.loads(manifest_path.read_text())
        scenario = Scenario.model_validate(manifest["scenario"])
        return cls(run_dir=run_dir, scenario=scenario, model_path=manifest["model_path"])

    def first_substantive_request(self) -> str:
        """The request id of the run's first substantive divergence (else its first mismatch),
        from its requests.jsonl and replay.jsonl as `rig compare` pairs them."""
        try:
            pairs = run_pairs(
                self.run_dir,
                self.scenario.gates.near_tie_margin,
                self.scenario.workload.max_tokens,
            )
        except (OSError, ValueError) as exc:
            raise BisectError(f"{self.run_dir}: {exc}") from exc
        divergent = [pair for pair in pairs if pair.divergence is not None]
        if not divergent:
            raise BisectError(f"{self.run_dir}: the run has no divergent pair to bisect")
        substantive = [pair for pair in divergent if pair.substantive]
        return (substantive or divergent)[0].request_id

    def timed_record(self, request_id: str) -> RequestRecord:
        """The reference's timed record of `request_id`: where the request sat in the load."""
        for record in read_records(self.run_dir / REQUESTS_FILE):
            timed = record.side == Side.REFERENCE and not record.warmup
            if timed and record.request_id == request_id:
                return record
        raise BisectError(f"request id {request_id!r} is not one of the run's timed requests")


def request_spec(run: FinishedRun, request_id: str, side: str, salt_run_id: str):
    """The run's request `request_id` as sent to `side`, with a fresh cache salt."""
    workload = run.scenario.workload
    if workload.conversations is not None:  # a turn alone on fresh servers: no cached state
        raise BisectError("rig bisect does not replay conversation turns (workload.conversations)")
    record = run.timed_record(request_id)
    specs = level_requests(
        workload,
        resolve_prompts(workload),
        level=record.level,
        repeat=record.repeat,
        side=side,
        run_id=salt_run_id,
        count=record.index + 1,
    )
    return specs[record.index]


# --- capture on live servers ---------------------------------------------------------------


@dataclass(frozen=True)
class CapturedRequest:
    """What each side's server captured and answered for the one request."""

    capture_dirs: dict[str, Path]
    records: dict[str, RequestRecord]
    argv: dict[str, list[str]]


def capture_request(run: FinishedRun, request_id: str, out_dir: Path) -> CapturedRequest:
    """Start both sides with capture on and send the request to each."""
    scenario = run.scenario
    capture_dirs = {side: (out_dir / "capture" / side).resolve() for side in SIDES}
    updates = {}
    for side in SIDES:
        config = scenario.side(side)
        env = {
            **config.env,
            CAPTURE_ENV: str(capture_dirs[side]),
            CAPTURE_CALLS_ENV: str(CAPTURE_CALLS),
        }
        updates[side] = config.model_copy(update={"env": env, "url": None, "port": None})
    scenario = scenario.model_copy(update=updates)
    plan = plan_servers(scenario, run.model_path, out_dir, Hardware.detect())
    records: dict[str, RequestRecord] = {}
    for phase in plan.phases:
        plans = [plan.servers[side] for side in phase]
        with ServerSet(plans, scenario.model.startup_timeout_s) as servers:
            for side, server in servers.items():
                before = set(list_captures(capture_dirs[side]))
                for stale in before:  # start-up calls (profiling, warm-up) are not the request's
                    stale.unlink()
                target = server.target()
                spec = request_spec(run, request_id, side, f"bisect-{out_dir.name}")
                result = run_level(
                    [SideJob(target, [spec])],
                    1,
                    timeout_s=scenario.workload.timeout_s,
                    progress=False,
                )
                records[side] = result[side][0]
    argv = {side: list(server.argv) for side, server in plan.servers.items()}
    return CapturedRequest(capture_dirs, records, argv)


# --- comparison ----------------------------------------------------------------------------


def layer_number(layer: str) -> int:
    found = re.search(r"layers\.(\d+)\.", layer)
    return int(found.group(1)) if found else -1


def request_calls(capture_dir: Path) -> list[Capture]:
    """The captured calls in execution order; call indices renumbered from 0 per layer."""
    captures = [load_capture(path) for path in list_captures(capture_dir)]
    captures.sort(key=lambda c: (c.meta.call_index, layer_number(c.meta.layer), c.meta.pid))
    return captures


def runner_for(kernel: str, device: str = "cpu") -> KernelRunner:
    """The kernel that served a capture, as the plugin named it."""
    if kernel == VLLM_CPU_REFERENCE or kernel.startswith("vllm-"):
        runner = reference_runner(device)
        if runner is None:
            raise BisectError(f"cannot replay {kernel}: vLLM's reference kernel is not installed")
        return runner
    return candidate_runner(kernel, device)


def input_difference(reference: GdnInputs, candidate: GdnInputs) -> float:
    worst = 0.0
    for name in INPUT_FIELDS:
        ref, cand = getattr(reference, name), getattr(candidate, name)
        if ref.shape != cand.shape:
            return float("inf")
        if ref.dim() == 1:
            ref, cand = ref[:, None], cand[:, None]
        worst = max(worst, tensor_error(cand, ref).head_rel_l2)
    if not reference.cu_seqlens.equal(candidate.cu_seqlens):
        return float("inf")
    return worst


def compare_calls(reference: list[Capture], candidate: list[Capture]) -> list[CallComparison]:
    """Pair the sides' calls by (layer, n-th call of the request) and compare them in order."""
    truth = recurrence_runner()
    runners: dict[str, KernelRunner] = {}
    by_key = {}
    for side_calls in (reference, candidate):
        seen: dict[str, int] = {}
        for capture in side_calls:
            number = seen.get(capture.meta.layer, 0)
            seen[capture.meta.layer] = number + 1
            by_key.setdefault((capture.meta.layer, number), []).append(capture)
    comparisons = []
    ordered = sorted(
        (key for key, pair in by_key.items() if len(pair) == 2),
        key=lambda key: (key[1], layer_number(key[0])),
    )
    for order, (layer, number) in enumerate(ordered):
        ref, cand = by_key[(layer, number)]
        for kernel in (ref.meta.kernel, cand.meta.kernel):
            runners.setdefault(kernel, runner_for(kernel))
        ref_out = runners[ref.meta.kernel].run(ref.inputs)[0]
        cand_out = runners[cand.meta.kernel].run(cand.inputs)[0]
        ref_error = tensor_error(ref_out, truth.run(ref.inputs)[0]).head_rel_l2
        cand_error = tensor_error(cand_out, truth.run(cand.inputs)[0])
        difference = tensor_error(cand_out, ref_out)
        comparisons.append(
            CallComparison(
                order=order,
                layer=layer,
                call=number,
                tokens=ref.inputs.num_tokens,
                reference_kernel=ref.meta.kernel,
                candidate_kernel=cand.meta.kernel,
                input_difference=input_difference(ref.inputs, cand.inputs),
                output_difference=difference.head_rel_l2,
                bound=max(BOUND_FLOOR, BOUND_FACTOR * ref_error),
                reference_error=ref_error,
                candidate_error=cand_error.head_rel_l2,
                candidate_finite=cand_error.finite,
            )
        )
    return comparisons


def bisect(run_dir: Path, request_id: str | None = None) -> tuple[BisectResult, Path]:
    run = FinishedRun.load(run_dir)
    request_id = request_id or run.first_substantive_request()
    out_dir = run_dir / f"bisect-{request_id}"
    spec = request_spec(run, request_id, Side.REFERENCE, "bisect")
    print(f"rig bisect: {request_id} ({spec.prompt_id}) on fresh servers, GDN capture on")
    captured = capture_request(run, request_id, out_dir)
    calls = [request_calls(captured.capture_dirs[side]) for side in SIDES]
    if not calls[0] or not calls[1]:
        raise BisectError("no GDN prefill call was captured (is the rig's vLLM plugin installed?)")
    result = BisectResult(
        request_id=request_id,
        prompt_id=spec.prompt_id,
        texts={side: record.text for side, record in captured.records.items()},
        calls=compare_calls(*calls),
        servers=captured.argv,
    )
    write_result(result, out_dir)
    return result, out_dir


def write_result(result: BisectResult, out_dir: Path) -> None:
    rows = [asdict(call) for call in result.calls]
    with open(out_dir / "bisect.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["order"])
        writer.writeheader()
        writer.writerows(rows)
    first = result.first_divergent
    summary = {
        "request_id": result.request_id,
        "prompt_id": result.prompt_id,
        "verdict": result.verdict(),
        "first_divergent": asdict(first) if first else None,
        "closer_to_float64": first.closer_to_float64 if first else None,
        "texts": result.texts,
        "servers": result.servers,
        "calls": rows,
    }
    (out_dir / "bisect.json").write_text(json.dumps(summary, indent=2, allow_nan=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rig.run.bisect", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a finished run's folder (results/<run-id>)")
    parser.add_argument(
        "--request-id", default=None, help="default: the run's first substantive divergence"
    )
    args = parser.parse_args(argv)
    try:
        result, out_dir = bisect(args.run_dir, args.request_id)
    except (BisectError, ServerError) as error:
        print(f"rig: error: {str(error).splitlines()[0]}", file=sys.stderr)
        return ExitCode.ERROR
    for call in result.calls:
        mark = "  <- first" if call is result.first_divergent else ""
        print(
            f"{call.order:3d} {call.layer} call {call.call} ({call.tokens} tok): "
            f"inputs {call.input_difference:.3g}, outputs {call.output_difference:.3g} "
            f"(bound {call.bound:.3g}); vs float64: ref {call.reference_error:.3g}, "
            f"cand {call.candidate_error:.3g}{mark}"
        )
    print(f"rig bisect: {result.verdict()}")
    print(f"rig bisect: {out_dir / 'bisect.json'}")
    return ExitCode.PASS if result.first_divergent is not None else ExitCode.FAILED


if __name__ == "__main__":
    sys.exit(main())
