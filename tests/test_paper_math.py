"""The core paper's equations (docs/algorithms.md part 1) against hand-computed values."""
import math

import numpy as np
import pytest
import torch

from node.accounting import analytic_gaussian_sigma
from node.data import by_user_labels, partition_by_user
from node.models import build_model, count_parameters
from node.privacy import (LipschitzEstimate, add_noise, clip_gradients, clip_parts, noise_factor,
                          noise_scale, sensitivity, vector_norm)
from node.schedule import BitSchedule, cosine_bits, importance, label_entropy
from node.training import LocalTraining, train_local
from node.data import Dataset


# ---- Eq. 1.5 / 1.6 ---------------------------------------------------------------------------------
def test_cosine_server_bits_by_hand():
    # t = 0: 8 + 24 * (1 + 1)/2 = 32; t = T/2: 8 + 24 * 1/2 = 20; t = T/3: 8 + 24 * 0.75 = 26
    assert cosine_bits(0, 1000, 8, 32) == 32
    assert cosine_bits(500, 1000, 8, 32) == 20
    assert cosine_bits(1000 // 3, 1000, 8, 32) == round(8 + 24 * (1 + math.cos(math.pi * 333 / 1000)) / 2)
    assert cosine_bits(999, 1000, 8, 32) == 8


def test_cosine_rounds_half_to_even_like_python():
    # b_min=8, b_max=9, t = T/2 gives 8.5 exactly: Python's round gives 8 (even)
    assert cosine_bits(1, 2, 8, 9) == 8
    # b_min=9, b_max=10 gives 9.5 -> 10
    assert cosine_bits(1, 2, 9, 10) == 10


def test_mean_server_bits_over_1000_rounds_is_20_012():
    bits = [cosine_bits(t, 1000, 8, 32) for t in range(1000)]
    assert round(sum(bits) / 1000, 3) == 20.012
    assert round(1 - sum(bits) / 1000 / 32, 4) == 0.3746  # the paper's "Cosine 37.46 %"


def test_client_bits_scale_with_importance():
    # Eq. 1.6 at t = 0 with nu = 0.5: 8 + 24 * 0.5 * 1 = 20
    assert cosine_bits(0, 100, 8, 32, importance=0.5) == 20
    s = BitSchedule("dynamic", 100, 8, 32)
    assert s.client_bits(0, 99, 0.5) == 20 and s.server_bits(0, 99) == 32
    assert BitSchedule("cosine", 100, 8, 32).client_bits(0, 99, 0.5) == 32  # cosine ignores nu
    assert BitSchedule("static", 100).client_bits(5, 16, 0.5) == 16


# ---- Eq. 1.7 ------------------------------------------------------------------------------------
def test_label_entropy_normalised():
    assert label_entropy([3] * 10, 10) == pytest.approx(0.0, abs=1e-9)
    assert label_entropy(list(range(10)), 10) == pytest.approx(1.0)
    # two equally likely labels: 1 bit / log2(10) bits
    assert label_entropy([0, 1] * 5, 10) == pytest.approx(1 / math.log2(10), rel=1e-6)


def test_importance_by_hand():
    # lambda_h = 0.5, two balanced labels (H = 1/log2 10 = 0.30103), n = 50 of n_max = 200
    nu = importance([0, 1] * 25, 10, 50, 200, 0.5)
    assert nu == pytest.approx(0.5 * 0.30103 + 0.5 * 0.25, abs=1e-5)
    assert importance([0, 1] * 25, 10, 50, 200, 1.0) == pytest.approx(0.30103, abs=1e-5)


# ---- Eq. 1.8 ------------------------------------------------------------------------------------
def test_l1_clipping_scales_the_whole_gradient():
    a = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(1))
    a.grad = torch.tensor([3.0, -4.0])
    b.grad = torch.tensor([2.0])  # L1 norm 9
    norm = clip_gradients([a, b], 4.5, 1.0)
    assert norm == pytest.approx(9.0)
    factor = 4.5 / (9.0 + 1e-6)
    assert a.grad.tolist() == pytest.approx([3 * factor, -4 * factor])
    assert b.grad.tolist() == pytest.approx([2 * factor])
    a.grad = torch.tensor([1.0, 1.0])
    b.grad = torch.tensor([1.0])
    clip_gradients([a, b], 100.0, 1.0)  # under the threshold: untouched
    assert a.grad.tolist() == [1.0, 1.0]


def test_l1_norm_of_a_model_sized_gradient_is_accurate():
    """The CNN's 1.66 M-entry gradient: its L1 norm (the clip's, the estimate's) is the float64 sum
    to 1e-6. torch.linalg.vector_norm(g, 1) is off by about 1.6e-4 here."""
    g = torch.randn(1_663_370, generator=torch.Generator().manual_seed(0)) * 3
    exact = float(g.double().abs().sum())
    assert float(vector_norm(g, 1)) == pytest.approx(exact, rel=1e-6)
    flat = g.clone()
    p = torch.nn.Parameter(torch.zeros_like(g))
    p.grad = g.clone()
    assert clip_parts([flat], 1e9, 1.0) == pytest.approx(exact, rel=1e-6)
    assert clip_gradients([p], 1e9, 1.0) == pytest.approx(exact, rel=1e-6)


def test_both_clips_take_the_l1_norm_in_double_precision():
    """clip_gradients and clip_parts (training's, over the step's gradient tensors) clip by the
    float64 L1 norm over all of the CNN's parameters, to 1e-12 (a float32 sum is off by more),
    and by the norm of the flat gradient, however it is cut."""
    from node.models import build_model
    model = build_model("mnist_cnn", (1, 28, 28), 10)
    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 0.01
    exact = sum(float(p.grad.double().abs().sum()) for p in model.parameters())
    flat = _flat_gradient(model.parameters())
    assert clip_parts([flat], 1e9, 1.0) == pytest.approx(exact, rel=1e-12)
    assert clip_parts([p.grad for p in model.parameters()], 1e9, 1.0) == clip_parts([flat], 1e9, 1.0)
    assert clip_gradients(list(model.parameters()), 1e9, 1.0) == pytest.approx(exact, rel=1e-12)


def _flat_gradient(params) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])


def test_l2_clipping_for_the_gaussian_mechanism():
    a = torch.nn.Parameter(torch.zeros(2))
    a.grad = torch.tensor([3.0, 4.0])  # L2 5
    clip_gradients([a], 1.0, 2.0)
    assert float(a.grad.norm()) == pytest.approx(1.0, rel=1e-5)


# ---- Eq. 1.9 ------------------------------------------------------------------------------------
def quadratic_problem(curvature):
    """A one-parameter model with loss 0.5 * c * (w - y)^2 is c-smooth: the gradient differences
    over weight differences are exactly c."""
    class Quad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0]))

        def forward(self, x):
            return self.w.expand(x.shape[0], 1)

    return Quad()


def test_lipschitz_estimate_equals_the_curvature_of_a_quadratic():
    c, lr = 3.0, 0.1
    model = quadratic_problem(c)
    est = LipschitzEstimate(lr)
    targets = [torch.tensor([0.5]), torch.tensor([-0.25])]  # two batches, replayed each epoch
    for _ in range(3):
        for k, y in enumerate(targets):
            model.zero_grad()
            loss = 0.5 * c * ((model(torch.zeros(1, 1)) - y) ** 2).sum()
            loss.backward()
            est.observe(k, _flat_gradient(model.parameters()))
            with torch.no_grad():
                model.w -= lr * model.w.grad
    assert est.value == pytest.approx(c, rel=1e-5)


def test_lipschitz_estimate_matches_the_naive_all_copies_version():
    """Against the authors' way: keep (w, g) for every batch and epoch, then take the max ratio."""
    torch.manual_seed(0)
    data = Dataset(torch.rand(40, 1, 4, 4), torch.randint(0, 3, (40,)), 3)
    model = build_model("mlp", (1, 4, 4), 3)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = LocalTraining(3, 10, 0.1, clip=5.0, clip_norm=1.0, estimate_lipschitz=True, shuffle="once")
    order = np.random.default_rng(1).permutation(40)
    result = train_local(model, data, np.arange(40), cfg, np.random.default_rng(0), order)

    model.load_state_dict(init)
    params = list(model.parameters())
    records = {}
    for e in range(3):
        for k in range(4):
            idx = torch.from_numpy(order[k * 10:(k + 1) * 10])
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(data.x[idx]), data.y[idx]).backward()
            torch.nn.utils.clip_grad_norm_(params, 5.0, norm_type=1)
            records[(e, k)] = (torch.cat([p.detach().reshape(-1) for p in params]).clone(), _flat_gradient(params).clone())
            with torch.no_grad():
                for p in params:
                    p -= 0.1 * p.grad
    naive = max(float((records[(e, k)][1] - records[(e - 1, k)][1]).abs().sum())
                / float((records[(e, k)][0] - records[(e - 1, k)][0]).abs().sum())
                for e in range(1, 3) for k in range(4))
    assert result.lipschitz == pytest.approx(naive, rel=1e-3)
    assert result.lipschitz > 0


# ---- Eq. 1.10 -----------------------------------------------------------------------------------
def test_sensitivity_first_branch_by_hand():
    # lambda = 1, lr = 0.1, n = 100: E_0 = ln 101 / ln 1.1 = 48.42; E = 5 < E_0
    # Xi = (2 * 100 / (1 * 100)) * (1.1^5 - 1) = 2 * 0.61051 = 1.22102
    assert sensitivity(100, 1.0, 0.1, 5, 100.0) == pytest.approx(1.22102, rel=1e-6)


def test_sensitivity_second_branch_by_hand():
    # lambda = 100, lr = 0.1, n = 10: E_0 = ln 11 / ln 11 = 1; E = 5 >= E_0
    # Xi = 2 * 100 + 2 * 0.1 * 100 * (5 - 1) = 280
    assert sensitivity(10, 100.0, 0.1, 5, 100.0) == pytest.approx(280.0)


def test_sensitivity_zero_lipschitz_branch():
    assert sensitivity(50, 0.0, 0.1, 5, 100.0) == pytest.approx(2 * 100 * 0.1 * 5 / 50)


def test_sensitivity_jumps_at_e0_as_written():
    # E exactly E_0 takes the second branch: 2 xi; just below it the first gives 2 xi / lambda
    lam, lr, n, xi = 2.0, 0.5, 3, 1.0  # E_0 = ln 4 / ln 2 = 2
    assert sensitivity(n, lam, lr, 2, xi) == pytest.approx(2 * xi)
    below = (2 * xi / (lam * n)) * ((1 + lam * lr) ** 2 - 1)
    assert below == pytest.approx(2 * xi / lam)  # = 1.0, not 2.0: the discontinuity the spec notes


# ---- Eq. 1.11 -----------------------------------------------------------------------------------
def test_noise_factor_options():
    assert noise_factor("code", 1000, 5, 10, 100) == pytest.approx(20.0)
    assert noise_factor("paper", 1000, 5, 10, 100) == pytest.approx(100.0)
    assert noise_scale("laplace", 2.0, 20.0, 1e4) == pytest.approx(2.0 * 20 / 1e4)
    # the analytic Gaussian mechanism at (eps / c_T, delta), not the classic sqrt(2 ln(1.25/delta)) bound
    assert noise_scale("gaussian", 2.0, 20.0, 1e4, 1e-5) == pytest.approx(analytic_gaussian_sigma(1e4 / 20, 1e-5, 2.0))


def test_laplace_noise_has_the_scale_beta():
    beta = 0.37
    state = {"w": np.zeros((400, 500), np.float32), "count": np.array(7, np.int64)}
    noisy = add_noise(state, "laplace", beta, np.random.default_rng(11))
    x = noisy["w"].astype(np.float64).ravel()
    # Laplace(0, beta): E|x| = beta, Var|x| = beta^2, so the mean of |x| over n draws has sd beta/sqrt(n)
    n = x.size
    assert abs(np.abs(x).mean() - beta) < 4 * beta / math.sqrt(n)
    assert abs(x.mean()) < 4 * math.sqrt(2) * beta / math.sqrt(n)
    # its shape: P(|x| > beta ln 2) = 1/2 and P(x < 0) = 1/2 (binomial sd 0.5/sqrt(n)); Laplace's
    # P(|x| > 3 beta) = e^-3
    assert abs(np.mean(np.abs(x) > beta * math.log(2)) - 0.5) < 4 * 0.5 / math.sqrt(n)
    assert abs(np.mean(x < 0) - 0.5) < 4 * 0.5 / math.sqrt(n)
    tail = math.exp(-3)
    assert abs(np.mean(np.abs(x) > 3 * beta) - tail) < 4 * math.sqrt(tail * (1 - tail) / n)
    assert noisy["count"] == 7 and noisy["count"].dtype == np.int64  # counters untouched
    assert noisy["w"].dtype == np.float32


# ---- data and models ----------------------------------------------------------------------------
def test_vgg7_has_325002_trainable_parameters_and_runs():
    model = build_model("vgg7", (3, 32, 32), 10)
    assert count_parameters(model) == 325_002
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_by_user_labels_cover_each_digit_200_times():
    pairs = by_user_labels(1000, 10)
    assert all(a != b for a, b in pairs)
    counts = np.bincount([c for p in pairs for c in p], minlength=10)
    assert counts.tolist() == [200] * 10


def test_partition_by_user_merges_round_robin():
    labels = np.repeat(np.arange(10), 500)
    users = partition_by_user(labels, 1000, users=1000, seed=3)
    assert all(np.unique(labels[u]).size == 2 for u in users)
    assert sum(u.size for u in users) == labels.size
    merged = partition_by_user(labels, 10, users=1000, seed=3)
    for j in range(10):
        assert np.array_equal(merged[j], np.sort(np.concatenate([users[u] for u in range(j, 1000, 10)])))
    assert [m.size for m in partition_by_user(labels, 10, users=1000, seed=3)] == [m.size for m in merged]


# ---- FedProx --------------------------------------------------------------------------------------
def test_proximal_term_by_hand_and_its_pull():
    from node.training import proximal_term

    w = [torch.nn.Parameter(torch.tensor([1.0, 2.0])), torch.nn.Parameter(torch.tensor([3.0]))]
    anchor = [torch.tensor([0.0, 0.0]), torch.tensor([1.0])]
    # (0.1 / 2) * (1 + 4 + 4) = 0.45
    assert float(proximal_term(w, anchor, 0.1).detach()) == pytest.approx(0.45)

    torch.manual_seed(0)
    data = Dataset(torch.rand(64, 1, 4, 4), torch.randint(0, 3, (64,)), 3)

    def drift(mu):
        model = build_model("mlp", (1, 4, 4), 3)
        start = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
        train_local(model, data, np.arange(64), LocalTraining(5, 8, 0.5, prox_mu=mu), np.random.default_rng(0))
        return float((torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start).norm())

    plain, prox = drift(0.0), drift(1.0)
    assert prox < 0.8 * plain  # the proximal term keeps local weights nearer the global model


@pytest.mark.parametrize("compiled", [True, False])
def test_one_pass_l1_norms_sum_in_double_precision(monkeypatch, compiled):
    """node/_dpkernels.c (and the torch float64 fallback without it) against a float64 sum done
    by numpy, on lengths that are and are not multiples of the kernel's 8 accumulators."""
    from node import privacy

    if compiled and privacy._dpkernels is None:
        pytest.skip("node/_dpkernels.c is not built here")
    if not compiled:
        monkeypatch.setattr(privacy, "_dpkernels", None)
    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 8, 9, 1000, 1_663_370):
        x = torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 3)
        want = float(np.abs(x.numpy().astype(np.float64)).sum())
        assert privacy.l1_norm(x) == pytest.approx(want, rel=1e-13, abs=1e-300), n


def test_the_fused_lipschitz_update_equals_torchs_passes(monkeypatch):
    """observe's one-pass update writes the same float32 window as torch.sub and +=, bit for bit,
    leaves the previous gradient alone, and its two norms agree with the float64 reductions to 1e-13."""
    from node import privacy

    if privacy._dpkernels is None:
        pytest.skip("node/_dpkernels.c is not built here")
    rng = np.random.default_rng(6)
    for n in (13, 1_663_370):
        grad, prev, window = (torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for _ in range(3))
        want_window_l1 = float(window.double().abs().sum())
        want_diff = grad - prev
        want_window = window + want_diff
        p, w = prev.clone(), window.clone()
        window_l1, diff_l1 = privacy._dpkernels.lipschitz_update([grad.numpy()], [p.numpy()], [w.numpy()])
        assert torch.equal(p, prev) and torch.equal(w, want_window)
        assert window_l1 == pytest.approx(want_window_l1, rel=1e-13)
        assert diff_l1 == pytest.approx(float(want_diff.double().abs().sum()), rel=1e-13)
    with pytest.raises(ValueError):
        privacy._dpkernels.lipschitz_update([np.zeros(3, np.float32)], [np.zeros(4, np.float32)], [np.zeros(3, np.float32)])
    with pytest.raises(TypeError):
        privacy._dpkernels.l1_norm([np.zeros(3, np.float64)])
    # the estimate over a session is the same with the kernel and with torch's passes
    values = {}
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(privacy, "_dpkernels", None)
        estimate = privacy.LipschitzEstimate(0.1)
        gen = np.random.default_rng(7)
        for _epoch in range(3):
            for position in range(4):
                estimate.observe(position, torch.from_numpy(gen.standard_normal(5000).astype(np.float32)))
        values[compiled] = estimate.value
    assert values[True] == pytest.approx(values[False], rel=1e-13) and values[True] > 0


@pytest.mark.parametrize("compiled", [True, False])
def test_norms_and_estimate_do_not_depend_on_how_the_gradient_is_cut(monkeypatch, compiled):
    """Training hands the clip and the Lipschitz estimate the step's gradient as its parameters'
    tensors. Cut anywhere, the vector gives the flat vector's norms (bit for bit with the kernel,
    whose 8 accumulators follow each entry's place in the whole; to 1e-13 with torch's passes),
    the same differences and window, and the same estimate."""
    from node import privacy

    if compiled and privacy._dpkernels is None:
        pytest.skip("node/_dpkernels.c is not built here")
    if not compiled:
        monkeypatch.setattr(privacy, "_dpkernels", None)
    gen = np.random.default_rng(8)
    n = 1_663_370
    cuts = [0, 3, 800, 803, 52_003, 52_067, 1_658_000, 1_658_512, 1_663_360, n]  # the CNN's, and odd ones
    same = (lambda a, b: a == b) if compiled else (lambda a, b: a == pytest.approx(b, rel=1e-13))

    def cut(t):
        return [t[a:b] for a, b in zip(cuts, cuts[1:])]

    vectors = [torch.from_numpy(gen.standard_normal(n).astype(np.float32)) for _ in range(6)]
    assert same(privacy.l1_norm(cut(vectors[0])), privacy.l1_norm(vectors[0]))
    whole, parts = LipschitzEstimate(0.1), LipschitzEstimate(0.1)
    for step, v in enumerate(vectors):
        whole.observe(step % 3, v.clone())
        parts.observe(step % 3, cut(v.clone()))
    assert same(parts.value, whole.value) and whole.value > 0
    for position in range(3):
        assert torch.equal(torch.cat(parts.previous[position]), whole.previous[position][0])
    assert torch.equal(torch.cat(parts.window), whole.window[0])


def test_the_fused_laplace_noise_is_numpys_bit_for_bit(monkeypatch):
    """add_noise's one-pass draw, sign, scale and sum (node/_dpkernels.c) gives the bits of the numpy
    path from the same generator, on shapes whose sizes are and are not multiples of 8, on
    weights that include -0.0, and leaves non-float32 entries to the numpy path."""
    from node import privacy

    if privacy._dpkernels is None:
        pytest.skip("node/_dpkernels.c is not built here")
    rng = np.random.default_rng(7)
    state = {"conv": rng.standard_normal((64, 32, 5, 5)).astype(np.float32), "bias": rng.standard_normal(13).astype(np.float32),
             "zeros": np.array([0.0, -0.0, 0.0], np.float32), "double": rng.standard_normal(9),
             "count": np.array(3, np.int64)}
    fused = privacy.add_noise(state, "laplace", 0.37, np.random.default_rng(21))
    monkeypatch.setattr(privacy, "_dpkernels", None)
    plain = privacy.add_noise(state, "laplace", 0.37, np.random.default_rng(21))
    for name in state:
        assert fused[name].dtype == plain[name].dtype, name
        assert fused[name].tobytes() == plain[name].tobytes(), name
    assert not np.array_equal(fused["conv"], state["conv"])
    monkeypatch.undo()
    with pytest.raises(ValueError, match="sizes do not agree"):  # 9 values need 9 words of 32 bits, not 8
        privacy._dpkernels.laplace_from_bits(np.zeros(4, np.uint64), 1.0, np.zeros(9, np.float32), np.zeros(9, np.float32))


def test_laplace_draws_from_words_by_hand_and_against_float64():
    """Word w: sign from the top bit, u = (k + 0.5) 2^-31 from the other 31, magnitude -log u. By
    hand: k = 0 is the largest draw, 32 ln 2 (u = 2^-32); k = 2^30 is u = 0.5 + 2^-32, about ln 2;
    the top bit negates. Against float64's log over 2 M random words: within 4e-7 relative."""
    from node import privacy

    words = np.array([0, 0x80000000, 2**30, 0x80000000 | 2**30, 0x7FFFFFFF], np.uint32)
    x = privacy.laplace_from_words(words, words.size).astype(np.float64)
    assert x[0] == pytest.approx(32 * math.log(2), rel=1e-7) and x[1] == -x[0]
    assert x[2] == pytest.approx(math.log(2), rel=1e-6) and x[3] == -x[2]
    assert x[4] == 0.0  # k = 2^31 - 1 rounds to u = 1 in float32
    w = np.random.default_rng(3).integers(0, 2**32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    x = privacy.laplace_from_words(w, w.size).astype(np.float64)
    u = ((w & 0x7FFFFFFF).astype(np.int32).astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-31)
    exact = -np.log(u.astype(np.float64)) * np.where(w >> 31, -1.0, 1.0)
    assert np.all(np.abs(x - exact) <= 4e-7 * np.abs(exact))
    # Laplace(0, 1) in shape (Kolmogorov-Smirnov at the 1 % level) and far into the tail:
    # P(|x| > 10) = e^-10, 90.8 expected of 2 M (sd 9.5)
    ordered = np.sort(x)
    cdf = np.where(ordered < 0, 0.5 * np.exp(np.minimum(ordered, 0)), 1 - 0.5 * np.exp(-np.maximum(ordered, 0)))
    n = ordered.size
    ks = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert ks < 1.63 / math.sqrt(n)
    assert abs(np.sum(np.abs(x) > 10) - 2e6 * math.exp(-10)) < 4 * math.sqrt(2e6 * math.exp(-10))
    # the generator's words: half a 64-bit word per draw, drawn in order
    rng, again = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(privacy.standard_laplace((3, 3), rng).ravel(),
                          privacy.laplace_from_words(again.bit_generator.random_raw(5).view("<u4"), 9))
