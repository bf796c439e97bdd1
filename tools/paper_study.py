"""A short MNIST study of the core paper's modes on the emulator, then the comparison table.

    python tools/paper_study.py --rounds 30 --epochs 1 --out runs/study

Runs scenarios/paper/mnist_MODE.yaml for each mode with the same seed, rounds and overrides, one
after another, and prints `python -m emulator compare` over the runs. The paper's finding to look
for: INT8 and Cosine end within a few points of FP32, INT4 clearly below.

The paper's study is T = 1000 rounds of E = 5 epochs. A shorter run keeps the paper's horizon
(--horizon, 1000: the cosine schedule's T and c_T's T), so it is a prefix of that study rather than the
whole schedule squeezed into fewer rounds; it says so when it is shortened."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studies import REPO, run_and_compare


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="fp32,int8,int4,cosine", help="comma-separated: fp32,int16,int8,int4,cosine,dynamic")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=5, help="E (the paper's: 5)")
    ap.add_argument("--horizon", type=int, default=1000, help="the T of the schedule and of c_T (the paper's: 1000)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--comm-only", action="store_true", help="algorithm.train=false: bytes and time only")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=Path("runs/paper_study"))
    args = ap.parse_args()

    if args.rounds < args.horizon or args.epochs != 5:
        print(f"note: a prefix of the paper's study: {args.rounds} of T = {args.horizon} rounds, E = {args.epochs} "
              f"(the paper's E is 5); the bit schedule and c_T follow T = {args.horizon}", file=sys.stderr)
    runs = []
    for mode in args.modes.split(","):
        sets = [f"rounds={args.rounds}", f"algorithm.local_epochs={args.epochs}", f"population.clients={args.clients}",
                f"eval.every={args.eval_every}", f"algorithm.quantization.horizon={args.horizon}",
                f"algorithm.privacy.horizon={args.horizon}", *(["algorithm.train=false"] if args.comm_only else []),
                *args.extra]
        runs.append((mode, REPO / "scenarios" / "paper" / f"mnist_{mode}.yaml", sets))
    return run_and_compare(runs, args.out)


if __name__ == "__main__":
    sys.exit(main())
