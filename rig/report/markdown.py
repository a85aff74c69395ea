"""summary.md: what fits in a pull-request comment (GitHub's 65,536 characters): the headline and
the verdict first, the gates, the per-level table and the first mismatches, each line clipped."""

from __future__ import annotations

import re

from rig.records import Side
from rig.report.accuracy import accuracy_markdown
from rig.report.format import DASH, check, missing, number
from rig.report.mismatches import mismatch_order
from rig.report.prefix_hits import hits_markdown
from rig.report.profile import profile_markdown
from rig.verdict.compare import PairResult
from rig.verdict.evidence import SideKernel
from rig.verdict.metrics import LevelSide
from rig.verdict.outcome import RunOutcome
from rig.verdict.perf_records import SERVER_METRICS, Metric, MetricComparison, PerfResult
from rig.verdict.words import Verdict

# The metrics a level's Markdown row shows, and the names the A/A floor's and a planted
# slowdown's lines give them.
ROW_DELTAS = (Metric.MEAN_TTFT, Metric.MEAN_E2EL, Metric.TOTAL_TOKEN_THROUGHPUT)
FLOOR_NAMES = {
    Metric.MEAN_TTFT: "TTFT",
    Metric.MEAN_E2EL: "E2EL",
    Metric.TOTAL_TOKEN_THROUGHPUT: "tok/s",
}
SUMMARY_MD_LIMIT = 65_536  # GitHub's limit on a comment's body, in characters
LINE_LIMIT = 1_000  # one gate detail or error line at most
MISMATCHES_LISTED = 10
DETAIL_POINTER = "report.html and mismatches.csv next to this summary"


def _fmt(value: float | None, digits: int = 1) -> str:
    if missing(value):
        return DASH
    return f"{value:.{digits}f}"


def _clip(line: str, limit: int = LINE_LIMIT) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _verdict_lines(verdict: Verdict, headline: list[str] = ()) -> list[str]:
    c = verdict.counts
    lines = [
        f"**Verdict: {verdict.word}** — {'PASS' if verdict.passed else 'FAIL'}",
        "",
        *(f"{line}  " for line in headline),
        "",
        f"{c.pairs} pairs: {c.divergences()} divergences"
        + (f", {c.unclassified} unclassified (no margin measured)" if c.unclassified else "")
        + f"; {c.pathologies} pathologies; "
        f"prefix-cache hits {c.prefix_cache_hits:g}; teacher-forced drift mean "
        f"{_fmt(c.drift_mean, 4)}, max {_fmt(c.drift_max, 4)}.",
    ]
    if verdict.aa_counts is not None:
        a = verdict.aa_counts
        lines.append(
            f"A/A noise floor: {a.pairs} pairs, {a.divergences()}"
            + (f", {a.unclassified} unclassified" if a.unclassified else "")
            + f"; drift mean {_fmt(a.drift_mean, 4)}, "
            f"max {_fmt(a.drift_max, 4)}."
        )
    lines += list(verdict.notes)
    lines += ["", "| gate | result | detail |", "|---|---|---|"]
    lines += [
        f"| {_cell_md(g.name)} | {check(g.passed)} {'pass' if g.passed else '**FAIL**'} "
        f"| {_cell_md(g.detail)} |"
        for g in verdict.gates
    ]
    return [_clip(line) for line in lines]


def _cell_md(value: object) -> str:
    return _clip(_md_text(str(value)).replace("|", "\\|").replace("\n", " "), 300)


def delta_md(compared: MetricComparison | None) -> str:
    """Candidate - reference in percent, its interval and the word (faster, slower, within
    noise, or why there is none), e.g. `+12.0 % [+9.1, +15.2] slower`."""
    if compared is None or missing(compared.change_pct):
        return DASH
    text = f"{compared.change_pct:+.1f} %"
    if compared.interval_pct is not None:
        low, high = compared.interval_pct
        text += f" [{low:+.1f}, {high:+.1f}]"
    return f"{text} {compared.word}".rstrip()


def _level_lines(levels: tuple[LevelSide, ...], perf: PerfResult) -> list[str]:
    """One Markdown row per level and side."""
    header = [
        "| level | side | ok | identical | TTFT mean | E2EL mean | total tok/s "
        "| TTFT cand−ref [CI] | E2EL cand−ref | tok/s cand−ref |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for found in levels:
        matches = found.matches
        candidate = found.side == Side.CANDIDATE
        ttft, e2el, tokens = (
            delta_md(perf.get(found.level, m) if candidate else None) for m in ROW_DELTAS
        )
        rows.append(
            f"| {found.level} | {found.side} | {found.completed}/{found.requests} "
            f"| {DASH if matches is None or not candidate else matches} "
            f"| {number(found.mean(lambda b: b.ttft.mean), 'ms')} "
            f"| {number(found.mean(lambda b: b.e2el.mean), 'ms')} "
            f"| {number(found.mean(lambda b: b.total_token_throughput))} "
            f"| {ttft} | {e2el} | {tokens} |"
        )
    return header + rows


def _mismatch_line(pair: PairResult) -> str:
    d = pair.divergence
    if d is None:
        return _clip(
            f"- `{pair.request_id}` ({_md_text(pair.prompt_id)}): {_md_text(_pathology_text(pair))}"
        )
    where = f"token {d.token_index}" if d.token_index is not None else f"char {d.char_index}"
    return _clip(
        f"- `{pair.request_id}` ({_md_text(pair.prompt_id)}, C={pair.level}) {d.kind} at "
        f"{where}, margin {_fmt(d.reference_margin, 3)}: ref "
        f"`{_inline(d.reference_excerpt)}` / cand `{_inline(d.candidate_excerpt)}`"
    )


def _md_text(text: str) -> str:
    """Text from a server or a model outside code spans: nothing that opens an HTML tag
    reaches the comment (a bare `<=` stays readable)."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def _fit(lines: list[str], budget: int, what: str) -> list[str]:
    """As many of `lines` as fit in `budget` characters; a count of the rest points at the
    full report."""
    kept, used = [], 0
    for index, line in enumerate(lines):
        rest = len(lines) - index
        note = f"… {rest} more {what}: see {DETAIL_POINTER}."
        if used + len(line) + 1 + len(note) + 1 > budget:
            return kept + [note]
        kept.append(line)
        used += len(line) + 1
    return kept


def _initial_state_text(kernel: SideKernel) -> str:
    counts = kernel.initial_state
    if counts is None:
        return ""
    return f"; {counts.sequences} of {counts.all_sequences} sequences from a non-zero state"


def render_markdown(outcome: RunOutcome) -> str:
    """summary.md: verdict, gates, per-level table and the first mismatches, never longer
    than a pull-request comment may be, whatever the size of the run."""
    head = [f"## rig: {outcome.scenario_name} ({outcome.run_id})", ""]
    if outcome.error:
        first, *more = outcome.error.strip().splitlines() or [""]
        rest = f" (+{len(more)} lines in manifest.json)" if more else ""
        head += [_clip(f"**Run error:** {_md_text(first)}") + rest, ""]
    head += _verdict_lines(outcome.verdict, [_md_text(t) for t in outcome.headline])
    kernels = ", ".join(
        f"{k.side}: {k.kernel} ({k.calls} prefill calls{_initial_state_text(k)})"
        for k in outcome.kernels.values()
    )
    head += ["", _clip(f"Kernels: {kernels or 'not proven'}"), ""]
    if outcome.chunked_prefill is not None:
        head += [_clip(f"Chunked prefill: {outcome.chunked_prefill.describe()}"), ""]
    head += accuracy_markdown(outcome.accuracy)
    head += _jit_lines(outcome.compiled_blocks)
    perf = outcome.perf
    head += _server_lines(perf)
    head += _aa_floor_lines(perf)
    head += _planted_lines(perf)
    head += profile_markdown(outcome.profile)
    head += hits_markdown(outcome.turn_hits)
    mismatched = sorted((p for p in outcome.pairs if not p.identical), key=mismatch_order)
    footer = ["", f"Full detail: {DETAIL_POINTER} (`results/{outcome.run_id}/`)."]
    budget = SUMMARY_MD_LIMIT - sum(len(line) + 1 for line in head + footer) - 1
    sides = outcome.level_sides
    level_lines = _level_lines(sides, perf) if sides else ["(no request finished)"]
    listed = [_mismatch_line(p) for p in mismatched[:MISMATCHES_LISTED]]
    more = len(mismatched) - len(listed)
    if more:
        listed.append(f"… {more} more mismatches: see {DETAIL_POINTER}.")
    title = f"First mismatches, substantive first ({len(mismatched):,} in all):"
    mismatch_block = ["", title, "", *listed]
    # Per-level rows may take what the mismatch list leaves (a run has at most a few dozen).
    levels = _fit(level_lines, budget - sum(len(x) + 1 for x in mismatch_block), "per-level rows")
    body = levels + (
        _fit(mismatch_block, budget - sum(len(x) + 1 for x in levels), "mismatches")
        if mismatched
        else []
    )
    text = "\n".join(head + body + footer) + "\n"
    return text[:SUMMARY_MD_LIMIT]


def _aa_floor_lines(perf: PerfResult) -> list[str]:
    """The A/A performance floor: what identical kernels measure as a change."""
    lines = []
    for level in perf.aa:
        metrics = ", ".join(
            f"{name} {delta_md(level.get(metric))}" for metric, name in FLOOR_NAMES.items()
        )
        lines.append(_clip(f"A/A performance floor at C={level.level}: {metrics}"))
    return [*lines, ""] if lines else []


def _planted_lines(perf: PerfResult) -> list[str]:
    """A candidate slowed on purpose: the change it planted next to the measured interval."""
    lines = []
    for level in perf.candidate:
        planted = level.planted
        if planted is None:
            continue
        parts = []
        for change in planted.changes:
            verdict = (
                "inside the interval" if change.inside_interval else "**outside the interval**"
            )
            parts.append(
                f"{FLOOR_NAMES[change.metric]} planted {change.planted_pct:+.1f} %, measured "
                f"{delta_md(level.get(change.metric))}: {verdict}"
            )
        lines.append(
            _clip(
                f"Planted slowdown at C={level.level}: "
                f"{planted.calls_per_request:.2f} GDN prefill calls per request x "
                f"{planted.delay_ms:g} ms = {planted.ms_per_request:.1f} ms per "
                f"request. {'; '.join(parts)}."
            )
        )
    return [*lines, ""] if lines else []


def _jit_lines(blocks: list[tuple[int, int, str]]) -> list[str]:
    """Blocks in which a server compiled a kernel (RunOutcome.compiled_blocks): their time
    holds the compilation, so they are left out of every speed interval (another block ran)."""
    if not blocks:
        return []
    where = ", ".join(f"C={lvl} repeat {rep} ({side})" for lvl, rep, side in blocks)
    return [
        _clip(
            f"**JIT compilation during timed blocks:** {where}: left out of the speed "
            "intervals; see report.html."
        ),
        "",
    ]


def _server_lines(perf: PerfResult) -> list[str]:
    """The servers' own timings per level: each side's mean per block, and the change."""
    lines = []
    for level in perf.candidate:
        parts = [
            f"{metric.label} {_fmt(compared.reference, 2)} → "
            f"{_fmt(compared.candidate, 2)} ms ({delta_md(compared)})"
            for metric in SERVER_METRICS
            if (compared := level.get(metric)) is not None
        ]
        if parts:
            lines.append(_clip(f"Server side at C={level.level}: " + "; ".join(parts)))
    return [*lines, ""] if lines else []


def _inline(text: str) -> str:
    return text.replace("`", "'").replace("\n", "⏎")[-60:]


def _pathology_text(pair: PairResult) -> str:
    return "; ".join(f"{p.side} {p.kind}: {p.detail}" for p in pair.pathologies) or "mismatch"
