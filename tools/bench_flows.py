"""The flow model's rate update: F concurrent flows through one server link, each also on its own
access link (a round's uploads), and one flow finishing. Times (a) the from-scratch max-min
solution of the remaining flows (emulator/links.py max_min_fill, what FlowModel does at every
flow start and end today) and (b) the incremental update (emulator/maxmin.py: remove the flow,
find the new water level) after which every flow's rate reads in O(1); both medians over many
finishing flows, measured in this run, and their ratio. A star with a second shared link (a
cell behind the server) is timed too, where the incremental model solves that component again.

Usage: python tools/bench_flows.py [--flows 10000] [--json]
--json prints one object: flows, scratch_ms, incremental_ms, speedup (and the same for the cell case)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emulator.links import max_min_fill  # noqa: E402
from emulator.maxmin import IncrementalMaxMin  # noqa: E402


def star(flows: int, rng: np.random.Generator, cell: bool) -> tuple[dict, dict]:
    """Access links of 1-100 Mbit/s behind a 1 Gbit/s server link; with `cell`, a tenth of the
    clients also behind one shared 50 Mbit/s cell."""
    caps = {"server": 1e9, "cell": 50e6}
    paths = {}
    for i in range(flows):
        caps[f"a{i}"] = float(rng.uniform(1e6, 100e6))
        paths[i] = (f"a{i}", "cell", "server") if cell and i % 10 == 0 else (f"a{i}", "server")
    return caps, paths


def measure(flows: int, finishing: int, cell: bool) -> dict:
    rng = np.random.default_rng(0)
    caps, paths = star(flows, rng, cell)
    model = IncrementalMaxMin(caps)
    for fid, path in paths.items():
        model.add(fid, path)
    model.rates()
    leaving = rng.choice(flows, finishing, replace=False)
    scratch, incremental = [], []
    for fid in leaving:
        fid = int(fid)
        del paths[fid]
        start = time.perf_counter()
        max_min_fill(list(paths.values()), caps)
        scratch.append(time.perf_counter() - start)
        start = time.perf_counter()
        model.remove(fid)
        model.rate(next(iter(paths)))  # the new level (or the component's solution) is computed here
        incremental.append(time.perf_counter() - start)
    s, i = statistics.median(scratch), statistics.median(incremental)
    # the incremental rates are the from-scratch ones
    order = sorted(paths, key=model.seq.__getitem__)
    want = max_min_fill([paths[f] for f in order], caps)[0]
    got = [model.rate(f) for f in order]
    worst = max(abs(a - b) / max(abs(b), 1.0) for a, b in zip(got, want))
    return {"flows": flows, "scratch_ms": round(s * 1e3, 4), "incremental_ms": round(i * 1e3, 4),
            "speedup": round(s / i, 1), "max_rel_error": worst}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, default=10_000)
    ap.add_argument("--finishing", type=int, default=50, help="flows that finish, one at a time (medians over them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    plain = measure(args.flows, args.finishing, cell=False)
    cell = measure(args.flows, min(args.finishing, 20), cell=True)
    if args.json:
        print(json.dumps({**plain, "cell": cell}))
        return
    for name, f in (("star (server link + own access links)", plain), ("star with a shared cell for 10 %", cell)):
        print(f"{name}, {f['flows']} flows, one finishing: from scratch {f['scratch_ms']:.3f} ms, "
              f"incremental {f['incremental_ms']:.4f} ms, speedup {f['speedup']:.0f}x "
              f"(largest relative difference of the rates {f['max_rel_error']:.1e})")


if __name__ == "__main__":
    main()
