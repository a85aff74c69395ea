"""python -m kernels.check on CPU: gates, the ns3 negative control, CLI exit codes and CSV."""

import pandas as pd
import pytest

from kernels.check import main, run_checks


def test_ns4_passes_and_ns3_control_fails_on_correlated_keys():
    rows = run_checks("cpu", "ns4", ["correlated", "varlen-5seq"], long_tokens=None)
    by_kernel = {(r.case, r.kernel, r.against): r for r in rows}
    ns4 = by_kernel["correlated-keys", "ns4", "recurrence-fp64"]
    ns3 = by_kernel["correlated-keys", "ns3", "recurrence-fp64"]
    assert ns4.within_bounds and ns4.output_max_abs < 0.1
    assert not ns3.within_bounds and ns3.expected == "fail" and ns3.gate_ok
    assert all(r.gate_ok for r in rows)
    assert {r.case for r in rows} == {
        "correlated-keys",
        "varlen-5seq-fp32-state",
        "varlen-5seq-bf16-state",
    }


def test_long_sequence_is_judged_per_window():
    rows = run_checks("cpu", "ns4", ["slow-decay"], long_tokens=2048)
    windows = [r for r in rows if r.kernel == "ns4" and r.against == "recurrence-fp64"]
    assert len(windows) == 9  # 8 windows + the whole sequence
    assert all(r.gate_ok and r.finite for r in windows)


def test_cli_writes_csv_and_fails_when_the_candidate_is_ns3(tmp_path, capsys):
    csv = tmp_path / "check.csv"
    assert main(["--cases", "correlated", "--csv", str(csv)]) == 0
    frame = pd.read_csv(csv)
    assert set(frame.kernel) >= {"ns4", "ns3"}
    assert "0 gate failures" in capsys.readouterr().out

    assert main(["--candidate", "ns3", "--cases", "correlated", "--csv", str(csv)]) == 1
    assert "GATE FAILED: correlated-keys" in capsys.readouterr().out


def test_cli_rejects_unknown_candidate(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--candidate", "nope", "--cases", "correlated"])
    assert exited.value.code == 2
    assert "known kernels" in capsys.readouterr().err


def test_planted_state_faults_fail_the_initial_state_cases_and_pass_the_zero_state_one():
    rows = run_checks("cpu", "ns4", ["initial-state"], long_tokens=None)
    by = {(r.case, r.kernel): r for r in rows if r.part == "all" and r.against == "recurrence-fp64"}
    for case in ("initial-state-fp32", "initial-state-bf16"):
        drop = by[case, "ns4+drop-state"]
        assert drop.expected == "fail" and not drop.within_bounds and drop.output_head_rel_l2 > 0.1
        assert by[case, "ns4"].within_bounds
    assert by["initial-state-zero", "ns4+drop-state"].within_bounds
    assert by["initial-state-zero", "ns4+bf16-state"].expected == "pass"
    assert by["initial-state-fp32", "ns4+bf16-state"].expected == "info"  # below the noise
    assert all(r.gate_ok for r in rows)


def test_a_planted_state_fault_as_the_candidate_fails_only_where_a_state_is_given(capsys):
    assert main(["--candidate", "ns4+drop-state", "--cases", "initial-state,correlated"]) == 1
    failed = {line.split()[2] for line in capsys.readouterr().out.splitlines() if "GATE" in line}
    assert failed == {"initial-state-fp32", "initial-state-bf16"}
