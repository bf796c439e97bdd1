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

--limit-s S stops each run at S wall seconds (SIGTERM: the run writes its files, status
"terminated"), and the case reports what it reached (first_round_s null where round 0 did not
end); growth exponents use completed runs only. --million runs the issue's case alone: N =
1,000,000, P = 10,000, 5 rounds, stopped at 900 s (15 minutes).

Usage: python tools/bench_scale.py [--clients 1000,10000,100000] [--per-round 100,1000] [--rounds 20]
                                   [--transport tcp|fluid] [--limit-s S] [--million] [--json]
--links traced gives every link mix of the scenario trace-driven capacity (a synthetic cellular trace
per client and direction, emulator/flows/traces.py's SyntheticFades, its mean the profile's rate in
scenarios/profiles.yaml); --links static,traced runs each case both ways, back to back, and adds
traced_wall_ratio and traced_pss_ratio (traced over static, whole run and peak PSS) to the traced case.
--trace-pool N gives each link mix and direction N generated traces that its clients share, each
client from its own offset (synthetic.pool), instead of one per client.

--json prints one object per case with keys clients, per_round, transport, links, wall_s_per_round,
events_per_s, pss_gib (and first_round_s, wall_s, rounds, emulated_s, status), then one object per
P with per_round, growth_exponent (per round) and growth_exponent_whole_run (over static runs when
both kinds ran)."""
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulator.scenario import DEFAULT_PROFILES, load_profiles  # noqa: E402
SCENARIO = ROOT / "scenarios" / "population_100k.yaml"
SAMPLES_PER_CLIENT = 2  # the scenario's 200,000 synthetic samples for 100,000 clients
MIN_POPULATION_PER_SELECTED = 4  # a quarter of the population is off at any time: P above N/4 is not a round
STOP_GRACE_S = 180  # a run stopped at its limit writes its files within this
# --million: the case, a million devices with 10,000 a round for 5 rounds in 15 minutes
MILLION = {"clients": "1000000", "per_round": "10000", "rounds": 5, "limit_s": 900.0}


def traced_links(pool: int | None = None) -> str:
    """The scenario's link mixes, each direction a synthetic trace at its profile's mean rate (with
    `pool`, one of that many per mix and direction)."""
    profiles = load_profiles(DEFAULT_PROFILES)["links"]
    extra = {"pool": pool} if pool else {}
    mixes = []
    for mix in yaml.safe_load(SCENARIO.read_text())["population"]["links"]:
        rates = profiles[mix["profile"]]
        mixes.append({**mix, "up_trace": {"synthetic": {"mean_mbps": rates["up_mbps"], **extra}},
                      "down_trace": {"synthetic": {"mean_mbps": rates["down_mbps"], **extra}}})
    return json.dumps(mixes)  # (YAML reads JSON)


def run_case(clients: int, per_round: int, rounds: int, transport: str, limit_s: float | None = None,
             links: str = "static", trace_pool: int | None = None) -> dict:
    """One real run; with limit_s, stopped by SIGTERM at that wall time (it writes what it has)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        sets = {"population.clients": clients, "selection.clients_per_round": per_round, "rounds": rounds,
                "task.synthetic.samples": SAMPLES_PER_CLIENT * clients, "network.transport": transport}
        if links == "traced":
            sets["population.links"] = traced_links(trace_pool)
        args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "emulator", "run", str(SCENARIO), "--plain", "--out", str(out), *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        stopped = False
        try:
            _, err = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stopped = True
            proc.terminate()  # the conductor stops every process and writes the run's files
            try:
                _, err = proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
        wall = time.perf_counter() - start
        summary_path = out / "summary.json"
        if not summary_path.exists() or (proc.returncode != 0 and not stopped):
            sys.exit(f"the run at N = {clients}, P = {per_round} failed:\n{err[-3000:]}")
        summary = json.loads(summary_path.read_text())
        with open(out / "rounds.csv") as f:
            walls = [float(r["wall_s"]) for r in csv.DictReader(f)]
    network = summary.get("network") or {}
    steady = (walls[-1] - walls[0]) / (len(walls) - 1) if len(walls) > 1 else None  # (JSON has no NaN)
    return {"clients": clients, "per_round": per_round, "transport": transport, "links": links,
            "trace_pool": trace_pool if links == "traced" else None, "wall_s_per_round": steady,
            "events_per_s": network.get("events_per_s"), "pss_gib": summary["peak_pss_mib"] / 1024,
            "first_round_s": walls[0] if walls else None, "wall_s": wall, "rounds": len(walls),
            "emulated_s": summary["emulated_time_s"], "events": network.get("events"), "status": summary["status"]}


def growth_exponent(cases: list[dict], per_round: int, key: str = "wall_s_per_round") -> float | None:
    """g in key ~ N^g over the completed cases at `per_round`, a least-squares fit in log-log."""
    kinds = {c["links"] for c in cases}
    points = [(math.log(c["clients"]), math.log(c[key])) for c in cases
              if c["per_round"] == per_round and c["status"] == "completed" and (c[key] or 0) > 0
              and (c["links"] == "static" or len(kinds) == 1)]
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
    ap.add_argument("--limit-s", type=float, default=None,
                    help="stop each run at this wall time (SIGTERM) and report what it reached")
    ap.add_argument("--million", action="store_true",
                    help="only N = 1,000,000, P = 10,000, 5 rounds, stopped at 900 s")
    ap.add_argument("--links", default="static", help="static, traced, or static,traced (each case both ways)")
    ap.add_argument("--trace-pool", type=int, default=None,
                    help="traced links: N generated traces per link mix and direction, shared (default: one per client)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    kinds = a.links.split(",")
    if not kinds or any(k not in ("static", "traced") for k in kinds):
        sys.exit(f"--links: {a.links!r}: give static, traced or static,traced")
    if a.million:
        a.clients, a.per_round, a.rounds, a.limit_s = MILLION["clients"], MILLION["per_round"], MILLION["rounds"], MILLION["limit_s"]
    cases = []
    for per_round in [int(p) for p in a.per_round.split(",")]:
        for clients in [int(n) for n in a.clients.split(",")]:
            if per_round * MIN_POPULATION_PER_SELECTED > clients:
                continue
            static = None
            for links in kinds:
                case = run_case(clients, per_round, a.rounds, a.transport, a.limit_s, links, a.trace_pool)
                cases.append(case)
                if links == "static":
                    static = case
                elif static is not None:
                    case["traced_wall_ratio"] = round(case["wall_s"] / static["wall_s"], 3)
                    case["traced_pss_ratio"] = round(case["pss_gib"] / static["pss_gib"], 3)
                report(case, a.json)
    for per_round in dict.fromkeys(c["per_round"] for c in cases):
        g, whole = growth_exponent(cases, per_round), growth_exponent(cases, per_round, "wall_s")
        if a.json:
            print(json.dumps({"per_round": per_round, "growth_exponent": g, "growth_exponent_whole_run": whole}))
        elif g is not None:
            print(f"P = {per_round:,}: wall time per round ~ N^{g:.3f}, whole run ~ N^{whole:.3f}")


def report(case: dict, as_json: bool) -> None:
    if as_json:
        keys = ("clients", "per_round", "transport", "links", "trace_pool", "wall_s_per_round", "events_per_s", "pss_gib",
                "first_round_s", "wall_s", "rounds", "emulated_s", "status", "traced_wall_ratio", "traced_pss_ratio")
        print(json.dumps({k: case[k] for k in keys if k in case}), flush=True)
        return
    first = f"{case['first_round_s']:6.1f} s" if case["first_round_s"] is not None else "not reached"
    per_round_s = f"{case['wall_s_per_round']:6.2f}" if case["wall_s_per_round"] is not None else "     -"
    ratios = (f"  (traced/static: whole run {case['traced_wall_ratio']:.2f}x, PSS {case['traced_pss_ratio']:.2f}x)"
              if "traced_wall_ratio" in case else "")
    print(f"N = {case['clients']:>7,}  P = {case['per_round']:>5,}  {case['links']:<6}  {per_round_s} s/round  "
          f"first round at {first}  whole run {case['wall_s']:6.1f} s ({case['status']}, "
          f"{case['rounds']} rounds)  {case['events'] or 0:>9,} events  {case['events_per_s'] or 0:7.0f} events/s  "
          f"{case['pss_gib']:.2f} GiB PSS{ratios}", flush=True)


if __name__ == "__main__":
    main()
