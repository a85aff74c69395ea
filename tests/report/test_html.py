import dataclasses
import math
import re

import pytest

from kernels.proof import InitialStateCounts
from rig.report.format import missing, number
from rig.report.html import evidence_section, render_html
from rig.report.levels import delta_table
from rig.report.mismatches import divergent_span, prompt_category
from rig.verdict.initial_state import ChunkedPrefill, PromptChunks
from rig.verdict.perf import perf_result
from rig.verdict.perf_records import NOISE, Metric, MetricComparison
from tests.report_synthetic import LONG_TEXT, XSS_IMG, XSS_SCRIPT, synthetic_outcome


@pytest.fixture(scope="module")
def synthetic(make_record, tmp_path_factory):
    return synthetic_outcome(make_record, tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def page(synthetic):
    outcome, vocabulary = synthetic
    return render_html(outcome, vocabulary.decode)


def visible_text(page: str) -> str:
    body = re.sub(r"<(script|style)>.*?</\1>", "", page, flags=re.S)
    return re.sub(r"<[^>]+>", " ", body)


def test_numbers_carry_units_and_blanks_are_dashes():
    assert number(1234.6, "ms") == "1,235 ms"
    assert number(12.345, "ms") == "12.3 ms"
    assert number(0.5, "nats") == "0.50 nats"
    assert number(0.0001234, "nats") == "0.0001 nats"
    assert number(-0.0001, digits=3) == "0.000" and number(-0.5, digits=3) == "-0.500"
    assert number(None, "ms") == number(math.nan) == "—"
    assert missing(None) and missing(math.nan) and not missing(0.0)


def test_no_python_literals_reach_the_page(page):
    text = visible_text(page)
    for literal in ("True", "False", "None", "nan", "NaN"):
        assert not re.search(rf"\b{literal}\b", text), literal


def test_gates_read_as_check_marks(synthetic, page):
    outcome, _ = synthetic
    for gate in outcome.verdict.gates:
        mark = "✓ pass" if gate.passed else "✗ FAIL"
        assert f'<td class="mark">{mark}</td><td>{gate.name}</td>' in page


def test_model_output_and_server_text_are_escaped(page):
    for raw in (XSS_IMG, XSS_SCRIPT, "<b>boom</b>", "<b>plugin</b>", "<b>Traceback</b>"):
        assert raw not in page
    assert "src=x onerror=&quot;window.__rigXss=1&quot;&gt;" in page
    assert "&lt;script&gt;window.__rigXss=2&lt;/script&gt;" in page
    assert page.lower().count("<script") == 1


def test_the_page_fetches_nothing(page):
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "default-src 'none'" in page


def test_the_divergent_token_is_marked_whole_when_the_tokenizer_places_it(synthetic, page):
    outcome, vocabulary = synthetic
    pair = next(p for p in outcome.pairs if p.request_id == "c4-r0-0000")
    reference = next(r for r in outcome.records if r.request_id == pair.request_id)
    span = divergent_span(reference, pair, vocabulary.decode)
    assert reference.text[span.start : span.end] == "42 "
    without = divergent_span(reference, pair, None)
    assert (without.start, without.end) == (span.start, span.start + 1)
    assert "is <mark>42 </mark>and" in page


def test_top_k_of_both_sides_at_the_divergence(page):
    # the near-tie: each side's token first in its own top-k, the other's second
    assert "top-k at token 8: &#x27;reasons␣&#x27; (id 8) chosen" in page
    assert "top-k at token 8: &#x27;reasoning␣&#x27; (id 11) chosen" in page
    assert '<tr class="other-side"><td data-sort="2" class="num">2</td>' in page


def card(page: str, attribute: str) -> str:
    """The first mismatch card whose opening tag holds `attribute`."""
    cards = page.split('<details class="mismatch"')[1:]
    return next(c for c in cards if attribute in c.split(">", 1)[0])


def test_a_pathology_without_divergence_marks_nothing(page):
    pathology = card(page, 'data-label="pathology"')
    assert "<mark" not in pathology
    assert "http_500: &lt;b&gt;boom&lt;/b&gt;" in pathology


def test_long_completions_are_folded_around_the_divergence(page):
    long = card(page, 'data-category="long"')
    assert f"whole completion ({len(LONG_TEXT):,} characters)" in long
    window = long.split("<details class='whole'>")[0]
    assert len(visible_text(window)) < len(LONG_TEXT) / 2


def test_cards_carry_what_the_filters_select(page):
    labels = re.findall(r'data-level="(\d+)" data-category="(\w+)" data-label="([\w-]+)"', page)
    assert ("1", "coding", "near-tie") in labels
    assert ("4", "math", "substantive") in labels
    assert ("4", "chat", "pathology") in labels
    assert labels[0][2] == "substantive"  # substantive first
    assert '<select name="category"><option value="">all</option>' in page


def test_prompt_category_prefers_the_recorded_one():
    assert prompt_category("math-03", {}) == "math"
    assert prompt_category("long-1000-0", {}) == "long"
    assert prompt_category("q7", {"q7": "chat"}) == "chat"


def test_per_level_changes_show_their_interval_and_word(synthetic, page):
    perf = synthetic[0].perf
    assert perf == perf_result(synthetic[0].records)  # the outcome's, computed once
    assert delta_table(perf.levels) in page
    level = perf.candidate[0]
    ttft = MetricComparison(level.level, Metric.MEAN_TTFT, 1.01, (0.97, 1.04), NOISE)
    others = tuple(m for m in level.metrics if m.metric != Metric.MEAN_TTFT)
    with_ci = dataclasses.replace(level, metrics=(ttft, *others))
    shown = '+1.0 %<small>[-3.0, +4.0]</small><small class="word">within noise</small>'
    assert shown in delta_table((with_ci,))
    assert 'class="num delta-within-noise"' in delta_table((with_ci,))
    assert "a positive latency change is slower" in page


def test_a_run_without_aa_says_how_to_get_the_floor(make_record, tmp_path):
    outcome, _ = synthetic_outcome(make_record, tmp_path, with_aa=False)
    page = render_html(dataclasses.replace(outcome, records=[], pairs=[], perf=perf_result([])))
    assert "No A/A control in this run" in page
    assert "No request finished." in page


def test_greedy_margins_are_drawn_next_to_the_drift(page):
    drift = page.split('<section id="drift">')[1].split("</section>")[0]
    assert 'alt="drift distribution"' in drift
    assert 'alt="greedy margin distribution"' in drift
    assert "where a correct kernel's rounding may flip a token" in drift


def test_a_run_without_a_replay_says_there_are_no_margins(make_record, tmp_path):
    outcome, _ = synthetic_outcome(make_record, tmp_path)
    outcome.replayed = {}
    outcome.drift = []
    page = render_html(outcome)
    drift = page.split('<section id="drift">')[1].split("</section>")[0]
    assert 'alt="greedy margin distribution"' not in drift
    assert "No greedy margins: no completion was replayed with top-k logprobs." in drift
    assert "No drift replay in this run." in drift


def test_the_kernel_proof_shows_each_sides_initial_state_and_the_chunks(synthetic):
    outcome, _ = synthetic
    counts = InitialStateCounts(3, 5, 700, 9, 1000)
    kernels = {
        "reference": dataclasses.replace(outcome.kernels["reference"], initial_state=counts),
        "candidate": outcome.kernels["candidate"],
    }
    chunked = ChunkedPrefill(256, (PromptChunks("long", 2410, 10),))
    section = evidence_section(
        dataclasses.replace(outcome, kernels=kernels, chunked_prefill=chunked)
    )
    text = visible_text(section)
    assert "<th>initial state</th>" in section
    assert "5 of 9 prefilled sequences started from a non-zero state (700 of 1,000 tokens" in text
    assert "not counted" in text  # the candidate's proof carried no count
    assert "1 of 1 prompts take several prefill steps at a budget of 256 tokens" in text
    assert "the step budget is vLLM's default" in visible_text(evidence_section(outcome))
