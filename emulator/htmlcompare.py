"""compare.html: several runs side by side on one page, readable offline (no library, no network).

The comparison table (`python -m emulator compare`'s rows), then every run's curves on shared
axes: accuracy against emulated time and against payload bytes, each round's duration, and the
server's ingress load over time, each run in its own colour, with a link to each run's own
report.html for its timeline and ledger."""
from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

import yaml

from .htmlreport import HELPERS
from .tracefile import read_rows
from .utilisation import utilisation


def curves(run_dir: Path) -> dict[str, Any]:
    """One run's series for the shared plots."""
    rounds = read_rows(run_dir / "rounds.csv")
    sent = 0.0
    accuracy = []
    for r in rounds:
        sent += sum(float(r.get(f"payload_bytes_{d}") or 0) for d in ("down", "up", "peer", "cloud"))
        if r.get("accuracy") not in (None, ""):
            accuracy.append([float(r["t_end"]), sent / 2**30, float(r["accuracy"])])
    scenario = yaml.safe_load((run_dir / "scenario.yaml").read_text()) or {}
    load = utilisation(read_rows(run_dir / "transfers.csv"), scenario, read_rows(run_dir / "population.csv"), bins=100)
    ingress = next((s for s in load["series"] if s["name"].startswith("server ingress")), None)
    return {"accuracy": accuracy, "durations": [[int(r["round"]), float(r["duration_s"])] for r in rounds],
            "ingress": {"t": load["t"], "mbps": ingress["mbps"]} if ingress else None}


def write_compare_html(rows: list[dict[str, Any]], run_dirs: list[Path], out_dir: Path) -> Path:
    out = out_dir / "compare.html"
    runs = []
    for row, run_dir in zip(rows, run_dirs):
        report = run_dir / "report.html"
        link = os.path.relpath(report, out_dir) if report.exists() else None
        runs.append({"row": {k: v for k, v in row.items()}, "report": link, **curves(run_dir)})
    payload = json.dumps({"runs": runs}, separators=(",", ":"), default=str).replace("</", "<\\/")
    title = html.escape(" vs ".join(r["run"] for r in rows)[:200])
    out.write_text(PAGE.replace("@TITLE@", title).replace("@DATA@", payload).replace("@SCRIPT@", SCRIPT))
    return out


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>@TITLE@ - fl-emulator comparison</title><style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}h1{font-size:22px}h2{font-size:17px;margin:28px 0 8px}
table{border-collapse:collapse;font-size:12px}td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}svg text{font-size:10px;fill:#444}.muted{color:#777}
</style></head><body>
<noscript>This page draws itself with JavaScript; compare.csv beside it has the same table.</noscript>
<main id="compare"></main>
<script id="compare-data" type="application/json">@DATA@</script>
<script>@SCRIPT@</script>
</body></html>
"""

SCRIPT = HELPERS + r"""
const DATA = JSON.parse(document.getElementById('compare-data').textContent);
const PALETTE = ['#4c72b0', '#c44e52', '#55a868', '#8172b2', '#ccb974', '#64b5cd', '#dd8452', '#937860'];
const main = document.getElementById('compare');
main.appendChild(el('h1', {}, `${DATA.runs.length} runs side by side`));
const columns = Object.keys(DATA.runs[0].row);
const t = el('table', {id: 'runs'}), head = el('tr');
columns.concat(['report']).forEach(c => head.appendChild(el('th', {}, c)));
t.appendChild(head);
DATA.runs.forEach((run, i) => {
  const tr = el('tr', {'class': 'run-row', 'data-run': run.row.run});
  columns.forEach((c, j) => { const td = el('td', {}, fmt(run.row[c])); if (j === 0) td.style.color = PALETTE[i % 8]; tr.appendChild(td); });
  const td = el('td');
  if (run.report) td.appendChild(el('a', {href: run.report}, 'report')); else td.textContent = '-';
  tr.appendChild(td); t.appendChild(tr);
});
main.appendChild(t);
function plot(id, title, xlabel, ylabel, series) {
  const W = 520, H = 240, L = 50, B = 30;
  const pts = series.flatMap(s => s.points);
  main.appendChild(el('h2', {}, title));
  if (!pts.length) { main.appendChild(el('div', {'class': 'muted', id: id}, 'nothing to plot')); return; }
  const xmax = Math.max(...pts.map(p => p[0])) || 1, ymax = Math.max(...pts.map(p => p[1])) || 1;
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('id', id); svg.setAttribute('width', W + L + 10); svg.setAttribute('height', H + B + 10);
  const text = (x, y, s) => { const e = document.createElementNS(svg.namespaceURI, 'text'); e.setAttribute('x', x); e.setAttribute('y', y); e.textContent = s; svg.appendChild(e); };
  text(L, H + B, `${xlabel} (0 to ${fmt(xmax)})`); text(0, 10, `${ylabel} (to ${fmt(ymax)})`);
  series.forEach((s, i) => {
    const line = document.createElementNS(svg.namespaceURI, 'polyline');
    line.setAttribute('points', s.points.map(p => `${L + W * p[0] / xmax},${10 + H * (1 - p[1] / ymax)}`).join(' '));
    line.setAttribute('fill', 'none'); line.setAttribute('stroke', PALETTE[s.index % 8]); line.setAttribute('class', 'series');
    line.setAttribute('data-run', s.name); svg.appendChild(line);
  });
  main.appendChild(svg);
}
const each = f => DATA.runs.map((r, i) => ({name: r.row.run, index: i, points: f(r)}));
plot('accuracy-time', 'Accuracy against emulated time', 'emulated s', 'accuracy', each(r => r.accuracy.map(a => [a[0], a[2]])));
plot('accuracy-bytes', 'Accuracy against payload sent', 'GiB', 'accuracy', each(r => r.accuracy.map(a => [a[1], a[2]])));
plot('durations', 'Round duration', 'round', 'emulated s', each(r => r.durations));
plot('ingress', "The server's ingress", 'emulated s', 'Mbit/s', each(r => r.ingress ? r.ingress.t.map((x, k) => [x, r.ingress.mbps[k]]) : []));
document.body.setAttribute('data-drawn', 'yes');
"""
