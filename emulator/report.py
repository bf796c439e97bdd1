"""`python -m emulator report RUN_DIR`: the run's headline numbers and its plots.

Plots (PNG, in RUN_DIR/plots): accuracy against emulated time and against GiB moved; each
round's time split into download, compute, upload and waiting; a Gantt timeline of one round's
clients with dropouts marked; bit-lengths per round when quantization is adaptive or static int."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

GIB = 2**30
GANTT_MOST = 80  # clients in one round's timeline
PHASES = (("download", "download_start", "download_end", "#4c72b0"), ("compute", "compute_start", "compute_end", "#55a868"),
          ("upload", "upload_start", "upload_end", "#c44e52"), ("gossip", "gossip_start", "gossip_end", "#8172b2"))


class ReportError(ValueError):
    """The run directory cannot be reported on; the message says why."""


def _num(value: Any) -> float | None:
    if value in (None, ""):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def load(run_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except FileNotFoundError:
        raise ReportError(f"{run_dir}: not a run directory (summary.json is missing)") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{run_dir}: summary.json is unreadable ({exc})") from None
    return summary, _read(run_dir / "rounds.csv"), _read(run_dir / "clients.csv")


def summary_text(summary: dict) -> str:
    def pct(v):
        return "-" if v is None else f"{100 * v:.2f} %"

    lines = [
        f"run: {summary.get('scenario')}  status: {summary.get('status')}  rounds: {summary.get('rounds_completed')}",
        f"emulated time: {summary.get('emulated_time_s', 0):.1f} s   wall time: {summary.get('wall_time_s') or 0:.1f} s",
        f"best accuracy: {pct(summary.get('best_accuracy'))} (round {summary.get('best_accuracy_round')})   "
        f"final: {pct(summary.get('final_accuracy'))}   time to target {summary.get('target_accuracy')}: "
        f"{summary.get('time_to_target_s') if summary.get('time_to_target_s') is not None else '-'}",
        f"payload GiB up {summary.get('payload_gib_up', 0):.4f} down {summary.get('payload_gib_down', 0):.4f} "
        f"peer-to-peer {summary.get('payload_gib_peer', 0):.4f}   "
        f"saving vs fp32 {pct(summary.get('saving_vs_fp32'))}   wasted bytes {summary.get('wasted_bytes', 0)}",
        f"client outcomes: {summary.get('client_outcomes') or {}}",
    ]
    if summary.get("peak_rss_bytes") or summary.get("peak_rss_gib"):
        lines.append(f"peak RSS: {summary.get('peak_rss_gib', 0):.2f} GiB")
    return "\n".join(lines)


def phase_split(rounds: list[dict], clients: list[dict]) -> list[dict[str, float]]:
    """Per round: mean download, compute and upload time of the clients whose update counted;
    waiting is the rest of the round (stragglers, deadline, aggregation)."""
    out = []
    for r in rounds:
        ok = [c for c in clients if c["round"] == r["round"] and c["outcome"] == "ok"]
        split = {}
        for name, start, end, _ in PHASES:
            spans = [_num(c[end]) - _num(c[start]) for c in ok if _num(c.get(start)) is not None and _num(c.get(end)) is not None]
            split[name] = sum(spans) / len(spans) if spans else 0.0
        split["waiting"] = max(0.0, float(r["duration_s"]) - sum(split.values()))
        out.append(split)
    return out


def choose_round(rounds: list[dict], clients: list[dict]) -> int | None:
    """The round with the most clients that did not count (dropped or late), else the last."""
    if not rounds:
        return None
    bad = {int(r["round"]): sum(1 for c in clients if c["round"] == r["round"] and c["outcome"] != "ok") for r in rounds}
    worst = max(bad, key=lambda k: (bad[k], -k))
    return worst if bad[worst] else int(rounds[-1]["round"])


def gantt_rows(rows: list[dict], most: int = GANTT_MOST) -> list[dict]:
    """The clients a round's timeline shows: all of them, or at most `most` (a bar each stays
    readable), the ones that did not count first, then the first by name; in name order."""
    if len(rows) <= most:
        return rows
    by_name = sorted(rows, key=lambda c: c["client"])
    picked = ([c for c in by_name if c["outcome"] != "ok"] + [c for c in by_name if c["outcome"] == "ok"])[:most]
    return sorted(picked, key=lambda c: c["client"])


def plot(run_dir: Path, gantt_round: int | None = None) -> list[Path]:
    """The run's figures in RUN_DIR/plots: accuracy (against time and bytes), round time by phase,
    one round's Gantt chart and the bit-lengths, each where the run has what it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, rounds, clients = load(run_dir)
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    if not rounds:
        return []
    figures = [_accuracy_figure(plt, rounds), _round_time_figure(plt, rounds, clients),
               _gantt_figure(plt, rounds, clients, gantt_round), _bits_figure(plt, rounds)]
    return [_save(fig, out_dir / name, plt) for fig, name in filter(None, figures)]


def _accuracy_figure(plt, rounds: list[dict]):
    evaluated = [r for r in rounds if _num(r.get("accuracy")) is not None]
    if not evaluated:
        return None
    cumulative, total = {}, 0
    for r in rounds:
        total += sum(int(r.get(k) or 0) for k in ("payload_bytes_up", "payload_bytes_down", "payload_bytes_peer"))
        cumulative[r["round"]] = total / GIB
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    acc = [float(r["accuracy"]) for r in evaluated]
    ax1.plot([float(r["t_end"]) for r in evaluated], acc, marker="o")
    ax1.set(xlabel="emulated time (s)", ylabel="test accuracy", title="accuracy vs emulated time")
    ax2.plot([cumulative[r["round"]] for r in evaluated], acc, marker="o", color="#c44e52")
    ax2.set(xlabel="payload moved (GiB)", ylabel="test accuracy", title="accuracy vs bytes")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig, "accuracy.png"


def _round_time_figure(plt, rounds: list[dict], clients: list[dict]):
    from matplotlib.ticker import MaxNLocator

    split = phase_split(rounds, clients)
    fig, ax = plt.subplots(figsize=(11, 4))
    idx = [int(r["round"]) for r in rounds]
    bottom = [0.0] * len(rounds)
    for name, color in [(p[0], p[3]) for p in PHASES] + [("waiting", "#bbbbbb")]:
        values = [s[name] for s in split]
        if name == "gossip" and not any(values):
            continue
        ax.bar(idx, values, bottom=bottom, color=color, label=name, width=0.8)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(xlabel="round", ylabel="emulated seconds", title="round time: mean client phases, and waiting")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    return fig, "round_time.png"


def _gantt_figure(plt, rounds: list[dict], clients: list[dict], gantt_round: int | None):
    chosen = gantt_round if gantt_round is not None else choose_round(rounds, clients)
    everyone = [c for c in clients if c["round"] == str(chosen)]
    rows = gantt_rows(everyone)
    if not rows:
        return None
    rnd = next(r for r in rounds if r["round"] == str(chosen))
    t0, end = float(rnd["t_start"]), float(rnd["duration_s"])
    fig, ax = plt.subplots(figsize=(11, max(3, 0.25 * len(rows) + 1.5)))
    for y, c in enumerate(sorted(rows, key=lambda c: c["client"])):
        for name, start, stop, color in PHASES:
            s, e = _num(c.get(start)), _num(c.get(stop))
            if s is not None and e is not None:
                ax.barh(y, e - s, left=s - t0, color=color, label=name if y == 0 else None)
        if c["outcome"] != "ok":
            at = end if c["outcome"] == "late" else max(
                [v for v in (_num(c[k]) for k in ("upload_start", "compute_end", "download_end", "download_start"))
                 if v is not None], default=t0) - t0
            ax.plot(at, y, marker="x", color="black", markersize=9)
            ax.text(at, y, f"  {c['outcome']}", va="center", fontsize=7)
    ax.axvline(end, color="black", linestyle="--", linewidth=1, label="round end")
    ax.set_yticks(range(len(rows)), sorted(c["client"] for c in rows), fontsize=7)
    shown = "one bar per selected client" if len(rows) == len(everyone) else \
        f"{len(rows)} of its {len(everyone)} selected clients (those that did not count first)"
    ax.set(xlabel="emulated seconds since round start", title=f"round {chosen}: {shown}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig, f"gantt_round_{chosen}.png"


def _bits_figure(plt, rounds: list[dict]):
    from matplotlib.ticker import MaxNLocator

    if not any(_num(r.get("bits_down")) is not None for r in rounds):
        return None
    idx = [int(r["round"]) for r in rounds]
    fig, ax = plt.subplots(figsize=(11, 3.5))
    ax.plot(idx, [_num(r.get("bits_down")) for r in rounds], label="download (server)")
    ax.plot(idx, [_num(r.get("bits_up_mean")) for r in rounds], label="upload (mean of clients)")
    ax.set(xlabel="round", ylabel="bits per value", title="bit-length per round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig, "bits.png"


def _save(fig, path: Path, plt) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
