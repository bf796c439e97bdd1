"""The pure math of the FIRMA ring family (docs/algorithms.md part 2): Fibonacci neighbour weights,
the accuracy gate, the gossip blend, the cosine retention schedule, 2-opt ring ordering.

Nothing here knows about actors or sockets; the ring client (node/ring.py) calls these."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

PHI = (1 + math.sqrt(5)) / 2
ALPHA = 1 / PHI  # left neighbour's Fibonacci weight
BETA = 1 / PHI**2  # right neighbour's; ALPHA + BETA = 1


def passes(clients: int, variant: str) -> int:
    """K: one gossip pass per round for FibFL and FibFL+, ceil(N/2) for FibFL++ (Fix B)."""
    return max(1, math.ceil(clients / 2)) if variant == "fibfl++" else 1


def warmup_rounds(rounds: int, variant: str) -> int:
    """W of Eq. 2.12: max(1, floor(R/6)) FedAvg warm-up rounds for FibFL++, none otherwise."""
    return max(1, rounds // 6) if variant == "fibfl++" else 0


def retention(round_index: int, rounds: int, variant: str, gamma: float = 0.5,
              gamma_start: float = 0.4, gamma_end: float = 0.05) -> float:
    """gamma_r: constant for FibFL and FibFL+, cosine-annealed over the main rounds for FibFL++ (Eq. 2.13)."""
    if variant != "fibfl++":
        return gamma
    w = warmup_rounds(rounds, variant)
    r_eff = round_index - w
    r_total = max(rounds - w - 1, 1)
    return gamma_end + 0.5 * (gamma_start - gamma_end) * (1 + math.cos(math.pi * r_eff / r_total))


def per_pass_retention(gamma_r: float, k: int) -> float:
    """Eq. 2.11: gamma_in = gamma_r^(1/K), so the direct self-path over K passes keeps gamma_r."""
    return gamma_r ** (1.0 / k)


def neighbour_weights(acc_left: float | None, acc_right: float | None, gated: bool,
                      tau: float = 0.35) -> tuple[float, float] | None:
    """(a_L, a_R) of the blend, summing to 1, or None to keep the own parameters.

    Ungated (FibFL) they are the Fibonacci prior (1/phi, 1/phi^2). Gated (FibFL+, FibFL++),
    Eqs. 2.5-2.8: accuracies under tau count as 0; if both fail the client keeps its own; otherwise
    half the prior plus half the accuracy posterior, so a failing neighbour keeps half its prior.

    A neighbour whose message never came (None: its process died) is left out and the other's
    weight renormalised to 1; with neither, the client keeps its own. That rule is ours: the
    paper's simulation never loses a neighbour."""
    if gated:
        g_l = acc_left if acc_left is not None and acc_left >= tau else 0.0
        g_r = acc_right if acc_right is not None and acc_right >= tau else 0.0
        if g_l + g_r < 1e-9:
            return None
        w_l, w_r = 0.5 * ALPHA + 0.5 * g_l / (g_l + g_r), 0.5 * BETA + 0.5 * g_r / (g_l + g_r)
    else:
        w_l, w_r = ALPHA, BETA
    if acc_left is None and acc_right is None:
        return None
    if acc_left is None:
        return 0.0, 1.0
    if acc_right is None:
        return 1.0, 0.0
    return w_l, w_r


def blend(own: Mapping[str, np.ndarray], left: Mapping[str, np.ndarray] | None, right: Mapping[str, np.ndarray] | None,
          weights: tuple[float, float] | None, gamma_in: float) -> dict[str, np.ndarray]:
    """Eq. 2.9: theta <- gamma_in theta + (1 - gamma_in)(a_L theta_L + a_R theta_R)."""
    if weights is None:
        return {k: np.array(v, copy=True) for k, v in own.items()}
    w_l, w_r = weights
    out = {}
    for k, v in own.items():
        mixed = np.zeros_like(v, dtype=np.float64)
        if w_l:
            mixed += w_l * left[k]
        if w_r:
            mixed += w_r * right[k]
        out[k] = (gamma_in * v + (1 - gamma_in) * mixed).astype(v.dtype)
    return out


def ring_cost(order: Sequence[int], proportions: np.ndarray) -> float:
    """Eq. 2.10: the sum over ring edges of the dot product of the neighbours' class proportions."""
    n = len(order)
    return float(sum(proportions[order[p]] @ proportions[order[(p + 1) % n]] for p in range(n)))


def two_opt(proportions: np.ndarray) -> list[int]:
    """Fix A: first-improvement 2-opt from the identity, reversing order[i+1..j], minimising Eq. 2.10
    (neighbours with unlike label mixes sit next to each other)."""
    n = proportions.shape[0]
    order = list(range(n))
    cost = ring_cost(order, proportions)
    improved = True
    while improved:
        improved = False
        for i in range(n - 1):
            for j in range(i + 2, n):
                if i == 0 and j == n - 1:
                    continue
                candidate = order[: i + 1] + order[i + 1: j + 1][::-1] + order[j + 1:]
                c = ring_cost(candidate, proportions)
                if c < cost - 1e-9:
                    order, cost, improved = candidate, c, True
    return order


def class_proportions(labels_per_client: Sequence[np.ndarray], classes: int) -> np.ndarray:
    """q_i: each client's normalised class counts."""
    q = np.zeros((len(labels_per_client), classes))
    for i, labels in enumerate(labels_per_client):
        counts = np.bincount(labels, minlength=classes).astype(float)
        q[i] = counts / max(counts.sum(), 1.0)
    return q


def mixing_matrix(n: int, order: Sequence[int], accuracies: Sequence[float], variant: str, gamma_r: float,
                  tau: float = 0.35) -> np.ndarray:
    """The effective N x N matrix of one round's K passes (row i: how much of each client's
    parameters client i ends with). For analysis and tests; the clients never build it."""
    k = passes(n, variant)
    gamma_in = per_pass_retention(gamma_r, k)
    pos = {c: p for p, c in enumerate(order)}
    step = np.zeros((n, n))
    for i in range(n):
        left, right = order[(pos[i] - 1) % n], order[(pos[i] + 1) % n]
        weights = neighbour_weights(accuracies[left], accuracies[right], variant != "fibfl", tau)
        step[i, i] += gamma_in if weights is not None else 1.0
        if weights is not None:
            step[i, left] += (1 - gamma_in) * weights[0]
            step[i, right] += (1 - gamma_in) * weights[1]
    return np.linalg.matrix_power(step, k)
