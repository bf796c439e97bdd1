"""Stragglers: one edge population, six answers to them, compared on time-to-accuracy and bytes.

    python tools/straggler_study.py --out runs/straggler_study [--rounds 12] [--json]

Every method runs scenarios/straggler_study.yaml (200 clients, a long-tailed device and link
mix, 20 clients a round) with the same seed, and differs only in how it treats slow clients:

  sync_all      FedAvg, every selected client awaited (a 600 s safety deadline for dead batteries)
  first_k       FedAvg, 1.3x over-selection, the round closes at the first 20 updates
  deadline      FedAvg, the round closes after --deadline emulated seconds, late updates dropped
  fedbuff       asynchronous: 20 clients always training, a server step every 10 updates,
                weighted 1/sqrt(1 + staleness); rounds x 2 steps (the same number of updates)
  hierarchical  HierFAVG: an edge aggregator per site, 2 edge rounds per cloud round; rounds / 2
                cloud rounds (the same number of client rounds)
  oort          FedAvg with Oort's utility-aware selection

It prints one table (and writes OUT/straggler_study.md, .csv, .json) and plots accuracy against
emulated time, one line per method (OUT/straggler_study.png)."""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "scenarios" / "straggler_study.yaml"
SAFETY = "round.timeout_s=600"
GIB = 2**30


def methods(rounds: int, deadline: float) -> dict[str, list[str]]:
    return {
        "sync_all": [f"rounds={rounds}", SAFETY],
        "first_k": [f"rounds={rounds}", "round.policy=first_k", "selection.over_selection=1.3", SAFETY],
        "deadline": [f"rounds={rounds}", f"round.timeout_s={deadline}"],
        "fedbuff": [f"rounds={2 * rounds}", "algorithm.name=fedbuff", "algorithm.options.buffer_size=10",
                    "algorithm.options.concurrency=20", "eval.every=2", SAFETY],
        "hierarchical": [f"rounds={max(1, rounds // 2)}", "topology=hierarchical", "hierarchy.edges=shared_links",
                         "hierarchy.edge_rounds=2", SAFETY],
        "oort": [f"rounds={rounds}", "selection.policy=oort", SAFETY],
    }


def run(label: str, sets: list[str], out: Path, quiet: bool) -> Path:
    run_dir = out / label
    cmd = [sys.executable, "-m", "emulator", "run", str(BASE), "--out", str(run_dir), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    if not quiet:
        print(f"== {label}: {' '.join(sets)}", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{label} failed (exit {res.returncode}): {res.stderr.strip()[-500:] or res.stdout.strip()[-500:]}")
    return run_dir


def figures(label: str, run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    payload = sum(summary.get(f"payload_bytes_{d}", 0) for d in ("up", "down", "cloud"))
    outcomes = summary.get("client_outcomes", {})
    return {
        "method": label, "steps": summary["rounds_completed"], "updates_ok": outcomes.get("ok", 0),
        "updates_lost": sum(v for k, v in outcomes.items() if k != "ok"),
        "best_accuracy": summary.get("best_accuracy"), "final_accuracy": summary.get("final_accuracy"),
        "emulated_time_s": summary["emulated_time_s"], "time_to_target_s": summary.get("time_to_target_s"),
        "target_accuracy": summary.get("target_accuracy"), "payload_gib": payload / GIB,
        "wall_time_s": summary.get("wall_time_s"),
        "curve": [(float(r["t_end"]), float(r["accuracy"])) for r in rounds if r.get("accuracy")],
    }


def table(rows: list[dict]) -> str:
    head = ["method", "steps", "updates ok", "updates lost", "best acc %", "final acc %", "emulated s",
            "s to target", "payload GiB", "wall s"]
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}"  # noqa: E731
    num = lambda v, f="{:.1f}": "-" if v is None else f.format(v)  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r["method"], str(r["steps"]), str(r["updates_ok"]), str(r["updates_lost"]),
                                        pct(r["best_accuracy"]), pct(r["final_accuracy"]), num(r["emulated_time_s"]),
                                        num(r["time_to_target_s"]), num(r["payload_gib"], "{:.3f}"),
                                        num(r["wall_time_s"])]) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if r["curve"]:
            t, acc = zip(*r["curve"])
            ax.plot(t, [100 * a for a in acc], marker="o", markersize=3, label=r["method"])
    ax.set_xlabel("emulated time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Stragglers: accuracy against emulated time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/straggler_study"))
    ap.add_argument("--rounds", type=int, default=12, help="synchronous rounds (FedBuff gets twice as many steps)")
    ap.add_argument("--deadline", type=float, default=40.0, help="emulated seconds of the deadline method")
    ap.add_argument("--methods", default=None, help="comma-separated subset")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="for every method")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    chosen = methods(args.rounds, args.deadline)
    if args.methods:
        unknown = [m for m in args.methods.split(",") if m not in chosen]
        if unknown:
            print(f"unknown methods {unknown}; known: {', '.join(chosen)}", file=sys.stderr)
            return 2
        chosen = {m: chosen[m] for m in args.methods.split(",")}
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [figures(label, run(label, sets + args.extra, args.out, args.json)) for label, sets in chosen.items()]
    (args.out / "straggler_study.md").write_text(table(rows))
    (args.out / "straggler_study.json").write_text(json.dumps(rows, indent=2))
    with open(args.out / "straggler_study.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "curve"])
        w.writeheader()
        w.writerows({k: v for k, v in r.items() if k != "curve"} for r in rows)
    plot(rows, args.out / "straggler_study.png")
    print(json.dumps(rows, indent=2) if args.json else table(rows) + f"\nplot: {args.out / 'straggler_study.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
