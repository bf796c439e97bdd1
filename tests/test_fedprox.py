"""FedProx: the proximal term by hand, its effect on local training, and that the scenario key
reaches every star algorithm's clients."""
import numpy as np
import pytest
import torch

from conftest import write_scenario
from emulator.scenario import ScenarioError, load_scenario
from emulator.world import build_world
from node.data import synthetic
from node.models import build_model
from node.training import LocalTraining, proximal_term, train_local


def test_proximal_term_and_its_gradient_by_hand():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    anchor = torch.zeros(2)
    term = proximal_term([w], [anchor], 0.5)
    assert float(term.detach()) == pytest.approx(0.25 * (1 + 4))  # (mu/2) ||w - w_t||^2
    term.backward()
    assert w.grad.tolist() == pytest.approx([0.5, 1.0])  # mu (w - w_t)


def _drift(mu: float) -> float:
    train, _ = synthetic(200, 10, (1, 8, 8), 4, seed=0)
    model = build_model("mlp", (1, 8, 8), 4, seed=1)
    start = [p.detach().clone() for p in model.parameters()]
    train_local(model, train, np.arange(200), LocalTraining(5, 20, 0.1, prox_mu=mu), np.random.default_rng(0))
    return float(sum(((p.detach() - s) ** 2).sum() for p, s in zip(model.parameters(), start)) ** 0.5)


def test_a_larger_mu_keeps_the_local_model_closer_to_the_global_one():
    free, held, tight = _drift(0.0), _drift(1.0), _drift(10.0)
    assert tight < held < free
    assert tight < 0.5 * free


SCENARIO = """
rounds: 1
task: {{dataset: synthetic, model: mlp}}
population: {{clients: 2, devices: [{{ms_per_sample: 1}}], links: [{{up_mbps: 1, down_mbps: 1}}]}}
algorithm: {algorithm}
"""


def test_fedprox_mu_reaches_the_clients(tmp_path):
    sc, _ = load_scenario(write_scenario(tmp_path / "s.yaml", SCENARIO.format(algorithm="{name: fedprox, options: {mu: 0.1}}")))
    world = build_world(sc)
    seen = []
    world.client.strategy.local_update({}, LocalTraining(1, 8, 0.1), lambda s, c: seen.append(c.prox_mu) or (s, None))
    assert seen == [0.1]


@pytest.mark.parametrize("algorithm", ["fedavg", "fedalign"])
def test_the_removed_prox_mu_key_names_the_fedprox_strategy(tmp_path, algorithm):
    with pytest.raises(ScenarioError) as err:
        load_scenario(write_scenario(tmp_path / "s.yaml", SCENARIO.format(algorithm=f"{{name: {algorithm}, prox_mu: 0.1}}")))
    assert "algorithm.prox_mu: removed: FedProx is the strategy fedprox; write algorithm: {name: fedprox, options: {mu: 0.1}}" \
        in str(err.value)
