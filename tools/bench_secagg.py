"""Secure aggregation's compute, measured on this CPU (issue 44's benchmarks): a client masking its
update, and the server unmasking a cohort with dropped clients, for a 1.66M-parameter model.

    python tools/bench_secagg.py [--params 1663370] [--cohort 100] [--dropout 0.1] [--degree 20] [--json]

- mask_mb_s: a client's mask stream (AES-CTR words, its self mask and one pairwise mask per
  neighbour) in MB/s, over a whole masking of its update (`--degree` neighbours: SecAgg+'s k; SecAgg
  masks with every other client of the cohort).
- unmask_s: the server's unmasking of a cohort of `--cohort` with `--dropout` of them dropped
  after masking: the survivors' self masks off, and each dropped client's pairwise masks with its
  surviving neighbours, for SecAgg (every pair) and SecAgg+ (`--degree` neighbours); the Shamir
  reconstructions (one secret per client) are included. Time is of the primitives only (no network,
  no decoding of frames), one thread.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.secagg import fixedpoint, masking, shamir  # noqa: E402


def seed(*parts) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


def neighbours(u: int, cohort: int, degree: int | None) -> list[int]:
    """Every other client (SecAgg), or `degree` of them on a ring-like regular graph (SecAgg+)."""
    if degree is None or degree >= cohort - 1:
        return [v for v in range(cohort) if v != u]
    half = degree // 2
    return sorted({(u + d) % cohort for d in range(-half, half + 1) if d} - {u})


def mask_rate(params: int, degree: int, bits: int) -> float:
    x = np.zeros(params, np.uint32)
    pairs = {v: seed("pair", v) for v in range(1, degree + 1)}
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        masking.masked(x, bits, seed("self"), pairs, 0)
        best = min(best, time.perf_counter() - t)
    return (degree + 1) * params * 4 / best / 1e6


def unmask_time(params: int, cohort: int, dropout: float, degree: int | None, bits: int) -> float:
    dropped = set(range(0, cohort, max(1, round(1 / dropout)))) if dropout > 0 else set()
    survivors = [u for u in range(cohort) if u not in dropped]
    masked = {u: np.zeros(params, np.uint32) for u in survivors}  # the values do not change the work
    threshold = cohort // 2 + 1
    shares = {u: shamir.split(seed("self", u), threshold, list(range(1, cohort + 1)), seed("c", u)) for u in range(cohort)}
    t = time.perf_counter()
    holders = [v + 1 for v in survivors[:threshold]]
    self_seeds = {u: shamir.combine({h: shares[u][h] for h in holders}) for u in survivors}

    def dropped_pairs():
        out = []
        for u in sorted(dropped):
            shamir.combine({h: shares[u][h] for h in holders})  # the dropped client's key, from its shares
            out += [(v, u, seed("pair", min(u, v), max(u, v))) for v in neighbours(u, cohort, degree) if v not in dropped]
        return out

    masking.unmasked_sum(masked, bits, self_seeds, dropped_pairs)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=int, default=1_663_370)
    ap.add_argument("--cohort", type=int, default=100)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--degree", type=int, default=20, help="SecAgg+'s neighbours per client")
    ap.add_argument("--bits", type=int, default=8, help="the shared fixed-point encoding's bits")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    m = fixedpoint.sum_bits(args.bits, args.cohort)
    out = {
        "params": args.params, "cohort": args.cohort, "dropout": args.dropout, "degree": args.degree, "sum_bits": m,
        "mask_mb_s": round(mask_rate(args.params, args.degree, m), 1),
        "unmask_s_secagg": round(unmask_time(args.params, args.cohort, args.dropout, None, m), 3),
        "unmask_s_secaggplus": round(unmask_time(args.params, args.cohort, args.dropout, args.degree, m), 3),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:22} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
