"""The profiled block in summary.md and report.html: the groups' table with their ratio, each
side's top kernels, the traces and their size, the chart, and the sentence that the block is
in no speed interval."""

from pathlib import Path

from rig.report.profile import profile_markdown, profile_section
from rig.verdict.profile_report import (
    NOT_TIMED,
    ProfiledBlock,
    ProfileResult,
    TraceFile,
    side_profile,
)

STORED = Path(__file__).parents[1] / "verdict" / "data" / "cpu-ns4-trace.json.gz"


def result() -> ProfileResult:
    data = STORED.read_bytes()
    sides = tuple(
        side_profile(
            ProfiledBlock(side, side, 4, 6, 0, 1.5, 0.2),
            [(TraceFile(f"profile/{side}/t.pt.trace.json.gz", len(data)), data)],
        )
        for side in ("reference", "candidate")
    )
    return ProfileResult(4, sides)


def test_summary_md_gives_the_groups_the_top_kernels_and_the_traces():
    lines = profile_markdown(result())
    text = "\n".join(lines)
    assert lines[0] == f"Profiled block (C=4, 6 requests a side, CPU ops' self time): {NOT_TIMED}."
    assert "| GDN prefill: ns4 |" in text and "| 1x |" in text  # the same trace on both sides
    assert "- reference, top kernels: vLLM step (outside ops)" in text
    assert "1 trace(s), 0.09 MiB gzipped" in text
    assert profile_markdown(None) == []


def test_report_html_has_the_chart_the_tables_and_the_trace_sizes():
    page = profile_section(result())
    assert page.startswith('<section id="profile">') and page.endswith("</section>")
    assert 'src="data:image/png;base64,' in page
    assert "reference: top kernels" in page and "candidate: top kernels" in page
    assert f"({STORED.stat().st_size:,} bytes)" in page
    assert "&lt;" not in NOT_TIMED and NOT_TIMED in page
    assert profile_section(None) == ""
