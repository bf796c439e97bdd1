"""FedAdam, FedYogi and FedAdagrad (node/strategies/fedopt.py) against the rules of Reddi et al.
2021 computed by hand, and a run of the shipped scenario."""
import csv
import math
import pickle

import numpy as np
import pytest

from conftest import REPO, needs_mnist, run_cli
from node.strategies import ClientUpdate, strategy_class

OPTIONS = {"server_lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 0.001}


def step(name: str, strategy=None, w=1.0, means=(2.0,)):
    """One server step from weights w, the clients' models averaging to each of `means` in turn."""
    strategy = strategy or strategy_class(name)(OPTIONS)
    state = {"w": np.array([w]), "count": np.array([3], np.int64)}
    for mean in means:
        for value, weight in ((mean - 1.0, 1.0), (mean + 1.0, 1.0)):  # two clients around the mean
            strategy.on_update(ClientUpdate("c", {"w": np.array([value]), "count": np.array([5], np.int64)}, {}, weight))
        state = strategy.aggregate(state)
    return strategy, state


@pytest.mark.parametrize("name, v", [
    ("fedadam", 0.99 * 1e-6 + 0.01 * 1.0),  # beta2 v + (1 - beta2) delta^2, v starting at tau^2
    ("fedyogi", 1e-6 + 0.01 * 1.0),  # v - (1 - beta2) delta^2 sign(v - delta^2), and v < delta^2
    ("fedadagrad", 1e-6 + 1.0),  # v + delta^2
])
def test_first_step_by_hand(name, v):
    strategy, state = step(name)
    m = 0.1 * 1.0  # (1 - beta1) delta, delta = 2 - 1
    assert state["w"][0] == pytest.approx(1.0 + 0.01 * m / (math.sqrt(v) + 0.001), rel=1e-12)
    assert strategy.v["w"][0] == pytest.approx(v, rel=1e-12) and strategy.m["w"][0] == pytest.approx(m, rel=1e-12)
    assert state["count"].tolist() == [5] and state["count"].dtype == np.int64  # a counter takes the plain mean


def test_yogi_shrinks_v_toward_a_smaller_update_and_adam_decays_it():
    # round 1: delta = 1; round 2 from the new weights: delta = 0.1 - so v > delta^2 in round 2
    yogi, _ = step("fedyogi", means=(2.0,))
    v1 = yogi.v["w"][0]
    yogi, state = step("fedyogi", yogi, w=1.0, means=(1.1,))
    assert yogi.v["w"][0] == pytest.approx(v1 - 0.01 * 0.01 * np.sign(v1 - 0.01), rel=1e-9)
    assert yogi.v["w"][0] < v1
    adam, _ = step("fedadam", means=(2.0, 1.1))
    assert adam.v["w"][0] == pytest.approx(0.99 * (0.99e-6 + 0.01) + 0.01 * (1.1 - adam_w1()) ** 2, rel=1e-9)


def adam_w1() -> float:
    return 1.0 + 0.01 * 0.1 / (math.sqrt(0.99e-6 + 0.01) + 0.001)


def test_no_update_leaves_the_model_and_moments_and_a_checkpoint_keeps_them():
    strategy, state = step("fedadam")
    again = strategy_class("fedadam")(OPTIONS)
    again.restore(pickle.loads(pickle.dumps(strategy.snapshot())))  # as a checkpoint keeps it
    kept = again.aggregate(state)  # nobody answered
    assert kept["w"].tolist() == state["w"].tolist() and again.m["w"].tolist() == strategy.m["w"].tolist()
    _, a = step("fedadam", strategy, w=float(state["w"][0]), means=(1.5,))
    _, b = step("fedadam", again, w=float(state["w"][0]), means=(1.5,))
    assert a["w"][0] == b["w"][0]


@needs_mnist
def test_the_shipped_scenario_learns_and_sends_what_fedavg_sends(tmp_path):
    runs = {}
    for name in ("fedadam", "fedavg"):
        out = tmp_path / name
        res = run_cli("run", str(REPO / "scenarios/fedadam_mnist.yaml"), "--set", "rounds=3", "--set", "task.model=mlp",
                      "--set", f"algorithm.name={name}", "--set", "algorithm.options={}", "--set", "eval.every=1",
                      "--out", str(out), "--plain")
        assert res.returncode == 0, res.stderr[-3000:]
        with (out / "rounds.csv").open() as f:
            runs[name] = list(csv.DictReader(f))
    adam = [float(r["accuracy"]) for r in runs["fedadam"]]
    assert adam[-1] > 0.3 and adam[-1] > adam[0]  # it learns (10 classes, chance is 0.1)
    for key in ("payload_bytes_down", "payload_bytes_up", "wire_bytes_down", "wire_bytes_up"):
        assert [r[key] for r in runs["fedadam"]] == [r[key] for r in runs["fedavg"]]
