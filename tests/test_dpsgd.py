"""DP-SGD as a client stage (algorithm.privacy.mechanism: dpsgd): per-sample clipping and
Gaussian noise at every step through torch.func (node/cohort.py), its RDP accountant
(node/accounting.py) checked by hand and against Opacus, and a run that reports each client's
epsilon per round and in total."""
import copy
import json
import math

import numpy as np
import pytest
import torch

from conftest import read_csv, run_cli, write_scenario
from node.accounting import ORDERS, Release, compose, dpsgd_rdp, rdp_epsilon, sampled_gaussian_rdp
from node.cohort import CohortTrainer, TrainRequest, train_cohort
from node.data import synthetic
from node.models import build_model, state_to_numpy
from node.training import DpSgd, LocalTraining, batches, train_local

opacus = pytest.importorskip("opacus", reason="the comparison needs Opacus (pip install -e '.[test]')")
from opacus import GradSampleModule  # noqa: E402
from opacus.accountants import RDPAccountant  # noqa: E402
from opacus.optimizers import DPOptimizer  # noqa: E402


# ---- the accountant ---------------------------------------------------------------------------
def test_rdp_of_full_batches_is_the_gaussian_mechanisms():
    # q = 1: every step is the Gaussian mechanism of sensitivity C, noise sigma C: RDP a / (2 sigma^2)
    assert dpsgd_rdp(1.0, 2.0, 10, (2.0, 7.5)) == pytest.approx((10 * 2 / 8, 10 * 7.5 / 8))


def test_rdp_at_order_two_matches_the_closed_form():
    # A_2 = (1-q)^2 + 2q(1-q) + q^2 e^{1/sigma^2}, so RDP(2) = log(1 + q^2 (e^{1/sigma^2} - 1))
    for q, sigma in [(0.01, 1.0), (0.3, 0.7), (0.9, 3.0)]:
        assert sampled_gaussian_rdp(q, sigma, 2) == pytest.approx(math.log1p(q * q * math.expm1(1 / sigma**2)), rel=1e-12)


def test_fractional_orders_lie_between_their_integer_neighbours():
    q, sigma = 0.05, 1.1
    for low in (2, 3, 7):
        mid = sampled_gaussian_rdp(q, sigma, low + 0.5)
        assert sampled_gaussian_rdp(q, sigma, low) <= mid <= sampled_gaussian_rdp(q, sigma, low + 1)


def test_rdp_composes_by_adding_and_epsilon_grows_with_steps():
    q, sigma = 0.02, 1.0
    assert dpsgd_rdp(q, sigma, 300) == pytest.approx(tuple(a + b for a, b in zip(dpsgd_rdp(q, sigma, 100), dpsgd_rdp(q, sigma, 200))))
    eps = [rdp_epsilon(dpsgd_rdp(q, sigma, s), 1e-5)[0] for s in (10, 100, 1000)]
    assert eps[0] < eps[1] < eps[2]
    # a Gaussian release of rho = a * rho in RDP: its epsilon is below zCDP's conversion of the same rho
    gauss = Release("update", "gaussian", 1.0, 1e-5, 0.5)
    spent = compose([gauss, gauss], 1e-5)
    assert spent["rdp"]["epsilon"] <= spent["zcdp"]["epsilon"]


@pytest.mark.parametrize("q, sigma, steps", [(0.01, 1.1, 1000), (16 / 47, 1.0, 30), (0.2, 0.8, 50), (0.001, 4.0, 10000),
                                             (0.5, 2.0, 7), (0.16, 1.0, 14)])
def test_epsilon_is_opacus_rdp_accountants(q, sigma, steps):
    ours, order = rdp_epsilon(dpsgd_rdp(q, sigma, steps), 1e-5)
    accountant = RDPAccountant()
    accountant.history = [(sigma, q, steps)]
    theirs, their_order = accountant.get_privacy_spent(delta=1e-5, alphas=list(ORDERS))
    assert ours == pytest.approx(theirs, rel=1e-9)
    assert order == their_order


# ---- the update ---------------------------------------------------------------------------------
DATA = synthetic(480, 10, (1, 28, 28), 10, seed=0)


@pytest.mark.parametrize("name", ["mlp", "mnist_cnn"])
@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_update_is_opacus_for_the_same_batches_and_noise_seed(name, sampling):
    """Same start, same batches, same torch generator seed: Opacus's GradSampleModule + DPOptimizer
    (per-sample clipping to C, N(0, (sigma C)^2), divided by the expected batch size) gives the same
    weights within float32 rounding."""
    train = DATA[0]
    cfg = LocalTraining(2, 10, 0.1, dpsgd=DpSgd(1.1, 0.5, sampling))
    model = build_model(name, (1, 28, 28), 10, seed=3)
    start = state_to_numpy(model)
    indices = np.arange(40)
    rng = np.random.default_rng(5)
    probe = copy.deepcopy(rng)  # what train_cohort will draw: the noise seed, then each epoch's batches
    seed = int(probe.integers(2**62))
    plan = [b for _ in range(cfg.epochs) for b in batches(indices, cfg, probe, None)]
    (ours, result), = train_cohort(model, [TrainRequest(start, train, indices, cfg, rng)])

    module = GradSampleModule(build_model(name, (1, 28, 28), 10, seed=3))
    opt = DPOptimizer(torch.optim.SGD(module.parameters(), lr=cfg.lr), noise_multiplier=1.1, max_grad_norm=0.5,
                      expected_batch_size=10, generator=torch.Generator().manual_seed(seed))
    for b in plan:
        x, y = train.batch(torch.from_numpy(b))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(module(x), y).backward()
        opt.step()
    theirs = {k: v.detach().numpy() for k, v in module._module.state_dict().items()}
    moved = max(np.abs(ours[k] - start[k]).max() for k in ours)
    gap = max(np.abs(ours[k] - theirs[k]).max() for k in ours)
    assert moved > 1e-2 and gap <= 1e-6, (moved, gap)
    if sampling == "poisson":
        assert len({b.size for b in plan}) > 1  # really Poisson: the batch sizes vary
    assert result.samples_seen == 40


def test_cohorts_of_dpsgd_clients_train_as_each_alone():
    train = DATA[0]
    cfg = LocalTraining(1, 16, 0.05, dpsgd=DpSgd(1.0, 1.0, "poisson"))
    model = build_model("mnist_cnn", (1, 28, 28), 10, seed=2)
    start = state_to_numpy(model)
    shards = [np.arange(0, 47), np.arange(60, 107), np.arange(120, 168), np.arange(200, 246)]
    request = lambda c: TrainRequest(start, train, shards[c], cfg, np.random.default_rng([7, c]))  # noqa: E731
    together = CohortTrainer(model, 8)._train_group([request(c) for c in range(4)])
    pair = CohortTrainer(model, 8)._train_group([request(0), request(3)])
    alone = CohortTrainer(model, 1)._train_group([request(c) for c in range(4)])
    for c in range(4):
        assert all(np.abs(together[c][0][k] - alone[c][0][k]).max() <= 1e-6 for k in start)
    assert all(np.array_equal(pair[0][0][k], together[0][0][k]) for k in start)
    assert all(np.array_equal(pair[1][0][k], together[3][0][k]) for k in start)
    with pytest.raises(ValueError, match="per-sample gradients"):
        train_local(model, train, shards[0], cfg, np.random.default_rng(0))


# ---- a run ------------------------------------------------------------------------------------
SCENARIO = """
name: dpsgd
seed: 3
rounds: 3
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 800, test_samples: 200}
population:
  clients: 8
  hosts: 2
  devices: [{ms_per_sample: 1}]
  links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]
selection: {clients_per_round: 4}
algorithm: {local_epochs: 2, batch_size: 16, lr: 0.1, privacy: {mechanism: dpsgd, clip: 1.0, noise_multiplier: 1.0}}
eval: {every: 1}
"""


def test_a_dpsgd_run_reports_each_clients_epsilon_per_round_and_in_total(tmp_path):
    path = write_scenario(tmp_path / "s.yaml", SCENARIO)
    res = run_cli("run", str(path), "--out", str(tmp_path / "out"), "--plain", timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = read_csv(tmp_path / "out" / "clients.csv")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    # 100 samples each (800 over 8 clients), batch 16: q = 0.16, 7 steps per epoch, 2 epochs
    per_round, _ = rdp_epsilon(dpsgd_rdp(16 / 100, 1.0, 14), 1e-5)
    accountant = RDPAccountant()
    accountant.history = [(1.0, 0.16, 14)]
    assert per_round == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    rounds_of: dict[str, int] = {}
    for row in rows:
        assert row["outcome"] == "ok"
        rounds_of[row["client"]] = rounds_of.get(row["client"], 0) + 1
        assert float(row["dp_epsilon"]) == pytest.approx(per_round, rel=1e-9)
        total, _ = rdp_epsilon(dpsgd_rdp(0.16, 1.0, 14 * rounds_of[row["client"]]), 1e-5)
        assert float(row["dp_epsilon_total"]) == pytest.approx(total, rel=1e-9)
    assert max(rounds_of.values()) >= 2  # someone composed over rounds
    spent = summary["privacy_spent"]
    worst, _ = rdp_epsilon(dpsgd_rdp(0.16, 1.0, 14 * max(rounds_of.values())), 1e-5)
    assert spent["max_rdp_epsilon"] == pytest.approx(worst, rel=1e-9)
    assert spent["max_rdp_epsilon"] < spent["max_zcdp_epsilon"]  # amplification by sampling counts
    assert max(float(r["accuracy"]) for r in read_csv(tmp_path / "out" / "rounds.csv") if r["accuracy"]) > 0.3


@pytest.mark.parametrize("privacy, expected", [
    ("{mechanism: dpsgd, clip: 1.0}", "mechanism dpsgd needs clip and noise_multiplier"),
    ("{mechanism: dpsgd, clip: 1.0, noise_multiplier: 1.0, epsilon: 3}", "epsilon: dpsgd spends what"),
    ("{mechanism: laplace, clip: 1.0, epsilon: 3, noise_multiplier: 1.0}", "noise_multiplier: only for mechanism dpsgd"),
    ("{mechanism: dpsgd, clip: 1.0, noise_multiplier: 1.0, sampling: uniform}", "sampling"),
])
def test_bad_dpsgd_settings_give_one_line(tmp_path, privacy, expected):
    text = SCENARIO.replace("{mechanism: dpsgd, clip: 1.0, noise_multiplier: 1.0}", privacy)
    res = run_cli("validate", str(write_scenario(tmp_path / "s.yaml", text)), timeout=60)
    assert res.returncode == 2 and expected in res.stderr and "Traceback" not in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.strip()]) == 1


# ---- capped sessions (issue 43, item 3) ------------------------------------------------------------
def test_a_capped_poisson_session_draws_from_all_samples_for_the_caps_steps_and_is_accounted_so():
    """max_samples_per_round under DP-SGD with Poisson sampling: each step's batch is drawn from all
    n of the client's samples at rate B/n, for ceil(cap/B) steps an epoch (the cap's work in
    expectation), and the release is the proven add/remove bound for exactly those draws. A fixed
    subset of `cap` samples would make neighbouring data sets differ by substitution."""
    from node.actor import Message
    from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
    from node.stages import Privacy
    from protocol.codecs import encode_state, make_codec

    n, cap, batch, epochs, sigma = 120, 24, 8, 2, 1.1
    train, test = synthetic(n, 10, (1, 4, 4), 3, seed=0)
    client = ClientActor(ClientProfile("c0", 0, np.arange(n), 10.0), Trainer(TaskSpec("mlp", train, test, seed=0)),
                         ClientConfig(make_codec("fp32"), seed=0, max_samples=cap,
                                      privacy=Privacy("dpsgd", clip=1.0, noise_multiplier=sigma, compute_factor=1.0)))
    drawn = []
    original = client.trainer.train

    def spy(state, indices, cfg, rng, order=None, data=None, correction=None):
        drawn.append((indices.copy(), cfg))
        return original(state, indices, cfg, rng, order, data, correction)

    client.trainer.train = spy
    encoded = encode_state(state_to_numpy(client.trainer.model), make_codec("fp32"), np.random.default_rng(0))
    body = {"epochs": epochs, "batch_size": batch, "lr": 0.1, "bits": None, "n_max": n}
    reaction = client.react(Message("server", "c0", "task", 0, 0.0, body, encoded.frames, {}))
    assert reaction.work_s == pytest.approx(10.0 * cap * epochs / 1000)  # charged for the cap, not for n
    out = reaction.work()()
    [(indices, cfg)] = drawn
    assert indices.size == n and cfg.dpsgd.steps == math.ceil(cap / batch) == 3
    draws = np.random.default_rng(7)
    steps = [b for _ in range(50) for b in batches(indices, cfg, draws, None)]
    assert len(steps) == 50 * 3
    seen = np.concatenate(steps)
    assert np.unique(seen).size > cap  # batches reach beyond any fixed subset of cap samples
    assert seen.size / len(steps) == pytest.approx(batch, rel=0.1)  # B samples a step on average: rate B/n
    assert out.sends[0].body["samples"] == cap  # weighted by the cap
    [privacy] = [r for r in out.reports if r["type"] == "privacy"]
    assert privacy["adjacency"] == "add_remove" and privacy["guarantee"] == "proven"
    assert tuple(privacy["rdp"]) == pytest.approx(dpsgd_rdp(batch / n, sigma, epochs * 3))
