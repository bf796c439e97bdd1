"""FedAvg, FedProx, FedAlign and the FIRMA ring family on one non-IID task, same seed and rounds.

    python tools/firma_study.py --rounds 20 --out runs/firma_study

Every method runs on the same 10 clients (Fashion-MNIST, FIRMA's label skew K = 1 by default),
the same devices and links, the same firma_mlp model, and is scored the same way: the mean over
clients of the accuracy on each client's own test split (eval.split: clients for the star
methods; the ring clients evaluate themselves with their private heads). The star methods use
scenarios/fedalign.yaml with full participation; the ring ones scenarios/ring_fibfl.yaml. Local
compute is matched: FedAvg-style methods train E_h + E_e epochs per round.

The paper's finding to look for: FibFL++ beats FedAvg under label skew."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studies import REPO, run_and_compare
STAR = REPO / "scenarios" / "fedalign.yaml"
RING = REPO / "scenarios" / "ring_fibfl.yaml"
METHODS = {
    "fedavg": (STAR, ["algorithm.name=fedavg"]),
    "fedprox": (STAR, ["algorithm.name=fedprox", "algorithm.options.mu=0.01"]),
    "fedalign": (STAR, ["algorithm.name=fedalign"]),
    "fibfl": (RING, ["algorithm.firma.variant=fibfl"]),
    "fibfl+": (RING, ["algorithm.firma.variant=fibfl+"]),
    "fibfl++": (RING, ["algorithm.firma.variant=fibfl++"]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="fedavg,fedalign,fibfl,fibfl++", help=f"comma-separated: {','.join(METHODS)}")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--epochs-head", type=int, default=1)
    ap.add_argument("--epochs-extractor", type=int, default=4, help="the paper's code uses 20")
    ap.add_argument("--partition", default="label_skew", choices=["label_skew", "dirichlet", "iid"])
    ap.add_argument("--k", type=int, default=1, help="label_skew: primary classes per client")
    ap.add_argument("--alpha", type=float, default=0.5, help="dirichlet concentration")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=Path("runs/firma_study"))
    args = ap.parse_args()

    task = [f"task.partition.kind={args.partition}", f"task.partition.classes_per_client={args.k}",
            f"task.partition.alpha={args.alpha}", "task.partition.rule=floor", f"rounds={args.rounds}", "eval.every=1"]
    runs = []
    for method in args.methods.split(","):
        if method not in METHODS:
            print(f"unknown method {method!r}; known: {', '.join(METHODS)}", file=sys.stderr)
            return 2
        scenario, sets = METHODS[method]
        if scenario == RING:
            sets = sets + [f"algorithm.firma.epochs_head={args.epochs_head}",
                           f"algorithm.firma.epochs_extractor={args.epochs_extractor}"]
        else:
            sets = sets + [f"algorithm.local_epochs={args.epochs_head + args.epochs_extractor}"]
        runs.append((method, scenario, task + sets + args.extra))
    return run_and_compare(runs, args.out)


if __name__ == "__main__":
    sys.exit(main())
