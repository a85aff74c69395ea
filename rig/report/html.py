"""report.html: one self-contained page a reviewer opens from the pull request.

Verdict and gates first, as plain HTML that reads the same with JavaScript off; then the A/A
noise floor next to the candidate's numbers, the kernel proof and prefix-cache evidence, per
level the latency distributions and throughput of both sides (with the spread or interval over
repeats), the drift distribution, and every mismatch the way a reviewer reads it: both
completions side by side with the first divergent token marked and both sides' top-k there.

Every string that came from a model, a server or a file is HTML-escaped; the only script is the
page's own (sorting tables, filtering mismatches), and nothing is fetched from the network.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from rig.report.accuracy import accuracy_section
from rig.report.assets import POLICY, SCRIPT, STYLE
from rig.report.format import cell, check, esc, number, table
from rig.report.levels import levels_section
from rig.report.mismatches import Decode, mismatches_section
from rig.report.plots import drift_figure, margin_figure, side_margins
from rig.report.prefix_hits import hits_html
from rig.report.profile import profile_section
from rig.verdict.initial_state import ChunkedPrefill
from rig.verdict.prefix_hits import PREFIX_GATE
from rig.verdict.words import VerdictWord

# --- verdict, gates, A/A floor, proofs -----------------------------------------------------


def _verdict_class(word: VerdictWord, passed: bool) -> str:
    if word in (VerdictWord.INVALID, VerdictWord.INCOMPLETE, VerdictWord.UNCLASSIFIED):
        return "invalid"
    return "pass" if passed else "fail"


def navigation(outcome) -> str:
    """Links to the page's sections, in their order: a reviewer jumps to the mismatches."""
    mismatched = sum(1 for p in outcome.pairs if not p.identical)
    links = [
        ("gates", f"Gates ({len(outcome.verdict.failed_gates)} failed)"),
        *([("accuracy", "Accuracy")] if outcome.accuracy is not None else []),
        ("mismatches", f"Mismatches ({mismatched:,})"),
        ("levels", "Performance"),
        *([("profile", "Profile")] if outcome.profile is not None else []),
        ("drift", "Drift"),
        ("evidence", "Kernel proof"),
        ("facts", "Run facts"),
    ]
    items = " · ".join(f'<a href="#{anchor}">{esc(text)}</a>' for anchor, text in links)
    return f'<nav id="top" class="sections">{items}</nav>'


def verdict_section(outcome) -> str:
    verdict = outcome.verdict
    c = verdict.counts
    status = "PASS" if verdict.passed else "FAIL"
    lines = [
        f'<header id="verdict" class="verdict {_verdict_class(verdict.word, verdict.passed)}">',
        f'<div class="word">{esc(verdict.word)} — {status}</div>',
        f"<p>{c.pairs} request pairs: {c.divergences()}"
        + (f", {c.unclassified} unclassified (no margin measured)" if c.unclassified else "")
        + f"; {c.pathologies} pathologies; prefix-cache hits "
        f"{c.prefix_cache_hits:g}; teacher-forced drift mean {esc(number(c.drift_mean, 'nats', 4))}"
        f", max {esc(number(c.drift_max, 'nats', 4))}.</p>",
    ]
    if outcome.error:
        lines.append(f'<p class="error">Run error: {esc(outcome.error)}</p>')
    lines += [f'<p class="headline">{esc(line)}</p>' for line in outcome.headline]
    lines += [f"<p>{esc(note)}</p>" for note in verdict.notes]
    lines.append("</header>")
    rows = [
        f'<tr class="{"pass" if g.passed else "fail"}"><td class="mark">{check(g.passed)} '
        f"{'pass' if g.passed else 'FAIL'}</td><td>{esc(g.name)}</td><td>{esc(g.detail)}</td></tr>"
        for g in verdict.gates
    ]
    lines += [
        '<section id="gates"><h2>Gates</h2>',
        '<table class="gates"><thead><tr><th>result</th><th>gate</th><th>detail</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></section>",
    ]
    return "\n".join(lines)


def floor_section(outcome) -> str:
    """The candidate's text and drift numbers next to the A/A control's (the noise floor)."""
    c, a = outcome.verdict.counts, outcome.verdict.aa_counts
    rows = (
        ("request pairs", c.pairs, a and a.pairs, ""),
        ("identical", c.identical, a and a.identical, ""),
        ("near-tie divergences", c.near_tie, a and a.near_tie, ""),
        ("reference variants", c.reference_variant, a and a.reference_variant, ""),
        ("substantive divergences", c.substantive, a and a.substantive, ""),
        ("unclassified divergences", c.unclassified, a and a.unclassified, ""),
        ("gating pathologies", c.pathologies, a and a.pathologies, ""),
        ("drift mean, completion", c.drift_mean, a and a.drift_mean, "nats"),
        ("drift max, completion", c.drift_max, a and a.drift_max, "nats"),
        ("drift mean, prompt", c.prompt_drift_mean, a and a.prompt_drift_mean, "nats"),
        ("failed replays", c.drift_errors, a and a.drift_errors, ""),
    )

    def show(value, unit):
        if isinstance(value, int) and not isinstance(value, bool):
            return cell(f"{value:,}", value, "num")
        return cell(number(value, unit, 4 if unit else None), value, "num")

    body = [
        f"<tr><td>{esc(name)}</td>{show(cand, unit)}"
        + (show(aa, unit) if a is not None else "")
        + "</tr>"
        for name, cand, aa, unit in rows
    ]
    headers = ["", "candidate vs reference"] + (["A/A: reference vs itself"] if a else [])
    note = (
        "<p>The A/A control replays the reference's first-level requests on the reference "
        "server: what it measures is the noise a correct kernel cannot beat.</p>"
        if a is not None
        else "<p>No A/A control in this run (<code>control.aa: true</code> measures the noise "
        "floor).</p>"
    )
    return (
        f'<section id="floor"><h2>Text and drift against the A/A floor</h2>{note}'
        + table(headers, body, "compact")
        + "</section>"
    )


def chunked_prefill_html(chunked: ChunkedPrefill | None) -> str:
    """Each prompt's prefill chunks at the step's token budget, for the initial-state path."""
    if chunked is None:
        return "<p>Chunked prefill: the step budget is vLLM's default (not set).</p>"
    rows = [
        cell(p.prompt_id) + cell(f"{p.tokens:,}", p.tokens, "num") + cell(p.chunks, p.chunks, "num")
        for p in chunked.prompts
    ]
    return (
        f"<p>Chunked prefill: {esc(chunked.describe())}.</p><details><summary>chunks per prompt "
        f"({len(rows)})</summary>{table(['prompt', 'tokens', 'chunks'], rows, 'compact')}"
        "</details>"
    )


def evidence_section(outcome) -> str:
    """Which kernel each side ran (the plugin's proof), how many of its prefilled sequences
    started from a non-zero state, each prompt's chunks, and the prefix-cache counters."""
    kernel_rows = [
        cell(k.side, cls="nowrap")
        + cell(k.kernel, cls="nowrap")
        + cell(f"{k.calls:,}", k.calls, "num")
        + cell(k.initial_state.describe() if k.initial_state else "not counted")
        + cell(k.detail)
        for k in outcome.kernels.values()
    ]
    parts = ['<section id="evidence"><h2>Kernel proof</h2>']
    if kernel_rows:
        headers = ["side", "kernel", "prefill calls", "initial state", "detail"]
        parts.append(table(headers, kernel_rows, "compact"))
    else:
        parts.append("<p>No kernel proof (attached servers, or the run stopped early).</p>")
    parts.append(chunked_prefill_html(outcome.chunked_prefill))
    hashes = outcome.manifest.kernel_file_sha256
    if hashes:
        rows = [cell(name) + cell(digest, cls="mono") for name, digest in sorted(hashes.items())]
        parts.append(
            f"<details><summary>kernel file hashes ({len(hashes)})</summary>"
            f"{table(['file', 'sha256'], rows, 'compact')}</details>"
        )
    cache = outcome.server_deltas
    hits = sum(p.hits for p in cache)
    turns = hits_html(outcome.turn_hits, outcome.records)
    gate = next((g for g in outcome.verdict.gates if g.name == PREFIX_GATE), None)
    meaning = (
        f"conversation turns hit by design; {esc(gate.detail) if gate else 'no gate'}"
        if turns
        else "every side and level; any hit means a prefill skipped the kernel"
    )
    passed = gate.passed if gate is not None else hits == 0
    parts.append(
        f"<h2>Prefix cache</h2><p>{check(passed)} prefix-cache hits: {hits:g} in "
        f"{len(cache)} readings ({meaning}).</p>{turns}"
    )
    if cache:
        rows = [
            cell(p.server)
            + cell(p.level, p.level, "num")
            + cell(p.repeat, p.repeat, "num")
            + cell(number(p.queries, digits=0), p.queries, "num")
            + cell(number(p.hits, digits=0), p.hits, "num" + (" bad" if p.hits else ""))
            for p in cache
        ]
        readings = table(["server", "level", "repeat", "queries", "hits"], rows)
        parts.append(
            f"<details><summary>per level ({len(cache)} readings)</summary>{readings}</details>"
        )
    parts.append("</section>")
    return "\n".join(parts)


# --- drift and faults --------------------------------------------------------------------------

DRIFT_ROWS = 25


def margin_block(replayed: dict, near_tie_margin: float | None) -> str:
    """The greedy-margin CDF of both sides, or one line saying why there is none."""
    png = margin_figure(side_margins(replayed), near_tie_margin)
    if png is None:
        return "<p>No greedy margins: no completion was replayed with top-k logprobs.</p>"
    return (
        f'<figure><img alt="greedy margin distribution" src="data:image/png;base64,{png}">'
        "<figcaption>Margin of each side's best token over its runner-up at every position of "
        "the teacher-forced replay of the reference completions: "
        "positions left of the dashed near-tie margin are near-ties, where a correct kernel's "
        "rounding may flip a token, so their share says how many divergences to expect from "
        "noise alone.</figcaption></figure>"
    )


def drift_section(outcome) -> str:
    parts = ['<section id="drift"><h2>Teacher-forced drift and greedy margins</h2>']
    gates = outcome.manifest.scenario.gates
    margins = margin_block(outcome.replayed, gates.near_tie_margin)
    if not outcome.drift:
        parts += ["<p>No drift replay in this run.</p>", margins, "</section>"]
        return "\n".join(parts)
    png = drift_figure(outcome.drift, outcome.aa_drift, gates.model_dump())
    if png:
        parts.append(
            f'<figure><img alt="drift distribution" src="data:image/png;base64,{png}">'
            "<figcaption>|Δlogprob| of the reference's tokens replayed on both sides, one value "
            "per sequence.</figcaption></figure>"
        )
    parts.append(margins)
    ordered = sorted(
        outcome.drift, key=lambda d: -d.mean_abs if math.isfinite(d.mean_abs) else -math.inf
    )
    rows = [
        cell(d.prompt_id)
        + cell(f"{d.completion_tokens:,}", d.completion_tokens, "num")
        + "".join(
            cell(number(v, digits=4), v, "num")
            for v in (d.mean_abs, d.max_abs, d.p99_abs, d.prompt_mean_abs, d.prompt_max_abs)
        )
        + cell(d.nonfinite, d.nonfinite, "num" + (" bad" if d.nonfinite else ""))
        + cell(d.error or "", d.error or "")
        for d in ordered
    ]
    headers = [
        "prompt",
        "tokens",
        "mean |Δ|",
        "max |Δ|",
        "p99 |Δ|",
        "prompt mean |Δ|",
        "prompt max |Δ|",
        "non-finite",
        "error",
    ]
    parts.append(table(headers, rows[:DRIFT_ROWS]))
    if len(rows) > DRIFT_ROWS:
        parts.append(
            f"<details><summary>the other {len(rows) - DRIFT_ROWS} sequences</summary>"
            f"{table(headers, rows[DRIFT_ROWS:])}</details>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def faults_section(outcome) -> str:
    if not outcome.faults:
        return ""
    rows = [
        cell(f.server)
        + cell(f.level, f.level, "num")
        + cell(f.kind)
        + cell(f.line, cls="mono")
        + cell(f.failed_requests, cls="mono")
        for f in outcome.faults
    ]
    return (
        '<section id="faults"><h2>Server-log faults</h2>'
        + table(["server", "level", "kind", "log line", "failed requests"], rows)
        + "</section>"
    )


# --- the run's facts and the page --------------------------------------------------------------


def facts_section(outcome) -> str:
    manifest = outcome.manifest
    rows = [
        ("model", manifest.model_path or manifest.scenario.model.name),
        ("versions", ", ".join(f"{k} {v}" for k, v in manifest.versions.items() if v)),
        (
            "machine",
            ", ".join(f"{k} {v}" for k, v in asdict(manifest.machine).items() if v or v == 0),
        ),
        ("rig commit", manifest.rig_git.sha),
        ("timings", ", ".join(f"{k} {v:.1f} s" for k, v in outcome.timings.items())),
    ]
    body = [cell(name) + cell(value if value not in ({}, "") else None) for name, value in rows]
    return (
        '<section id="facts"><details><summary>Run facts</summary>'
        + table(["", ""], body, "compact")
        + "<p>Every file of the run (requests.csv, mismatches.csv, drift.csv, manifest.json, "
        "the server logs) sits next to this page.</p></details></section>"
    )


def render_html(outcome, decode: Decode | None = None) -> str:
    """The whole page; `decode` turns token ids into text to name and place tokens."""
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">',
            f"<title>rig {esc(outcome.run_id)}: {esc(outcome.verdict.word)}</title>",
            f"<style>{STYLE}</style></head><body>",
            f"<h1>rig: {esc(outcome.scenario_name)} <small>({esc(outcome.run_id)})</small></h1>",
            navigation(outcome),
            verdict_section(outcome),
            accuracy_section(outcome.accuracy, outcome.pairs),
            mismatches_section(outcome, decode),
            levels_section(outcome),
            profile_section(outcome.profile),
            drift_section(outcome),
            floor_section(outcome),
            evidence_section(outcome),
            faults_section(outcome),
            facts_section(outcome),
            f"<script>{SCRIPT}</script>",
            "</body></html>",
        ]
    )
