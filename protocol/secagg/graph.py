"""Who shares secrets with whom, and how many shares rebuild one. SecAgg (Bonawitz et al., CCS
2017) makes every two clients of the cohort neighbours; SecAgg+ (Bell et al., CCS 2020) a random
k-regular graph: a Harary graph (each client joined to the k/2 nearest on either side of a ring)
over a seeded random order of the clients, so that a client's work and bytes grow with k, not n.

The degree and threshold of SecAgg+ follow Bell et al.'s reasoning in a simplified form, stated
here rather than quoted: a client's neighbourhood (its k neighbours and itself, k + 1 holders of
its shares) must
- keep at least t holders that answer when a share of `dropout` of the clients drop out, for every
  client: n P[Bin(k + 1, 1 - dropout) < t] <= 2^-eta (correctness), and
- never give a server colluding with a share `corrupt` of the clients t shares of a secret it
  should not learn: n P[Bin(k + 1, corrupt) >= t] <= 2^-sigma (security); and t > (k + 1) / 2, so
  that no client's two secrets (its self-mask seed and its mask key) are both rebuilt.
The smallest even k that admits such a t is chosen, with the smallest such t. Bell et al. bound
the same events with the graph's randomness and the adversary's choice in more detail; this
bound is a union bound over clients with exact binomial tails."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GraphChoice:
    degree: int  # k: neighbours of each client (n - 1: every pair)
    threshold: int  # t: shares that rebuild a secret, of the k + 1 holders
    complete: bool  # every pair are neighbours (SecAgg, or SecAgg+ where k would reach n - 1)


def _log_binom_pmf(n: int, k: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def binomial_tail_at_least(n: int, t: int, p: float) -> float:
    """P[Bin(n, p) >= t], summed in log space (n of a few thousand)."""
    if t <= 0:
        return 1.0
    if t > n:
        return 0.0
    logs = [_log_binom_pmf(n, k, p) for k in range(t, n + 1)]
    top = max(logs)
    if top == -math.inf:
        return 0.0
    return math.exp(top) * sum(math.exp(v - top) for v in logs)


def majority(holders: int) -> int:
    """The smallest t above half of the holders (and at least 2 where there are 2)."""
    return min(holders, holders // 2 + 1)


def choose_secaggplus(n: int, dropout: float, corrupt: float, sigma: int = 40, eta: int = 30) -> GraphChoice:
    """SecAgg+'s (k, t) for n clients (module docstring). Where no k below n - 1 satisfies both
    bounds, every pair are neighbours and t is the majority of the cohort (as secagg)."""
    for k in range(2, n - 1, 2):
        holders = k + 1
        for t in range(majority(holders), holders + 1):
            if n * (1.0 - binomial_tail_at_least(holders, t, 1.0 - dropout)) > 2.0 ** -eta:
                break  # a larger t only fails more often
            if n * binomial_tail_at_least(holders, t, corrupt) <= 2.0 ** -sigma:
                return GraphChoice(k, t, False)
    return GraphChoice(n - 1, majority(n), True)


def choose_secagg(n: int, threshold: int | None = None) -> GraphChoice:
    """SecAgg: every pair, t the given threshold or the majority of the cohort."""
    return GraphChoice(n - 1, threshold if threshold is not None else majority(n), True)


def neighbours(ids: list[int], degree: int, seed: int) -> dict[int, list[int]]:
    """Each client's neighbours (client ids, sorted): all the others when degree >= len(ids) - 1,
    else a Harary graph H(degree, n) over a seeded random order of the ids (degree even)."""
    ids = sorted(ids)
    n = len(ids)
    if degree >= n - 1:
        return {u: [v for v in ids if v != u] for u in ids}
    order = [ids[i] for i in np.random.default_rng([seed, 0x5A6]).permutation(n)]
    half = degree // 2
    out: dict[int, set[int]] = {u: set() for u in ids}
    for pos, u in enumerate(order):
        for step in range(1, half + 1):
            v = order[(pos + step) % n]
            out[u].add(v)
            out[v].add(u)
    return {u: sorted(vs) for u, vs in out.items()}
