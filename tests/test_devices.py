"""Devices and selection as pure functions: availability processes, FedScale trace files,
CPU load, battery arithmetic, selection policies."""
import json
import math
import pickle
import sys

import numpy as np
import pytest

from emulator.devices import (Battery, MarkovAvailability, TraceAvailability, behaviour_from_trace, capacity_from_trace,
                              load_trace_file, seconds_until_empty)
from node.compute import cpu_load, loaded_duration
from node.strategy import expected_seconds, meets_resources, select_clients


def take(iterator, n):
    return [t for _, t in zip(range(n), iterator)]


def test_trace_availability_repeats_with_its_period():
    tr = TraceAvailability(active=[0, 50], inactive=[20, 80], finish_time=100)
    assert tr.initially_on
    assert take(tr.transitions(), 6) == [20, 50, 80, 100, 120, 150]  # off, on, off, on (wrap), off, on
    assert tr.on_at(10) and not tr.on_at(30) and tr.on_at(160) and not tr.on_at(185)


def test_trace_availability_without_changes_never_transitions():
    assert take(TraceAvailability([0], [], 1e6).transitions(), 3) == []
    off = TraceAvailability([], [0], 10)
    assert not off.initially_on and take(off.transitions(), 3) == []


def test_trace_that_starts_off():
    tr = TraceAvailability(active=[30], inactive=[70], finish_time=100)
    assert not tr.initially_on
    assert take(tr.transitions(), 4) == [30, 70, 130, 170]


def test_markov_availability_long_run_fraction_on():
    rng = np.random.default_rng(0)
    fractions = []
    for _ in range(200):
        m = MarkovAvailability(30.0, 10.0, rng)
        on, t, total_on, horizon = m.initially_on, 0.0, 0.0, 2000.0
        for nxt in m.transitions():
            end = min(nxt, horizon)
            total_on += (end - t) if on else 0.0
            t, on = end, not on
            if t >= horizon:
                break
        fractions.append(total_on / horizon)
    # stationary on-probability 30 / (30 + 10) = 0.75; the mean over 200 devices is tight around it
    assert np.mean(fractions) == pytest.approx(0.75, abs=0.02)


def test_markov_transitions_are_the_exponential_draws_summed_and_small():
    """Each time is the last plus an Exp(mean of the state it leaves) draw from the device's own
    stream, in order; and the iterator the network holds per device for the whole run is a few
    slots, not a generator's frame (about 250 bytes)."""
    m = MarkovAvailability(30.0, 10.0, np.random.default_rng(7))
    twin = np.random.default_rng(7)
    twin.random()  # (the draw that chose the initial state)
    steps = m.transitions()
    t, on = 0.0, m.initially_on
    for _ in range(20):
        t += float(twin.exponential(30.0 if on else 10.0))
        on = not on
        assert next(steps) == t
    assert sys.getsizeof(m.transitions()) < 100


def test_fedscale_files_load_from_pickle_and_json(tmp_path):
    behaviour = {1: {"active": [0, 40], "inactive": [10, 90], "finish_time": 100}}
    capacity = {"7": {"computation": 12.5, "communication": 2400.0}}
    (tmp_path / "b.pkl").write_bytes(pickle.dumps(behaviour))
    (tmp_path / "c.json").write_text(json.dumps(capacity))
    loaded = load_trace_file(tmp_path / "b.pkl")
    assert list(loaded) == ["1"]  # ids become strings
    assert take(behaviour_from_trace(loaded["1"], "x").transitions(), 3) == [10, 40, 90]
    assert capacity_from_trace(load_trace_file(tmp_path / "c.json")["7"], "x") == (12.5, 2400.0)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="non-empty mapping"):
        load_trace_file(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="needs 'active'"):
        behaviour_from_trace({"active": []}, "trace[3]")


def test_cpu_load_is_piecewise_constant_deterministic_and_slows_training():
    a = cpu_load(1, 5, 10.0, 60.0, 0.3)
    assert a == cpu_load(1, 5, 59.9, 60.0, 0.3)  # same period
    assert a == cpu_load(1, 5, 10.0, 60.0, 0.3)  # any process computes the same value
    draws = [cpu_load(1, d, 0.0, 60.0, 0.3) for d in range(2000)]
    assert np.mean(draws) == pytest.approx(0.3, abs=0.01)
    assert cpu_load(1, 5, 10.0, 60.0, 0.0) == 0.0
    assert loaded_duration(2.0, 0.0, None, constant=0.5) == pytest.approx(4.0)  # twice the 2 s of an idle device


def test_battery_drain_charge_and_running_dry():
    b = Battery(capacity_j=100.0, level_j=50.0, idle_w=0.5)
    b.advance(10.0)
    assert b.level_j == pytest.approx(45.0)
    assert b.spend(40.0) == 0.0 and b.level_j == pytest.approx(5.0)
    assert b.spend(8.0) == pytest.approx(3.0) and b.level_j == 0.0  # 3 J short: the device dies
    c = Battery(100.0, 90.0, charging=True, charge_w=2.0)
    c.advance(10.0)
    assert c.level_j == 100.0  # capped at capacity
    assert c.spend(1e9) == 0.0  # mains powered while charging
    assert seconds_until_empty(30.0, 3.0) == 10.0 and seconds_until_empty(30.0, 0.0) == math.inf


def test_resource_thresholds():
    assert meets_resources({"battery": 0.6, "cpu_load": 0.2, "up_mbps": 10}, 0.5, 0.5, 5)
    assert not meets_resources({"battery": 0.4, "cpu_load": 0.2, "up_mbps": 10}, 0.5, 0.5, 5)
    assert meets_resources({"battery": 0.1, "charging": True, "cpu_load": 0.2, "up_mbps": 10}, 0.5, 0.5, 5)
    assert not meets_resources({"battery": 0.9, "cpu_load": 0.7}, 0.5, 0.5, 0)
    assert not meets_resources({"battery": 0.9, "up_mbps": 1}, 0.5, 1.0, 5)


def test_expected_seconds_by_hand():
    st = {"samples": 100, "ms_per_sample": 10, "cpu_load": 0.5, "down_mbps": 8, "up_mbps": 4}
    # 1 MB down at 8 Mbit/s = 1 s; 100 x 10 ms x 2 epochs / (1 - 0.5) = 4 s; 1 MB up at 4 Mbit/s = 2 s
    assert expected_seconds(st, 2, 1_000_000, 1_000_000) == pytest.approx(7.0)


def test_selection_policies():
    rng = np.random.default_rng(0)
    pool = {f"c{i}": {"battery": i / 10, "cpu_load": 0.0, "samples": 10, "ms_per_sample": 1 + i, "up_mbps": 10,
                      "down_mbps": 10} for i in range(10)}
    fit = select_clients("resource_aware", pool, 10, rng, min_battery=0.55)
    assert fit == ["c6", "c7", "c8", "c9"]
    fastest = select_clients("fastest", pool, 4, rng, explore=0.0, epochs=1, down_bytes=1000, up_bytes=1000)
    assert fastest == ["c0", "c1", "c2", "c3"]
    mixed = select_clients("fastest", pool, 4, rng, explore=0.5, epochs=1, down_bytes=1000, up_bytes=1000)
    assert {"c0", "c1"} <= set(mixed) and len(mixed) == 4
    assert len(select_clients("random", pool, 3, rng)) == 3
    with pytest.raises(ValueError, match="selection policy"):
        select_clients("magic", pool, 3, rng)


def test_device_speed_in_gflops_scales_with_the_model(tmp_path):
    from conftest import write_scenario
    from emulator.scenario import load_scenario
    from emulator.world import build_world, device_ms_per_sample
    from node.models import build_model, training_flops

    # the MNIST CNN by hand: 6 x (28*28*32*25 + 14*14*64*32*25 + 3136*512 + 512*10) multiply-accumulates
    assert training_flops(build_model("mnist_cnn", (1, 28, 28), 10), (1, 28, 28)) == 6 * 12_273_152
    assert training_flops(build_model("firma_mlp", (1, 28, 28), 10), (1, 28, 28)) == 6 * (784 * 256 + 256 * 256 + 256 * 128 + 128 * 10)
    text = """
rounds: 1
task: {dataset: synthetic, model: MODEL}
population:
  clients: 2
  devices: [{profile: phone_high, share: 0.5}, {profile: rpi4, share: 0.5, ms_per_sample: 5}]
  links: [{up_mbps: 1, down_mbps: 1}]
"""
    for model, flops in (("mnist_cnn", 6 * 12_273_152), ("mlp", 6 * (784 * 64 + 64 * 10))):
        sc, _ = load_scenario(write_scenario(tmp_path / f"{model}.yaml", text.replace("MODEL", model)))
        world = build_world(sc)
        # phone_high: 35 GFLOP/s from the profile; the rpi4 entry's own ms_per_sample replaces its gflops
        assert device_ms_per_sample(sc, world.task) == pytest.approx([flops / 35e9 * 1000, 5.0])


def test_markov_availability_draws_the_same_after_travelling_to_another_process():
    rng = np.random.default_rng([3, 17, 0xD1])
    m = MarkovAvailability(1800.0, 600.0, rng)
    rng.uniform(0.2, 1.0)  # the world draws the battery from the same generator afterwards
    travelled = pickle.loads(pickle.dumps(m))
    assert travelled.rng is None and len(pickle.dumps(m)) < 300
    here, there = m.transitions(), travelled.transitions()
    assert [next(here) for _ in range(50)] == [next(there) for _ in range(50)]
