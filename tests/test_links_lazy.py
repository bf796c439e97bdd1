"""The flow model counts a flow's bits when something looks at it rather than at every event, and
updates the standing queues of the flow whose window moved rather than of all: the same arrivals
as the eager model gave (tests/data/flow_reference.json, written by it from tests/flow_scenarios.py
before the change), to float rounding (sums taken in another order)."""
import json
import math
from pathlib import Path

import pytest

from emulator.flows.links import simulate
from flow_scenarios import workload

REFERENCE = json.loads((Path(__file__).parent / "data" / "flow_reference.json").read_text())


@pytest.mark.parametrize("key", sorted(REFERENCE))
def test_arrivals_are_the_eager_models(key):
    kind, seed = key.split("-")
    model, transfers = workload(int(seed), kind == "tcp")
    got = simulate(model, transfers)
    assert len(got) == len(REFERENCE[key])
    for (start, arrival), (want_start, want_arrival) in zip(got, REFERENCE[key]):
        for value, want in ((start, want_start), (arrival, want_arrival)):
            assert math.isinf(value) == math.isinf(want)
            if not math.isinf(want):
                assert math.isclose(value, want, rel_tol=1e-12, abs_tol=1e-12), (key, value, want)


def test_time_moves_without_visiting_flows_and_a_look_catches_up():
    from emulator.flows.links import FlowModel
    model = FlowModel({"server": 30.0, "a": 10.0, "b": 40.0})
    model.add("x", 100.0, ("a", "server"))
    model.add("y", 100.0, ("b", "server"))
    assert (model.flows["x"].rate, model.flows["y"].rate) == (10.0, 20.0)
    model.advance(2.0)
    assert [f.remaining_bits for f in model.flows.values()] == [100.0, 100.0]  # not visited
    model.sync(model.flows["y"])
    assert model.flows["y"].remaining_bits == 60.0 and model.flows["x"].remaining_bits == 100.0
    _, changed = model.remove("y")  # a rebalance catches every flow up before rates change
    assert model.flows["x"].remaining_bits == 80.0 and model.flows["x"].rate == 10.0


def test_flows_starting_together_are_settled_once_with_the_rates_of_one_by_one():
    from emulator.flows.links import FlowModel
    from emulator.flows.transport import TcpParams, TcpTransport

    caps = {"server": 30.0, "a": 10.0, "b": 40.0, "c": 5.0}
    paths = {"x": ("a", "server"), "y": ("b", "server"), "z": ("c", "server")}
    for transport in (None, TcpTransport(TcpParams())):
        eager = FlowModel(dict(caps), transport)
        for fid, path in paths.items():
            eager.add(fid, 1e3, path, **({"connection": fid, "rtt": 0.01} if transport else {}))
        lazy = FlowModel(dict(caps), TcpTransport(TcpParams()) if transport else None)
        calls = []
        original = lazy._rebalance
        lazy._rebalance = lambda force=None: calls.append(force) or original(force)
        for fid, path in paths.items():
            assert lazy.add(fid, 1e3, path, settle=False, **({"connection": fid, "rtt": 0.01} if transport else {})) == []
        assert lazy.unsettled and not calls
        changed = lazy.settle()
        assert len(calls) == 1 and not lazy.unsettled and lazy.settle() == []
        assert {fid for fid, _, _ in changed} == set(paths)
        for fid in paths:
            assert (lazy.flows[fid].rate, lazy.flows[fid].done_at) == (eager.flows[fid].rate, eager.flows[fid].done_at)
