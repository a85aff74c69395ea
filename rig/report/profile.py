"""The profiled block in the report: both sides' kernel groups with their candidate/reference
ratio, each side's top kernels, the traces kept and their size, in summary.md and report.html
(with a bar chart of the groups' shares). Renders only the ProfileResult verdict hands it."""

from __future__ import annotations

from rig.records import Side
from rig.report.format import cell, esc, number, table
from rig.report.plots import profile_figure
from rig.verdict.profile import TraceTable
from rig.verdict.profile_report import NOT_TIMED, ProfileResult

TOP_SHOWN = 5  # kernels per side in summary.md; report.html and profile.csv list more


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def profile_title(profile: ProfileResult) -> str:
    requests = {s.block.requests for s in profile.sides}
    count = "/".join(str(r) for r in sorted(requests))
    return (
        f"Profiled block (C={profile.level}, {count} requests a side, {profile.time_kind}): "
        f"{NOT_TIMED}."
    )


def profile_markdown(profile: ProfileResult | None) -> list[str]:
    """summary.md's lines: the groups' table, each side's top kernels, one line per side."""
    if profile is None:
        return []
    lines = [profile_title(profile), ""]
    lines += [
        "| kernel group | reference ms | share | candidate ms | share | candidate/reference |",
        "|---|---|---|---|---|---|",
    ]
    for g in profile.groups():
        lines.append(
            f"| {g.group} | {_ms(g.reference_ms)} | {_pct(g.reference_share_pct)} | "
            f"{_ms(g.candidate_ms)} | {_pct(g.candidate_share_pct)} | {_ratio(g.ratio)} |"
        )
    lines.append("")
    for side in profile.sides:
        if side.table is not None:
            top = ", ".join(
                f"{k.name.replace('|', '/')} {k.time_us / 1000:,.1f} ms"
                + (f" ({k.group})" if k.gdn else "")
                for k in side.table.kernels[:TOP_SHOWN]
            )
            lines.append(f"- {side.block.label}, top kernels: {top}")
    lines += [f"- {line}" for line in profile.lines()]
    return [*lines, ""]


def _kernel_table(table_: TraceTable) -> str:
    rows = []
    for k in table_.kernels[: TOP_SHOWN * 3]:
        share = 100 * k.time_us / table_.step_us if table_.step_us > 0 else None
        rows.append(
            cell(k.name)
            + cell(k.group)
            + cell(number(k.time_us / 1000, " ms", 2), k.time_us)
            + cell(f"{k.calls:,}", k.calls)
            + cell(_pct(share), share)
        )
    return table(["kernel", "group", "time", "calls", "share of steps"], rows)


def profile_section(profile: ProfileResult | None) -> str:
    """report.html's section: the chart, the groups' table, each side's kernels."""
    if profile is None:
        return ""
    groups = profile.groups()
    parts = ['<section id="profile"><h2>Where the time went</h2>']
    parts.append(f"<p>{esc(profile_title(profile))}</p>")
    png = profile_figure(groups)
    if png:
        parts.append(
            f'<figure><img alt="kernel groups by share of step time" '
            f'src="data:image/png;base64,{png}"><figcaption>Each side\'s kernel groups, as a '
            "share of its own profiled step time.</figcaption></figure>"
        )
    rows = [
        cell(g.group)
        + cell(_ms(g.reference_ms), g.reference_ms)
        + cell(_pct(g.reference_share_pct), g.reference_share_pct)
        + cell(_ms(g.candidate_ms), g.candidate_ms)
        + cell(_pct(g.candidate_share_pct), g.candidate_share_pct)
        + cell(_ratio(g.ratio), g.ratio)
        for g in groups
    ]
    headers = ["group", "reference ms", "share", "candidate ms", "share", "cand/ref"]
    parts.append(table(headers, rows))
    parts.append("<ul>" + "".join(f"<li>{esc(line)}</li>" for line in profile.lines()) + "</ul>")
    for side_name in (Side.REFERENCE, Side.CANDIDATE):
        side = profile.side(side_name)
        if side is not None and side.table is not None:
            parts.append(f"<h3>{esc(side.block.label)}: top kernels</h3>")
            parts.append(_kernel_table(side.table))
    traces = [t for s in profile.sides for t in s.traces]
    if traces:
        listed = ", ".join(f"<code>{esc(t.path)}</code> ({t.size_bytes:,} bytes)" for t in traces)
        parts.append(
            f"<p>Traces (gzipped Chrome trace JSON; Perfetto or chrome://tracing open them): "
            f"{listed}.</p>"
        )
    parts.append("</section>")
    return "\n".join(parts)
