"""Statistics of link-capacity traces, the figures emulator/flows/traces.py's SyntheticFades is
fitted to: each file's mean, coefficient of variation, percentiles of the rate relative to the mean,
the share of time below 30 % of the mean and the mean length of those fades, and the share of time
with no capacity, in bins of --bin-s (1 s by default).

    python tools/trace_stats.py ../shared/data/traces/mahimahi/*.up ../shared/data/traces/mahimahi/*.down
    python tools/trace_stats.py --synthetic 5 --seeds 3     # what the generator gives, for comparison
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from emulator.flows.traces import SyntheticFades, Trace, TraceRef, load_trace  # noqa: E402


def stats(trace: Trace) -> dict:
    r = np.asarray(trace.rates)
    mean = float(r.mean())
    rel = r / mean if mean > 0 else r
    low = rel < 0.3
    runs, run = [], 0
    for x in low:
        if x:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    if run:
        runs.append(run)
    return {"name": trace.name, "mean_mbps": mean / 1e6, "cv": float(rel.std()),
            "p10": float(np.percentile(rel, 10)), "p50": float(np.percentile(rel, 50)), "p90": float(np.percentile(rel, 90)),
            "below_30pct_share": float(low.mean()), "fade_s": float(np.mean(runs)) * trace.bin_s if runs else 0.0,
            "outage_share": float(np.mean(r == 0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--bin-s", type=float, default=1.0)
    ap.add_argument("--synthetic", type=float, metavar="MEAN_MBPS", help="also the generator's traces at this mean")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    traces = [load_trace(TraceRef(f, bin_s=args.bin_s)) for f in args.files]
    if args.synthetic:
        traces += [SyntheticFades(args.synthetic).trace([seed], args.bin_s) for seed in range(args.seeds)]
    rows = [stats(t) for t in traces]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        name = row['name'] if row['name'].startswith('synthetic') else Path(row['name']).name
        print(f"{name[:34]:34s} mean {row['mean_mbps']:7.2f} Mbit/s  cv {row['cv']:.2f}  "
              f"p10/50/90 {row['p10']:.2f}/{row['p50']:.2f}/{row['p90']:.2f}  below 30 % {row['below_30pct_share']:.2f} "
              f"(fades {row['fade_s']:.1f} s)  outage {row['outage_share']:.2f}")


if __name__ == "__main__":
    main()
