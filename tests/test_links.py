import math

import pytest

from emulator.flows.links import INF, FlowModel, Framing, max_min_rates


def test_framing_tcp_ethernet_default():
    f = Framing()
    assert f.link_bytes(1448) == 1514
    assert f.link_bytes(1449) == 1449 + 2 * 66
    assert f.link_bytes(6_653_480) == 6_653_480 + math.ceil(6_653_480 / 1448) * 66


def test_max_min_equal_share_and_bottleneck():
    assert max_min_rates([["a"], ["a"]], {"a": 10}) == [5, 5]
    # link c limits flow 2 to 1; then b leaves 3 for flow 0; a gives flow 1 the remaining 7
    assert max_min_rates([["a", "b"], ["a"], ["b", "c"]], {"a": 10, "b": 4, "c": 1}) == [3, 7, 1]
    assert max_min_rates([["x"]], {}) == [INF]


def test_flow_model_two_then_three_flows_hand_computed():
    # Two 1 MB (8e6 bit) flows through a 10 Mbit/s link: 5 Mbit/s each, both done at 1.6 s.
    fm = FlowModel({"s": 10e6})
    fm.add(1, 8e6, ["s"])
    changed = dict((fid, t) for fid, t, _ in fm.add(2, 8e6, ["s"]))
    assert changed == {1: pytest.approx(1.6), 2: pytest.approx(1.6)}
    # A third joins at 0.8 s: flows 1, 2 have 4e6 bits left; rates drop to 10/3 Mbit/s.
    fm.advance(0.8)
    changed = {fid: t for fid, t, _ in fm.add(3, 8e6, ["s"])}
    assert changed[1] == pytest.approx(2.0)  # 0.8 + 4e6 / (10e6 / 3)
    assert changed[3] == pytest.approx(3.2)  # provisional: 0.8 + 8e6 / (10e6 / 3)
    # At 2.0 s flows 1 and 2 finish; flow 3 has sent 1.2 s * 10/3 Mbit/s = 4e6 bits, the rest at 10 Mbit/s.
    fm.advance(2.0)
    fm.remove(1)
    _, changed = fm.remove(2)
    assert {fid: t for fid, t, _ in changed} == {3: pytest.approx(2.4)}


def _reference_max_min(paths, capacity):
    """Progressive filling, the textbook way: the link with the smallest fair share fixes its flows."""
    rates = [None] * len(paths)
    while any(r is None for r in rates):
        best = None
        for link, cap in capacity.items():
            users = [i for i, p in enumerate(paths) if link in p]
            free = [i for i in users if rates[i] is None]
            if not free:
                continue
            share = (cap - sum(rates[i] for i in users if rates[i] is not None)) / len(free)
            if best is None or share < best[0]:
                best = (share, free)
        if best is None:
            return [r if r is not None else float("inf") for r in rates]
        for i in best[1]:
            rates[i] = best[0]
    return rates


def test_max_min_fill_matches_progressive_filling_on_random_topologies():
    import random

    from emulator.flows.links import max_min_fill

    rng = random.Random(7)
    for _ in range(300):
        links = [f"l{k}" for k in range(rng.randint(1, 6))]
        capacity = {link: rng.choice([1.0, 2.0, 5.0, rng.uniform(0.5, 10)]) for link in links}
        paths = [tuple(rng.sample(links, rng.randint(1, len(links)))) for _ in range(rng.randint(1, 8))]
        rates, bottleneck = max_min_fill(paths, capacity)
        assert rates == pytest.approx(_reference_max_min(paths, capacity), rel=1e-9, abs=1e-12)
        for path, rate, link in zip(paths, rates, bottleneck):
            assert link in path  # its bottleneck is on its path and saturated
            assert sum(r for p, r in zip(paths, rates) if link in p) == pytest.approx(capacity[link])


def test_compiled_filling_gives_the_python_fillings_numbers_bit_for_bit():
    """emulator/flows/_flowfill.c against max_min_fill_py on random topologies built to tie: shared and
    private links of equal capacity, a link twice on a path, links with no (or an infinite)
    capacity, zero capacities, and per-flow window caps given as `override`."""
    import random

    from emulator.flows import links as links_module

    if links_module._compiled_fill is None:
        pytest.skip("emulator/flows/_flowfill.c is not built here (no C compiler at install)")
    rng = random.Random(11)
    for case in range(2000):
        names = [("up", f"c{k}") if k % 2 else f"l{k}" for k in range(rng.randint(1, 9))]
        capacity = {link: rng.choice([0.0, 1.0, 2.0, 3.0, 7.5, math.inf, rng.uniform(0.1, 10), rng.randint(1, 4)])
                    for link in names if rng.random() < 0.9}
        paths, override = [], {}
        for i in range(rng.randint(0, 40)):
            path = [rng.choice(names) for _ in range(rng.randint(0, 5))] + (["nowhere"] if rng.random() < 0.1 else [])
            if rng.random() < 0.5:
                window = ("window", i)
                override[window] = rng.choice([0.0, 1.0, 2.0, rng.uniform(0.1, 10)])
                path.append(window)
            paths.append(tuple(path))
        want = links_module.max_min_fill_py(paths, capacity, override)
        got = links_module._compiled_fill(paths, capacity, override)
        assert [r.hex() for r in got[0]] == [r.hex() for r in want[0]], case
        assert got[1] == want[1], case
    # the override is looked up first, and the capacities map may be any mapping
    from types import MappingProxyType
    assert links_module._compiled_fill([("a",), ("a", "w")], MappingProxyType({"a": 10, "w": 9}), {"w": 1.0}) == ([9.0, 1.0], ["a", "w"])


def test_a_tcp_round_arrives_at_the_same_times_with_either_filling(monkeypatch):
    """The flow model's tcp arithmetic around the filling (windows, queues, loss) on a flagship-like
    round of 24 clients: the compiled filling changes no arrival time, not even in the last bit."""
    import sys

    from conftest import REPO
    from emulator.flows import links as links_module

    if links_module._compiled_fill is None:
        pytest.skip("emulator/flows/_flowfill.c is not built here (no C compiler at install)")
    sys.path.insert(0, str(REPO / "tools"))
    import bench_flows

    arrivals = {}
    compiled = (links_module._compiled_fill, links_module._compiled_rebalance)
    for name, (fill, rebalance) in (("compiled", compiled), ("python", (None, None))):
        monkeypatch.setattr(links_module, "_compiled_fill", fill)
        monkeypatch.setattr(links_module, "_compiled_rebalance", rebalance)  # it fills in C itself
        model, transfers = bench_flows.tcp_round(24, model_bytes=1_000_000, seed=3)
        arrivals[name] = [(a.hex(), b.hex()) for a, b in links_module.simulate(model, transfers)]
    assert arrivals["compiled"] == arrivals["python"]
    assert len(arrivals["python"]) == 48 and all(float.fromhex(b) > float.fromhex(a) for a, b in arrivals["python"])


def test_the_traced_round_of_the_benchmark_changes_capacities_only_while_flows_use_the_links():
    """tools/bench_flows.py's traced round: every uplink follows a synthetic trace; capacities
    change while uploads use the links (not before the first upload starts, and the count stays
    below what changing every link all the time would take), and the round's end moves."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "tools"))
    import bench_flows

    out = bench_flows.measure_traced_round(12)
    assert out["capacity_changes"] > 0
    assert out["traced_round_s"] != out["static_round_s"]
    # 12 links at 100 ms bins over the whole round would change about 120 times a second
    assert out["capacity_changes"] < 12 * 10 * out["traced_round_s"] / 2


class _PropertyFlow(__import__("emulator.flows.links").flows.links.Flow):
    """A Flow subclass whose rate is a property: the compiled rebalance must not read its slot."""

    _rate_value = 0.0

    @property
    def rate(self):
        return self._rate_value

    @rate.setter
    def rate(self, value):
        self._rate_value = value


@pytest.mark.parametrize("tcp,subclass,controls", [(True, False, ()), (False, False, ()), (True, True, ()),
                                                   (True, False, ("cubic", "bbr", "reno"))])
def test_compiled_rebalance_gives_the_python_rebalances_times_and_state_bit_for_bit(monkeypatch, tcp, subclass, controls):
    """emulator/flows/_flowfill.c's `rebalance` writes out FlowModel._rebalance_py (sync, window caps, the
    filling, after_rates, next events, load, standing queues): on random workloads (stars behind a
    server link and a shared cell, windows, loss, queues, reused connections; tests/flow_scenarios.py)
    every arrival is the same float, and so is every event the model handed out. It reads the slots
    of Flow, TcpState and Connection in place, and a subclass's attributes through getattr. With
    BBR and Reno beside CUBIC, the pacing, the wake-ups and the paced standing queues agree too."""
    from emulator.flows import links as links_module
    from flow_scenarios import workload

    if links_module._compiled_rebalance is None:
        pytest.skip("emulator/flows/_flowfill.c is not built here (no C compiler at install)")
    for seed in range(40 if not subclass else 10):
        seen = {}
        for name, rebalance in (("compiled", links_module._compiled_rebalance), ("python", None)):
            monkeypatch.setattr(links_module, "_compiled_rebalance", rebalance)
            model, transfers = workload(seed, tcp, controls)
            if subclass:
                model.flow_class = _PropertyFlow
            events = []
            original = links_module.FlowModel._rebalance

            def recorded(self, force=None, original=original, events=events):
                changed = original(self, force)
                events.append([(fid, due.hex(), version) for fid, due, version in changed])
                events.append(sorted((link, q.hex()) for link, q in self.qdelay.items()))
                return changed
            monkeypatch.setattr(links_module.FlowModel, "_rebalance", recorded)
            arrivals = [(a.hex(), b.hex()) for a, b in links_module.simulate(model, transfers)]
            monkeypatch.setattr(links_module.FlowModel, "_rebalance", original)
            seen[name] = arrivals, events
        assert seen["compiled"][0] == seen["python"][0], seed
        assert seen["compiled"][1] == seen["python"][1], seed
        assert len(seen["python"][1]) > 2, seed  # the workload did rebalance


def test_the_compiled_rebalance_stands_aside_for_overridden_hooks():
    """A subclass that changes one of the methods the compiled rebalance writes out gets the Python
    version, so its change takes effect."""
    from emulator.flows import links as links_module
    from emulator.flows.transport import TcpTransport

    class Slower(TcpTransport):
        def next_event(self, flow, now):
            return super().next_event(flow, now) + 1.0

    class Scheduled(links_module.FlowModel):
        def _schedule(self, fid, flow, changed):
            super()._schedule(fid, flow, changed)

    assert links_module._hooks_are_ours(links_module.FlowModel, TcpTransport)
    assert links_module._hooks_are_ours(links_module.FlowModel, type(None))
    assert not links_module._hooks_are_ours(links_module.FlowModel, Slower)
    assert not links_module._hooks_are_ours(Scheduled, TcpTransport)
    model = links_module.FlowModel({"l": 8e6}, transport=Slower())
    changed = model.add("f", 8e6, ("l",), connection="c", rtt=0.1)
    assert changed and changed[0][1] > 1.0  # Slower's hour was used: the first round alone ends at 0.1 s


def test_the_compiled_rebalance_calls_the_congestion_control_back():
    """The compiled rebalance knows windows and pacing rates, not CUBIC: when a window starts to
    limit its flow it calls the connection's congestion control (on_window_limited), so a congestion
    control of one's own is honoured by either rebalance, with the same calls at the same times."""
    from emulator.flows import links as links_module
    from emulator.flows.congestion import Cubic
    from flow_scenarios import workload

    if links_module._compiled_rebalance is None:
        pytest.skip("emulator/flows/_flowfill.c is not built here (no C compiler at install)")

    class Counted(Cubic):
        name = "counted"  # not registered: given to the transport directly

        def __init__(self, params):
            super().__init__(params)
            self.calls = []

        def on_window_limited(self, st, now):
            self.calls.append((st.fid, now.hex()))
            super().on_window_limited(st, now)

    calls = {}
    for seed in range(6):
        for name, rebalance in (("compiled", links_module._compiled_rebalance), ("python", None)):
            model, transfers = workload(seed, True)
            model.transport.cc = Counted(model.transport.p)
            saved = links_module._compiled_rebalance
            links_module._compiled_rebalance = rebalance
            try:
                arrivals = [(a.hex(), b.hex()) for a, b in links_module.simulate(model, transfers)]
            finally:
                links_module._compiled_rebalance = saved
            calls.setdefault(name, []).append((model.transport.cc.calls, arrivals))
    assert calls["compiled"] == calls["python"]
    assert sum(len(c) for c, _ in calls["python"]) > 10  # windows did come to limit their flows


def test_the_records_python_fields_are_the_compiled_structs():
    """emulator/flows/records.py names the fields of the C structs _flowfill.c owns: the same names
    in the same order, so the Python layout (no compiler) and the compiled one hold the same state."""
    from emulator.flows import records

    native = records.native
    if native is None:
        pytest.skip("emulator/flows/_flowfill.c is not built here (no C compiler at install)")
    for record, fields in ((native.FlowRecord, records.FLOW_FIELDS), (native.WindowRecord, records.WINDOW_FIELDS),
                           (native.ConnectionRecord, records.CONNECTION_FIELDS)):
        members = [name for name, value in vars(record).items() if type(value).__name__ == "member_descriptor"]
        assert members == list(fields), record
