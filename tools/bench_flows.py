"""The flow model's rate update: F concurrent flows through one server link, each also on its own
access link (a round's uploads), and one flow finishing. Times (a) the from-scratch max-min
solution of the remaining flows (emulator/flows/links.py max_min_fill, what FlowModel does at every
flow start and end today) and (b) the incremental update (emulator/flows/maxmin.py: remove the flow,
find the new water level) after which every flow's rate reads in O(1); both medians over many
finishing flows, measured in this run, and their ratio. A star with a second shared link (a
cell behind the server) is timed too, where the incremental model solves that component again.

A third case times what the network's tcp model does in a flagship round (edge_1000's links:
130 clients download the 6.6 MB model through the server's 1 Gbit/s uplink and, after training,
upload it through its 300 Mbit/s ingress, with slow start, queues and loss), run through
`emulator.flows.links.simulate` twice in this run: with the compiled max-min filling and rebalance
(emulator/flows/_flowfill.c) and with the Python ones. Both must give the same arrival times, bit for bit.

A fourth case (`--traced-clients N`, default 130: the flagship's round, 130 of its 1000 clients)
times the same tcp round with every client's uplink following a synthetic cellular trace of its own (emulator/flows/traces.py's SyntheticFades, 100 ms
bins, a seeded start offset; its mean the link's static rate) against the static links, both with
the compiled path, in this run: what traces cost the flow model, which is the network process's
own work (the process also moves the messages, which traces do not change). `--traced-solver
incremental` runs both sides with the incremental solver (network.flow_solver: incremental): the
scratch one cannot take all 1000 clients at once.

Usage: python tools/bench_flows.py [--flows 10000] [--traced-clients 1000] [--traced-solver scratch|incremental] [--json]
--json prints one object: flows, scratch_ms, incremental_ms, speedup (and the same for the cell
case), tcp_round: {clients, events, compiled_s, python_s, speedup}, and traced_round: {clients,
population, solver, static_s, traced_s, traced_cpu_ratio, capacity_changes, static_round_s, traced_round_s}.
The other 870 uplinks of the 1000 are traced too and idle: they cost nothing, which the count of
capacity changes shows (only links with a flow change)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emulator.flows import links  # noqa: E402
from emulator.flows.levelflows import IncrementalFlowModel  # noqa: E402
from emulator.flows.links import FlowModel, max_min_fill, simulate  # noqa: E402
from emulator.flows.traces import SyntheticFades, TraceRates, TraceRef  # noqa: E402
from emulator.flows.transport import TcpTransport  # noqa: E402
from emulator.flows.maxmin import IncrementalMaxMin  # noqa: E402


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


# edge_1000's link mix (scenarios/profiles.yaml): share, up and down Mbit/s, one-way ms, loss, queue ms
LINK_MIX = [(0.45, 20, 50, 10, 0.001, 50), (0.35, 8, 30, 40, 0.005, 200), (0.10, 40, 250, 15, 0.002, 100),
            (0.10, 1, 4, 100, 0.01, 500)]


def tcp_round(clients: int, model_bytes: int = 6_600_000, seed: int = 0) -> tuple[FlowModel, list[dict]]:
    """A flagship-like round for the tcp model: every client downloads the model from the server
    at once and uploads it after 2-20 s of training."""
    rng = np.random.default_rng(seed)
    caps = {("up", "server"): 1000e6, ("down", "server"): 300e6}
    queues = {("up", "server"): 0.1, ("down", "server"): 0.1}
    transfers = []
    for c in range(clients):
        share, up, down, ms, loss, queue_ms = LINK_MIX[rng.choice(len(LINK_MIX), p=[m[0] for m in LINK_MIX])]
        caps[("up", c)], caps[("down", c)] = up * 1e6, down * 1e6
        queues[("up", c)] = queues[("down", c)] = queue_ms / 1e3
        rtt = 2 * (ms + 2) / 1e3
        bits = model_bytes * 8 * 1514 / 1448
        common = dict(bits=bits, rtt=rtt, loss=loss, seg_bits=1514 * 8.0, mss=1448)
        transfers.append(dict(start=0.0, path=(("up", "server"), ("down", c)), latency=rtt / 2,
                              connection=("server", c), rng=np.random.default_rng([seed, c, 0]), **common))
        transfers.append(dict(after=len(transfers) - 1, gap=float(rng.uniform(2, 20)), path=(("up", c), ("down", "server")),
                              latency=rtt / 2, connection=(c, "server"), rng=np.random.default_rng([seed, c, 1]), **common))
    return FlowModel(caps, transport=TcpTransport(), queue_s=queues), transfers


def measure_tcp_round(clients: int) -> dict:
    """The round with the compiled filling and rebalance and with the Python ones, alternately, best
    of three each. `fills`: the rebalances of the round (each fills max-min rates once)."""
    compiled, rebalance = links._compiled_fill, links._compiled_rebalance
    if compiled is None or rebalance is None:
        return {"clients": clients, "compiled_s": None, "python_s": None, "speedup": None, "note": "emulator/flows/_flowfill.c not built"}
    times: dict[str, list[float]] = {"compiled": [], "python": []}
    results = {}
    calls = {"n": 0}

    def counted(*args):
        calls["n"] += 1
        return rebalance(*args)
    try:
        for _ in range(3):
            for name, (fill, rebalancing) in (("compiled", (compiled, counted)), ("python", (None, None))):
                links._compiled_fill, links._compiled_rebalance = fill, rebalancing
                model, transfers = tcp_round(clients)
                calls["n"] = 0
                start = time.perf_counter()
                results[name] = simulate(model, transfers)
                times[name].append(time.perf_counter() - start)
                if name == "compiled":
                    fills = calls["n"]
    finally:
        links._compiled_fill, links._compiled_rebalance = compiled, rebalance
    if [(a.hex(), b.hex()) for a, b in results["compiled"]] != [(a.hex(), b.hex()) for a, b in results["python"]]:
        raise SystemExit("the compiled and the Python filling gave different arrival times")
    c, p = min(times["compiled"]), min(times["python"])
    return {"clients": clients, "fills": fills, "compiled_s": round(c, 3), "python_s": round(p, 3), "speedup": round(p / c, 2),
            "round_s": round(max(b for _, b in results["compiled"]), 3)}


def traced_uplinks(capacity: dict, population: int, seed: int = 0) -> TraceRates:
    """Every client's uplink on a synthetic trace of its own from a seeded offset, its mean the link's
    static rate (8 Mbit/s for a client without one in `capacity`: an idle member of the population)."""
    return TraceRates({("up", c): TraceRef("", float(np.random.default_rng([seed, c]).uniform(0, 600)),
                                           synthetic=SyntheticFades(mean_mbps=capacity.get(("up", c), 8e6) / 1e6),
                                           seed=(seed, c)) for c in range(population)})


def measure_traced_round(clients: int, population: int = 1000, seed: int = 0, solver: str = "scratch") -> dict:
    """The tcp round on static links and with every uplink traced (mean: its static rate), best of
    two each, alternately; the population's other uplinks are traced too, idle (a link without a
    flow costs nothing: the counts show it). Counts the capacity changes the traced run made. With
    solver "incremental", both sides run IncrementalFlowModel (network.flow_solver: incremental)."""
    times: dict[str, list[float]] = {"static": [], "traced": []}
    ends, changes = {}, {"n": 0}
    model_class = IncrementalFlowModel if solver == "incremental" else FlowModel
    original = model_class.set_capacity

    def counted(self, link, bps):
        changes["n"] += 1
        return original(self, link, bps)

    for _ in range(2):
        for name in ("static", "traced"):
            model, transfers = tcp_round(clients, seed=seed)
            if solver == "incremental":
                model = IncrementalFlowModel(model.capacity, model.transport, model.queue_s)
            traces = None
            if name == "traced":
                traces = traced_uplinks(model.capacity, max(clients, population), seed)
            changes["n"] = 0
            model_class.set_capacity = counted
            try:
                start = time.perf_counter()
                out = simulate(model, transfers, traces=traces)
                times[name].append(time.perf_counter() - start)
            finally:
                model_class.set_capacity = original
            ends[name] = max(b for _, b in out)
            if name == "traced":
                traced_changes = changes["n"]
    s, t = min(times["static"]), min(times["traced"])
    return {"clients": clients, "population": max(clients, population), "solver": solver, "static_s": round(s, 3), "traced_s": round(t, 3), "traced_cpu_ratio": round(t / s, 2),
            "capacity_changes": traced_changes, "static_round_s": round(ends["static"], 2),
            "traced_round_s": round(ends["traced"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, default=10_000)
    ap.add_argument("--finishing", type=int, default=50, help="flows that finish, one at a time (medians over them)")
    ap.add_argument("--clients", type=int, default=130, help="clients in the tcp round")
    ap.add_argument("--traced-clients", type=int, default=130, help="clients in the traced round (0: skip it)")
    ap.add_argument("--population", type=int, default=1000, help="traced uplinks in all, the round's and idle ones")
    ap.add_argument("--traced-solver", choices=("scratch", "incremental"), default="scratch",
                    help="the flow solver of the traced round, both sides (incremental: all 1000 clients at once)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    plain = measure(args.flows, args.finishing, cell=False)
    cell = measure(args.flows, min(args.finishing, 20), cell=True)
    tcp = measure_tcp_round(args.clients)
    traced = measure_traced_round(args.traced_clients, args.population, solver=args.traced_solver) if args.traced_clients else None
    if args.json:
        print(json.dumps({**plain, "cell": cell, "tcp_round": tcp, "traced_round": traced}))
        return
    if traced:
        print(f"tcp round, {traced['clients']} of {traced['population']} clients, every uplink traced: {traced['traced_s']:.3f} s against "
              f"{traced['static_s']:.3f} s on static links at the traces' means ({traced['traced_cpu_ratio']:.2f}x; "
              f"{traced['capacity_changes']} capacity changes; the round ends at {traced['traced_round_s']} s against "
              f"{traced['static_round_s']} s)")
    if tcp["compiled_s"] is not None:
        print(f"tcp round, {tcp['clients']} clients ({tcp['fills']} fillings, {tcp['round_s']} emulated s): "
              f"compiled filling {tcp['compiled_s']:.3f} s, Python filling {tcp['python_s']:.3f} s, speedup {tcp['speedup']:.2f}x "
              "(the same arrival times bit for bit)")
    for name, f in (("star (server link + own access links)", plain), ("star with a shared cell for 10 %", cell)):
        print(f"{name}, {f['flows']} flows, one finishing: from scratch {f['scratch_ms']:.3f} ms, "
              f"incremental {f['incremental_ms']:.4f} ms, speedup {f['speedup']:.0f}x "
              f"(largest relative difference of the rates {f['max_rel_error']:.1e})")


if __name__ == "__main__":
    main()
