"""FedAlign's pure math (docs/algorithms.md part 3) against hand-computed values."""
import math

import numpy as np
import pytest

from node import fedalign


def test_moments_by_hand():
    m = fedalign.moments(np.array([1.0, 2.0, 3.0, 4.0]).reshape(4, 1, 1, 1))
    assert m["mean"].tolist() == [2.5] and m["var"].tolist() == [1.25]
    assert m["skew"][0] == pytest.approx(0.0, abs=1e-12)
    assert m["kurt"][0] == pytest.approx(1.64)  # (2 x 1.5^4 + 2 x 0.5^4) / 4 / 1.25^2
    m = fedalign.moments(np.array([0.0, 0.0, 0.0, 1.0]).reshape(4, 1, 1, 1))
    assert m["mean"][0] == 0.25 and m["var"][0] == 0.1875
    assert m["skew"][0] == pytest.approx(2 / math.sqrt(3))  # 1.1547
    assert m["kurt"][0] == pytest.approx(7 / 3)


def test_moments_per_channel_and_per_dimension():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 3, 2, 2)) * np.array([1, 2, 3]).reshape(1, 3, 1, 1) + np.array([0, 5, -5]).reshape(1, 3, 1, 1)
    m = fedalign.moments(x, "channel")
    assert m["mean"].shape == (3,) and np.allclose(m["mean"], [0, 5, -5], atol=0.2)
    assert np.allclose(m["var"], [1, 4, 9], rtol=0.1)
    d = fedalign.moments(x, "dimension")
    assert d["mean"].shape == (12,)
    assert d["mean"][4] == pytest.approx(x[:, 1, 0, 0].mean())


def test_gaussian_noise_scale_of_the_update_is_the_analytic_mechanism():
    # sensitivity 2C = 2 at (1, 1e-5): Balle & Wang's sigma 3.7306 per unit sensitivity, not the
    # classic sqrt(8 ln(1.25e5)) = 9.69 (loose here and not DP at all for epsilon > 1)
    assert fedalign.update_noise_scale(1.0, 1.0, 1e-5) == pytest.approx(2 * 3.73063, rel=1e-5)
    assert fedalign.update_noise_scale(2.0, 1.0, 1e-5) == pytest.approx(2 * fedalign.update_noise_scale(1.0, 1.0, 1e-5))
    assert fedalign.update_noise_scale(1.0, 1e4, 1e-5) > 10 * math.sqrt(8 * math.log(1.25e5)) / 1e4


def test_raw_moments_of_clamped_inputs_by_hand():
    x = np.array([-1.0, 0.5, 1.0, 2.0]).reshape(4, 1, 1, 1)  # clamped to [0, 1]: 0, 0.5, 1, 1
    raw = fedalign.raw_moments(x, "channel", 4, 0.0, 1.0)
    assert raw["m1"].tolist() == [0.625] and raw["m2"].tolist() == [0.5625]
    assert raw["m3"].tolist() == [pytest.approx(2.125 / 4)] and raw["m4"].tolist() == [pytest.approx(2.0625 / 4)]
    assert fedalign.raw_moment_ranges(0.0, 1.0, 4) == [1.0, 1.0, 1.0, 1.0]
    assert fedalign.raw_moment_ranges(-1.0, 2.0, 3) == [3.0, 4.0, 9.0]  # x^2 on [-1, 2] spans [0, 4]
    central = fedalign.central_moments(fedalign.raw_moments(np.array([1.0, 2, 3, 4]).reshape(4, 1, 1, 1), "channel", 4, 0, 10), 10)
    assert central["mean"][0] == pytest.approx(2.5) and central["var"][0] == pytest.approx(1.25)
    assert central["skew"][0] == pytest.approx(0.0, abs=1e-9) and central["kurt"][0] == pytest.approx(1.64)


def test_statistics_sensitivity_is_the_whole_vectors_and_one_mechanism_covers_it():
    # one of 100 inputs replaced: each of 2 moments x 3 channels moves by at most R_k / 100
    assert fedalign.stat_sensitivity(100, 3, 2) == pytest.approx(math.sqrt(6) / 100)
    # the worst case reaches that bound: a black image replaced by a white one moves every channel's m1 and m2 by 1/n
    x = np.zeros((100, 3, 2, 2))
    y = x.copy()
    y[0] = 1.0
    a, b = (fedalign.raw_moments(v, "channel", 2, 0.0, 1.0) for v in (x, y))
    moved = math.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in a))
    assert moved == pytest.approx(fedalign.stat_sensitivity(100, 3, 2))
    big = {"m1": np.zeros(20000), "m2": np.zeros(20000)}
    out = fedalign.privatize_moments(big, [1.0, 4.0], 100, 1.0, 1e-5, np.random.default_rng(1))
    sens = fedalign.stat_sensitivity(100, 20000, 2)
    assert out.sensitivity == sens and out.sigma == pytest.approx(3.73063 * sens, rel=1e-5)
    assert out.raw["m1"].std() == pytest.approx(out.sigma, rel=0.03)
    assert out.raw["m2"].std() == pytest.approx(4 * out.sigma, rel=0.03)  # in units of R_2
    assert fedalign.privatize_moments(big, [1.0, 4.0], 100, None, 1e-5, np.random.default_rng(1)).sigma == 0.0


def test_skewness_and_kurtosis_from_noised_moments_are_clamped():
    central = fedalign.central_moments({"m1": np.array([0.0]), "m2": np.array([1e-9]), "m3": np.array([1.0]),
                                        "m4": np.array([1.0])}, 10.0)
    assert central["var"][0] == fedalign.VAR_FLOOR and central["skew"][0] == 10.0 and central["kurt"][0] == 10.0


def test_aggregate_weighted_by_samples_with_variance_floor():
    a = {"mean": np.array([1.0]), "var": np.array([0.5]), "skew": np.array([0.0]), "kurt": np.array([3.0])}
    b = {"mean": np.array([3.0]), "var": np.array([-2.0]), "skew": np.array([1.0]), "kurt": np.array([5.0])}
    g = fedalign.aggregate_moments([(a, 1.0), (b, 3.0)])
    assert g["mean"][0] == pytest.approx(2.5) and g["skew"][0] == pytest.approx(0.75) and g["kurt"][0] == pytest.approx(4.5)
    assert g["var"][0] == pytest.approx(fedalign.VAR_FLOOR)  # (0.5 - 6) / 4 < 0


def test_align_gives_the_target_mean_and_variance_per_channel():
    rng = np.random.default_rng(2)
    x = rng.gamma(2.0, size=(400, 3, 4, 4))
    target = {"mean": np.array([0.1, 0.2, 0.3]), "var": np.array([0.04, 0.09, 0.01]),
              "skew": np.zeros(3), "kurt": np.full(3, 3.0)}
    m = fedalign.moments(fedalign.align(x, target, "channel"), "channel")
    assert np.allclose(m["mean"], target["mean"], atol=1e-5) and np.allclose(m["var"], target["var"], rtol=1e-4)
    # The higher-moment step (first-order Cornish-Fisher) moves a mild skewness toward the target's and
    # keeps mean and variance. It is a small-correction formula: on gamma(2) data (skew 1.4) it overshoots.
    z = rng.normal(size=(4000, 3, 4, 4))
    x = z + np.array([0.03, 0.05, 0.08]).reshape(1, 3, 1, 1) * (z**2 - 1)  # skewness 0.17, 0.28, 0.48
    before = fedalign.moments(x, "channel")["skew"]
    h = fedalign.moments(fedalign.align(x, target, "channel", higher=True), "channel")
    assert (np.abs(h["skew"]) < 0.25 * np.abs(before)).all()
    assert np.allclose(h["mean"], target["mean"], atol=1e-5) and np.allclose(h["var"], target["var"], rtol=1e-4)


def test_private_update_clips_and_noises_the_pseudo_gradient():
    before = {"w": np.zeros(4, np.float32), "n": np.array(3, dtype=np.int64)}
    after = {"w": np.array([-0.3, -0.4, 0.0, 0.0], np.float32), "n": np.array(5, dtype=np.int64)}
    # step = eta_l tau = 0.1: g = (before - after) / 0.1 = (3, 4, 0, 0), norm 5, clipped to 1
    up = fedalign.private_update(before, after, 0.1, 1.0, None, 1e-5, np.random.default_rng(0))
    assert up.norm == pytest.approx(5.0)
    assert np.allclose(up.delta["w"], [-0.06, -0.08, 0, 0])  # -(0.1) (0.6, 0.8, 0, 0)
    assert up.delta["n"] == 0 and up.noise_scale == 0.0
    unclipped = fedalign.private_update(before, after, 0.1, None, None, 1e-5, np.random.default_rng(0))
    assert np.allclose(unclipped.delta["w"], after["w"])  # without clip or noise: the model change itself
    big_before, big_after = {"w": np.zeros(50000, np.float32)}, {"w": np.zeros(50000, np.float32)}
    noisy = fedalign.private_update(big_before, big_after, 0.1, 1.0, 100.0, 1e-5, np.random.default_rng(1))
    sigma = fedalign.update_noise_scale(1.0, 100.0, 1e-5)
    assert noisy.noise_scale == pytest.approx(sigma)
    assert noisy.delta["w"].std() == pytest.approx(0.1 * sigma, rel=0.02)


def test_split_round():
    cfg = fedalign.FedAlignConfig(sample_fraction=0.8, rho=0.5)
    sampled, unsampled = fedalign.split_round(np.arange(100), cfg, np.random.default_rng(0))
    assert sampled.size == 80 and unsampled.size == 10
    assert not set(sampled) & set(unsampled)


def test_feature_noise_is_fixed_per_client_and_grows_with_the_index(tmp_path):
    import torch

    from conftest import write_scenario
    from emulator.scenario import load_scenario
    from emulator.world import build_world
    from node.data import Dataset, with_input_noise

    base = Dataset(torch.zeros((3000, 1, 4, 4), dtype=torch.uint8), torch.zeros(3000, dtype=torch.long), 10)
    idx = np.arange(100, 2100)
    noisy, own = with_input_noise(base, idx, 0.2, [1, 2])
    assert own.tolist() == list(range(2000)) and noisy.x.dtype == torch.float32
    assert float(noisy.x.std()) == pytest.approx(0.2, rel=0.02)  # clean inputs are 0 here
    again, _ = with_input_noise(base, idx, 0.2, [1, 2])
    assert torch.equal(noisy.x, again.x)  # drawn once, the same every epoch and run
    assert with_input_noise(base, idx, 0.0, [1, 2]) == (base, idx)  # no noise: the shared data, untouched
    text = """
rounds: 1
task: {dataset: synthetic, model: mlp, feature_noise: 0.1}
population: {clients: 4, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}
"""
    sc, _ = load_scenario(write_scenario(tmp_path / "s.yaml", text))
    assert [c.profile.input_noise for c in build_world(sc).clients] == pytest.approx([0.025, 0.05, 0.075, 0.1])
