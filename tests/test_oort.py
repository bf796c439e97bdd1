"""Oort's selection: utilities and scores by hand for three clients, the exploration share, the
penalty for clients slower than T, the pacer, and a real run where the selector sees losses."""
import math

import numpy as np
import pytest

from conftest import read_csv, run_cli, write_scenario
from node.oort import Arm, OortParams, OortSelector, exploration_share, scores, statistical_utility, system_factor
from node.training import LocalTraining, train_local
from node.data import Dataset
import torch


def test_statistical_utility_is_samples_times_rms_loss():
    # per-sample losses 1, 2, 2 over |B| = 3: 3 * sqrt((1 + 4 + 4) / 3)
    assert statistical_utility(3, math.sqrt(3.0)) == pytest.approx(3 * math.sqrt(9 / 3))


def test_scores_by_hand_for_three_clients():
    p = OortParams(alpha=2.0, staleness_bonus=0.1)
    arms = {"a": Arm(10.0, last_round=4, duration=5.0),   # best utility, fast
            "b": Arm(6.0, last_round=1, duration=20.0),   # middling, slow: penalised
            "c": Arm(2.0, last_round=4, duration=8.0)}    # worst utility
    got = scores(arms, round_=9, preferred=10.0, p=p)
    bonus = lambda last: math.sqrt(0.1 * math.log(10) / (last + 1))  # noqa: E731
    assert got["a"] == pytest.approx(1.0 + bonus(4))
    assert got["b"] == pytest.approx((0.5 + bonus(1)) * (10.0 / 20.0) ** 2)
    assert got["c"] == pytest.approx(0.0 + bonus(4))


def test_penalty_only_for_clients_slower_than_T():
    assert system_factor(9.9, 10.0, 2.0) == 1.0
    assert system_factor(None, 10.0, 2.0) == 1.0
    assert system_factor(40.0, 10.0, 2.0) == pytest.approx(1 / 16)
    assert system_factor(40.0, 10.0, 0.5) == pytest.approx(0.5)


def test_exploration_share_decays_to_its_floor():
    p = OortParams(exploration=0.9, exploration_decay=0.5, exploration_min=0.3)
    assert [exploration_share(r, p) for r in range(4)] == pytest.approx([0.9, 0.45, 0.3, 0.3])


def test_selection_splits_explore_and_exploit_and_avoids_slow_clients():
    p = OortParams(exploration=0.5, exploration_decay=1.0, exploration_min=0.5, preferred_duration_s=10.0, cutoff=0.95)
    sel = OortSelector(p)
    names = [f"c{i:02d}" for i in range(40)]
    for i, n in enumerate(names[:20]):  # explored: equal utility; the odd ones take 100 s
        sel.feedback(n, 0, samples=10, loss_rms=1.0, duration=100.0 if i % 2 else 5.0)
    rng = np.random.default_rng(0)
    picked = sel.select({n: {} for n in names}, 10, 1, rng, expected={})
    explored = [n for n in picked if n in names[:20]]
    assert len(picked) == 10 and len(explored) == 5  # epsilon 0.5 of 10 slots for new clients
    assert all(int(n[1:]) % 2 == 0 for n in explored)  # penalised 400x, below the cut-off
    assert len(set(picked) - set(names[:20])) == 5


def test_pacer_relaxes_T_when_utility_falls():
    sel = OortSelector(OortParams(preferred_duration_s=10.0, pacer_window=2, pacer_delta_s=3.0))
    rng = np.random.default_rng(0)
    pool = {f"c{i}": {} for i in range(4)}
    for r, u in enumerate([5.0, 5.0, 1.0, 1.0]):  # rounds 2-3 collect less than rounds 0-1
        sel.select(pool, 2, r, rng, {})
        sel.feedback("c0", r, 1, u, 1.0)
    sel.select(pool, 2, 4, rng, {})
    assert sel.preferred == 13.0


def test_training_reports_the_rms_of_per_sample_losses():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    data = Dataset(torch.randn(12, 1, 2, 2), torch.randint(0, 3, (12,)), 3)
    result = train_local(model, data, np.arange(12), LocalTraining(1, 12, 0.0), np.random.default_rng(0))
    with torch.no_grad():
        per = torch.nn.functional.cross_entropy(model(data.x), data.y, reduction="none")
    assert result.loss_rms == pytest.approx(float((per ** 2).mean().sqrt()), rel=1e-5)
    assert result.loss_rms >= result.loss  # RMS >= mean


SCENARIO = """
name: oort
seed: 2
rounds: 4
task: {dataset: synthetic, model: mlp, synthetic: {samples: 600, test_samples: 50, shape: [1, 28, 28], classes: 10}}
population:
  clients: 12
  hosts: 2
  devices: [{name: fast, share: 0.5, ms_per_sample: 1}, {name: slow, share: 0.5, ms_per_sample: 200}]
  links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]
selection: {clients_per_round: 4, policy: oort, checkin: true, oort: {exploration: 0.25, exploration_min: 0.25}}
algorithm: {local_epochs: 1, batch_size: 10, lr: 0.05}
eval: {every: 0}
"""


def test_oort_run_prefers_fast_clients_once_explored(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO)), "--out", str(out), "--quiet", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    device = {r["client"]: r["device"] for r in read_csv(out / "population.csv")}
    rows = read_csv(out / "clients.csv")
    late = [device[r["client"]] for r in rows if int(r["round"]) >= 2]
    # T is the median expected duration (between the two kinds): from round 2 on, 3 of 4 slots are
    # exploited, and a slow client's score is cut by (T/d)^2 far below the cut-off
    assert late.count("fast") >= 6, late
    assert all(r["loss"] not in ("", None) for r in rows if r["outcome"] == "ok")
