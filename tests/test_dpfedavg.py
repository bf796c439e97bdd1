"""User-level DP-FedAvg (issue 44, item 2), server-side: the clip and the noise by hand, the
accountant against Opacus's RDP accountant for the same (q, z, rounds), the adaptive clip tracking
its quantile, and a real run whose summary says what every user spent and whether it is proven."""
import json
import math

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from conftest import run_cli, write_scenario
from node import accounting
from node.strategies.base import ClientUpdate, RoundControl
from node.strategies.dpfedavg import DpFedAvg


@pytest.mark.parametrize("q, z, rounds", [(0.1, 1.0, 20), (0.01, 0.8, 500), (0.13, 1.3, 200), (1.0, 4.0, 10)])
def test_the_user_level_epsilon_is_opacus_rdp_accountants(q, z, rounds):
    delta = accounting.user_level_delta(1000)
    assert delta == pytest.approx(1000 ** -1.1)
    ours = accounting.user_level_summary([accounting.user_level_release(q, z, delta)] * rounds)
    opacus = RDPAccountant()
    opacus.history = [(z, q, rounds)]
    assert ours["epsilon"] == pytest.approx(opacus.get_epsilon(delta), rel=0.01)
    assert ours["releases"] == rounds and ours["guarantee"] == "proven"


def test_the_clipped_count_shares_the_budget():
    # Andrew et al.: z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2
    assert accounting.update_noise_multiplier(1.0, 5.0) == pytest.approx((1 - 0.01) ** -0.5)
    assert accounting.update_noise_multiplier(1.0, 0.0) == 1.0
    with pytest.raises(ValueError):
        accounting.update_noise_multiplier(2.0, 0.9)


@pytest.mark.parametrize("quantile", [0.3, 0.5, 0.8])
def test_the_adaptive_clip_tracks_its_quantile_on_a_stream_of_norms(quantile):
    rng = np.random.default_rng(3)
    clip, cohort, sigma_b = 0.1, 100, 5.0
    for _ in range(400):
        norms = rng.lognormal(0.0, 0.5, cohort)  # a round's update norms
        share = (np.sum(norms <= clip) + rng.normal(0.0, sigma_b)) / cohort
        clip = accounting.adapted_clip(clip, share, quantile, 0.2)
    target = math.exp(0.5 * math.sqrt(2) * _erfinv(2 * quantile - 1))  # the lognormal's quantile
    assert clip == pytest.approx(target, rel=0.1)


def _erfinv(y: float) -> float:
    lo, hi = -6.0, 6.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid) < y else (lo, mid)
    return lo


def control(selected: int, population: int) -> RoundControl:
    return RoundControl(0, [f"c{i}" for i in range(selected)], 0, lambda *a: None, population)


def test_each_update_is_clipped_and_the_sum_noised_over_the_expected_cohort():
    strategy = DpFedAvg({"clip": 1.0, "noise_multiplier": 1e-9})
    w = {"w": np.zeros(4, np.float32), "count": np.array([7])}
    strategy.configure_round(control(4, 40), w)
    big = {"w": np.array([3.0, 0.0, 4.0, 0.0], np.float32), "count": np.array([7])}  # norm 5: scaled to 1
    small = {"w": np.array([0.0, 0.5, 0.0, 0.0], np.float32), "count": np.array([7])}  # norm 0.5: kept
    for d in (big, small):
        strategy.on_update(ClientUpdate("c", d, d, 10.0))
    out = strategy.aggregate(w)
    assert out["w"] == pytest.approx(np.array([0.6, 0.5, 0.8, 0.0]) / 4, abs=1e-6)  # over the 4 asked, not the 2 that came
    assert out["count"] is w["count"]  # integer buffers are not noised
    [release] = strategy.take_releases()
    assert release.mechanism == "dpfedavg" and release.delta == pytest.approx(40 ** -1.1)
    assert tuple(release.rdp) == pytest.approx(accounting.dpsgd_rdp(0.1, 1e-9, 1))
    assert strategy.take_releases() == []
    noisy = DpFedAvg({"clip": 2.0, "noise_multiplier": 1.5})
    noisy.configure_round(control(10, 100), {"w": np.zeros(200_000, np.float32)})
    spread = np.std(noisy.aggregate({"w": np.zeros(200_000, np.float32)})["w"])
    assert spread == pytest.approx(1.5 * 2.0 / 10, rel=0.01)  # std z C over the cohort


SCENARIO = """
name: dpfedavg
seed: 2
rounds: 3
task: {dataset: synthetic, model: mlp, synthetic: {samples: 600, test_samples: 100, shape: [1, 28, 28], classes: 10}}
population: {clients: 20, hosts: 2, devices: [{ms_per_sample: 1}], links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]}
selection: {clients_per_round: 5}
algorithm: {name: dpfedavg, local_epochs: 1, batch_size: 20, lr: 0.1,
            options: {clip: 0.5, noise_multiplier: 1.1, adaptive_clip: true}}
"""


def test_a_run_reports_what_every_user_spent_and_whether_it_is_proven(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO)), "--out", str(out), "--quiet", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    spent = json.loads((out / "summary.json").read_text())["privacy_spent"]
    user = spent["user_level"]
    expected = accounting.user_level_summary([accounting.user_level_release(5 / 20, 1.1, 20 ** -1.1)] * 3)
    assert user["releases"] == 3 and user["guarantee"] == "proven"
    assert user["epsilon"] == pytest.approx(expected["epsilon"]) and user["delta"] == pytest.approx(20 ** -1.1)
    assert "server" not in spent["per_client"]
    # a selection policy that is not uniform voids the amplification: heuristic, and the run says so
    biased = SCENARIO.replace("selection: {clients_per_round: 5}", "selection: {clients_per_round: 5, policy: fastest}")
    res = run_cli("run", str(write_scenario(tmp_path / "b.yaml", biased)), "--out", str(tmp_path / "b"), "--quiet",
                  timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["privacy_spent"]["user_level"]["guarantee"] == "heuristic"


def test_local_dp_beside_it_is_refused_in_one_line(tmp_path):
    text = SCENARIO.replace("adaptive_clip: true}}", "adaptive_clip: true},\n            privacy: {mechanism: laplace, epsilon: 10, clip: 1}}")
    res = run_cli("validate", str(write_scenario(tmp_path / "s.yaml", text)))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "algorithm.privacy.mechanism" in line and "dpfedavg adds its own noise" in line


def test_a_count_noise_that_leaves_the_update_no_budget_is_refused():
    with pytest.raises(ValueError, match="count_noise must be above"):
        DpFedAvg({"noise_multiplier": 2.0, "adaptive_clip": True, "count_noise": 0.9})
    small = DpFedAvg({"clip": 1.0, "noise_multiplier": 1.1, "adaptive_clip": True})  # cohort 5: sigma_b = max(0.25, 1.1)
    small.configure_round(control(5, 50), {"w": np.zeros(3, np.float32)})
    small.aggregate({"w": np.zeros(3, np.float32)})
    assert small.clip != 1.0 and small.steps == 1
