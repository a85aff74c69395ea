"""report.html's own stylesheet and script, and the Content-Security-Policy that allows no
network and no script but that one (by its hash): defence in depth behind the escaping."""

from __future__ import annotations

import base64
import hashlib

STYLE = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d1d1f;margin:0 auto;
 max-width:1240px;padding:0 16px 48px}
h1{font-size:20px;margin:16px 0 8px}h2{font-size:17px;margin:28px 0 8px;
 border-bottom:1px solid #ddd;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
nav.sections{position:sticky;top:0;z-index:2;background:#e3ecf7;padding:6px 12px;margin:0 0 8px;
 border-radius:0 0 6px 6px}
nav.sections a{color:#0b3d91;text-decoration:none;font-weight:600}
.verdict .headline{font-weight:600}
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
td small.word{white-space:normal}
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
.badge.reference-variant{background:#00838f}
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


POLICY = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()}'"
)
