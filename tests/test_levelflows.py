"""The incremental flow model (emulator/flows/levelflows.py, network.flow_solver: incremental) gives the
from-scratch model's times, touching only the flows a change moves."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import read_csv, run_cli, write_scenario
from emulator.flows.levelflows import IncrementalFlowModel
from emulator.flows.links import FlowModel, simulate
from emulator.flows.traces import SyntheticFades, TraceRates, TraceRef
from flow_scenarios import workload

REFERENCE = json.loads((Path(__file__).parent / "data" / "flow_reference.json").read_text())


@pytest.mark.parametrize("key", sorted(k for k in REFERENCE if k.startswith("fluid")))
def test_fluid_arrivals_are_the_from_scratch_models(key):
    base, transfers = workload(int(key.split("-")[1]), False)
    got = simulate(IncrementalFlowModel(base.capacity, None, base.queue_s), transfers)
    for (start, arrival), (want_start, want_arrival) in zip(got, REFERENCE[key], strict=True):
        for value, want in ((start, want_start), (arrival, want_arrival)):
            assert math.isinf(value) == math.isinf(want)
            if not math.isinf(want):
                assert math.isclose(value, want, rel_tol=1e-12, abs_tol=1e-12), (key, value, want)


@pytest.mark.parametrize("seed", range(100))
def test_tcp_arrivals_are_the_from_scratch_models(seed):
    """CUBIC senders (the default): windows, slow start, HyStart, loss, queues, reused
    connections, stars and flows across a shared cell; every start and arrival within 1e-9 s."""
    assert_same_arrivals(seed, ())


@pytest.mark.parametrize("seed", range(80))
def test_tcp_arrivals_with_cubic_bbr_and_reno_senders(seed):
    """Each connection's sender picks CUBIC, BBR or Reno (BBR paces and wakes on its own clock)."""
    assert_same_arrivals(seed, ("cubic", "bbr", "reno"))


@pytest.mark.parametrize("seed", range(60))
def test_tcp_arrivals_when_flows_start_together(seed):
    """Starts on a half-second grid, added unsettled as the network process adds them: flows that
    start together with one window spend their slow-start budgets at the same instant."""
    assert_same_arrivals(seed, (), together=True)


def test_level_flows_whose_caps_rose_keep_the_lower_cap_and_the_times(monkeypatch):
    """After a queue moves, a level flow whose cap rose keeps its lower cap in the solver
    (IncrementalFlowModel._recap_after_queue). The random workloads take that shortcut, and their
    times stay the scratch model's (the workloads above check every arrival; here, that the
    shortcut is taken at all, so that those checks cover it)."""
    taken = []
    recap = IncrementalFlowModel._recap_after_queue

    def counting(self, fid, flow):
        before = self.mm.capacity.get(("window", fid))
        read = recap(self, fid, flow)
        taken.append(not read and before == self.mm.capacity.get(("window", fid)) != self.transport.cap(flow, self.t))
        return read

    monkeypatch.setattr(IncrementalFlowModel, "_recap_after_queue", counting)
    for seed in range(30):
        assert_same_arrivals(seed, ())
    assert sum(taken) >= 20 and len(taken) > sum(taken)


@pytest.mark.parametrize("seed", range(80))
def test_tcp_arrivals_on_trace_driven_links(seed):
    """Access links and the shared cell follow synthetic cellular traces (fades, outages, a new level
    every 0.3 s): each bin's change re-places the link's flows, and the times stay the scratch model's."""
    assert_same_arrivals(seed, ("cubic", "bbr", "reno") if seed % 2 else (), traced=True)


@pytest.mark.parametrize("seed", range(20))
def test_fluid_arrivals_on_trace_driven_links(seed):
    base, transfers = workload(seed, False)
    want = simulate(base, transfers, traces=traces_for(seed, base.capacity))
    base, transfers = workload(seed, False)
    got = simulate(IncrementalFlowModel(base.capacity, None, base.queue_s), transfers, traces=traces_for(seed, base.capacity))
    assert sum(math.isfinite(a) for _, a in want) >= 3
    for (start, arrival), (want_start, want_arrival) in zip(got, want, strict=True):
        for value, expected in ((start, want_start), (arrival, want_arrival)):
            assert math.isclose(value, expected, rel_tol=1e-12, abs_tol=1e-12), (seed, value, expected)


def test_trace_changes_reach_links_that_carry_flows(monkeypatch):
    """The traced workloads above do move the rates of links in use (so their checks cover it)."""
    moved = []
    original = IncrementalFlowModel.set_capacity

    def counting(self, link, bps):
        moved.append(len(self.mm.users.get(link, ())))
        return original(self, link, bps)

    monkeypatch.setattr(IncrementalFlowModel, "set_capacity", counting)
    for seed in range(10):
        assert_same_arrivals(seed, (), traced=True)
    assert len(moved) >= 100 and sum(n >= 2 for n in moved) >= 10, (len(moved), sum(n >= 2 for n in moved))


@pytest.mark.parametrize("traced", [False, True], ids=["static", "traced"])
def test_a_flagship_like_round_is_the_scratch_models(traced):
    """tools/bench_flows.py's tcp round of 60 clients (120 transfers through the server's two links,
    CUBIC, loss, queues; with `traced`, every uplink on a synthetic trace): many flows in lockstep,
    whose events fall due at the same instant. simulate takes such events in flow order, as the
    network process takes them by sender and transfer, so the order the solver hands them out in
    does not matter (in the order handed out, the solvers swapped two such flows' roles, and their
    arrivals drifted apart by up to 1.5 s at 130 clients)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import bench_flows

    def traces(capacity):
        return bench_flows.traced_uplinks(capacity, 60) if traced else None

    model, transfers = bench_flows.tcp_round(60)
    want = simulate(model, transfers, traces=traces(model.capacity))
    model, transfers = bench_flows.tcp_round(60)
    got = simulate(IncrementalFlowModel(model.capacity, model.transport, model.queue_s), transfers,
                   traces=traces(model.capacity))
    assert all(math.isfinite(a) for _, a in want)
    for (start, arrival), (want_start, want_arrival) in zip(got, want, strict=True):
        assert abs(start - want_start) <= 1e-9 and abs(arrival - want_arrival) <= 1e-9


def traces_for(seed: int, capacity: dict) -> TraceRates:
    """About two thirds of the access links and the cell follow a trace of their own (mean: the
    link's rate), from a random offset; the server link stays static."""
    rng = np.random.default_rng([seed, 42])
    links = [link for link in capacity if link != "server" and rng.random() < 0.67]
    fades = {link: SyntheticFades(mean_mbps=capacity[link] / 1e6, good_step_s=0.3, fade_s=0.5, outage_s=0.3,
                                  outage_share=0.03, duration_s=20.0) for link in links}
    return TraceRates({link: TraceRef("", float(rng.uniform(0, 20)), synthetic=fades[link], seed=(seed, k))
                       for k, link in enumerate(links)})


def assert_same_arrivals(seed: int, controls: tuple[str, ...], together: bool = False, traced: bool = False) -> None:
    def load():  # fresh loss draws and windows for each model
        base, transfers = workload(seed, True, controls)
        for tr in transfers if together else ():
            if "start" in tr:
                tr["start"] = round(tr["start"] * 2) / 2
        return base, transfers, traces_for(seed, base.capacity) if traced else None

    base, transfers, traces = load()
    want = simulate(base, transfers, traces=traces, together=together)
    base, transfers, traces = load()
    got = simulate(IncrementalFlowModel(base.capacity, base.transport, base.queue_s), transfers, traces=traces,
                   together=together)
    assert sum(math.isfinite(a) for _, a in want) >= 3
    for (start, arrival), (want_start, want_arrival) in zip(got, want, strict=True):
        for value, expected in ((start, want_start), (arrival, want_arrival)):
            assert math.isinf(value) == math.isinf(expected)
            if not math.isinf(expected):
                assert abs(value - expected) <= 1e-9, (seed, value, expected)


def test_a_star_by_hand():
    """Server link 20 bit/s; access links 10, 40, 40; 100, 100 and 300 bits from t = 0. All three are
    held by the level (3 s = 20: 6.67 bit/s each, a's own 10 is above it): a and b finish at 15 s;
    c then runs alone at min(40, 20) = 20 bit/s for its last 200 bits: 25 s."""
    model = IncrementalFlowModel({"server": 20.0, "a": 10.0, "b": 40.0, "c": 40.0})
    got = simulate(model, [{"start": 0.0, "bits": 100.0, "path": ("a", "server")},
                           {"start": 0.0, "bits": 100.0, "path": ("b", "server")},
                           {"start": 0.0, "bits": 300.0, "path": ("c", "server")}])
    assert [round(a, 9) for _, a in got] == [15.0, 15.0, 25.0]


def test_a_level_change_reschedules_one_flow_not_all():
    caps = {"server": 1e9, **{f"a{i}": 100e6 for i in range(1000)}}
    changed = {}
    for cls in (FlowModel, IncrementalFlowModel):
        model = cls(dict(caps))
        for i in range(1000):
            model.add(i, 8e6 + i, (f"a{i}", "server"), settle=False)
        model.settle()
        model.advance(1.0)
        _, changed[cls] = model.remove(0)
        assert math.isclose(model.flows[1].rate, 1e9 / 999)
    assert len(changed[FlowModel]) == 999  # every flow's finish time moved
    assert len(changed[IncrementalFlowModel]) == 1  # the first to finish, on the star's clock


def test_flows_held_by_their_own_link_switch_when_the_level_passes_them():
    model = IncrementalFlowModel({"server": 30.0, "a": 10.0, "b": 40.0, "c": 40.0})
    model.add("a", 1e3, ("a", "server"))
    model.add("b", 1e3, ("b", "server"))
    assert model.flows["a"].rate == 10.0 and model.flows["b"].rate == 20.0  # a by its link, b by the level
    model.add("c", 1e3, ("c", "server"))
    assert model.flows["a"].rate == 10.0 and model.flows["b"].rate == 10.0
    model.remove("a")
    assert model.flows["b"].rate == 15.0 and model.flows["c"].rate == 15.0
    model.advance(2.0)
    model.sync(model.flows["b"])
    assert math.isclose(model.flows["b"].remaining_bits, 1e3 - 30.0)


SCENARIO = """
name: solver
seed: 3
rounds: 3
task: {{dataset: synthetic, model: mlp, synthetic: {{samples: 2000, test_samples: 50}}}}
population:
  clients: 40
  devices: [{{ms_per_sample: 1}}]
  links:
    - {{share: 0.5, {first}, latency_ms: 10, loss: 0.001}}
    - {{share: 0.5, up_mbps: 5, down_mbps: 20, latency_ms: 40}}
server: {{link: {{up_mbps: 60, down_mbps: 40, latency_ms: 1}}}}
selection: {{clients_per_round: 20, checkin: true}}
round: {{policy: first_k, timeout_s: 30}}
algorithm: {{train: false, local_epochs: 1, batch_size: 50}}
eval: {{every: 0}}
network: {{transport: {transport}, flow_solver: {solver}}}
"""


STATIC = "up_mbps: 20, down_mbps: 50"
TRACED = "up_trace: {synthetic: {mean_mbps: 20}}, down_trace: {synthetic: {mean_mbps: 50}}"


@pytest.mark.parametrize("transport,first", [("fluid", STATIC), ("tcp", STATIC), ("tcp", TRACED)],
                         ids=["fluid", "tcp", "tcp-traced"])
def test_a_run_is_the_same_with_either_solver(tmp_path, transport, first):
    """Real processes: check-ins, first-k rounds, loss, and (tcp-traced) half the clients on cellular
    traces; every row and every emulated time equal (the last digit may differ: sums are taken in
    another order)."""
    outs = {}
    for solver in ("scratch", "incremental"):
        out = outs[solver] = tmp_path / solver
        path = write_scenario(tmp_path / f"{solver}.yaml", SCENARIO.format(transport=transport, solver=solver, first=first))
        res = run_cli("run", str(path), "--out", str(out), timeout=180)
        assert res.returncode == 0, res.stderr[-2000:]
    order = {"rounds.csv": lambda r: int(r["round"]), "clients.csv": lambda r: (int(r["round"]), r["client"]),
             "transfers.csv": lambda r: int(r["id"])}  # rows reach the results in the order processes report them
    for name, drop in (("rounds.csv", {"wall_s"}), ("clients.csv", set()), ("transfers.csv", set())):
        rows = {s: sorted(({k: v for k, v in r.items() if k not in drop} for r in read_csv(outs[s] / name)), key=order[name])
                for s in outs}
        assert rows["scratch"], name
        assert len(rows["incremental"]) == len(rows["scratch"]), name
        for got, want in zip(rows["incremental"], rows["scratch"]):
            assert got.keys() == want.keys()
            for key in want:
                assert same(got[key], want[key]), (name, key, got[key], want[key])


def same(a: str, b: str) -> bool:
    """Equal, or equal numbers to rounding (sums are taken in another order)."""
    if a == b:
        return True
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-12)
    except ValueError:
        return False
