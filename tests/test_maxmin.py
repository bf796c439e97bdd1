"""Incremental max-min fair rates (emulator/flows/maxmin.py): after every change they equal the
from-scratch water-filling of emulator/flows/links.py, on random topologies (hypothesis), and a star
(flows sharing one server link, each on its own access link) is updated without a full solve."""
import math

from hypothesis import given, settings, strategies as st

from emulator.flows.links import max_min_rates
from emulator.flows.maxmin import IncrementalMaxMin, _SortedCaps

LINKS = ["server", "cell0", "cell1", "a0", "a1", "a2", "a3", "a4", "a5", "open"]


def capacities(draw_caps):
    caps = dict(zip(LINKS, draw_caps))
    caps["open"] = math.inf  # a link that never constrains
    return caps


def check(model: IncrementalMaxMin, flows: dict, caps: dict) -> None:
    order = sorted(flows, key=model.seq.__getitem__)
    expected = max_min_rates([flows[f] for f in order], caps)
    got = model.rates()
    for fid, want in zip(order, expected):
        assert math.isclose(got[fid], want, rel_tol=1e-9, abs_tol=1e-9), (fid, got[fid], want, flows, caps)


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.sampled_from(LINKS), min_size=0, max_size=4)),
    st.tuples(st.just("remove"), st.integers(0, 50)),
    st.tuples(st.just("capacity"), st.sampled_from(LINKS[:-1]), st.floats(0.5, 100.0)),
), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.5, 100.0), min_size=len(LINKS), max_size=len(LINKS)), ops)
def test_incremental_rates_equal_the_from_scratch_solution(draw_caps, script):
    caps = capacities(draw_caps)
    model = IncrementalMaxMin(caps)
    flows: dict[int, tuple] = {}
    next_id = 0
    for op in script:
        if op[0] == "add":
            flows[next_id] = tuple(op[1])
            model.add(next_id, op[1])
            next_id += 1
        elif op[0] == "remove" and flows:
            fid = sorted(flows)[op[1] % len(flows)]
            model.remove(fid)
            del flows[fid]
        elif op[0] == "capacity":
            caps[op[1]] = op[2]
            model.set_capacity(op[1], op[2])
        check(model, flows, caps)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=300), st.integers(0, 20), st.floats(1.0, 5000.0))
def test_water_level_solves_its_equation(caps, unlimited, capacity):
    level = _SortedCaps()
    for i, c in enumerate(caps):
        level.insert(c, i)
    for i in range(unlimited):
        level.insert(math.inf, 10_000 + i)
    s = level.level(capacity)
    if s == math.inf:
        assert unlimited == 0 and sum(caps) <= capacity * (1 + 1e-12)
    else:
        used = sum(min(c, s) for c in caps) + unlimited * s
        assert math.isclose(used, capacity, rel_tol=1e-9)


def test_a_star_is_updated_without_solving_it_again():
    caps = {"server": 1000.0, **{f"a{i}": 1.0 + i % 37 for i in range(500)}}
    model = IncrementalMaxMin(caps)
    solved = []
    model._solve_component = lambda start: solved.append(start)  # must not be needed
    flows = {}
    for i in range(500):
        flows[i] = (f"a{i}", "server")
        model.add(i, flows[i])
    for i in range(0, 500, 7):
        model.remove(i)
        del flows[i]
        assert model.rate(i + 1) > 0
    check(model, flows, caps)
    assert not solved and not model.general


def test_a_second_shared_link_solves_only_its_component():
    caps = {"server": 10.0, "cell": 4.0, "a": 3.0, "b": 3.0, "c": 3.0, "x": 5.0, "y": 5.0, "other": 6.0}
    model = IncrementalMaxMin(caps)
    flows = {"a": ("a", "cell", "server"), "b": ("b", "cell", "server"), "c": ("c", "server"),
             "x": ("x", "other"), "y": ("y", "other")}
    for fid, path in flows.items():
        model.add(fid, path)
    check(model, flows, caps)
    assert set(model.general) == {"a", "b", "c"}  # the cell and the server: one component; x and y: a star
    model.remove("c")
    del flows["c"]
    check(model, flows, caps)


def _state(model: IncrementalMaxMin) -> tuple:
    """Everything the solver keeps, dict orders included (they decide later ties and sums)."""
    tables = ("capacity", "routes", "paths", "users", "seq", "attached", "impure", "private", "levels",
              "general", "general_bottleneck", "by_seq")
    out = [list(getattr(model, t).items()) for t in tables]
    out.append([(link, list(u)) for link, u in model.users.items() if u])
    out.append([(link, caps.blocks, caps.maxes, caps.sums, caps.finite, caps.infinite) for link, caps in model.caps.items()])
    return tuple(out), model.touched_links, model.touched_flows, model.dirty


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(LINKS[:6]), min_size=0, max_size=3), min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(0, 29), st.one_of(st.floats(0.5, 100.0), st.just(math.inf))), min_size=1, max_size=30))
def test_a_windows_new_capacity_leaves_what_remove_and_add_leave(paths, changes):
    """set_own_capacity (a window's cap read again) against the remove and add it replaces: the same
    tables in the same orders, the same sorted caps block by block, the same changes recorded."""
    caps = capacities([10.0 * (i + 1) for i in range(len(LINKS))])
    fast, slow = IncrementalMaxMin(caps), IncrementalMaxMin(caps)
    for fid, path in enumerate(paths):
        for model in (fast, slow):
            model.capacity[("window", fid)] = 5.0 + fid
            model.add(fid, (*path, ("window", fid)), fid)
    for k, cap in changes:
        _new_window_both_ways(fast, slow, k % len(paths), paths[k % len(paths)], cap)


def test_a_star_members_new_window_takes_the_short_way_and_leaves_the_same_state(monkeypatch):
    """A member of a star of three flows or more whose window moves (every member, each time a busy
    server link's queue moves) is moved in the star's sorted caps alone (_star_member_recapped):
    the same tables in the same orders as remove and add, and the general way is not taken."""
    caps = capacities([30.0, 50.0, 50.0, 7.0, 9.0, 11.0, 13.0, 15.0, 17.0, 0.0])
    fast, slow = IncrementalMaxMin(caps), IncrementalMaxMin(caps)
    paths = [("server", access) for access in ("a0", "a1", "a2", "a3", "a4")]
    for fid, path in enumerate(paths):
        for model in (fast, slow):
            model.capacity[("window", fid)] = 20.0 + fid
            model.add(fid, (*path, ("window", fid)), fid)
    general = []
    monkeypatch.setattr(IncrementalMaxMin, "_reattach_partners", lambda self, *a: general.append(a))
    for fid, cap in ((2, 3.0), (0, 250.0), (2, 40.0), (4, 1.5), (1, 8.5)):
        _new_window_both_ways(fast, slow, fid, paths[fid], cap)
    assert general == []
    # by hand: private caps 7, 8.5, 11, 13 (windows 250, 8.5, 40, 23) and 1.5; 1.5 + 7 + 3 s = 30
    rates = fast.rates()
    assert rates[4] == 1.5 and rates[0] == 7.0
    assert all(math.isclose(rates[fid], 21.5 / 3, rel_tol=1e-12) for fid in (1, 2, 3))


def _new_window_both_ways(fast: IncrementalMaxMin, slow: IncrementalMaxMin, fid: int, path: tuple, cap: float) -> None:
    """The window's new cap by set_own_capacity in `fast`, by remove and add in `slow`: the same state."""
    window = ("window", fid)
    fast.set_own_capacity(fid, window, cap)
    slow.remove(fid)
    slow.capacity[window] = cap
    slow.add(fid, (*path, window), fid)
    assert _state(fast) == _state(slow)
    assert fast.rates() == slow.rates()
