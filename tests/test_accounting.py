"""DP calibration and composition (issue 13, item 4) against published and hand-computed values."""
import math

import numpy as np
import pytest

from node.accounting import (analytic_gaussian_sigma, compose, gaussian_delta, gaussian_release, laplace_release,
                             ledger_summary, log_ndtr, zcdp_epsilon)
from node.privacy import noise_scale


def test_log_ndtr_matches_erfc_and_the_far_tail():
    for x in (-5.0, -1.0, 0.0, 2.0):
        assert log_ndtr(x) == pytest.approx(math.log(0.5 * math.erfc(-x / math.sqrt(2))), rel=1e-12)
    # at -30 both branches agree; at -100, Phi ~ exp(-5000) / (100 sqrt(2 pi))
    assert log_ndtr(-30.0 + 1e-9) == pytest.approx(log_ndtr(-30.0 - 1e-9), rel=1e-9)
    assert log_ndtr(-100.0) == pytest.approx(-5000 - math.log(100) - 0.5 * math.log(2 * math.pi) + math.log(1 - 1e-4 + 3e-8), rel=1e-12)


def test_analytic_gaussian_matches_balle_and_wang():
    # Balle & Wang 2018, Figure / Table: eps = 1, delta = 1e-5 -> sigma ~ 3.73 per unit sensitivity
    assert analytic_gaussian_sigma(1.0, 1e-5, 1.0) == pytest.approx(3.7306, abs=1e-4)
    for eps, delta in [(0.1, 1e-6), (1.0, 1e-5), (8.0, 1e-5), (1e4, 1e-5)]:
        sigma = analytic_gaussian_sigma(eps, delta, 2.0)
        assert gaussian_delta(sigma, eps, 2.0) <= delta < gaussian_delta(sigma * (1 - 1e-6), eps, 2.0)
        assert analytic_gaussian_sigma(eps, delta, 1.0) == pytest.approx(sigma / 2, rel=1e-8)  # linear in sensitivity


def test_classic_calibration_fails_above_epsilon_one_and_is_loose_below():
    classic = lambda eps, delta: math.sqrt(2 * math.log(1.25 / delta)) / eps  # noqa: E731
    assert gaussian_delta(classic(0.5, 1e-5), 0.5, 1.0) < 1e-5  # valid, with room to spare
    assert gaussian_delta(classic(10.0, 1e-5), 10.0, 1.0) > 2e-5  # not (10, 1e-5)-DP
    assert gaussian_delta(classic(1e4, 1e-5), 1e4, 1.0) > 0.99  # no privacy at all


def test_core_gaussian_option_is_analytic_at_epsilon_over_c_t():
    assert noise_scale("gaussian", 2.0, 4.0, 8.0, 1e-5) == pytest.approx(analytic_gaussian_sigma(2.0, 1e-5, 2.0))
    assert noise_scale("laplace", 2.0, 4.0, 8.0) == pytest.approx(1.0)  # Eq. 1.11: sens c_T / eps


def test_composition_basic_and_zcdp_by_hand():
    releases = [laplace_release("update", 0.5)] * 4 + [gaussian_release("statistics", 2.0, 1.0, 1.0, 1e-5)] * 2
    total = compose(releases, 1e-6)
    assert total["releases"] == 6
    assert total["basic"] == {"epsilon": pytest.approx(4.0), "delta": pytest.approx(2e-5)}
    rho = 4 * 0.5**2 / 2 + 2 * 1.0 / (2 * 4.0)  # 0.5 + 0.25
    assert total["zcdp"]["rho"] == pytest.approx(rho)
    assert total["zcdp"]["epsilon"] == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e6)))
    # many small releases: zCDP grows like sqrt(k), basic like k
    many = compose([gaussian_release("u", 10.0, 1.0, 0.5, 1e-6)] * 1000, 1e-5)
    assert many["zcdp"]["epsilon"] < many["basic"]["epsilon"] / 5
    assert zcdp_epsilon(0.0, 1e-5) == 0.0


def test_ledger_reports_each_client_and_the_worst():
    ledger = ledger_summary({"c1": [laplace_release("update", 1.0)] * 3, "c0": [laplace_release("update", 1.0)]}, 1e-5)
    assert list(ledger["per_client"]) == ["c0", "c1"] and ledger["clients"] == 2
    assert ledger["max_basic_epsilon"] == 3.0 and ledger["max_basic_delta"] == 0.0
    assert ledger["max_zcdp_epsilon"] == pytest.approx(zcdp_epsilon(1.5, 1e-5))
    assert np.isfinite(ledger["max_zcdp_epsilon"])


def test_a_ledger_summarised_after_every_round_composes_only_the_clients_with_new_releases(monkeypatch):
    """The run writer summarises its growing ledger after every round with a cache of each
    client's totals: the same summary as from scratch, and a client with no new release is not
    composed again."""
    from node import accounting

    ledger = {"c0": [laplace_release("update", 1.0)], "c1": [gaussian_release("u", 2.0, 1.0, 0.5, 1e-6)]}
    cache: dict = {}
    first = ledger_summary(ledger, 1e-5, cache)
    assert first == ledger_summary(ledger, 1e-5)
    calls = []
    real = accounting._client_ledger  # each client's totals (all, proven and heuristic), composed at once
    monkeypatch.setattr(accounting, "_client_ledger", lambda rs, delta: calls.append(len(rs)) or real(rs, delta))
    ledger["c1"].append(laplace_release("update", 0.5))
    ledger["c2"] = [laplace_release("update", 4.0)]
    second = ledger_summary(ledger, 1e-5, cache)
    assert sorted(calls) == [1, 2]  # c1 (now 2 releases) and the new c2; c0 from the cache
    monkeypatch.undo()
    assert second == ledger_summary(ledger, 1e-5)
    assert second["per_client"]["c1"]["releases"] == 2 and second["max_basic_epsilon"] == 4.0


def test_a_laplace_release_has_mironovs_rdp_curve_never_above_its_epsilon():
    """Issue 43, item 3: Mironov 2017, Prop. 6, by hand at order 2; at most epsilon at every order,
    also where exp would overflow; and 100 releases compose below basic composition (the zCDP
    conversion gave 1.4e7 for 100 releases of epsilon 500)."""
    from node.accounting import ORDERS, laplace_rdp

    eps = 1.0
    by_hand = math.log(2 / 3 * math.exp(eps) + 1 / 3 * math.exp(-2 * eps))  # order 2: 1/(2-1) log(...)
    assert laplace_rdp(eps, (2.0,))[0] == pytest.approx(by_hand, rel=1e-12) == pytest.approx(0.61912, abs=1e-5)
    for eps in (0.1, 1.0, 50.0, 500.0, 1e4):
        curve = laplace_rdp(eps)
        assert len(curve) == len(ORDERS) and all(0 < r <= eps for r in curve)
        assert list(curve) == sorted(curve)  # RDP grows with the order
    for eps in (1.0, 500.0):
        total = compose([laplace_release("update", eps)] * 100, 1e-5)
        assert total["rdp"]["epsilon"] < total["basic"]["epsilon"] == pytest.approx(100 * eps)
    assert compose([laplace_release("update", 500.0)] * 100, 1e-5)["rdp"]["epsilon"] < 5.1e4


def test_proven_and_heuristic_releases_are_summed_apart():
    """Issue 43, item 3: the ledger's top-level figures are the proven releases' only; the core paper's
    Laplace (calibrated to an estimate) is heuristic and reported apart, with each release's adjacency."""
    core = laplace_release("update", 100.0, "heuristic")
    proven = gaussian_release("update", 2.0, 1.0, 0.5, 1e-6)
    ledger = ledger_summary({"c0": [core, core, proven], "c1": [core]}, 1e-5)
    assert ledger["max_basic_epsilon"] == pytest.approx(0.5)  # c0's one proven release
    assert ledger["heuristic"]["max_basic_epsilon"] == pytest.approx(200.0)
    c0 = ledger["per_client"]["c0"]
    assert c0["proven"]["releases"] == 1 and c0["heuristic"]["releases"] == 2 and c0["releases"] == 3
    assert c0["basic"]["epsilon"] == pytest.approx(200.5)  # all of them, as before, per client
    assert ledger["adjacency"] == ["substitution"]
    assert ledger_summary({"c1": [core]}, 1e-5)["max_rdp_epsilon"] == 0.0  # nothing proven, nothing claimed


# ---- a sound calibration of the core paper's mechanism (issue 43, item 3) ----------------------------
def test_the_worst_case_sensitivity_is_twice_lr_clip_for_every_step_of_the_session():
    from node.privacy import worst_case_sensitivity

    # 100 samples in batches of 32: 4 steps an epoch, 5 epochs; each step moves at most lr * clip
    assert worst_case_sensitivity(100, 32, 0.1, 5, 100.0) == pytest.approx(2 * 0.1 * 100.0 * 20)
    assert worst_case_sensitivity(96, 32, 0.05, 1, 2.0) == pytest.approx(2 * 0.05 * 2.0 * 3)


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_worst_case_calibration_is_a_proven_release_and_the_papers_a_heuristic(mechanism):
    import numpy as np

    from node.stages import LocalDP, Privacy
    from node.training import LocalTraining, TrainingResult

    local = LocalTraining(epochs=2, batch_size=10, lr=0.1)
    result = TrainingResult(loss=1.0, lipschitz=3.0, samples_seen=45)
    state = {"w": np.zeros(1000, dtype=np.float32)}
    out = {}
    for calibration in ("paper", "worst_case"):
        privacy = Privacy(mechanism, epsilon=40.0, delta=1e-5, clip=1.0, factor=4.0, calibration=calibration)
        info = {}
        noised, release = LocalDP(privacy).privatize(state, result, local, np.random.default_rng(0), info)
        out[calibration] = (info, release, float(np.std(noised["w"])))
    (paper, p_release, p_std), (worst, w_release, w_std) = out["paper"], out["worst_case"]
    assert p_release.guarantee == "heuristic" and w_release.guarantee == "proven"
    assert w_release.adjacency == "substitution" and w_release.epsilon == p_release.epsilon == 10.0  # epsilon / c_T
    assert worst["sensitivity"] == pytest.approx(2 * 0.1 * 1.0 * 2 * 5)  # 10 steps
    assert worst["sensitivity"] > paper["sensitivity"]
    assert w_std / p_std == pytest.approx(worst["noise_scale"] / paper["noise_scale"], rel=0.1)  # the noise follows


def test_calibration_is_refused_beside_dpsgd_with_the_key():
    from conftest import REPO, run_cli

    res = run_cli("validate", str(REPO / "scenarios" / "dpsgd_mnist.yaml"), "--set", "algorithm.privacy.calibration=worst_case")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "algorithm.privacy.calibration" in line and "dpsgd" in line
