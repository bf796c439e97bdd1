"""SCAFFOLD (node/strategies/scaffold.py): option II control variates by hand, the gradient
correction in both training paths, the arrays beside the model counted on the wire both ways, and
the combinations its capabilities refuse."""
import csv

import numpy as np
import pytest
import torch

from conftest import REPO, needs_mnist, run_cli
from emulator.scenario import ScenarioError, load_scenario
from node.cohort import CohortTrainer, TrainRequest
from node.data import Dataset
from node.models import build_model, state_to_numpy
from node.strategies import ClientUpdate, RoundControl, strategy_class
from node.training import LocalTraining, TrainingResult

SCENARIO = REPO / "scenarios" / "scaffold_mnist.yaml"


def test_client_step_option_two_by_hand():
    scaffold = strategy_class("scaffold")()
    x = {"w": np.array([1.0, 2.0], np.float32)}
    y = {"w": np.array([0.5, 1.0], np.float32)}
    c = {"c/w": np.array([0.1, 0.2], np.float32)}
    seen = {}

    def train(state, config, correction=None):
        seen["correction"] = correction
        return y, TrainingResult(0.0, samples_seen=30)

    config = LocalTraining(epochs=2, batch_size=10, lr=0.1)  # K = 2 epochs x 3 steps = 6
    step = scaffold.client_step(x, config, train, c, {})
    assert seen["correction"]["w"].tolist() == pytest.approx([0.1, 0.2])  # c - c_i, c_i = 0 at first
    expected = np.array([-0.1 + 0.5 / 0.6, -0.2 + 1.0 / 0.6])  # c_i+ = c_i - c + (x - y) / (K lr)
    assert step.client_state["c_i"]["w"] == pytest.approx(expected, rel=1e-6)
    assert step.extras["c/w"] == pytest.approx(expected, rel=1e-6)  # delta c_i = c_i+ - 0
    assert step.state is y
    # the next round starts from c_i+: its correction is c - c_i+, and the delta is against c_i+
    step2 = scaffold.client_step(x, config, train, c, step.client_state)
    assert seen["correction"]["w"] == pytest.approx(np.array([0.1, 0.2]) - expected, rel=1e-6)
    # c_i++ - c_i+ = -c + (x - y) / (K lr): the same change as the first round's, from the same x and y
    assert step2.extras["c/w"] == pytest.approx(expected, rel=1e-5)
    assert step2.client_state["c_i"]["w"] == pytest.approx(2 * expected, rel=1e-5)


def test_server_moves_c_by_the_sum_of_deltas_over_the_population():
    scaffold = strategy_class("scaffold")()
    w = {"w": np.zeros(2, np.float32), "n": np.array([7], np.int64)}
    assert scaffold.round_extras(w)["c/w"].tolist() == [0.0, 0.0] and "c/n" not in scaffold.round_extras(w)
    scaffold.configure_round(RoundControl(0, ["a", "b"], 0, lambda *_: None, population=4), w)
    for name, value, dc, samples in (("a", 1.0, [1.0, 2.0], 1.0), ("b", 3.0, [3.0, -2.0], 3.0)):
        scaffold.on_update(ClientUpdate(name, {"w": np.full(2, value, np.float32), "n": np.array([7])}, {}, samples,
                                        extras={"c/w": np.array(dc, np.float32)}))
    out = scaffold.aggregate(w)
    assert out["w"].tolist() == [2.5, 2.5]  # FedAvg's sample-weighted mean: (1 + 9) / 4
    assert scaffold.c["w"].tolist() == [1.0, 0.0]  # (1 + 3) / 4, (2 - 2) / 4
    assert scaffold.round_extras(out)["c/w"].tolist() == [1.0, 0.0]
    assert scaffold.extras_spec({"w": ((2,), "f4"), "n": ((1,), "i8")}, "up") == {"c/w": ((2,), "f4")}


def tiny_data() -> Dataset:
    g = torch.Generator().manual_seed(0)
    return Dataset(torch.rand(40, 1, 4, 4, generator=g), torch.randint(0, 3, (40,), generator=g), 3)


def test_the_correction_is_added_to_every_step_one_by_one_and_in_cohorts():
    model = build_model("mlp", (1, 4, 4), 3, seed=1)
    state = state_to_numpy(model)
    correction = {name: np.full(v.shape, 0.5, np.float32) for name, v in state.items()}
    config = LocalTraining(epochs=1, batch_size=40, lr=0.1)  # one step on all 40 samples
    data, idx = tiny_data(), np.arange(40)

    def one(corr, trainer):
        return trainer.train(TrainRequest(state, data, idx, config, np.random.default_rng(0), None, corr))[0]

    plain = one(None, CohortTrainer(model, 1))
    corrected = one(correction, CohortTrainer(model, 1))
    for name in state:  # w - lr (g + corr) = (w - lr g) - lr corr
        assert corrected[name] == pytest.approx(plain[name] - 0.05, abs=1e-6)
    cohort = CohortTrainer(model, 2)
    pair = cohort.run_group([lambda: one(correction, cohort), lambda: one(None, cohort)])
    for name in state:
        assert pair[0][name] == pytest.approx(corrected[name], abs=1e-5)
        assert pair[1][name] == pytest.approx(plain[name], abs=1e-5)


@pytest.mark.parametrize("override, key", [
    ("topology=hierarchical", "topology"),
    ("algorithm.codec.up.name=topk", "algorithm.codec.up"),
    ("algorithm.codec.up.error_feedback=true", "algorithm.codec.up"),
    ("algorithm.train=false", "algorithm.train"),
])
def test_what_scaffold_declares_it_cannot_do_is_refused_naming_the_key(override, key):
    extra = ["hierarchy.edges=2"] if override.startswith("topology") else []
    with pytest.raises(ScenarioError) as err:
        load_scenario(SCENARIO, [override, *extra])
    assert f"scaffold_mnist.yaml: {key}: " in str(err.value) and "scaffold" in str(err.value)


def test_dp_with_scaffold_is_refused():
    with pytest.raises(ScenarioError, match="algorithm.privacy.mechanism: scaffold works with none, not laplace"):
        load_scenario(SCENARIO, ["algorithm.privacy.mechanism=laplace", "algorithm.privacy.epsilon=10",
                                 "algorithm.privacy.clip=1"])


@needs_mnist
def test_a_run_sends_the_control_variates_both_ways_and_learns(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(SCENARIO), "--set", "rounds=3", "--set", "task.model=mlp", "--set", "eval.every=1",
                  "--out", str(out), "--plain")
    assert res.returncode == 0, res.stderr[-3000:]
    params = 784 * 64 + 64 + 64 * 10 + 10  # mlp: 784-64-10, by hand
    with (out / "transfers.csv").open() as f:
        transfers = list(csv.DictReader(f))
    assert len(transfers) == 3 * 10 * 2
    # fp32 both ways: the model and one control variate per parameter, 4 bytes each, on every message
    assert {int(r["payload_bytes"]) for r in transfers} == {2 * 4 * params}
    with (out / "rounds.csv").open() as f:
        accuracy = [float(r["accuracy"]) for r in csv.DictReader(f)]
    assert accuracy[-1] > 0.2  # it learns (10 classes: chance is 0.1)
