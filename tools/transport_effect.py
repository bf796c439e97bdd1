"""What the transport model changes in a scenario: the same scenario and seed under
`network.transport: fluid` and `tcp`, side by side.

    python tools/transport_effect.py scenarios/edge_1000.yaml --set rounds=5 [--json] [--out runs/transport]

Prints, per transport: emulated total time, mean round, mean download (task) and upload (update)
transfer time over the transfers that arrived, and wall seconds. --json prints one object per run
with keys scenario, transport, emulated_s, mean_round_s, mean_download_s, mean_upload_s, wall_s,
then one object with the tcp/fluid ratio of each."""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEYS = ("emulated_s", "mean_round_s", "mean_download_s", "mean_upload_s", "wall_s")


def figures(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    with open(run_dir / "transfers.csv") as f:
        transfers = [t for t in csv.DictReader(f) if t["outcome"] == "ok"]

    def mean_time(kind: str) -> float | None:
        times = [float(t["t_end"]) - float(t["t_start"]) for t in transfers if t["kind"] == kind]
        return statistics.fmean(times) if times else None

    return {"emulated_s": summary["emulated_time_s"],
            "mean_round_s": statistics.fmean(float(r["t_end"]) - float(r["t_start"]) for r in rounds),
            "mean_download_s": mean_time("task"), "mean_upload_s": mean_time("update"), "wall_s": summary["wall_time_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=Path("runs/transport_effect"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {}
    for transport in ("fluid", "tcp"):
        run_dir = args.out / f"{args.scenario.stem}_{transport}"
        cmd = [sys.executable, "-m", "emulator", "run", str(args.scenario), "--out", str(run_dir), "--plain", "--quiet",
               "--set", f"network.transport={transport}", *[x for s in args.extra for x in ("--set", s)]]
        res = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
        if res.returncode != 0:
            print(f"{transport}: the run failed with exit code {res.returncode}", file=sys.stderr)
            return res.returncode
        results[transport] = figures(run_dir)
    ratios = {k: (results["tcp"][k] / results["fluid"][k] if results["fluid"][k] else None) for k in KEYS}
    if args.json:
        for transport, figs in results.items():
            print(json.dumps({"scenario": str(args.scenario), "transport": transport, **figs}))
        print(json.dumps({"scenario": str(args.scenario), "ratio_tcp_to_fluid": ratios}))
        return 0
    print(f"{args.scenario} {' '.join(args.extra)}")
    print(f"{'':18}{'fluid':>12}{'tcp':>12}{'tcp/fluid':>11}")
    for k in KEYS:
        f, t, r = results["fluid"][k], results["tcp"][k], ratios[k]
        cell = lambda v, w=12: f"{v:{w}.3f}" if v is not None else "-".rjust(w)  # noqa: E731
        print(f"{k:18}{cell(f)}{cell(t)}{cell(r, 11)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
