"""The per-level tables read the typed perf records: the candidate's change per metric with
its interval and word, the servers' own timings beside it."""

from rig.report.levels import delta_table, server_table
from rig.report.markdown import delta_md
from rig.verdict.perf_records import NOT_JUDGED, ONE_BLOCK, SLOWER, Metric, PerfResult
from tests.perf_builders import changed, perf_level


def test_a_change_shows_its_interval_and_word_and_one_block_its_reason():
    slower = changed(4, Metric.MEAN_TTFT, 12.0, (9.1, 15.2), SLOWER)
    single = changed(4, Metric.MEAN_E2EL, 5.0, None, ONE_BLOCK)
    assert delta_md(slower) == "+12.0 % [+9.1, +15.2] slower"
    assert delta_md(single) == "+5.0 % not measured (one block)"
    assert delta_md(None) == "—"
    html = delta_table((perf_level(4, slower, single, excluded=1),))
    assert '+12.0 %<small>[+9.1, +15.2]</small><small class="word">slower</small>' in html
    assert "1 left out (JIT)" in html and "unit: block" in html
    assert "TTFT mean" in html and "total tok/s" in html  # every client metric has a column


def test_the_servers_timings_show_both_sides_and_the_change_not_judged():
    gdn = changed(4, Metric.GDN_MS_PER_CALL, 100.0, (50.0, 150.0), NOT_JUDGED, (1.5, 3.0))
    perf = PerfResult((perf_level(4, gdn),))
    html = server_table(perf)
    assert "1.50 ms → 3.00 ms<small>+100.0 % [+50.0, +150.0]</small>" in html
    assert "GDN prefill per call" in html and "queue per request" in html
    assert server_table(PerfResult((perf_level(4),))) == ""  # no server published them
