"""benchmarks/gpu_busy.py: each side's GPU utilization is read from inside its own timed blocks
only, and bad sample lines are left out rather than fatal."""

import datetime
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_busy import block_busy, busy_table, main, read_samples  # noqa: E402

START = 1796673200.0  # 2026/12/07 19:13:20 UTC


def _stamp(offset_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(START + offset_s, tz=datetime.UTC)
    return moment.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _write(tmp_path: Path) -> tuple[Path, Path]:
    # the reference's block at 0-2 s is busy, the candidate's at 3-5 s half busy; between
    # blocks (2.5 s) the GPU idles and must count for neither
    busy = {0.0: 95, 0.5: 100, 1.0: 90, 1.5: 95, 2.5: 0, 3.0: 50, 3.5: 40, 4.0: 60, 4.5: 50}
    lines = ["timestamp, utilization.gpu [%], memory.used [MiB]", "NVIDIA-SMI has failed"]
    lines += [f"{_stamp(at)}, {pct} %, 1000 MiB" for at, pct in busy.items()]
    samples = tmp_path / "gpu-busy.csv"
    samples.write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    blocks = [("reference", 0.0, 2.0), ("candidate", 3.0, 5.0)]
    rows = [
        {"server": side, "level": 16, "repeat": 0, "queries": 0.0, "hits": 0.0,
         "started_at": START + begin, "ended_at": START + end}
        for side, begin, end in blocks
    ]  # fmt: skip
    (run / "server_counters.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return samples, run


def test_each_side_counts_only_the_samples_inside_its_blocks(tmp_path):
    samples_path, run = _write(tmp_path)
    samples = read_samples(samples_path)
    assert len(samples) == 9  # the header and the error line left out
    table = busy_table(block_busy(samples, run))
    reference = table.loc[("run", 16, "reference")]
    candidate = table.loc[("run", 16, "candidate")]
    assert reference.samples == 4 and reference.busy_pct == 95.0 and reference.at_90_pct == 100.0
    assert candidate.samples == 4 and candidate.busy_pct == 50.0 and candidate.at_90_pct == 0.0


def test_no_sample_inside_any_block_is_an_error_not_an_empty_table(tmp_path, capsys):
    samples_path, run = _write(tmp_path)
    (run / "server_counters.jsonl").write_text(
        json.dumps({"server": "reference", "level": 1, "repeat": 0, "queries": 0.0,
                    "hits": 0.0, "started_at": START + 100, "ended_at": START + 101}) + "\n"
    )  # fmt: skip
    assert main([str(samples_path), str(run)]) == 2
    assert "no timed block" in capsys.readouterr().err
