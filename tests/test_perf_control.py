"""benchmarks/perf_control.py's judgement of runs that went wrong (the whole control runs real
servers: tests/e2e/test_perf_control.py)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from perf_control import ControlRun, checks  # noqa: E402

from rig.records import REQUESTS_FILE  # noqa: E402


def test_a_run_that_compared_nothing_fails_its_check_instead_of_crashing(tmp_path):
    """An A/A whose candidate never started leaves an empty perf.csv and no finished request
    (seen on an H200); the control must say the check failed, not raise."""
    run_dir = tmp_path / "aa"
    run_dir.mkdir()
    (run_dir / "perf.csv").write_text("")
    (run_dir / REQUESTS_FILE).write_text("")
    run = ControlRun("aa", None, returncode=1, run_dir=run_dir, wall_s=1.0)
    assert run.perf().empty
    results = checks({"aa": run}, family_confidence=0.95)
    assert results and not any(passed for passed, _ in results)
    assert "no result" in results[0][1]
