"""benchmarks/perf_control.py's judgement of runs that went wrong (the whole control runs real
servers: tests/e2e/test_perf_control.py)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from dataclasses import replace  # noqa: E402

from perf_control import ControlRun, aa_checks, checks, gdn_prediction  # noqa: E402

from rig.records import REQUESTS_FILE  # noqa: E402
from rig.report.tables import perf_table  # noqa: E402
from rig.verdict.perf_records import (  # noqa: E402
    HEADLINE_METRICS,
    NOISE,
    NOT_JUDGED,
    SLOWER,
    Metric,
    PerfResult,
)
from tests.perf_builders import changed, perf_level, planted, sensitivity  # noqa: E402


def test_a_run_that_compared_nothing_fails_its_check_instead_of_crashing(tmp_path):
    """An A/A whose candidate never started leaves an empty perf.csv and no finished request
    (seen on an H200); the control must say the check failed, not raise."""
    run_dir = tmp_path / "aa"
    run_dir.mkdir()
    (run_dir / "perf.csv").write_text("")
    (run_dir / REQUESTS_FILE).write_text("")
    run = ControlRun("aa", None, returncode=1, run_dir=run_dir, wall_s=1.0)
    assert run.perf() == ()
    results = checks({"aa": run}, family_confidence=0.95)
    assert results and not any(passed for passed, _ in results)
    assert "no result" in results[0][1]


def stored_run(tmp_path, name, *levels):
    run_dir = tmp_path / name
    run_dir.mkdir()
    perf_table(PerfResult(levels)).to_csv(run_dir / "perf.csv", index=False)
    return ControlRun(name, "k", returncode=0, run_dir=run_dir, wall_s=1.0)


def test_the_checks_read_a_stored_runs_perf_as_records(tmp_path):
    """perf.csv read back as typed records: the planted change beside its interval, and the
    change the GDN time predicts beside the measured one, as the run wrote them."""
    ttft = changed(1, Metric.MEAN_TTFT, 150.0, (100.0, 200.0), SLOWER)
    tput = changed(1, Metric.TOTAL_TOKEN_THROUGHPUT, -40.0, (-50.0, -30.0), SLOWER)
    gdn = changed(1, Metric.GDN_MS_PER_CALL, 100.0, (40.0, 160.0), NOT_JUDGED, (1.5, 3.0))
    share = planted((Metric.MEAN_TTFT, 250.0, False))
    found = sensitivity(gdn, (160.0, ttft), (-35.0, tput))
    runs = {
        "planted": stored_run(tmp_path, "planted", replace(perf_level(1, ttft), planted=share)),
        "gpu": stored_run(
            tmp_path, "gpu", replace(perf_level(1, ttft, tput, gdn), sensitivity=found)
        ),
    }
    (planted_check, *gpu) = checks(runs, family_confidence=0.95)
    assert planted_check == (
        False,
        "planted: TTFT +150.0 % [+100.0, +200.0] slower, planted +250.0 % outside the interval",
    )
    assert [passed for passed, _ in gpu] == [True, True]
    assert "predicted -35.0 % inside the interval" in gpu[1][1]
    (level,) = runs["gpu"].perf()
    assert gdn_prediction(level).startswith("GDN 1.500 → 3.000 ms per call x 3.00 calls")


def test_an_aa_interval_outside_the_resolution_is_named_by_metric_and_level(tmp_path):
    """The H100 A/A of 2026-12-08: every interval within ±0.7 % at C=64, TTFT [-0.1, +2.5] at
    C=200; the check fails on ±2 % and says where, so nobody hunts through 8 intervals."""
    c64 = [changed(64, m, 0.0, (-0.7, 0.7), NOISE) for m in HEADLINE_METRICS]
    c200 = [
        changed(
            200, m, *((1.2, (-0.1, 2.5)) if m == Metric.MEAN_TTFT else (0.0, (-0.6, 0.5))), NOISE
        )
        for m in HEADLINE_METRICS
    ]
    run = stored_run(tmp_path, "aa", perf_level(64, *c64), perf_level(200, *c200))
    (run.run_dir / "scenario.resolved.json").write_text('{"workload": {"speed_resolution_pct": 2}}')
    (run.run_dir / REQUESTS_FILE).write_text("")
    *_, resolution = aa_checks(run, family_confidence=0.95)
    assert resolution == (
        False,
        "A/A: every headline interval inside ±2 % (widest bound 2.5 %, mean_ttft_ms at C=200)",
    )
