"""Accuracy against epsilon on the flagship's population, for the three mechanisms the project has
(issue 44, item 3), with each run's emulated time and bytes beside it:

- laplace: the core paper's local DP on the weights (scenarios/edge_1000.yaml, algorithm.privacy
  epsilon); its epsilon is the ledger's largest per-client composition, calibrated to an estimated
  Lipschitz constant: heuristic, one record substituted;
- dpsgd: per-sample clipping and noise at every local step (edge_1000.yaml with privacy dpsgd,
  clip 1, the noise multiplier given); the ledger's largest per-client RDP epsilon at delta 1e-5:
  proven, one record added or removed;
- dpfedavg: user-level DP-FedAvg whose clients add the noise, under SecAgg+
  (scenarios/edge_1000_private.yaml, the noise multiplier given); summary.json's
  privacy_spent.user_level epsilon at delta 1e-4: proven, a user's whole data added or removed.

The three epsilons protect different things (a record of one update, a record of a client's
data, all of a user's data) and are not interchangeable; the study sets them side by side because
a user choosing a mechanism sees exactly this trade.

    python tools/privacy_study.py [--rounds 20] [--laplace 10,1000,10000] [--dpsgd 0.6,1.0]
                                  [--dpfedavg 0.5,0.8,1.5] [--plot FILE.png] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from studies import run_scenario  # noqa: E402


def _run(scenario: str, sets: list[str], rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        res = run_scenario(scenario, out, [f"rounds={rounds}", f"eval.every={max(1, rounds // 4)}", *sets],
                           ("--quiet",), capture_output=True)
        if res.returncode != 0:
            raise SystemExit(f"{scenario} {sets}: {res.stderr[-2000:]}")
        return json.loads((out / "summary.json").read_text())


def _row(mechanism: str, parameter: float, summary: dict) -> dict:
    spent = summary.get("privacy_spent") or {}
    if mechanism == "dpfedavg":
        user = spent.get("user_level") or {}
        epsilon, delta, guarantee, adjacency = user.get("epsilon"), user.get("delta"), user.get("guarantee"), "user"
    elif mechanism == "dpsgd":
        epsilon, delta, guarantee, adjacency = spent.get("max_rdp_epsilon"), spent.get("accounting_delta"), "proven", \
            "record (add/remove)"
    else:
        heuristic = spent.get("heuristic") or {}
        epsilon, delta, guarantee, adjacency = heuristic.get("max_basic_epsilon"), 0.0, "heuristic", "record (substitution)"
    return {"mechanism": mechanism, "parameter": parameter, "epsilon": epsilon, "delta": delta, "guarantee": guarantee,
            "adjacency": adjacency, "final_accuracy": summary.get("final_accuracy"),
            "best_accuracy": summary.get("best_accuracy"), "emulated_time_s": summary.get("emulated_time_s"),
            "payload_gib_up": summary.get("payload_gib_up"), "payload_gib_down": summary.get("payload_gib_down"),
            "wall_time_s": summary.get("wall_time_s")}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for mechanism, marker in (("laplace", "o"), ("dpsgd", "s"), ("dpfedavg", "^")):
        mine = sorted((r for r in rows if r["mechanism"] == mechanism and r["epsilon"]), key=lambda r: r["epsilon"])
        if mine:
            ax.plot([r["epsilon"] for r in mine], [r["final_accuracy"] for r in mine], marker=marker,
                    label=f"{mechanism} ({mine[0]['adjacency']}, {mine[0]['guarantee']})")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (each mechanism's own adjacency)")
    ax.set_ylabel("final test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--laplace", default="10,1000,10000", help="algorithm.privacy.epsilon values")
    ap.add_argument("--dpsgd", default="0.6,1.0", help="noise multipliers")
    ap.add_argument("--dpfedavg", default="0.5,0.8,1.5", help="noise multipliers")
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for eps in _floats(args.laplace):
        rows.append(_row("laplace", eps, _run("scenarios/edge_1000.yaml", [f"algorithm.privacy.epsilon={eps}"], args.rounds)))
    for z in _floats(args.dpsgd):
        sets = ["algorithm.privacy.mechanism=dpsgd", "algorithm.privacy.clip=1.0", f"algorithm.privacy.noise_multiplier={z}",
                "algorithm.privacy.epsilon=null", "algorithm.privacy.noise_factor=code"]
        rows.append(_row("dpsgd", z, _run("scenarios/edge_1000.yaml", sets, args.rounds)))
    for z in _floats(args.dpfedavg):
        rows.append(_row("dpfedavg", z, _run("scenarios/edge_1000_private.yaml", [f"algorithm.options.noise_multiplier={z}"],
                                             args.rounds)))
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        print(json.dumps({"rounds": args.rounds, "runs": rows}, indent=1))
        return
    print(f"{'mechanism':>9} {'param':>8} {'epsilon':>10} {'delta':>7} {'guarantee':>9} {'final acc':>9} {'emulated s':>10} "
          f"{'GiB up':>7} {'GiB down':>8}")
    for r in rows:
        eps = f"{r['epsilon']:.3g}" if r["epsilon"] is not None else "-"
        print(f"{r['mechanism']:>9} {r['parameter']:>8g} {eps:>10} {r['delta'] or 0:>7.0e} {r['guarantee']:>9} "
              f"{r['final_accuracy'] or 0:>9.4f} {r['emulated_time_s'] or 0:>10.1f} {r['payload_gib_up'] or 0:>7.3f} "
              f"{r['payload_gib_down'] or 0:>8.3f}")


if __name__ == "__main__":
    main()
