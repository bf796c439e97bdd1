"""Scale: scenarios/population_100k.yaml's family (edge profiles, Markov availability, batteries,
check-ins, comm-only, a small MLP) at N = 1k, 10k and 100k clients and P = 100 and 1,000 per round,
each a real run of `python -m emulator run` measured in this run.

Per case it prints:
- wall_s_per_round: wall seconds per round once the run is under way (round 0's end to the last
  round's end, over rounds - 1): what a round costs at this N;
- first_round_s: wall seconds from the command's start to round 0's end (building the world,
  starting the processes, every available device checking in);
- wall_s: the whole command, plots included;
- events_per_s: events the network process handled per second of wall time (summary.json network);
- pss_gib: the run's peak PSS over all its processes (summary.json peak_pss_mib).
Then, for each P with two population sizes or more, the growth exponent g of wall_s_per_round ~ N^g
(a least-squares fit in log-log) and the same over the whole run (wall_s: building the world, the
check-in wave and round 0 included).

The transport is the scenario's (tcp, the default, with the incremental solver); --transport fluid
runs the same cases with the fluid model instead, for comparison.

Usage: python tools/bench_scale.py [--clients 1000,10000,100000] [--per-round 100,1000] [--rounds 20]
                                   [--transport tcp|fluid] [--json]
--json prints one object per case with keys clients, per_round, transport, wall_s_per_round,
events_per_s, pss_gib (and first_round_s, wall_s, rounds, emulated_s), then one object per P with
per_round, growth_exponent (per round) and growth_exponent_whole_run."""
from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "population_100k.yaml"
SAMPLES_PER_CLIENT = 2  # the scenario's 200,000 synthetic samples for 100,000 clients
MIN_POPULATION_PER_SELECTED = 4  # a quarter of the population is off at any time: P above N/4 is not a round


def run_case(clients: int, per_round: int, rounds: int, transport: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        sets = {"population.clients": clients, "selection.clients_per_round": per_round, "rounds": rounds,
                "task.synthetic.samples": SAMPLES_PER_CLIENT * clients, "network.transport": transport}
        args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
        start = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "emulator", "run", str(SCENARIO), "--plain", "--out", str(out), *args],
                             capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if res.returncode != 0:
            sys.exit(f"the run at N = {clients}, P = {per_round} failed:\n{res.stderr[-3000:]}")
        summary = json.loads((out / "summary.json").read_text())
        with open(out / "rounds.csv") as f:
            walls = [float(r["wall_s"]) for r in csv.DictReader(f)]
    network = summary.get("network") or {}
    steady = (walls[-1] - walls[0]) / (len(walls) - 1) if len(walls) > 1 else float("nan")
    return {"clients": clients, "per_round": per_round, "transport": transport, "wall_s_per_round": steady,
            "events_per_s": network.get("events_per_s"), "pss_gib": summary["peak_pss_mib"] / 1024,
            "first_round_s": walls[0] if walls else float("nan"), "wall_s": wall, "rounds": len(walls),
            "emulated_s": summary["emulated_time_s"], "events": network.get("events")}


def growth_exponent(cases: list[dict], per_round: int, key: str = "wall_s_per_round") -> float | None:
    """g in key ~ N^g over the cases at `per_round`, a least-squares fit in log-log."""
    points = [(math.log(c["clients"]), math.log(c[key])) for c in cases if c["per_round"] == per_round and c[key] > 0]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1000,10000,100000")
    ap.add_argument("--per-round", default="100,1000")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--transport", choices=("tcp", "fluid"), default="tcp")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cases = []
    for per_round in [int(p) for p in a.per_round.split(",")]:
        for clients in [int(n) for n in a.clients.split(",")]:
            if per_round * MIN_POPULATION_PER_SELECTED > clients:
                continue
            case = run_case(clients, per_round, a.rounds, a.transport)
            cases.append(case)
            if a.json:
                print(json.dumps({k: case[k] for k in ("clients", "per_round", "transport", "wall_s_per_round", "events_per_s",
                                                       "pss_gib", "first_round_s", "wall_s", "rounds", "emulated_s")}),
                      flush=True)
            else:
                print(f"N = {clients:>7,}  P = {per_round:>5,}  {case['wall_s_per_round']:6.2f} s/round  "
                      f"first round at {case['first_round_s']:6.1f} s  whole run {case['wall_s']:6.1f} s  "
                      f"{case['events']:>9,} events  {case['events_per_s'] or 0:7.0f} events/s  {case['pss_gib']:.2f} GiB PSS",
                      flush=True)
    for per_round in dict.fromkeys(c["per_round"] for c in cases):
        g, whole = growth_exponent(cases, per_round), growth_exponent(cases, per_round, "wall_s")
        if a.json:
            print(json.dumps({"per_round": per_round, "growth_exponent": g, "growth_exponent_whole_run": whole}))
        elif g is not None:
            print(f"P = {per_round:,}: wall time per round ~ N^{g:.3f}, whole run ~ N^{whole:.3f}")


if __name__ == "__main__":
    main()
