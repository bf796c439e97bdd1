"""RUN_DIR/report.html: a whole run on one page, readable offline in any browser.

The page carries the run's data as JSON and draws it with a little vanilla JavaScript (no library,
no network): the headline numbers, the rounds (time, who was asked and who answered, accuracy,
bytes), a timeline with one row per client over emulated time (download, compute, upload or
gossip, coloured; a late or dropped client's bars pale; paged, and zoomed to any window of time),
the shared bottlenecks' load over time (emulator/utilisation.py), selection and outcomes by device
and link profile, the run's plots (accuracy against time and bytes, round time by phase, a round's Gantt,
bit-lengths; embedded), the clients that straggled or dropped and why, the incidents, the privacy
ledger as summary.json gives it, secure aggregation's phases (secure.csv) where it ran, and the
network process's own figures.
`python -m emulator report RUN_DIR` writes it (a run writes it at its end, with the plots)."""
from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path
from typing import Any

import yaml

from .tracefile import PHASES, read_rows, time_of
from .utilisation import utilisation

MOST_ROWS = 5000  # clients in the timeline (the ones with the most rounds first); the page says when there are more
PAGE_ROWS = 100  # of them on one page of the timeline


def timeline(clients: list[dict[str, str]], most: int = MOST_ROWS) -> tuple[list[dict], int]:
    """One row per client: its phases per round as [round, phase, start, end, outcome]; the clients
    with the most rounds first (ties by name), at most `most`; and how many clients there were."""
    by_client: dict[str, list] = {}
    for row in clients:
        slices = by_client.setdefault(row["client"], [])
        for phase, start, end in PHASES:
            t0, t1 = time_of(row.get(start)), time_of(row.get(end))
            if t0 is not None and t1 is not None and t1 >= t0:
                slices.append([int(row["round"]), phase, t0, t1, row.get("outcome", "")])
        if not slices or slices[-1][0] != int(row["round"]):  # selected, but no phase began: a mark at selection
            t = time_of(row.get("selected_t"))
            if t is not None:
                slices.append([int(row["round"]), "selected", t, t, row.get("outcome", "")])
    ordered = sorted(by_client, key=lambda c: (-len({s[0] for s in by_client[c]}), c))
    return [{"client": c, "slices": by_client[c]} for c in ordered[:most]], len(by_client)


def by_profile(clients: list[dict[str, str]], population: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Selection and outcomes by device and link profile: how often its clients were selected, and
    what share of those selections answered in time, came late, or dropped."""
    profile = {r["client"]: (r.get("device", ""), r.get("link", "")) for r in population}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in clients:
        device, link = profile.get(row["client"], ("", row.get("link", "")))
        entry = out.setdefault((device, link), {"device": device, "link": link, "clients": 0, "selected": 0, "ok": 0,
                                                "late": 0, "dropped": 0, "other": 0})
        entry["selected"] += 1
        outcome = row.get("outcome", "")
        key = "ok" if outcome == "ok" else "late" if outcome == "late" else "dropped" if outcome.startswith("dropped") else "other"
        entry[key] += 1
    for (device, link), entry in out.items():
        entry["clients"] = sum(1 for d, k in profile.values() if (d, k) == (device, link))
    return sorted(out.values(), key=lambda e: (-e["selected"], e["device"], e["link"]))


def plots(run_dir: Path) -> list[dict[str, str]]:
    """The run's PNG plots, embedded (the page stays one file)."""
    return [{"name": png.stem.replace("_", " "), "src": "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()}
            for png in sorted((run_dir / "plots").glob("*.png"))]


def collect(run_dir: Path) -> dict[str, Any]:
    """What the page shows, from the run directory's files."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = read_rows(run_dir / "rounds.csv")
    clients = read_rows(run_dir / "clients.csv")
    rows, total = timeline(clients)
    population = read_rows(run_dir / "population.csv")
    scenario = yaml.safe_load((run_dir / "scenario.yaml").read_text()) or {}
    keep = ("round", "t_start", "t_end", "duration_s", "selected", "completed", "failed", "accuracy", "test_loss",
            "wire_bytes_down", "wire_bytes_up", "wire_bytes_peer", "bits_down", "bits_up_mean")
    outcomes = [{k: r.get(k) for k in ("round", "client", "outcome", "link", "selected_t", "download_end", "compute_end",
                                      "upload_end")} for r in clients if r.get("outcome") not in ("ok", "", None)]
    return {
        "name": run_dir.name, "scenario": summary.get("scenario"), "status": summary.get("status"),
        "headline": {k: summary.get(k) for k in ("topology", "rounds_completed", "emulated_time_s", "best_accuracy",
                                                  "final_accuracy", "time_to_target_s", "wire_gib_down", "wire_gib_up",
                                                  "payload_gib_peer", "saving_vs_fp32", "wall_time_s")},
        "rounds": [{k: r.get(k) for k in keep if k in r} for r in rounds],
        "timeline": rows, "timeline_clients": total,
        "stragglers": outcomes,
        "privacy": {"settings": summary.get("privacy"), "spent": summary.get("privacy_spent")},
        "secure": {"summary": summary.get("secure_aggregation"),
                   "phases": read_rows(run_dir / "secure.csv") if (run_dir / "secure.csv").exists() else []},
        "network": summary.get("network"),
        "incidents": summary.get("incidents") or [],
        "client_outcomes": summary.get("client_outcomes"),
        "profiles": by_profile(clients, population),
        "utilisation": utilisation(read_rows(run_dir / "transfers.csv"), scenario, population),
        "page_rows": PAGE_ROWS,
        "plots": plots(run_dir),
    }


def render(data: dict[str, Any]) -> str:
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")  # safe inside <script>
    title = html.escape(f"{data['name']} - fl-emulator report")
    return PAGE.replace("@TITLE@", title).replace("@DATA@", payload).replace("@SCRIPT@", SCRIPT).replace("@STYLE@", STYLE)


def write_report(run_dir: Path) -> Path:
    """RUN_DIR/report.html, written whole or not at all (a full disk leaves no half page)."""
    out = run_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    try:
        tmp.write_text(render(collect(run_dir)))
        os.replace(tmp, out)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return out


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>@TITLE@</title><style>@STYLE@</style></head>
<body>
<noscript>This report draws itself with JavaScript; the same numbers are in the run directory's CSVs and summary.json.</noscript>
<main id="report"></main>
<script id="run-data" type="application/json">@DATA@</script>
<script>@SCRIPT@</script>
</body></html>
"""

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
table{border-collapse:collapse;font-size:12px}td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.kpi{display:inline-block;margin:0 18px 8px 0}
.kpi b{display:block;font-size:18px}.muted{color:#777}.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:10px;margin-right:4px}svg text{font-size:10px;fill:#444}
figure{display:inline-block;margin:0 12px 12px 0}figcaption{color:#777;font-size:12px}
"""

HELPERS = r"""
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function fmt(v, digits) {
  if (v === null || v === undefined || v === '') return '-';
  const n = Number(v);
  return Number.isFinite(n) ? n.toLocaleString('en', {maximumFractionDigits: digits ?? 3}) : String(v);
}
"""

SCRIPT = HELPERS + r"""
const RUN = JSON.parse(document.getElementById('run-data').textContent);
const COLORS = {download: '#4c72b0', compute: '#55a868', upload: '#c44e52', gossip: '#8172b2', selected: '#999'};
const main = document.getElementById('report');
function table(id, rows, columns) {
  const t = el('table', {id: id}), head = el('tr');
  columns.forEach(c => head.appendChild(el('th', {}, c)));
  t.appendChild(head);
  rows.forEach(r => {
    const tr = el('tr', {'class': 'row'});
    columns.forEach(c => tr.appendChild(el('td', {}, fmt(r[c]))));
    t.appendChild(tr);
  });
  return t;
}
main.appendChild(el('h1', {id: 'run-name'}, RUN.name));
main.appendChild(el('div', {'class': 'muted', id: 'run-status'}, `scenario ${RUN.scenario}, ${RUN.status}`));
const kpis = el('div', {id: 'headline'});
for (const [k, v] of Object.entries(RUN.headline)) {
  const d = el('div', {'class': 'kpi'}); d.appendChild(el('b', {}, fmt(v))); d.appendChild(el('span', {}, k.replaceAll('_', ' ')));
  kpis.appendChild(d);
}
main.appendChild(kpis);
main.appendChild(el('h2', {}, 'Rounds'));
main.appendChild(table('rounds', RUN.rounds, Object.keys(RUN.rounds[0] || {round: 0})));
main.appendChild(el('h2', {}, 'Clients over emulated time'));
const legend = el('div', {'class': 'legend'});
Object.entries(COLORS).forEach(([p, c]) => { const s = el('span'); const i = el('i'); i.style.background = c; s.appendChild(i); s.appendChild(document.createTextNode(p)); legend.appendChild(s); });
main.appendChild(legend);
if (RUN.timeline_clients > RUN.timeline.length)
  main.appendChild(el('div', {'class': 'muted'}, `${RUN.timeline.length} of ${RUN.timeline_clients} clients shown (those in the most rounds)`));
const END = Math.max(1e-9, ...RUN.timeline.flatMap(r => r.slices.map(s => s[3])));
const W = 1000, ROW = 14, LEFT = 70, PAGES = Math.max(1, Math.ceil(RUN.timeline.length / RUN.page_rows));
const view = {page: 0, t0: 0, t1: END};
const controls = el('div', {id: 'timeline-controls'});
const pageLabel = el('span', {id: 'timeline-page'});
const prev = el('button', {id: 'timeline-prev'}, 'previous'), next = el('button', {id: 'timeline-next'}, 'next');
const from = el('input', {id: 'timeline-from', type: 'number', step: 'any', value: 0, size: 8});
const to = el('input', {id: 'timeline-to', type: 'number', step: 'any', value: END.toFixed(3), size: 8});
const reset = el('button', {id: 'timeline-reset'}, 'whole run');
[prev, pageLabel, next, document.createTextNode(' emulated s from '), from, document.createTextNode(' to '), to, reset]
  .forEach(x => controls.appendChild(x));
main.appendChild(controls);
const holder = el('div', {id: 'timeline-holder'});
main.appendChild(holder);
function drawTimeline() {
  const rows = RUN.timeline.slice(view.page * RUN.page_rows, (view.page + 1) * RUN.page_rows);
  const span = Math.max(1e-9, view.t1 - view.t0), x = t => LEFT + W * (t - view.t0) / span;
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('id', 'timeline'); svg.setAttribute('width', W + LEFT); svg.setAttribute('height', ROW * rows.length + 20);
  rows.forEach((row, i) => {
    const g = document.createElementNS(svg.namespaceURI, 'g');
    g.setAttribute('class', 'client-row'); g.setAttribute('data-client', row.client);
    const label = document.createElementNS(svg.namespaceURI, 'text');
    label.setAttribute('x', 0); label.setAttribute('y', i * ROW + 10); label.textContent = row.client; g.appendChild(label);
    row.slices.forEach(([round, phase, t0, t1, outcome]) => {
      if (t1 < view.t0 || t0 > view.t1) return;
      const r = document.createElementNS(svg.namespaceURI, 'rect');
      const a = Math.max(t0, view.t0), b = Math.min(t1, view.t1);
      r.setAttribute('x', x(a)); r.setAttribute('y', i * ROW + 2);
      r.setAttribute('width', Math.max(1, x(b) - x(a))); r.setAttribute('height', ROW - 4);
      r.setAttribute('fill', COLORS[phase] || '#999'); r.setAttribute('opacity', outcome === 'ok' ? 1 : 0.45);
      const tip = document.createElementNS(svg.namespaceURI, 'title');
      tip.textContent = `${row.client} round ${round}: ${phase} ${t0.toFixed(2)}-${t1.toFixed(2)} s (${outcome})`;
      r.appendChild(tip); g.appendChild(r);
    });
    svg.appendChild(g);
  });
  holder.replaceChildren(svg, el('div', {'class': 'muted'}, `${fmt(view.t0, 1)} to ${fmt(view.t1, 1)} s emulated`));
  pageLabel.textContent = ` clients ${view.page * RUN.page_rows + 1}-${view.page * RUN.page_rows + rows.length} of ${RUN.timeline.length} (page ${view.page + 1} of ${PAGES}) `;
}
prev.onclick = () => { view.page = Math.max(0, view.page - 1); drawTimeline(); };
next.onclick = () => { view.page = Math.min(PAGES - 1, view.page + 1); drawTimeline(); };
from.onchange = to.onchange = () => { const a = Number(from.value), b = Number(to.value);
  if (Number.isFinite(a) && Number.isFinite(b) && b > a) { view.t0 = a; view.t1 = b; drawTimeline(); } };
reset.onclick = () => { view.t0 = 0; view.t1 = END; from.value = 0; to.value = END.toFixed(3); drawTimeline(); };
drawTimeline();
main.appendChild(el('h2', {}, 'Shared bottlenecks over emulated time'));
main.appendChild(el('div', {'class': 'muted'}, 'Mbit/s per time bin, each transfer at its average rate over its lifetime (so a bin can pass the capacity where rates changed within transfers), against the capacity (dashed)'));
const util = el('div', {id: 'utilisation'});
RUN.utilisation.series.forEach(s => {
  const H = 90, t = RUN.utilisation.t, w = RUN.utilisation.width_s, top = Math.max(s.capacity_mbps || 0, ...s.mbps) || 1;
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('class', 'bottleneck'); svg.setAttribute('data-name', s.name);
  svg.setAttribute('width', W + LEFT); svg.setAttribute('height', H + 16);
  const tx = document.createElementNS(svg.namespaceURI, 'text');
  tx.setAttribute('x', 0); tx.setAttribute('y', 12);
  tx.textContent = `${s.name}: peak ${fmt(Math.max(...s.mbps), 1)} Mbit/s` + (s.capacity_mbps ? ` of ${fmt(s.capacity_mbps)}` : '');
  svg.appendChild(tx);
  const xs = i => LEFT + W * i / t.length, ys = v => 14 + H * (1 - v / top);
  const path = document.createElementNS(svg.namespaceURI, 'polyline');
  path.setAttribute('points', s.mbps.map((v, i) => `${xs(i)},${ys(v)} ${xs(i + 1)},${ys(v)}`).join(' '));
  path.setAttribute('fill', 'none'); path.setAttribute('stroke', '#4c72b0'); svg.appendChild(path);
  if (s.capacity_mbps) {
    const cap = document.createElementNS(svg.namespaceURI, 'line');
    cap.setAttribute('x1', LEFT); cap.setAttribute('x2', LEFT + W); cap.setAttribute('y1', ys(s.capacity_mbps));
    cap.setAttribute('y2', ys(s.capacity_mbps)); cap.setAttribute('stroke', '#c44e52'); cap.setAttribute('stroke-dasharray', '4 3');
    svg.appendChild(cap);
  }
  util.appendChild(svg);
});
if (!RUN.utilisation.series.length) util.textContent = 'no transfer crossed a shared bottleneck';
main.appendChild(util);
main.appendChild(el('h2', {}, 'Selection and outcomes by device and link profile'));
main.appendChild(table('profiles', RUN.profiles, ['device', 'link', 'clients', 'selected', 'ok', 'late', 'dropped', 'other']));
if (RUN.plots.length) {
  main.appendChild(el('h2', {}, 'Plots'));
  RUN.plots.forEach(p => { const f = el('figure'); f.appendChild(el('img', {src: p.src, alt: p.name, width: 560}));
                           f.appendChild(el('figcaption', {}, p.name)); main.appendChild(f); });
}
main.appendChild(el('h2', {}, 'Who straggled or dropped, and why'));
main.appendChild(RUN.stragglers.length ? table('stragglers', RUN.stragglers, Object.keys(RUN.stragglers[0]))
                                       : el('div', {id: 'stragglers', 'class': 'muted'}, 'every selected client answered in time'));
main.appendChild(el('h2', {}, 'Incidents'));
main.appendChild(RUN.incidents.length ? el('pre', {id: 'incidents'}, RUN.incidents.map(i => JSON.stringify(i)).join('\n'))
                                      : el('div', {id: 'incidents', 'class': 'muted'}, 'none'));
if (RUN.secure.phases.length) {
  main.appendChild(el('h2', {}, 'Secure aggregation, phase by phase'));
  main.appendChild(el('pre', {id: 'secure-summary'}, JSON.stringify(RUN.secure.summary, null, 1)));
  main.appendChild(table('secure', RUN.secure.phases, Object.keys(RUN.secure.phases[0])));
}
main.appendChild(el('h2', {}, 'Privacy ledger'));
main.appendChild(el('pre', {id: 'privacy'}, JSON.stringify(RUN.privacy, null, 1)));
main.appendChild(el('h2', {}, 'The network process'));
main.appendChild(el('pre', {id: 'network'}, JSON.stringify(RUN.network, null, 1)));
document.body.setAttribute('data-drawn', 'yes');
"""
