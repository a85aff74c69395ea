"""The profiled blocks read back from the run's folder: each server's block record and its
worker traces (the API server's own trace left out), in the sides' order."""

import json
import shutil
from pathlib import Path

from rig.run.profile_phase import read_profile, traces_of
from rig.verdict.profile_report import BLOCK_FILE, ProfiledBlock
from tests.run_fakes import run_context

STORED = Path(__file__).parents[1] / "verdict" / "data" / "cpu-ns4-trace.json.gz"
WORKER = "dp0_pp0_tp0_dcp0_ep0_rank0.1.pt.trace.json.gz"


def _leave(run_dir: Path, side: str) -> None:
    folder = run_dir / "profile" / side
    folder.mkdir(parents=True)
    shutil.copy(STORED, folder / WORKER)
    (folder / "vm_1.async_llm.2.pt.trace.json.gz").write_bytes(b"\x1f\x8b")  # unreadable
    (folder / "rank0.profiler_out.txt").write_text("table")
    block = ProfiledBlock(side, side, 1, 3, 0, 1.0, 0.5)
    (folder / BLOCK_FILE).write_text(json.dumps(block.to_json()))


def test_both_sides_are_read_reference_first(tmp_path):
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"}, profile={"requests": 3})
    for side in ("candidate", "reference"):
        _leave(tmp_path, side)
    found = read_profile(tmp_path, ctx.scenario)
    assert [s.block.side for s in found.sides] == ["reference", "candidate"]
    assert found.level == 1
    for side in found.sides:
        (trace,) = side.traces
        assert trace.path == f"profile/{side.block.side}/{WORKER}"
        assert trace.size_bytes == STORED.stat().st_size
        assert side.table is not None and side.table.gdn_calls == 2


def test_no_profile_asked_or_none_left_is_none(tmp_path):
    assert read_profile(tmp_path, run_context(tmp_path).scenario) is None
    asked = run_context(tmp_path, profile={}).scenario
    assert read_profile(tmp_path, asked) is None  # the run stopped before its profiled block
    (tmp_path / "profile" / "reference").mkdir(parents=True)  # vLLM's folder, no block
    assert read_profile(tmp_path, asked) is None


def test_only_worker_traces_are_read(tmp_path):
    _leave(tmp_path, "reference")
    assert [p.name for p in traces_of(tmp_path / "profile" / "reference")] == [WORKER]
