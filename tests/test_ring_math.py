"""The FIRMA ring family's pure math (docs/algorithms.md part 2) against hand-computed values."""
import itertools
import math

import numpy as np
import pytest

from node import firma
from node.data import partition_dirichlet_floor, partition_label_skew


def test_fibonacci_weights():
    assert firma.ALPHA == pytest.approx(0.6180339887, abs=1e-10)
    assert firma.BETA == pytest.approx(0.3819660113, abs=1e-10)
    assert firma.ALPHA + firma.BETA == pytest.approx(1.0, abs=1e-15)
    assert firma.neighbour_weights(0.1, 0.9, gated=False) == (firma.ALPHA, firma.BETA)  # FibFL ignores accuracy


def test_gate_both_pass_mixes_prior_and_posterior():
    # w_L = 0.8 / 1.2 = 2/3, w_R = 1/3; a_L = alpha/2 + 1/3, a_R = beta/2 + 1/6
    a_l, a_r = firma.neighbour_weights(0.8, 0.4, gated=True, tau=0.35)
    assert a_l == pytest.approx(0.3090169944 + 1 / 3, abs=1e-9)
    assert a_r == pytest.approx(0.1909830056 + 1 / 6, abs=1e-9)
    assert a_l + a_r == pytest.approx(1.0)


def test_gate_partial_suppression_when_only_one_neighbour_passes():
    a_l, a_r = firma.neighbour_weights(0.9, 0.2, gated=True, tau=0.35)
    assert a_l == pytest.approx((firma.ALPHA + 1) / 2) and a_l == pytest.approx(0.809017, abs=1e-6)
    assert a_r == pytest.approx(firma.BETA / 2) and a_r == pytest.approx(0.190983, abs=1e-6)  # keeps half its prior
    a_l, a_r = firma.neighbour_weights(0.2, 0.5, gated=True, tau=0.35)
    assert (a_l, a_r) == pytest.approx((firma.ALPHA / 2, firma.BETA / 2 + 0.5))


def test_gate_both_fail_keeps_own_and_threshold_is_inclusive():
    assert firma.neighbour_weights(0.3, 0.34, gated=True, tau=0.35) is None
    assert firma.neighbour_weights(0.35, 0.0, gated=True, tau=0.35) == pytest.approx(((firma.ALPHA + 1) / 2, firma.BETA / 2))


def test_lost_neighbour_is_left_out():
    assert firma.neighbour_weights(None, 0.9, gated=True) == (0.0, 1.0)
    assert firma.neighbour_weights(0.9, None, gated=False) == (1.0, 0.0)
    assert firma.neighbour_weights(None, 0.1, gated=True) is None  # the one left fails the gate
    assert firma.neighbour_weights(None, None, gated=False) is None


def test_blend_by_hand():
    own, left, right = {"w": np.array([1.0])}, {"w": np.array([2.0])}, {"w": np.array([4.0])}
    out = firma.blend(own, left, right, (firma.ALPHA, firma.BETA), 0.5)
    assert out["w"][0] == pytest.approx(0.5 + 0.5 * (2 * firma.ALPHA + 4 * firma.BETA))
    assert out["w"][0] == pytest.approx(1.881966, abs=1e-6)
    assert firma.blend(own, left, right, None, 0.5)["w"][0] == 1.0


def test_warmup_length_and_passes():
    assert [firma.warmup_rounds(r, "fibfl++") for r in (1, 5, 6, 12, 20, 30)] == [1, 1, 1, 2, 3, 5]
    assert firma.warmup_rounds(20, "fibfl") == firma.warmup_rounds(20, "fibfl+") == 0
    assert [firma.passes(n, "fibfl++") for n in (3, 6, 7, 10)] == [2, 3, 4, 5]
    assert firma.passes(10, "fibfl") == firma.passes(10, "fibfl+") == 1


def test_cosine_retention_schedule():
    # R = 20: W = 3, R_eff = 16; gamma is 0.4 at the first main round, 0.05 at the last, 0.225 half way
    assert firma.retention(3, 20, "fibfl++") == pytest.approx(0.4)
    assert firma.retention(11, 20, "fibfl++") == pytest.approx(0.225)
    assert firma.retention(19, 20, "fibfl++") == pytest.approx(0.05)
    assert firma.retention(7, 20, "fibfl++") == pytest.approx(0.05 + 0.175 * (1 + math.cos(math.pi / 4)))
    assert firma.retention(11, 20, "fibfl+") == 0.5 == firma.retention(0, 20, "fibfl")


def test_retention_per_pass_multiplies_to_the_round_value():
    gamma_in = firma.per_pass_retention(0.4, 5)
    assert gamma_in == pytest.approx(0.4 ** 0.2) and gamma_in == pytest.approx(0.832553, abs=1e-6)
    assert gamma_in ** 5 == pytest.approx(0.4)


def test_mixing_matrix_properties_of_fibfl_pp():
    n, gamma_r = 10, 0.4
    acc = np.linspace(0.4, 0.9, n)
    m = firma.mixing_matrix(n, list(range(n)), acc, "fibfl++", gamma_r)
    assert np.allclose(m.sum(axis=1), 1.0)  # row-stochastic
    assert not np.allclose(m.sum(axis=0), 1.0)  # not doubly stochastic
    assert (np.diag(m) > gamma_r).all() and (np.diag(m) < 0.5).all()  # weight comes back along two-hop paths
    assert (m > 0).all()  # K = ceil(N/2) passes reach everyone (Proposition 2)
    one = firma.mixing_matrix(n, list(range(n)), acc, "fibfl+", 0.5)
    assert (one == 0).sum() == n * (n - 3)  # one pass: self and two neighbours only


def test_ring_cost_and_two_opt_on_a_known_optimum():
    # two clients of class 0 and two of class 1: the identity ring puts like next to like (cost 2),
    # alternating them costs 0, which is optimal
    q = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    assert firma.ring_cost([0, 1, 2, 3], q) == 2.0
    order = firma.two_opt(q)
    assert order == [0, 2, 1, 3]
    assert firma.ring_cost(order, q) == 0.0


def test_two_opt_reaches_the_brute_force_optimum_on_a_small_instance():
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.full(4, 0.3), size=6)
    order = firma.two_opt(q)
    assert sorted(order) == list(range(6)) and order[0] == 0
    best = min(firma.ring_cost((0, *p), q) for p in itertools.permutations(range(1, 6)))
    assert firma.ring_cost(order, q) <= firma.ring_cost(list(range(6)), q)
    assert firma.ring_cost(order, q) == pytest.approx(best, abs=1e-9)


def test_class_proportions():
    q = firma.class_proportions([np.array([0, 0, 1, 2]), np.array([2, 2])], 3)
    assert q.tolist() == [[0.5, 0.25, 0.25], [0.0, 0.0, 1.0]]


def test_label_skew_partition_by_hand():
    labels = np.repeat(np.arange(10), 100)  # n = 1000, N = 10: B = 100 -> 55 / 20 / 3 per class
    shards = partition_label_skew(labels, 10, 1, np.random.default_rng(42))
    counts = [np.bincount(labels[s], minlength=10) for s in shards]
    assert counts[0].tolist() == [55, 20, 20, 3, 3, 3, 3, 3, 3, 3]  # primary 0, secondary 1 and 2
    assert counts[1].tolist() == [3, 55, 20, 20, 3, 3, 3, 3, 3, 3]
    # classes run dry for the last client: of class 0, 55 (c0) + 7 x 3 (c1..c7) + 20 (c8) = 96 are taken, so
    # it gets 4 of 20 wanted; of its primary class 9, 7 x 3 (c0..c6) + 20 (c7) + 20 (c8) = 61, so 39 of 55
    assert counts[9][0] == 4 and counts[9][9] == 39
    all_idx = np.concatenate(shards)
    assert np.unique(all_idx).size == all_idx.size  # no sample given twice


def test_label_skew_two_primary_classes():
    labels = np.repeat(np.arange(10), 1000)
    shards = partition_label_skew(labels, 10, 2, np.random.default_rng(1))
    c0 = np.bincount(labels[shards[0]], minlength=10)
    # B = 1000: primary 0, 1 (550 each); secondary 2, 3, 4 (200 each); 30 of the rest
    assert c0.tolist() == [550, 550, 200, 200, 200, 30, 30, 30, 30, 30]


def test_dirichlet_floor_gives_the_remainder_to_the_last_client():
    labels = np.repeat(np.arange(3), 101)
    shards = partition_dirichlet_floor(labels, 4, 0.5, np.random.default_rng(7))
    assert sum(s.size for s in shards) == labels.size
    assert np.unique(np.concatenate(shards)).size == labels.size
