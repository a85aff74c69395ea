"""report.html in a real browser: headless Chromium opens a report of a failing synthetic run
(mismatches, hostile model output in the completions: <script>, </textarea>, an attribute
broken out of, bidi controls; markup in server errors) and checks what a reviewer sees at
1280 px: the verdict, every gate, a highlighted divergence, working filters and sorting, model
output as text (no script run, no element injected, bidi controls shown as code points),
nothing fetched, nothing wider than the window. The
screenshots stay under the test's tmp_path."""

from __future__ import annotations

import pytest
from PIL import Image

from rig.report.files import write_report
from rig.report.format import BIDI_CONTROLS
from tests import chromium
from tests.report_synthetic import HOSTILE, XSS_SCRIPT, XSS_TEXTAREA, synthetic_outcome

WIDTH = 1280

# Runs after the page's own script; writes what it saw into <pre id=rig-browser-check>.
CHECK_SCRIPT = """
(function () {
  const r = {};
  function visible(el) {
    if (!el) return false;
    const style = getComputedStyle(el), box = el.getBoundingClientRect();
    return style.display !== "none" && style.visibility !== "hidden" && box.width > 0
      && box.height > 0 && !el.closest("[hidden]");
  }
  const verdict = document.getElementById("verdict");
  r.verdict = verdict ? verdict.querySelector(".word").textContent : null;
  r.verdictVisible = visible(verdict);
  r.gates = Array.from(document.querySelectorAll("#gates tbody tr")).filter(visible)
    .map(function (tr) { return [tr.cells[0].textContent.trim(), tr.cells[1].textContent]; });
  const marks = Array.from(document.querySelectorAll("mark")).filter(visible);
  r.marks = marks.map(function (m) { return m.textContent; });
  r.markColour = marks.length ? getComputedStyle(marks[0]).backgroundColor : null;
  r.xss = window.__rigXss === undefined ? null : window.__rigXss;
  r.injected = document.querySelectorAll("img[src='x'], [onerror]").length
    + Array.from(document.querySelectorAll("b")).filter(function (b) {
      return ["boom", "plugin", "Traceback"].indexOf(b.textContent) >= 0;
    }).length;
  r.scripts = document.scripts.length;
  r.textareas = document.querySelectorAll("textarea").length;
  r.injectedIds = document.querySelectorAll("#rig-injected").length;
  r.hostile = Array.from(document.querySelectorAll("details.mismatch")).filter(function (c) {
    return c.dataset.level === "4" && c.dataset.category === "math";
  }).map(function (c) {
    const pre = c.querySelectorAll(".side")[1].querySelector("pre");
    c.open = true;
    return {text: pre.textContent, shown: pre.innerText, visible: visible(pre)};
  });
  const bidi = /[\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069]/;
  r.bidiInPage = bidi.test(document.body.textContent);
  r.resources = performance.getEntriesByType("resource").map(function (e) { return e.name; })
    .filter(function (name) { return !name.startsWith("data:"); });
  r.sectionTops = ["verdict", "gates", "mismatches", "levels", "drift"].map(function (id) {
    return document.getElementById(id).getBoundingClientRect().top + window.scrollY;
  });
  r.navLinks = Array.from(document.querySelectorAll("nav#top a")).map(function (a) {
    return a.getAttribute("href");
  });
  r.headline = document.querySelector("#verdict .headline").textContent;
  r.innerWidth = window.innerWidth;
  r.scrollWidth = document.documentElement.scrollWidth;
  r.tooWide = Array.from(document.querySelectorAll("body *")).filter(function (el) {
    return visible(el) && el.getBoundingClientRect().right > window.innerWidth + 0.5;
  }).slice(0, 5).map(function (el) { return el.tagName + "." + el.className; });
  const cards = Array.from(document.querySelectorAll("details.mismatch"));
  function shown() {
    return cards.filter(function (c) { return !c.hidden; }).map(function (c) {
      return c.dataset.level + "/" + c.dataset.category + "/" + c.dataset.label;
    });
  }
  r.cards = shown();
  const byLabel = document.querySelector(".filters select[name=label]");
  const byLevel = document.querySelector(".filters select[name=level]");
  byLabel.value = "substantive"; byLabel.dispatchEvent(new Event("change"));
  byLevel.value = "4"; byLevel.dispatchEvent(new Event("change"));
  r.filtered = shown();
  r.filterCount = document.getElementById("filter-count").textContent;
  byLabel.value = ""; byLevel.value = ""; byLabel.dispatchEvent(new Event("change"));
  const drift = document.querySelector("#drift table.sortable");
  const header = Array.from(drift.tHead.rows[0].cells).find(function (th) {
    return th.textContent.startsWith("max |");
  });
  header.click();
  r.sortedUp = Array.from(drift.tBodies[0].rows).map(function (tr) {
    return tr.cells[header.cellIndex].dataset.sort;
  });
  header.click();
  r.sortedDown = Array.from(drift.tBodies[0].rows).map(function (tr) {
    return tr.cells[header.cellIndex].dataset.sort;
  });
  const out = document.createElement("pre");
  out.id = "rig-browser-check";
  out.textContent = JSON.stringify(r);
  document.body.appendChild(out);
})();
"""


@pytest.fixture(scope="module")
def report(make_record, tmp_path_factory):
    if chromium.binary() is None:
        pytest.fail(chromium.INSTALL_HINT)
    outcome, vocabulary = synthetic_outcome(make_record, tmp_path_factory.mktemp("run"))
    page = write_report(outcome, vocabulary.decode)["report.html"]
    return outcome, page


@pytest.fixture(scope="module")
def seen(report, tmp_path_factory):
    """What the check script saw, from the DOM Chromium dumped."""
    _, page = report
    work = tmp_path_factory.mktemp("browser")
    checked = chromium.with_check_script(page, CHECK_SCRIPT, work / "checked.html")
    return chromium.check_result(chromium.dump_dom(checked, work / "profile", width=WIDTH))


def test_verdict_and_every_gate_are_visible(report, seen):
    outcome, _ = report
    assert seen["verdictVisible"]
    assert seen["verdict"] == "NOT equivalent — FAIL"
    expected = [[f"{'✓ pass' if g.passed else '✗ FAIL'}", g.name] for g in outcome.verdict.gates]
    assert seen["gates"] == expected
    assert any(row[0] == "✗ FAIL" for row in seen["gates"])


def test_the_page_reads_headline_gates_mismatches_performance_drift(seen):
    """In Chromium's layout, top to bottom: the verdict with its speed line, the gates, the
    mismatch cards (within the first screens, not thousands of px down), then performance
    and drift; the navigation at the top links each."""
    tops = seen["sectionTops"]
    assert tops == sorted(tops), tops
    assert tops[2] < 1600, tops  # the mismatches start on the second screen at the latest
    assert seen["navLinks"][:4] == ["#gates", "#mismatches", "#levels", "#drift"]
    assert seen["headline"].startswith("speed: ")


def test_the_divergent_tokens_are_highlighted(seen):
    # whole tokens, as the vocabulary cut them: the reference's "42 " against the
    # candidate's "<img " (escaped, so shown as text), and the near-tie's two words
    assert "42 " in seen["marks"] and "<img " in seen["marks"]
    assert "reasons " in seen["marks"] and "reasoning " in seen["marks"]
    assert seen["markColour"] == "rgb(255, 183, 77)"


def test_no_script_from_model_output_ran_and_nothing_was_fetched(seen):
    assert seen["xss"] is None
    assert seen["injected"] == 0  # no <img src=x>, no onerror=, no <b> from a server error
    assert seen["scripts"] == 2  # the page's own and this test's check script
    assert seen["resources"] == []


def test_hostile_model_output_renders_as_text(seen):
    """`<script>`, a closing `</textarea>`, an attribute broken out of and bidi controls in a
    completion: the candidate's completion reads back character for character, every control
    as its visible code point, and nothing of it became an element."""
    expected = f"The answer to math-01 is {HOSTILE} indeed.".translate(
        {ord(char): f"⟨U+{ord(char):04X}⟩" for char in BIDI_CONTROLS}
    )
    assert len(seen["hostile"]) == 2  # both repeats of level 4
    for completion in seen["hostile"]:
        assert completion["visible"] and completion["text"] == expected
        assert "⟨U+202E⟩evil⟨U+202C⟩ ⟨U+2066⟩left⟨U+2069⟩" in completion["shown"]
        assert XSS_TEXTAREA in completion["shown"] and XSS_SCRIPT in completion["shown"]
    assert not seen["bidiInPage"]
    assert seen["textareas"] == 0 and seen["injectedIds"] == 0 and seen["xss"] is None


def test_nothing_overflows_at_1280_px(seen):
    assert seen["innerWidth"] == WIDTH
    assert seen["scrollWidth"] <= WIDTH, seen["tooWide"]
    assert seen["tooWide"] == []


def test_mismatch_filters_and_table_sorting_work(report, seen):
    outcome, _ = report
    mismatched = [p for p in outcome.pairs if not p.identical]
    assert len(seen["cards"]) == len(mismatched) == 7
    assert "1/coding/near-tie" in seen["cards"] and "4/chat/pathology" in seen["cards"]
    assert seen["filtered"] == ["4/math/substantive", "4/math/substantive", "4/long/substantive"]
    assert seen["filterCount"] == "3 of 7 shown"
    numbers = [float(v) for v in seen["sortedUp"] if v != ""]
    assert numbers == sorted(numbers) and seen["sortedUp"][-1] == ""  # a blank sorts last
    assert [float(v) for v in seen["sortedDown"] if v != ""] == sorted(numbers, reverse=True)


NAV = (0xE3, 0xEC, 0xF7)  # nav.sections' background


def _share(image: Image.Image, box: tuple[int, int, int, int], colour: tuple[int, int, int]):
    """Fraction of the pixels in `box` within a few levels of `colour`."""
    pixels = list(image.convert("RGB").crop(box).get_flattened_data())
    near = sum(1 for p in pixels if all(abs(a - b) <= 6 for a, b in zip(p, colour, strict=True)))
    return near / len(pixels)


@pytest.mark.parametrize("script", [True, False], ids=["javascript", "no-javascript"])
def test_screenshot_shows_the_failing_verdict_and_gates(report, tmp_path, script):
    """The red verdict banner and the red FAIL gate rows are painted with JavaScript on and
    off (the page's script only adds sorting and filters)."""
    _, page = report
    if not script:
        page = chromium.without_scripts(page, tmp_path / "report-nojs.html")
    shot = chromium.screenshot(
        page, tmp_path / f"{page.stem}.png", tmp_path / "profile", width=WIDTH, height=900
    )
    image = Image.open(shot)
    assert image.size == (WIDTH, 900)
    assert _share(image, (0, 0, WIDTH, 160), (0xFD, 0xEC, 0xEA)) > 0.2  # the verdict banner
    nav_rows = [y for y in range(0, 160) if _share(image, (0, y, WIDTH, y + 1), NAV) > 0.5]
    banner_rows = [
        y for y in range(0, 300) if _share(image, (0, y, WIDTH, y + 1), (0xFD, 0xEC, 0xEA)) > 0.5
    ]
    assert nav_rows and banner_rows and max(nav_rows) < min(banner_rows)  # navigation on top
    assert _share(image, (0, 160, WIDTH, 420), (0xFD, 0xEC, 0xEA)) > 0.05  # FAIL gate rows
