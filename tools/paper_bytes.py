"""The core paper's Table 6 bytes, every published cell, from the analytic comm-only path.

    python tools/paper_bytes.py [--json]

For each published (data set, N, mode) it computes the payload GiB (2^30 bytes, down plus up,
T = 1000, P = N/10) of the shipped scenario scenarios/paper/DATASET_MODE.yaml with
algorithm.train=false, without starting a process (emulator/analytic.py; tests/test_paper_totals.py
checks that path against a real run round by round). CIFAR-10's files are not needed: only its
class sizes matter. Each row gives the total here, the total counted as the authors' code counts
it (it quantized BatchNorm's counters with the weights), and the paper's figure.

Needs MNIST (EMULATOR_DATA or task.data_root) for the MNIST rows."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.analytic import labels_only_task, totals_gib  # noqa: E402
from emulator.scenario import load_scenario  # noqa: E402

# The paper's Table 6 (GiB), as docs/guide/paper.md lists it: (data set, N, mode) -> GiB.
# INT16 and INT4 at N = 50 are Eq. 1.13's, not read from the paper.
PUBLISHED = {
    ("mnist", 50, "fp32"): 61.97, ("mnist", 50, "int16"): 30.98, ("mnist", 50, "int8"): 15.49,
    ("mnist", 50, "int4"): 7.75, ("mnist", 50, "cosine"): 38.75, ("mnist", 50, "dynamic"): 31.27,
    ("mnist", 100, "fp32"): 123.93, ("mnist", 100, "int8"): 30.98, ("mnist", 100, "cosine"): 77.50,
    ("mnist", 100, "dynamic"): 61.30,
    ("mnist", 1000, "fp32"): 1239.31, ("mnist", 1000, "cosine"): 775.03, ("mnist", 1000, "dynamic"): 586.92,
    ("cifar10", 50, "fp32"): 12.13, ("cifar10", 50, "int8"): 3.03, ("cifar10", 50, "cosine"): 7.59,
    ("cifar10", 50, "dynamic"): 6.86,
    ("cifar10", 1000, "fp32"): 242.67, ("cifar10", 1000, "cosine"): 151.76, ("cifar10", 1000, "dynamic"): 133.32,
}


def cell(dataset: str, clients: int, mode: str, *sets: str) -> tuple[float, float]:
    """(GiB here, GiB as the paper's code counts) for one cell of the table."""
    sc, _ = load_scenario(REPO / "scenarios" / "paper" / f"{dataset}_{mode}.yaml",
                          ["algorithm.train=false", f"population.clients={clients}", *sets])
    return totals_gib(sc, labels_only_task(sc) if dataset == "cifar10" else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object: a row per cell")
    args = ap.parse_args()
    rows = []
    for (dataset, clients, mode), paper in PUBLISHED.items():
        here, counted = cell(dataset, clients, mode)
        rows.append({"dataset": dataset, "clients": clients, "mode": mode, "paper_gib": paper, "gib": round(here, 4),
                     "gib_paper_counting": round(counted, 4), "relative": round(here / paper - 1, 5)})
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
        return 0
    print(f"{'data set':8} {'N':>5} {'mode':8} {'paper':>9} {'here':>10} {'as counted':>10} {'rel.':>8}")
    for r in rows:
        print(f"{r['dataset']:8} {r['clients']:5} {r['mode']:8} {r['paper_gib']:9.2f} {r['gib']:10.3f} "
              f"{r['gib_paper_counting']:10.3f} {100 * r['relative']:+7.3f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
