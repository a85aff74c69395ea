import json
import xml.etree.ElementTree as ET

import pandas as pd

from rig.records import JIT_COMPILE, LevelFault, ServerDelta, TokenLogprob
from rig.report.files import render_junit
from rig.scenario.gates_config import GatesConfig
from rig.verdict.compare import compare_pairs
from rig.verdict.drift import DriftResult
from rig.verdict.evidence import Evidence, SideKernel
from rig.verdict.gates import decide
from rig.verdict.outcome import RunOutcome
from tests.report_synthetic import unit_manifest

SCRIPT = "<script>alert(1)</script>"
KERNELS = {
    "reference": SideKernel("reference", "fla", 10, "vLLM's own"),
    "candidate": SideKernel("candidate", "ns4", 10, "<i>plugin</i>"),
}
REPORT_FILES = {
    "requests.csv",
    "summary.csv",
    "perf.csv",
    "profile.csv",
    "mismatches.csv",
    "drift.csv",
    "accuracy.csv",
    "summary.md",
    "report.html",
    "junit.xml",
    "manifest.json",
}


def near_tie_pair(make_record):
    ref = make_record("reference", "q4", text="yes.", token_ids=[5])
    cand = make_record("candidate", "q4", text="no.", token_ids=[6])
    return ref, cand


# Both sides' replay along the near-tie pair's reference completion (the timed records carry
# no logprobs): each side's top-k at the divergent token.
# The substantive pair's (q1): the reference was sure of its second token.
SURE = [TokenLogprob(7, -0.01, {7: -0.01, 3: -6.0}), TokenLogprob(8, -0.02, {8: -0.02, 9: -5.0})]
REPLAYED = {
    "reference": {
        ("p0", (5,)): [TokenLogprob(5, -0.6, {5: -0.6, 6: -0.7})],
        ("p1", (7, 8)): SURE,
    },
    "candidate": {
        ("p0", (5,)): [TokenLogprob(5, -0.66, {6: -0.65, 5: -0.66})],
        ("p1", (7, 8)): SURE,
    },
}


def build_outcome(make_record, tmp_path, records=None) -> RunOutcome:
    """Five request pairs: identical, substantive (with a script tag), candidate http error,
    both timed out, near-tie."""
    if records is None:
        error = "http_500: <img src=x onerror=alert(2)>"
        timeout = "timeout: no complete response within 5 s"
        records = [
            make_record("reference", "q0", text="same answer"),
            make_record("candidate", "q0", text="same answer"),
            make_record("reference", "q1", "The answer is 4.", prompt_id="p1", token_ids=[7, 8]),
            make_record(
                "candidate", "q1", f"The answer is {SCRIPT}", prompt_id="p1", token_ids=[7, 9]
            ),
            make_record("reference", "q2", text="fine"),
            make_record("candidate", "q2", text="", error=error, http_status=500),
            make_record("reference", "q3", text="", error=timeout),
            make_record("candidate", "q3", text="", error=timeout),
            *near_tie_pair(make_record),
        ]
    reference = [r for r in records if r.side == "reference"]
    candidate = [r for r in records if r.side == "candidate"]
    pairs = compare_pairs(reference, candidate, 0.25, max_tokens=64, replayed=REPLAYED)
    drift = [
        DriftResult("p0", 5, 0.02, 0.01, 0.02, 0.0, 0.0, 0),
        DriftResult("p1", 0, *[float("nan")] * 5, 0, error=f"RuntimeError: {SCRIPT}"),
    ]
    verdict = decide(Evidence(GatesConfig(), pairs, KERNELS, drift, requested_kernel="ns4"))
    return RunOutcome(
        run_id="run-1",
        run_dir=tmp_path / "run-1",
        scenario_name="unit",
        manifest=unit_manifest(),
        records=records,
        pairs=pairs,
        drift=drift,
        server_deltas=[ServerDelta("reference", 1, 0, 12.0, 0.0)],
        faults=[
            LevelFault("candidate", 1, "traceback", "<b>Traceback</b> (most recent call)"),
            LevelFault("reference", 4, JIT_COMPILE, "triton compile during inference: k"),
        ],
        kernels=KERNELS,
        verdict=verdict,
        timings={"wall_s": 1.5},
    )


def test_every_file_is_written(outcome, written):
    assert set(written) == REPORT_FILES
    for name, path in written.items():
        assert path == outcome.run_dir / name
        assert path.is_file() and path.stat().st_size > 0, name


def test_csv_files_hold_one_row_per_thing(outcome, written):
    assert len(pd.read_csv(written["requests.csv"])) == len(outcome.records) == 10
    mismatches = pd.read_csv(written["mismatches.csv"])
    assert sorted(mismatches["request_id"]) == ["q1", "q2", "q3", "q4"]
    assert len(pd.read_csv(written["drift.csv"])) == 2
    summary = pd.read_csv(written["summary.csv"])
    assert sorted(summary["side"]) == ["candidate", "reference"]
    assert {"mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "total_token_throughput"} <= set(
        summary.columns
    )
    perf = pd.read_csv(written["perf.csv"])
    assert {"mean_ttft_ms_ratio", "mean_ttft_ms_change_pct", "mean_ttft_ms_word"} <= set(
        perf.columns
    )


def test_one_vllm_style_result_per_side_and_level(outcome, written):
    bench = outcome.run_dir / "bench"
    names = sorted(p.name for p in bench.iterdir())
    assert names == [
        f"{side}-c{level}.json"
        for side in ("candidate", "reference")
        for level in sorted({r.level for r in outcome.records})
    ]
    result = json.loads((bench / names[0]).read_text(encoding="utf-8"))
    assert result["completed"] == len(result["ttfts"]) - result["failed"]


# --- HTML --------------------------------------------------------------------------------------


def test_html_escapes_model_output(written):
    page = written["report.html"].read_text(encoding="utf-8")
    assert SCRIPT not in page
    assert page.lower().count("<script") == 1  # the page's own, for sorting and filtering
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_html_escapes_errors_faults_and_kernel_details(written):
    page = written["report.html"].read_text(encoding="utf-8")
    for raw in ("<img src=x", "<b>Traceback</b>", "<i>plugin</i>"):
        assert raw not in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&lt;b&gt;Traceback&lt;/b&gt;" in page


def test_html_marks_the_first_differing_character(written):
    page = written["report.html"].read_text(encoding="utf-8")
    # q1 parts at "4" / "<": the mark wraps exactly that character on each side
    assert "The answer is <mark>4</mark>." in page
    assert "The answer is <mark>&lt;</mark>script&gt;" in page


def test_html_leads_with_the_verdict_then_gates_mismatches_performance_drift(outcome, written):
    page = written["report.html"].read_text(encoding="utf-8")
    heading = f"{outcome.verdict.word} — {'PASS' if outcome.verdict.passed else 'FAIL'}"
    assert heading in page
    order = [page.index(heading)] + [
        page.index(f'<section id="{name}"') for name in ("gates", "mismatches", "levels", "drift")
    ]
    assert order == sorted(order)
    nav = page[page.index('<nav id="top"') : page.index("</nav>")]
    for anchor in ("#gates", "#mismatches", "#levels", "#drift"):
        assert f'href="{anchor}"' in nav
    assert 'class="headline">speed:' in page


# --- JUnit -------------------------------------------------------------------------------------


def junit_cases(path):
    suite = ET.fromstring(path.read_bytes())
    cases = {(case.get("classname"), case.get("name")): case for case in suite.iter("testcase")}
    return suite, cases


def test_junit_has_one_testcase_per_pair_and_per_gate(outcome, written):
    suite, cases = junit_cases(written["junit.xml"])
    pair_cases = sorted(name for cls, name in cases if cls == "rig.pairs.c1")
    gate_cases = sorted(name for cls, name in cases if cls == "rig.gates")
    assert pair_cases == ["q0", "q1", "q2", "q3", "q4"]
    assert gate_cases == sorted(g.name for g in outcome.verdict.gates)
    assert int(suite.get("tests")) == len(cases) == 5 + len(outcome.verdict.gates)


def test_junit_manifest_and_exit_code_agree(outcome, written):
    suite, _ = junit_cases(written["junit.xml"])
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    manifest = json.loads(written["manifest.json"].read_text())
    expected = int(outcome.verdict.exit_code(outcome.error))
    assert properties == {"verdict": outcome.verdict.word, "exit_code": str(expected)}
    assert manifest["exit_code"] == expected
    assert manifest["verdict"]["word"] == outcome.verdict.word


def test_junit_failures_where_expected(outcome, written):
    suite, cases = junit_cases(written["junit.xml"])
    failed = {key for key, case in cases.items() if case.find("failure") is not None}
    expected_pairs = {("rig.pairs.c1", q) for q in ("q1", "q2", "q3")}
    expected_gates = {("rig.gates", g.name) for g in outcome.verdict.failed_gates}
    assert expected_gates  # substantive divergence, pathologies and drift fail here
    assert failed == expected_pairs | expected_gates
    assert int(suite.get("failures")) == len(failed)
    substantive = cases[("rig.pairs.c1", "q1")].find("failure").get("message")
    assert "substantive divergence at token" in substantive
    assert "http_500" in cases[("rig.pairs.c1", "q2")].find("failure").get("message")
    near_tie = cases[("rig.pairs.c1", "q4")]
    assert "near-tie" in near_tie.find("system-out").text


def test_junit_for_a_reference_only_failure(make_record, tmp_path):
    """A pair with no divergence and nothing wrong on the candidate (the reference timed out)
    used to crash the JUnit writer; it fails like the verdict counts it."""
    records = [
        make_record("reference", "q0", text="", error="timeout: slow"),
        make_record("candidate", "q0", text="fine"),
    ]
    outcome = build_outcome(make_record, tmp_path, records)
    suite = ET.fromstring(render_junit(outcome))
    (case,) = [c for c in suite.iter("testcase") if c.get("name") == "q0"]
    assert "reference timeout" in case.find("failure").get("message")


def test_junit_passes_when_everything_is_identical(make_record, tmp_path):
    records = [make_record(side, "q0", text="same") for side in ("reference", "candidate")]
    outcome = build_outcome(make_record, tmp_path, records)
    outcome.verdict = decide(
        Evidence(GatesConfig(), outcome.pairs, KERNELS, requested_kernel="ns4")
    )
    suite = ET.fromstring(render_junit(outcome))
    assert suite.get("failures") == "0"
    assert not list(suite.iter("failure"))


# --- Markdown and manifest ---------------------------------------------------------------------


def huge_run(make_record, tmp_path, levels: int, per_level: int) -> RunOutcome:
    """Every pair diverges, with long texts and a huge error message."""
    records = []
    for level in range(1, levels + 1):
        for index in range(per_level):
            request_id = f"c{level}-r0-{index:04d}"
            fields = {"level": level, "index": index, "prompt_id": f"math-{index:02d}"}
            text = "x" * 3000
            records.append(make_record("reference", request_id, text=text + "a", **fields))
            records.append(make_record("candidate", request_id, text=text + "b", **fields))
    outcome = build_outcome(make_record, tmp_path, records)
    outcome.error = "server died: " + "traceback line\n" * 20_000
    return outcome


def test_manifest_is_json_with_the_verdict(outcome, written):
    manifest = json.loads(written["manifest.json"].read_text(encoding="utf-8"))
    assert manifest["scenario"]["name"] == "unit"  # what run.py put there is kept
    assert manifest["versions"] == {"vllm": "0.32.0"} and manifest["rig_git"]["dirty"] is False
    assert manifest["verdict"]["word"] == outcome.verdict.word
    assert manifest["verdict"]["passed"] is outcome.verdict.passed
    assert [g["name"] for g in manifest["verdict"]["gates"]] == [
        g.name for g in outcome.verdict.gates
    ]
    assert manifest["verdict"]["counts"]["pairs"] == 5
    assert manifest["verdict"]["aa_counts"] is None  # no A/A control in this run
    assert manifest["kernels"]["candidate"]["kernel"] == "ns4"
    assert manifest["timings"] == {"wall_s": 1.5}


def test_junit_stays_parseable_with_control_characters_in_an_error(make_record, tmp_path):
    records = [
        make_record("reference", "q0", text="fine"),
        make_record("candidate", "q0", text="", error="http_502: \x1b[31mbad gateway\x00\x1b[0m"),
    ]
    suite = ET.fromstring(render_junit(build_outcome(make_record, tmp_path, records)))
    (case,) = [c for c in suite.iter("testcase") if c.get("name") == "q0"]
    message = case.find("failure").get("message")
    assert "bad gateway" in message
    assert "\x1b" not in message and "\x00" not in message
