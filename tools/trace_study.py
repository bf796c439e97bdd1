"""Why fading links matter: the same FL workload on trace-driven links and on static links at each
trace's mean rate.

    python tools/trace_study.py --out runs/trace_study [--scenario scenarios/cellular_edge.yaml]
                                [--rounds 10] [--seeds 3] [--train] [--json]

For each seed it runs the scenario as it is (every link mix's up_trace/down_trace) and again with each
traced direction replaced by a constant rate: a generated trace's mean_mbps, or the mean of a file
pool's traces. Communication only unless --train (training time is modelled either way; only the
accuracy needs training). It prints, for each: per-round time p50 / p95 / max, the share of selected
clients that missed the round's deadline (round.timeout_s), upload and download times p50 / p95, and
payload bytes; the traced/static ratios; and writes OUT/trace_study.json and a plot of the round
times' and the upload times' distributions (OUT/trace_study.png)."""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def static_twin(scenario: Path, data_root: str | None) -> dict:
    """The scenario with each traced direction at its trace's mean rate."""
    from emulator.flows.traces import TraceRef, load_trace  # noqa: PLC0415

    raw = yaml.safe_load(scenario.read_text())
    for mix in raw["population"]["links"]:
        for direction in ("up", "down"):
            spec = mix.pop(f"{direction}_trace", None)
            if spec is None:
                continue
            if spec.get("synthetic"):
                mix[f"{direction}_mbps"] = float(spec["synthetic"]["mean_mbps"])
                continue
            files = [spec["files"]] if isinstance(spec["files"], str) else spec["files"]
            root = Path(data_root or ".")
            paths = [p for f in files for p in sorted((scenario.parent.glob(f) if not Path(f).is_absolute() else [Path(f)]))
                     or sorted(root.glob(f))]
            means = [load_trace(TraceRef(str(p), bin_s=spec.get("bin_ms", 100) / 1000.0)).mean_bps for p in paths]
            mix[f"{direction}_mbps"] = sum(means) / len(means) / 1e6
    return raw


def run(scenario: Path, sets: list[str], out: Path) -> Path:
    cmd = [sys.executable, "-m", "emulator", "run", str(scenario), "--out", str(out), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{out.name} failed (exit {res.returncode}): {res.stderr.strip()[-800:]}")
    return out


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def figures(run_dir: Path) -> dict:
    rounds = list(csv.DictReader(open(run_dir / "rounds.csv")))
    clients = list(csv.DictReader(open(run_dir / "clients.csv")))
    transfers = list(csv.DictReader(open(run_dir / "transfers.csv")))
    summary = json.loads((run_dir / "summary.json").read_text())
    durations = [float(r["duration_s"]) for r in rounds]
    late = [c for c in clients if c["outcome"] != "ok"]
    up = [float(t["t_end"]) - float(t["t_start"]) for t in transfers if t["kind"] == "update" and t["outcome"] == "ok"]
    down = [float(t["t_end"]) - float(t["t_start"]) for t in transfers if t["kind"] == "task" and t["outcome"] == "ok"]
    return {"round_s_p50": _pct(durations, 0.5), "round_s_p95": _pct(durations, 0.95), "round_s_max": max(durations),
            "missed_share": len(late) / len(clients) if clients else 0.0,
            "upload_s_p50": _pct(up, 0.5), "upload_s_p95": _pct(up, 0.95),
            "download_s_p50": _pct(down, 0.5), "download_s_p95": _pct(down, 0.95),
            "payload_bytes": summary["payload_bytes_up"] + summary["payload_bytes_down"],
            "emulated_s": summary["emulated_time_s"], "durations": durations, "uploads": up}


def plot(results: dict, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, style in (("traced", "-"), ("static", "--")):
        for ax, key, what in ((axes[0], "durations", "round time (s)"), (axes[1], "uploads", "upload time (s)")):
            values = sorted(v for run in results[label] for v in run[key])
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], style, label=label)
            ax.set_xlabel(what)
            ax.set_ylabel("share")
            ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("fading links (traced) against their means (static)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", type=Path, default=REPO / "scenarios" / "cellular_edge.yaml")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "trace_study")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import os  # noqa: PLC0415

    args.out.mkdir(parents=True, exist_ok=True)
    twin = args.out / "static.yaml"
    twin.write_text(yaml.safe_dump(static_twin(args.scenario.resolve(), os.environ.get("EMULATOR_DATA")), sort_keys=False))
    results: dict[str, list[dict]] = {"traced": [], "static": []}
    for seed in range(args.seeds):
        sets = [f"rounds={args.rounds}", f"seed={seed}"] + ([] if args.train else ["algorithm.train=false"])
        for label, scenario in (("traced", args.scenario.resolve()), ("static", twin)):
            results[label].append(figures(run(scenario, sets, args.out / f"{label}-{seed}")))
    keys = ["round_s_p50", "round_s_p95", "round_s_max", "missed_share", "upload_s_p50", "upload_s_p95",
            "download_s_p50", "download_s_p95", "payload_bytes", "emulated_s"]
    table = {label: {k: statistics.mean(r[k] for r in runs) for k in keys} for label, runs in results.items()}
    ratios = {k: table["traced"][k] / table["static"][k] if table["static"][k] else None for k in keys}
    report = {"scenario": str(args.scenario), "rounds": args.rounds, "seeds": args.seeds, "train": args.train,
              "traced": table["traced"], "static": table["static"], "traced_over_static": ratios}
    (args.out / "trace_study.json").write_text(json.dumps(report, indent=1))
    plot(results, args.out / "trace_study.png")
    if args.json:
        print(json.dumps(report))
        return
    print(f"{'(means over ' + str(args.seeds) + ' seeds)':28s} {'traced':>12s} {'static':>12s} {'ratio':>8s}")
    for k in keys:
        r = ratios[k]
        print(f"{k:28s} {table['traced'][k]:12.3f} {table['static'][k]:12.3f} {'' if r is None else f'{r:8.2f}'}")
    print(f"plot: {args.out / 'trace_study.png'}")


if __name__ == "__main__":
    main()
