"""What secure aggregation costs per round (issue 44, item 4): for cohorts of 10 to 1000 clients with
a 1.66M-parameter model (the MNIST CNN) and 0, 10 and 30 % of the cohort dropping out after
sharing their keys, a client's and the server's bytes, the server's compute, and (for the cohorts
emulated) the round's emulated time, for secagg and secaggplus, beside the growth Bell et al. state.

    python tools/secagg_study.py [--cohorts 10,50,100,500,1000] [--emulate 10,50,100] [--json]

- Bytes and compute of every cell come from node/secure/analytic.py: the protocol's record sizes
  and the cost model measured on this machine now (node/secure/config.py), the same model a run
  charges. With no dropout they are exact: tests/test_secure_protocol.py checks them against the
  actors' messages.
- `--emulate` cohorts run for real (real processes, every phase through the emulated links, one
  round, communication only: algorithm.train false), with no dropout; the study prints their
  emulated round time and checks that each phase's payload bytes in secure.csv equal the
  arithmetic. Masking every pair of a cohort of 500 or 1000 for real would take hours of CPU here
  (each client expands n - 1 masks of 1.66M words), which is why the larger cells are arithmetic.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from node.secure import analytic  # noqa: E402
from node.secure.config import SecureConfig, measure_costs  # noqa: E402
from studies import run_scenario  # noqa: E402

LENGTH = 1_663_370 + 1  # the MNIST CNN's parameters and the weight slot
PROTOCOLS = ("secagg", "secaggplus")
SCENARIO = """
name: secagg_study
seed: 1
rounds: 1
task: {{dataset: mnist, model: mnist_cnn, partition: {{kind: iid}}}}
population:
  clients: {n}
  devices: [{{profile: phone_mid}}]
  links: [{{profile: lte}}]
server: {{link: {{up_mbps: 1000, down_mbps: 1000, latency_ms: 2}}}}
selection: {{clients_per_round: {n}}}
algorithm:
  train: false
  codec: {{down: {{name: int}}}}
  secure_aggregation: {{protocol: {protocol}, bits: 16, clip: 0.5, dropout: 0.1}}
eval: {{every: 0}}
"""


def emulate(protocol: str, n: int, cfg: SecureConfig) -> dict:
    """One round for real; its emulated time and whether secure.csv's bytes are the arithmetic's."""
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "s.yaml", Path(tmp) / "run"
        path.write_text(SCENARIO.format(n=n, protocol=protocol))
        res = run_scenario(path, out, [], ("--quiet",), capture_output=True)
        if res.returncode != 0:
            raise SystemExit(f"the emulated run of {protocol} n={n} failed: {res.stderr[-2000:]}")
        with open(out / "rounds.csv") as f:
            rnd = next(csv.DictReader(f))
        with open(out / "secure.csv") as f:
            phases = list(csv.DictReader(f))
    cost = analytic.round_cost(cfg, n, LENGTH)
    up = sum(int(p["payload_bytes_up"]) for p in phases)
    down = sum(int(p["payload_bytes_down"]) for p in phases)
    return {"protocol": protocol, "cohort": n, "round_time_s": float(rnd["t_end"]) - float(rnd["t_start"]),
            "phase_s": {p["phase"]: float(p["duration_s"]) for p in phases},
            "bytes_match": (up, down) == (cost.server_up_bytes, cost.server_down_bytes), "server_up_bytes": up,
            "server_down_bytes": down}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohorts", default="10,50,100,500,1000")
    ap.add_argument("--dropouts", default="0,0.1,0.3")
    ap.add_argument("--emulate", default="10,50,100", help="cohorts to run for real (none: '')")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    costs = measure_costs(1.0)
    cells = []
    for protocol in PROTOCOLS:
        for n in (int(x) for x in args.cohorts.split(",")):
            for d in (float(x) for x in args.dropouts.split(",")):
                # secaggplus chooses its graph for the dropout it expects (at least 10 %)
                cfg = SecureConfig(protocol, 16, 0.5, dropout=max(d, 0.1), costs=costs)
                cost = analytic.round_cost(cfg, n, LENGTH, d, costs)
                client_growth, server_growth = analytic.growth(protocol, n, LENGTH)
                cells.append({**cost.as_dict(), "client_bytes": cost.client_up_bytes + cost.client_down_bytes,
                              "server_bytes": cost.server_up_bytes + cost.server_down_bytes,
                              "bell_client_growth": client_growth, "bell_server_growth": server_growth})
    emulated = []
    for n in (int(x) for x in args.emulate.split(",") if x):
        for protocol in PROTOCOLS:
            emulated.append(emulate(protocol, n, SecureConfig(protocol, 16, 0.5, dropout=0.1)))
    if args.json:
        print(json.dumps({"model_values": LENGTH, "costs": costs.as_dict(), "cells": cells, "emulated": emulated}, indent=1))
        return
    print(f"{'protocol':>10} {'n':>5} {'drop':>5} {'k':>4} {'t':>4} {'m':>3} {'client MB':>10} {'server MB':>11} "
          f"{'overhead MB':>12} {'client s':>9} {'server s':>9}")
    for c in cells:
        print(f"{c['protocol']:>10} {c['cohort']:>5} {c['dropout']:>5.2f} {c['degree']:>4} {c['threshold']:>4} "
              f"{c['word_bits']:>3} {c['client_bytes'] / 1e6:>10.3f} {c['server_bytes'] / 1e6:>11.1f} "
              f"{c['overhead_bytes'] / 1e6:>12.2f} {c['client_compute_s']:>9.3f} {c['server_compute_s']:>9.3f}")
    for e in emulated:
        print(f"emulated {e['protocol']} n={e['cohort']}: round {e['round_time_s']:.2f} s "
              f"(phases {', '.join(f'{k} {v:.2f}' for k, v in e['phase_s'].items())}); bytes match the arithmetic: "
              f"{e['bytes_match']}")


if __name__ == "__main__":
    main()
