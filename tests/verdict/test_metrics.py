import dataclasses
import json
import math

import pytest

from rig.verdict.compare import PairResult
from rig.verdict.metrics import bench_results, block_summaries, level_sides
from tests.report_synthetic import unit_manifest


def timed(make_record, side, request_id, sent_at, ttft, e2el, out, prompt, itl, **fields):
    return make_record(
        side,
        request_id,
        sent_at=sent_at,
        ttft_s=ttft,
        e2el_s=e2el,
        output_tokens=out,
        prompt_tokens=prompt,
        itl_s=itl,
        **fields,
    )


@pytest.fixture
def level_records(make_record):
    """Four answered requests and one failed one on the reference at C=1, repeat 0."""
    return [
        timed(make_record, "reference", "q0", 1000.0, 0.010, 1.0, 5, 10, [0.1, 0.2]),
        timed(make_record, "reference", "q1", 1000.5, 0.020, 2.0, 3, 20, [0.3]),
        timed(make_record, "reference", "q2", 1000.25, 0.030, 0.5, 4, 5, [0.4, 0.5]),
        timed(make_record, "reference", "q3", 1001.0, 0.040, 1.0, 2, 5, []),
        timed(
            make_record,
            "reference",
            "q4",
            1000.75,
            5.0,
            None,
            None,
            None,
            [9.0],
            error="http_500: boom",
            text="",
        ),
    ]


# --- one row per side, level and repeat --------------------------------------------------------


def test_summary_percentiles_and_throughput(level_records):
    (block,) = block_summaries(level_records)
    row = {"side": block.side, "level": block.level, "repeat": block.repeat}
    row |= {"requests": block.requests} | block.bench_stats()
    assert (row["side"], row["level"], row["repeat"]) == ("reference", 1, 0)
    assert (row["requests"], row["completed"], row["failed"]) == (5, 4, 1)
    # TTFT 10, 20, 30, 40 ms (the failed request's 5 s is left out)
    assert row["mean_ttft_ms"] == pytest.approx(25.0)
    assert row["median_ttft_ms"] == pytest.approx(25.0)
    assert row["p90_ttft_ms"] == pytest.approx(37.0)  # 30 + 0.7 * 10
    assert row["p99_ttft_ms"] == pytest.approx(39.7)
    # E2EL 500, 1000, 1000, 2000 ms
    assert row["mean_e2el_ms"] == pytest.approx(1125.0)
    assert row["median_e2el_ms"] == pytest.approx(1000.0)
    assert row["p90_e2el_ms"] == pytest.approx(1700.0)
    assert row["p99_e2el_ms"] == pytest.approx(1970.0)
    # TPOT (E2EL - TTFT) / (out - 1): 990/4, 1980/2, 470/3, 960/1 ms
    tpots = [990 / 4, 1980 / 2, 470 / 3, 960 / 1]
    assert row["mean_tpot_ms"] == pytest.approx(sum(tpots) / 4)
    # ITL: every gap of the answered requests, 100 ... 500 ms
    assert row["mean_itl_ms"] == pytest.approx(300.0)
    assert row["p90_itl_ms"] == pytest.approx(460.0)
    assert row["p99_itl_ms"] == pytest.approx(496.0)
    # first send 1000.0, last finish 1000.5 + 2.0: 2.5 s for 4 answers, 14 out + 40 prompt tokens
    assert row["duration"] == pytest.approx(2.5)
    assert row["request_throughput"] == pytest.approx(4 / 2.5)
    assert row["output_throughput"] == pytest.approx(14 / 2.5)
    assert row["total_token_throughput"] == pytest.approx(54 / 2.5)


def test_summary_has_one_row_per_side_level_and_repeat(level_records, make_record):
    more = [
        timed(make_record, "candidate", "q0", 1000.0, 0.01, 1.0, 5, 10, [0.1]),
        timed(make_record, "candidate", "x0", 2000.0, 0.01, 1.0, 5, 10, [0.1], level=4),
        timed(make_record, "candidate", "x1", 3000.0, 0.01, 1.0, 5, 10, [0.1], level=4, repeat=1),
    ]
    blocks = block_summaries(level_records + more)
    keys = [(b.side, b.level, b.repeat) for b in blocks]
    assert keys == [("candidate", 1, 0), ("candidate", 4, 0), ("candidate", 4, 1)] + [
        ("reference", 1, 0)
    ]
    assert sum(b.requests for b in blocks) == 8
    sides = level_sides(blocks)
    assert [(s.level, s.side, len(s.blocks)) for s in sides] == [
        (1, "candidate", 1),
        (1, "reference", 1),
        (4, "candidate", 2),
    ]
    assert sides[2].requests == 2 and sides[2].values(lambda b: b.repeat) == [0, 1]


def test_summary_of_an_all_failed_level_has_no_throughput(make_record):
    failed = [make_record("reference", "q0", error="timeout: x", e2el_s=None, ttft_s=None)]
    (block,) = block_summaries(failed)
    assert (block.completed, block.failed) == (0, 1)
    assert math.isnan(block.ttft.mean) and math.isnan(block.request_throughput)
    (side,) = level_sides([block])
    assert math.isnan(side.mean(lambda b: b.ttft.mean))  # no repeat has one
    assert side.spread(lambda b: b.ttft.mean) is None


def test_summary_of_nothing_is_empty():
    assert block_summaries([]) == () and level_sides(()) == ()


def test_a_level_side_averages_its_repeats_and_gives_their_spread(level_records):
    again = [dataclasses.replace(r, repeat=1, ttft_s=r.ttft_s * 3) for r in level_records]
    (side,) = level_sides(block_summaries(level_records + again))
    ttft = side.mean(lambda b: b.ttft.mean)
    assert ttft == pytest.approx(50.0)  # 25 ms and 75 ms
    assert side.spread(lambda b: b.ttft.mean) == pytest.approx(100.0)  # (75 - 25) / 50
    assert (side.requests, side.completed, side.matches, side.pairs) == (10, 8, None, None)


def pair(request_id: str, level: int, repeat: int, identical: bool) -> PairResult:
    return PairResult(request_id, "p", level, repeat, 0, identical, None, ())


def test_match_counts_are_merged_per_level_and_repeat(make_record):
    records = [
        timed(make_record, side, f"q{i}", 1000.0, 0.01, 1.0, 3, 3, [], level=level)
        for side in ("reference", "candidate")
        for i, level in enumerate((1, 1, 1, 1, 4))
    ]
    pairs = [pair(f"q{i}", 1, 0, i != 2) for i in range(4)] + [pair("q4", 4, 0, True)]
    blocks = block_summaries(records, pairs)
    candidate = {b.level: b for b in blocks if b.side == "candidate"}
    assert (candidate[1].matches, candidate[1].pairs) == (3, 4)
    assert (candidate[4].matches, candidate[4].pairs) == (1, 1)
    reference = {b.level: b for b in blocks if b.side == "reference"}
    assert (reference[1].matches, reference[1].pairs) == (3, 4)  # the level's pairs, both sides


# --- vllm bench serve's result files -------------------------------------------------------------

# The keys a script written for `vllm bench serve --save-result` files reads (vLLM's own
# benchmarks/serve.py writes these; its percentile metrics default to ttft, tpot, itl).
VLLM_RESULT_KEYS = {
    "date",
    "endpoint_type",
    "backend",
    "model_id",
    "num_prompts",
    "request_rate",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "generated_texts",
    "errors",
    *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl")),
}


def read_like_vllm_tooling(result: dict) -> dict:
    """What a typical script over vLLM result files does: JSON round trip, then the summary."""
    data = json.loads(json.dumps(result))
    return {
        "concurrency": data["max_concurrency"],
        "tok/s": data["output_throughput"],
        "ttft": data["mean_ttft_ms"],
        "ok": data["completed"] == sum(1 for e in data["errors"] if not e),
    }


def test_bench_results_have_vllm_bench_serve_layout(level_records):
    results = bench_results(level_records, block_summaries(level_records), unit_manifest())
    assert list(results) == ["reference-c1.json"]
    result = results["reference-c1.json"]
    assert set(result) >= VLLM_RESULT_KEYS
    assert read_like_vllm_tooling(result) == {
        "concurrency": 1,
        "tok/s": pytest.approx(14 / 2.5),
        "ttft": pytest.approx(25.0),
        "ok": True,
    }
    assert (result["num_prompts"], len(result["ttfts"]), result["failed"]) == (5, 5, 1)


def test_bench_results_are_per_repeat_with_repeats(level_records, make_record):
    again = [dataclasses.replace(r, repeat=1) for r in level_records]
    records = level_records + again
    names = bench_results(records, block_summaries(records), unit_manifest())
    assert sorted(names) == ["reference-c1-r0.json", "reference-c1-r1.json"]


@pytest.mark.parametrize(
    ("endpoint", "backend"), [("completions", "openai"), ("chat", "openai-chat")]
)
def test_bench_results_name_the_endpoint_as_vllm_bench_serve_does(level_records, endpoint, backend):
    """`vllm bench serve --backend openai` sends to /v1/completions, `openai-chat` to
    /v1/chat/completions; its result file names the backend in `backend` and `endpoint_type`."""
    manifest = unit_manifest()
    workload = manifest.scenario.workload.model_copy(update={"endpoint": endpoint})
    scenario = manifest.scenario.model_copy(update={"workload": workload})
    manifest = dataclasses.replace(manifest, scenario=scenario)
    (result,) = bench_results(level_records, block_summaries(level_records), manifest).values()
    assert (result["backend"], result["endpoint_type"]) == (backend, backend)
