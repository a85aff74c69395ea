import dataclasses
import json
import re

import numpy as np
import pytest

from rig.load.replay_records import REPLAY_FILE, write_replay
from rig.records import REQUESTS_FILE, ForcedLogprobs, ForcedSequence, TokenLogprob
from rig.report.files import write_report
from rig.report.tables import perf_table, read_perf_table
from rig.run.cache import GoldenEntry
from rig.run.compare_runs import main as compare_main
from rig.run.compare_runs import side_records
from rig.run.compare_speed import MANIFEST_FILE, stored_design
from rig.run.conclude import build_outcome
from rig.scenario.config import Scenario
from rig.verdict.perf_records import CLIENT_METRICS, HEADLINE_METRICS, Metric, PerfResult
from rig.verdict.speed import SHORT_NAMES
from tests.run.test_conclude import KERNELS, ONE_LEVEL, timed_blocks
from tests.run_fakes import run_context
from tests.verdict.test_compare import pair_at_third_token

# --- comparing stored runs ---------------------------------------------------------------------


def store(run_dir, records):
    run_dir.mkdir()
    lines = "".join(record.to_json() + "\n" for record in records)
    (run_dir / REQUESTS_FILE).write_text(lines, encoding="utf-8")
    return run_dir


def test_read_records_keeps_one_side_without_warmups(make_record, tmp_path):
    top = {3: -0.5, 4: -0.9}
    records = [
        make_record("reference", "q0", token_ids=[3], logprobs=[TokenLogprob(3, -0.5, top)]),
        make_record("reference", "warmup-q0", warmup=True),
        make_record("candidate", "q0"),
    ]
    (record,) = side_records(store(tmp_path / "run", records), "reference")
    assert record.request_id == "q0"
    assert record.logprobs == [TokenLogprob(3, -0.5, top)]  # int token ids survive JSON


def test_read_records_errors(make_record, tmp_path):
    with pytest.raises(FileNotFoundError, match=REQUESTS_FILE):
        side_records(tmp_path, "reference")
    run = store(tmp_path / "run", [make_record("reference", "q0")])
    with pytest.raises(ValueError, match="'candidate'"):
        side_records(run, "candidate")


def test_main_compares_two_stored_runs(make_record, tmp_path, capsys):
    run_a = store(tmp_path / "a", [make_record("reference", f"q{i}") for i in range(2)])
    same = store(tmp_path / "b", [make_record("candidate", f"q{i}") for i in range(2)])
    assert compare_main([str(run_a), str(same)]) == 0
    assert "2 pairs, 2 identical" in capsys.readouterr().out
    other = store(
        tmp_path / "c",
        [make_record("candidate", "q0"), make_record("candidate", "q1", text="else")],
    )
    assert compare_main([str(run_a), str(other)]) == 3  # no replay: no margin to judge by
    assert "0 substantive, 1 unclassified" in capsys.readouterr().out


def test_main_classifies_from_the_runs_replays(make_record, tmp_path, capsys):
    """Each side's top-k from its own run's replay.jsonl, found by the reference completion."""
    ref, cand, replayed = pair_at_third_token(make_record, {3: -0.5, 9: -0.6}, {9: -0.5, 3: -0.6})
    sequence = ForcedSequence("p0", (7,), (1, 2, 3, 4))
    runs = {}
    for name, side, record in (("a", "reference", ref), ("b", "candidate", cand)):
        runs[name] = store(tmp_path / name, [record])
        positions = replayed[side][sequence.key]
        answer = ForcedLogprobs(
            (None, *(p.logprob for p in positions)), tuple(p.top for p in positions)
        )
        write_replay(runs[name] / REPLAY_FILE, [sequence], {side: {0: answer}})
    assert compare_main([str(runs["a"]), str(runs["b"])]) == 0
    assert "1 near-tie, 0 reference variant, 0 substantive" in capsys.readouterr().out
    (runs["b"] / REPLAY_FILE).unlink()
    assert compare_main([str(runs["a"]), str(runs["b"])]) == 3
    assert "token 2 (unclassified" in capsys.readouterr().out


def test_main_fails_when_requests_failed(make_record, tmp_path, capsys):
    run_a = store(tmp_path / "a", [make_record("reference", "q0")])
    failed = store(tmp_path / "b", [make_record("candidate", "q0", text="", error="timeout: x")])
    assert compare_main([str(run_a), str(failed)]) == 1
    assert "1 with a failed request" in capsys.readouterr().out


def test_main_reports_a_missing_run(tmp_path, capsys):
    assert compare_main([str(tmp_path / "nope"), str(tmp_path / "nope")]) == 2
    assert "rig: error" in capsys.readouterr().err


# --- speed ---------------------------------------------------------------------------------


def timed(make_record, side, level, repeats=3, slower=1.0, n=20):
    """`repeats` blocks of `n` requests at `level`; the candidate's TTFT `slower` times the
    reference's, request by request, give or take 1 %."""
    rng, jitter = np.random.default_rng(level), np.random.default_rng(level + 100)
    records = []
    for repeat in range(repeats):
        ttfts = 0.1 * (1 + 0.1 * rng.standard_normal(n))
        noise = 1 + 0.01 * jitter.standard_normal(n) if side == "candidate" else np.ones(n)
        for i, ttft in enumerate(ttfts * slower * noise):
            records.append(
                make_record(
                    side,
                    f"c{level}-r{repeat}-{i:04d}",
                    prompt_id=f"p{i}",
                    index=i,
                    level=level,
                    repeat=repeat,
                    sent_at=1000.0 + i * 0.1,
                    ttft_s=float(ttft),
                    itl_s=[0.01] * 9,
                    e2el_s=float(ttft) + 0.09,
                    output_tokens=10,
                    prompt_tokens=20,
                )
            )
    return records


def one_run(make_record, run_dir, slower=1.15, **manifest):
    """A stored run of both sides at C=1 and C=4, with the manifest.json its report writes
    (`manifest` overrides its fields; None: no manifest, a run whose report never came)."""
    sides = [
        record
        for level in (1, 4)
        for side, factor in (("reference", 1.0), ("candidate", slower))
        for record in timed(make_record, side, level, slower=factor)
    ]
    store(run_dir, sides)
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "model": {"name": "org/some-model"},
            "candidate": {"kernel": "ns4"},
            "workload": {"prompts": [{"long_tokens": [100]}], "concurrency": [1, 4], "repeats": 3},
        }
    )
    fields = {
        "scenario": json.loads(scenario.model_dump_json()),
        "verdict": {"word": "identical"},
        "error": None,
        "excluded_blocks": [],
        "pair_levels": [],
        "stage_one_blocks": None,
        "golden_run": None,
    } | manifest
    (run_dir / MANIFEST_FILE).write_text(json.dumps(fields), encoding="utf-8")
    return run_dir


FIFTEEN = r"\+1[45]\.\d %"  # the candidate's TTFT: 15 % slower, give or take its noise


def speed_output(capsys) -> list[str]:
    out = capsys.readouterr().out.splitlines()
    return out[next(i for i, line in enumerate(out) if line.startswith("speed:")) :]


def test_one_runs_own_sides_get_a_speed_word_per_level(make_record, tmp_path, capsys):
    run = one_run(make_record, tmp_path / "run")
    assert compare_main([str(run), str(run)]) == 0
    head, c1, c4 = speed_output(capsys)
    assert head.startswith("speed: family-wise 95% over 4 metrics x 2 level(s)")
    for line, level in ((c1, 1), (c4, 4)):
        assert re.match(rf"  C{level} \(3 block pairs\): TTFT {FIFTEEN} \[\+1\d\.\d, \+1", line)
        assert "] slower; TPOT +0.0 % [+0.0, +0.0] within noise;" in line


def test_two_stored_runs_are_not_comparable_for_speed(make_record, tmp_path, capsys):
    """RUN_A's reference and RUN_B's candidate, measured at different times: the changes are
    shown, never a word, whatever the numbers."""
    run_a = one_run(make_record, tmp_path / "a")
    run_b = one_run(make_record, tmp_path / "b")
    assert compare_main([str(run_a), str(run_b)]) == 0
    head, c1, c4 = speed_output(capsys)
    assert head.startswith("speed: not comparable (two runs, measured at different times")
    assert re.match(rf"  C1 \(3 block pairs\): TTFT {FIFTEEN}, TPOT \+0\.0 %, E2EL ", c1)
    assert c1.endswith(": not comparable") and c4.endswith(": not comparable")
    assert "slower" not in c1 + c4 and "[" not in c1 + c4


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (
            {"golden_run": "r0", "golden_stored_at": "2026-12-01"},
            "not comparable (reference from the golden cache: run r0, stored 2026-12-01",
        ),
        (
            {"verdict": {"word": "NOT equivalent"}},
            "not comparable (outputs differ: the candidate is NOT equivalent)",
        ),
        (
            {"error": "interrupted (SIGTERM)\nmore"},
            "not measured (the run did not complete: interrupted (SIGTERM))",
        ),
        (None, "not measured (no manifest.json"),
    ],
)
def test_one_run_keeps_its_speed_lines_refusals(make_record, tmp_path, capsys, manifest, reason):
    """Each refusal of the run's own speed line, and a run whose report was never written."""
    run = one_run(make_record, tmp_path / "run", **(manifest or {}))
    if manifest is None:
        (run / MANIFEST_FILE).unlink()
    compare_main([str(run), str(run)])
    head, c1, _ = speed_output(capsys)
    assert head.startswith(f"speed: {reason}")
    assert re.match(rf"  C1 \(3 block pairs\): TTFT {FIFTEEN},", c1) and "slower" not in c1


def test_a_manifest_that_does_not_say_where_the_reference_came_from_gets_no_word(
    make_record, tmp_path, capsys
):
    """An older rig's manifest.json: its reference may have come from the golden cache."""
    run = one_run(make_record, tmp_path / "run")
    stored = json.loads((run / MANIFEST_FILE).read_text())
    del stored["golden_run"]
    (run / MANIFEST_FILE).write_text(json.dumps(stored))
    compare_main([str(run), str(run)])
    head, c1, _ = speed_output(capsys)
    assert head.startswith("speed: not comparable (manifest.json does not record where")
    assert "slower" not in c1


@pytest.mark.parametrize(
    "golden", [None, GoldenEntry("first", [], [], {}, KERNELS["reference"], {}, "2026-12-01")]
)
def test_a_stored_runs_design_is_the_one_its_speed_line_had(tmp_path, make_record, golden):
    """What the run's manifest.json records rebuilds the run's own speed design."""
    ctx = run_context(tmp_path, candidate={"kernel": "ns4"}, drift={"enabled": False},
                      workload=ONE_LEVEL)  # fmt: skip
    outcome = build_outcome(ctx, timed_blocks(make_record), KERNELS, None, golden=golden)
    manifest = outcome.manifest.to_json() | {"verdict": {"word": outcome.verdict.word}}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest, default=str), encoding="utf-8")
    stored = stored_design(tmp_path)
    assert stored.speed == outcome.speed and stored.speed.measured == (golden is None)
    assert stored.levels == 1


# --- the same numbers as the run's report -------------------------------------------------------

CELL = re.compile(
    r'<td data-sort="[^"]*" class="num delta-[a-z-]+">([+-]\d+\.\d) %<small>\[([^]]+)\]</small>'
    r'<small class="word">([^<]+)</small></td>'
)


def test_rig_compare_shows_the_numbers_the_html_shows(make_record, tmp_path, capsys):
    """One run through build_outcome and write_report: `rig compare RUN RUN` prints, per level
    and headline metric, the change, interval and word report.html's table shows, because it
    reads the records the report rendered (perf.csv), not a second computation of them."""
    run_dir = tmp_path / "run"
    ctx = run_context(run_dir, candidate={"kernel": "ns4"}, drift={"enabled": False},
                      workload=ONE_LEVEL)  # fmt: skip
    state = timed_blocks(make_record, slower=1.15)
    outcome = build_outcome(ctx, state, KERNELS, None)
    paths = write_report(outcome)
    store_records(run_dir, state.records)
    assert compare_main([str(run_dir), str(run_dir)]) == 0
    head, line = speed_output(capsys)
    page = paths["report.html"].read_text(encoding="utf-8")
    delta_row = page.split("<h3>Candidate against reference</h3>")[1].split("</tr>")[1]
    html = dict(zip(CLIENT_METRICS, CELL.findall(delta_row), strict=True))
    shown = [html[m] for m in HEADLINE_METRICS]
    assert line == "  C1 (3 block pairs): " + "; ".join(
        f"{SHORT_NAMES[m]} {change} % [{interval}] {word}"
        for m, (change, interval, word) in zip(HEADLINE_METRICS, shown, strict=True)
    )
    assert "slower" in line  # the candidate's 15 % is worded, in both
    manifest = json.loads(paths["manifest.json"].read_text(encoding="utf-8"))
    assert manifest["speed"] == outcome.speed_line and outcome.speed_line in page
    # The stored records are what it shows: a number changed there is the number printed.
    (level,) = read_perf_table(paths["perf.csv"]).levels
    metrics = tuple(
        dataclasses.replace(m, ratio=1.5) if m.metric == Metric.MEAN_TTFT else m
        for m in level.metrics
    )
    changed = PerfResult((dataclasses.replace(level, metrics=metrics),))
    perf_table(changed).to_csv(paths["perf.csv"], index=False)
    compare_main([str(run_dir), str(run_dir)])
    assert "TTFT +50.0 %" in speed_output(capsys)[1]


def store_records(run_dir, records):
    lines = "".join(record.to_json() + "\n" for record in records)
    (run_dir / REQUESTS_FILE).write_text(lines, encoding="utf-8")
