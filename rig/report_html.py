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

import base64
import hashlib
import math

import pandas as pd

from rig.records import RequestRecord
from rig.report_format import DASH, cell, check, esc, missing, number, table
from rig.report_mismatches import Decode, mismatches_section
from rig.report_plots import drift_figure, level_figure, margin_figure, side_margins

# (column of summary.csv, header, unit) of the per-level table
LEVEL_COLUMNS = (
    ("mean_ttft_ms", "TTFT mean", "ms"),
    ("p99_ttft_ms", "TTFT p99", "ms"),
    ("mean_itl_ms", "ITL mean", "ms"),
    ("p99_itl_ms", "ITL p99", "ms"),
    ("mean_e2el_ms", "E2EL mean", "ms"),
    ("p99_e2el_ms", "E2EL p99", "ms"),
    ("output_throughput", "output", "tok/s"),
    ("total_token_throughput", "total", "tok/s"),
)
# (column stem of perf.csv, header) of the candidate-vs-reference table
DELTA_COLUMNS = (
    ("mean_ttft_ms", "TTFT mean"),
    ("median_ttft_ms", "TTFT median"),
    ("p99_ttft_ms", "TTFT p99"),
    ("mean_tpot_ms", "TPOT mean"),
    ("mean_itl_ms", "ITL mean"),
    ("mean_e2el_ms", "E2EL mean"),
    ("request_throughput", "requests/s"),
    ("output_throughput", "output tok/s"),
    ("total_token_throughput", "total tok/s"),
)

# --- verdict, gates, A/A floor, proofs -----------------------------------------------------


def _verdict_class(word: str, passed: bool) -> str:
    if word == "INVALID":
        return "invalid"
    return "pass" if passed else "fail"


def verdict_section(outcome) -> str:
    verdict = outcome.verdict
    c = verdict.counts
    status = "PASS" if verdict.passed else "FAIL"
    lines = [
        f'<header id="verdict" class="verdict {_verdict_class(verdict.word, verdict.passed)}">',
        f'<div class="word">{esc(verdict.word)} — {status}</div>',
        f"<p>{c.pairs} request pairs: {c.identical} identical, {c.near_tie} near-tie, "
        f"{c.substantive} substantive; {c.pathologies} pathologies; prefix-cache hits "
        f"{c.prefix_cache_hits:g}; teacher-forced drift mean {esc(number(c.drift_mean, 'nats', 4))}"
        f", max {esc(number(c.drift_max, 'nats', 4))}.</p>",
    ]
    if outcome.error:
        lines.append(f'<p class="error">Run error: {esc(outcome.error)}</p>')
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
        ("substantive divergences", c.substantive, a and a.substantive, ""),
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


def evidence_section(outcome) -> str:
    """Which kernel each side ran (the plugin's proof) and the prefix-cache counters."""
    kernel_rows = [
        cell(k.side, cls="nowrap")
        + cell(k.kernel, cls="nowrap")
        + cell(f"{k.calls:,}", k.calls, "num")
        + cell(k.detail)
        for k in outcome.kernels.values()
    ]
    parts = ['<section id="evidence"><h2>Kernel proof</h2>']
    if kernel_rows:
        parts.append(table(["side", "kernel", "prefill calls", "detail"], kernel_rows, "compact"))
    else:
        parts.append("<p>No kernel proof (attached servers, or the run stopped early).</p>")
    hashes = outcome.manifest.get("kernel_file_sha256") or {}
    if hashes:
        rows = [cell(name) + cell(digest, cls="mono") for name, digest in sorted(hashes.items())]
        parts.append(
            f"<details><summary>kernel file hashes ({len(hashes)})</summary>"
            f"{table(['file', 'sha256'], rows, 'compact')}</details>"
        )
    cache = outcome.prefix_cache
    hits = sum(p.hits for p in cache)
    parts.append(
        f"<h2>Prefix cache</h2><p>{check(hits == 0)} prefix-cache hits: {hits:g} in "
        f"{len(cache)} readings (every side and level; any hit means a prefill skipped the "
        "kernel).</p>"
    )
    if cache:
        rows = [
            cell(p.side)
            + cell(p.level, p.level, "num")
            + cell(p.repeat, p.repeat, "num")
            + cell(number(p.queries, digits=0), p.queries, "num")
            + cell(number(p.hits, digits=0), p.hits, "num" + (" bad" if p.hits else ""))
            for p in cache
        ]
        readings = table(["side", "level", "repeat", "queries", "hits"], rows)
        parts.append(
            f"<details><summary>per level ({len(cache)} readings)</summary>{readings}</details>"
        )
    parts.append("</section>")
    return "\n".join(parts)


# --- per level -------------------------------------------------------------------------------


def _spread(values: pd.Series) -> float | None:
    values = values.dropna()
    if len(values) < 2 or values.mean() == 0:
        return None
    return float((values.max() - values.min()) / abs(values.mean()) * 100.0)


def _level_row(level: int, side: str, group: pd.DataFrame) -> str:
    """One side at one level; with repeats the mean over repeats and the spread below it."""
    cells = cell(level, level, "num") + cell(side, cls="nowrap")
    requests, ok = int(group["requests"].sum()), int(group["completed"].sum())
    cells += cell(f"{ok:,}/{requests:,}", ok, "num" + ("" if ok == requests else " bad"))
    if "matches" in group.columns and side == "candidate":
        matches, pairs = group["matches"].sum(min_count=1), group["pairs"].sum(min_count=1)
        text = DASH if missing(matches) else f"{int(matches):,}/{int(pairs):,}"
        cells += cell(text, matches, "num")
    else:
        cells += cell(DASH, None, "num")
    for column, _, unit in LEVEL_COLUMNS:
        if column not in group.columns:
            cells += cell(DASH, None, "num")
            continue
        mean = group[column].mean()
        spread = _spread(group[column])
        extra = f"<small>spread {number(spread, '%', 1)}</small>" if spread is not None else ""
        cells += cell(esc(number(mean, unit)) + extra, mean, "num", raw=True)
    return cells


def _interval(row: pd.Series, metric: str) -> str:
    """The 95% bootstrap interval of one change (`<metric>_ci_low_pct` / `_ci_high_pct`)."""
    low, high = row.get(f"{metric}_ci_low_pct"), row.get(f"{metric}_ci_high_pct")
    if not missing(low) and not missing(high):
        return f"[{low:+.1f}, {high:+.1f}]"
    return ""


def _delta_row(row: pd.Series) -> str:
    level = int(row["level"])
    cells = cell(level, level, "num") + cell(row.get("comparison", ""), cls="nowrap")
    cells += cell(int(row.get("repeats", 1)), None, "num")
    for metric, _ in DELTA_COLUMNS:
        value = row.get(f"{metric}_change_pct")
        word = str(row.get(f"{metric}_word", ""))
        interval = _interval(row, metric)
        text = esc(number(value, "%", 1) if missing(value) else f"{value:+.1f} %")
        for detail in (interval, word):
            if detail and detail != "n/a":
                text += f"<small>{esc(detail)}</small>"
        cells += cell(text, value, f"num delta-{word.replace(' ', '-')}", raw=True)
    return cells


def delta_table(deltas: pd.DataFrame) -> str:
    """Candidate vs reference per level, each change with its 95% interval and its word."""
    rows = [_delta_row(row) for _, row in deltas.iterrows()]
    return table(["level", "compared", "repeats"] + [name for _, name in DELTA_COLUMNS], rows)


def levels_section(outcome, summary: pd.DataFrame, deltas: pd.DataFrame) -> str:
    parts = ['<section id="levels"><h2>Per level</h2>']
    if summary.empty:
        parts.append("<p>No request finished.</p></section>")
        return "\n".join(parts)
    if not deltas.empty:
        parts += [
            "<h3>Candidate against reference</h3>",
            "<p>Change = candidate − reference, in percent of the reference (a positive "
            "latency change is slower, a positive throughput change faster), with its 95% "
            "bootstrap interval [low, high] over requests and repeats. An interval that "
            "includes no change is <em>within noise</em>; the A/A row (the reference server "
            "replaying a level's requests) is what identical kernels measure"
            + (
                "."
                if int(deltas["repeats"].max()) >= 2
                else "; a single run's interval covers only request-to-request variation "
                "(<code>workload.repeats: 3</code> adds the run-to-run part)."
            )
            + "</p>",
            delta_table(deltas),
        ]
    rows = [
        _level_row(level, side, group)
        for (level, side), group in summary.groupby(["level", "side"], sort=True)
    ]
    headers = ["level", "side", "ok", "identical"] + [
        f"{name} ({unit})" for _, name, unit in LEVEL_COLUMNS
    ]
    parts += ["<h3>Latency and throughput</h3>", table(headers, rows)]
    by_level: dict[int, dict[str, list[RequestRecord]]] = {}
    for record in outcome.records:
        if not record.warmup:
            by_level.setdefault(record.level, {}).setdefault(record.side, []).append(record)
    for level in sorted(by_level):
        sides = dict(sorted(by_level[level].items(), key=lambda item: item[0] != "reference"))
        level_rows = summary[summary["level"] == level]
        throughput = {
            side: level_rows[level_rows["side"] == side]["total_token_throughput"].tolist()
            for side in sides
        }
        repeats = int(level_rows["repeat"].nunique()) if "repeat" in level_rows else 1
        png = level_figure(sides, throughput)
        parts.append(
            f'<figure><img alt="latency distributions and throughput at concurrency {level}" '
            f'src="data:image/png;base64,{png}"><figcaption>Client concurrency {level}'
            f"{f', {repeats} repeats' if repeats > 1 else ''}: latency CDFs of every request "
            "(ITL: every inter-token gap) and total throughput of each repeat.</figcaption>"
            "</figure>"
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
    gates = (outcome.manifest.get("scenario") or {}).get("gates") or {}
    margins = margin_block(outcome.replayed, gates.get("near_tie_margin"))
    if not outcome.drift:
        parts += ["<p>No drift replay in this run.</p>", margins, "</section>"]
        return "\n".join(parts)
    png = drift_figure(outcome.drift, outcome.aa_drift, gates)
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
        cell(f.side)
        + cell(f.level, f.level, "num")
        + cell(f.kind)
        + cell(f.line, cls="mono")
        + cell(f.failed_requests, cls="mono")
        for f in outcome.faults
    ]
    return (
        '<section id="faults"><h2>Server-log faults</h2>'
        + table(["side", "level", "kind", "log line", "failed requests"], rows)
        + "</section>"
    )


# --- the run's facts and the page --------------------------------------------------------------


def facts_section(outcome) -> str:
    manifest = outcome.manifest
    rows = [
        ("model", manifest.get("model_path") or (manifest.get("scenario") or {}).get("model")),
        (
            "versions",
            ", ".join(f"{k} {v}" for k, v in (manifest.get("versions") or {}).items() if v),
        ),
        ("machine", manifest.get("machine")),
        ("rig commit", (manifest.get("rig_git") or {}).get("sha")),
        ("timings", ", ".join(f"{k} {v:.1f} s" for k, v in outcome.timings.items())),
    ]
    body = [cell(name) + cell(value if value not in ({}, "") else None) for name, value in rows]
    return (
        '<section id="facts"><details><summary>Run facts</summary>'
        + table(["", ""], body, "compact")
        + "<p>Every file of the run (requests.csv, mismatches.csv, drift.csv, manifest.json, "
        "the server logs) sits next to this page.</p></details></section>"
    )


STYLE = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;margin:0 auto;
 max-width:1240px;padding:0 16px 48px}
h1{font-size:20px;margin:16px 0 8px}h2{font-size:17px;margin:28px 0 8px;
 border-bottom:1px solid #ddd;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.verdict{border-radius:6px;padding:10px 16px;border:2px solid}
.verdict .word{font-size:22px;font-weight:700}.verdict p{margin:4px 0}
.verdict.pass{background:#e8f5e9;border-color:#2e7d32}.verdict.pass .word{color:#1b5e20}
.verdict.fail{background:#fdecea;border-color:#c62828}.verdict.fail .word{color:#b71c1c}
.verdict.invalid{background:#fff4e0;border-color:#e65100}.verdict.invalid .word{color:#bf360c}
table{border-collapse:collapse;width:100%;font-size:12.5px;margin:6px 0}
.nowrap{white-space:nowrap}
td,th{border:1px solid #d5d5d5;padding:3px 6px;text-align:left;vertical-align:top;
 overflow-wrap:anywhere}
th{background:#f3f3f3;font-weight:600}table.compact{width:auto;max-width:100%}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td small{display:block;color:#666;font-size:11px}
td.bad,.error{color:#b71c1c;font-weight:600}
.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
table.gates td.mark{white-space:nowrap;font-weight:700;width:7em}
tr.pass td.mark{color:#1b5e20}tr.fail td.mark{color:#b71c1c}tr.fail{background:#fdecea}
.delta-faster{color:#1b5e20}.delta-slower{color:#b71c1c}.delta-within-noise{color:#666}
.js table.sortable th{cursor:pointer}.js table.sortable th:after{content:" ↕";color:#aaa}
th[data-dir=asc]:after{content:" ↑"!important}th[data-dir=desc]:after{content:" ↓"!important}
figure{margin:10px 0}figure img{max-width:100%;height:auto;display:block}
figcaption{font-size:12px;color:#555}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:0;font:12px/1.4 ui-monospace,Menlo,
 Consolas,monospace;background:#fafafa;border:1px solid #e3e3e3;padding:6px;max-height:28em;
 overflow-y:auto}
mark{background:#ffb74d;outline:2px solid #e65100;border-radius:2px}
details.mismatch{border:1px solid #ccc;border-radius:6px;margin:8px 0;padding:4px 10px}
details.mismatch>summary{cursor:pointer;padding:4px 0}
.facts{color:#555;font-size:12px}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;font-weight:700;
 color:#fff}
.badge.substantive{background:#c62828}.badge.near-tie{background:#f9a825;color:#000}
.badge.pathology,.badge.unclassified{background:#6a1b9a}
.sides{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:12px}
.side h4{margin:4px 0}.topk-title{margin:6px 0 2px;font-size:12px}
table.topk{width:auto;max-width:100%}tr.chosen td{font-weight:700}
tr.other-side td{background:#ffe0b2}
.filters{display:none;gap:16px;align-items:center;margin:8px 0;flex-wrap:wrap}
.js .filters{display:flex}
"""

SCRIPT = """
document.documentElement.classList.add("js");
function sortKey(cell){
 const v=cell.dataset.sort!==undefined?cell.dataset.sort:cell.textContent.trim();
 if(v===""||v==="\\u2014")return null;const n=Number(v);return isNaN(n)?v:n;}
document.querySelectorAll("table.sortable th").forEach(function(th){
 th.tabIndex=0;th.title="sort";th.addEventListener("click",function(){
  const table=th.closest("table"),body=table.tBodies[0];
  const index=Array.prototype.indexOf.call(th.parentNode.children,th);
  const dir=th.dataset.dir==="asc"?"desc":"asc";
  table.querySelectorAll("th").forEach(function(h){delete h.dataset.dir;});th.dataset.dir=dir;
  const rows=Array.from(body.rows);
  rows.sort(function(a,b){const x=sortKey(a.cells[index]),y=sortKey(b.cells[index]);
   if(x===null||y===null)return (x===null)-(y===null);
   const c=(typeof x==="number"&&typeof y==="number")?x-y:String(x).localeCompare(String(y));
   return dir==="asc"?c:-c;});
  rows.forEach(function(r){body.appendChild(r);});});});
const cards=Array.from(document.querySelectorAll("details.mismatch"));
const selects=Array.from(document.querySelectorAll(".filters select"));
function applyFilters(){let shown=0;cards.forEach(function(card){
 const keep=selects.every(function(s){return !s.value||card.dataset[s.name]===s.value;});
 card.hidden=!keep;if(keep)shown++;});
 const out=document.getElementById("filter-count");
 if(out)out.textContent=shown+" of "+cards.length+" shown";}
selects.forEach(function(s){s.addEventListener("change",applyFilters);});applyFilters();
"""


# Defence in depth behind the escaping: no network, and no script but the page's own.
POLICY = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()}'"
)


def render_html(
    outcome, summary: pd.DataFrame, deltas: pd.DataFrame, decode: Decode | None = None
) -> str:
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
            verdict_section(outcome),
            floor_section(outcome),
            evidence_section(outcome),
            levels_section(outcome, summary, deltas),
            drift_section(outcome),
            faults_section(outcome),
            mismatches_section(outcome, decode),
            facts_section(outcome),
            f"<script>{SCRIPT}</script>",
            "</body></html>",
        ]
    )
