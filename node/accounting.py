"""Differential-privacy calibration and accounting as pure functions.

- The analytic Gaussian mechanism (Balle & Wang, ICML 2018, Theorem 8): the smallest sigma for
  which N(0, sigma^2) noise on a query of L2 sensitivity D is (epsilon, delta)-DP, for any
  epsilon > 0. The classic sigma = D sqrt(2 ln(1.25/delta)) / epsilon holds only for epsilon <= 1
  (and is loose there).
- The sampled Gaussian mechanism of DP-SGD in Renyi DP (Mironov, Talwar & Zhang 2019, "Renyi
  Differential Privacy of the Sampled Gaussian Mechanism", Sections 3.2-3.3), composed over steps
  and rounds by adding RDP order by order, converted to (epsilon, delta) with Balle et al. 2020
  ("Hypothesis testing interpretations and Renyi DP", Theorem 21):
  eps = rdp(a) + log((a - 1)/a) - (log delta + log a)/(a - 1), minimised over the orders a.
- Composition over a client's releases, three ways, all reported:
  basic: the epsilons and the deltas add up;
  zCDP (Bun & Steinke 2016): a Gaussian release of sensitivity D and noise sigma is
  D^2 / (2 sigma^2)-zCDP, a pure epsilon-DP release (Laplace) is epsilon^2 / 2-zCDP, the rhos add
  up, and rho-zCDP implies (rho + 2 sqrt(rho ln(1/delta)), delta)-DP for every delta > 0;
  RDP: each release's RDP curve, added up order by order: a Gaussian release's a * rho, DP-SGD's
  sampled curve, and a Laplace release's own curve (Mironov 2017, "Renyi Differential Privacy",
  Proposition 6), which never exceeds its epsilon at any order (its zCDP bound a * epsilon^2 / 2
  does, by far: 100 releases of epsilon 500 came to an RDP epsilon of 1.4e7 that way, against basic
  composition's 5e4).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def log_ndtr(x: float) -> float:
    """log Phi(x) for the standard normal CDF, accurate far into the lower tail."""
    if x > -30.0:
        return math.log(0.5 * math.erfc(-x / _SQRT2))
    # Asymptotic series of the Mills ratio; at x <= -30 its first omitted term is below 1e-12.
    x2 = x * x
    series = 1.0 - 1.0 / x2 + 3.0 / x2**2 - 15.0 / x2**3 + 105.0 / x2**4
    return -0.5 * x2 - math.log(-x) - _LOG_SQRT_2PI + math.log(series)


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """The exact delta of the Gaussian mechanism at epsilon (Balle & Wang, Theorem 8):
    Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)."""
    if sigma <= 0:
        return 1.0
    r = sigma / sensitivity
    a, b = 1.0 / (2.0 * r) - epsilon * r, -1.0 / (2.0 * r) - epsilon * r
    log_a, log_b = log_ndtr(a), epsilon + log_ndtr(b)
    if log_b >= log_a:
        return 0.0
    return math.exp(log_a) * -math.expm1(log_b - log_a)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest sigma (to a relative 1e-10) with gaussian_delta(sigma) <= delta."""
    if not (epsilon > 0 and 0 < delta < 1 and sensitivity > 0):
        raise ValueError(f"need epsilon > 0, 0 < delta < 1 and sensitivity > 0, got {epsilon}, {delta}, {sensitivity}")
    low, high = sensitivity * 1e-12, sensitivity
    while gaussian_delta(high, epsilon, sensitivity) > delta:
        low, high = high, high * 2.0
    while high - low > 1e-10 * high:  # delta falls as sigma grows
        mid = 0.5 * (low + high)
        if gaussian_delta(mid, epsilon, sensitivity) > delta:
            low = mid
        else:
            high = mid
    return high


# ---- Renyi DP of the sampled Gaussian mechanism ------------------------------------------------
ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))  # the usual grid (TF Privacy, Opacus)


def _log_add(a: float, b: float) -> float:
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))


def _log_sub(a: float, b: float) -> float:
    """log(e^a - e^b) for a >= b."""
    if b == -math.inf:
        return a
    if a <= b:
        return -math.inf  # the series' partial sums are positive; a tie is rounding
    return a + math.log(-math.expm1(b - a))


def _log_erfc(x: float) -> float:
    return math.log(2.0) + log_ndtr(-x * _SQRT2)


def _log_binom_signed(alpha: float, i: int) -> tuple[float, int]:
    """(log |C(alpha, i)|, its sign) for real alpha >= 0 and integer i >= 0."""
    top = alpha - i + 1.0  # C(alpha, i) = Gamma(alpha+1) / (Gamma(i+1) Gamma(alpha-i+1))
    if top <= 0 and top == int(top):
        return -math.inf, 0
    sign = 1 if top > 0 or math.ceil(-top) % 2 == 0 else -1
    return math.lgamma(alpha + 1.0) - math.lgamma(i + 1.0) - math.lgamma(top), sign


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """log A_alpha = log E[(mu_1 / mu_0)^alpha] for integer alpha (Section 3.2)."""
    log_a = -math.inf
    for k in range(alpha + 1):
        term = (math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
                + k * math.log(q) + (alpha - k) * math.log1p(-q) + (k * k - k) / (2.0 * sigma**2))
        log_a = _log_add(log_a, term)
    return log_a


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """log A_alpha for fractional alpha: A_0 + A_1, two series that converge (Section 3.3)."""
    log_a0 = log_a1 = -math.inf
    z0 = sigma**2 * math.log(1.0 / q - 1.0) + 0.5
    i = 0
    while True:
        log_coef, sign = _log_binom_signed(alpha, i)
        j = alpha - i
        log_t0 = log_coef + i * math.log(q) + j * math.log1p(-q)
        log_t1 = log_coef + j * math.log(q) + i * math.log1p(-q)
        log_s0 = log_t0 + (i * i - i) / (2.0 * sigma**2) + math.log(0.5) + _log_erfc((i - z0) / (_SQRT2 * sigma))
        log_s1 = log_t1 + (j * j - j) / (2.0 * sigma**2) + math.log(0.5) + _log_erfc((z0 - j) / (_SQRT2 * sigma))
        if sign > 0:
            log_a0, log_a1 = _log_add(log_a0, log_s0), _log_add(log_a1, log_s1)
        elif sign < 0:
            log_a0, log_a1 = _log_sub(log_a0, log_s0), _log_sub(log_a1, log_s1)
        i += 1
        if i > alpha + 1 and max(log_s0, log_s1) < _log_add(log_a0, log_a1) - 30.0:
            return _log_add(log_a0, log_a1)
        if i > 10_000:
            raise ArithmeticError(f"the RDP series did not converge (q={q}, sigma={sigma}, alpha={alpha})")


def sampled_gaussian_rdp(q: float, sigma: float, alpha: float) -> float:
    """RDP at order alpha of one step of the sampled Gaussian mechanism: each record is in the
    batch with probability q (Poisson sampling), the clipped sum gets N(0, (sigma C)^2) noise."""
    if q <= 0:
        return 0.0
    if sigma <= 0:
        return math.inf
    if q >= 1.0:
        return alpha / (2.0 * sigma**2)
    if float(alpha).is_integer():
        return _log_a_integer(q, sigma, int(alpha)) / (alpha - 1.0)
    return _log_a_fractional(q, sigma, alpha) / (alpha - 1.0)


@functools.lru_cache(maxsize=4096)
def _step_curve(q: float, sigma: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sampled_gaussian_rdp(q, sigma, a) for a in orders)


def dpsgd_rdp(q: float, sigma: float, steps: int, orders: tuple[float, ...] = ORDERS) -> tuple[float, ...]:
    """RDP curve of `steps` DP-SGD steps with Poisson sampling rate q and noise multiplier sigma."""
    return tuple(steps * r for r in _step_curve(q, sigma, orders))


def rdp_epsilon(rdp: Iterable[float], delta: float, orders: tuple[float, ...] = ORDERS) -> tuple[float, float]:
    """(epsilon, the order that gives it) of an RDP curve at delta."""
    best = (math.inf, math.nan)
    for a, r in zip(orders, rdp):
        if math.isinf(r) or a <= 1:
            continue
        eps = r + math.log((a - 1.0) / a) - (math.log(delta) + math.log(a)) / (a - 1.0)
        if eps < best[0]:
            best = (max(eps, 0.0), a)
    return best


GUARANTEES = ("proven", "heuristic")
ADJACENCIES = ("add_remove", "zero_out", "substitution")


@dataclass(frozen=True)
class Release:
    """One noised message a client sent: its own (epsilon, delta), its zCDP rho and, where it is
    tighter than a * rho (DP-SGD with sampling, Laplace), its RDP curve at ORDERS. `guarantee`:
    proven where the noise is calibrated to a proven sensitivity, heuristic where it is calibrated
    to an estimate (the core paper's Laplace and Gaussian: an estimated Lipschitz constant, clipping
    of the batch mean); `adjacency`: the neighbouring datasets the figures are about (one record
    added or removed, zeroed out, or replaced)."""
    what: str  # e.g. "update", "statistics"
    mechanism: str  # laplace | gaussian | dpsgd
    epsilon: float
    delta: float
    rho: float
    rdp: tuple[float, ...] | None = None
    guarantee: str = "proven"
    adjacency: str = "substitution"

    def rdp_curve(self) -> tuple[float, ...]:
        return self.rdp if self.rdp is not None else tuple(a * self.rho for a in ORDERS)


def laplace_rdp(epsilon: float, orders: tuple[float, ...] = ORDERS) -> tuple[float, ...]:
    """The RDP curve of the Laplace mechanism that is epsilon-DP (scale = sensitivity / epsilon),
    Mironov 2017, Proposition 6: for a > 1,
    1/(a-1) log( a/(2a-1) e^((a-1) eps) + (a-1)/(2a-1) e^(-a eps) ),
    computed in logs (a release of epsilon 1e4 would overflow exp); at most epsilon at every order."""
    curve = []
    for a in orders:
        first = math.log(a / (2.0 * a - 1.0)) + (a - 1.0) * epsilon
        second = math.log((a - 1.0) / (2.0 * a - 1.0)) - a * epsilon
        curve.append(min(epsilon, _log_add(first, second) / (a - 1.0)))
    return tuple(curve)


def laplace_release(what: str, epsilon: float, guarantee: str = "proven", adjacency: str = "substitution") -> Release:
    return Release(what, "laplace", epsilon, 0.0, epsilon**2 / 2.0, laplace_rdp(epsilon), guarantee, adjacency)


def gaussian_release(what: str, sigma: float, sensitivity: float, epsilon: float, delta: float,
                     guarantee: str = "proven", adjacency: str = "substitution") -> Release:
    rho = 0.0 if sensitivity <= 0 else math.inf if sigma <= 0 else sensitivity**2 / (2.0 * sigma**2)
    return Release(what, "gaussian", epsilon, delta, rho, None, guarantee, adjacency)


def zcdp_epsilon(rho: float, delta: float) -> float:
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)) if rho > 0 else 0.0


def compose(releases: Iterable[Release], delta: float) -> dict:
    """What a sequence of releases spent in total: basic composition and zCDP at `delta`."""
    releases = list(releases)
    rho = sum(r.rho for r in releases)
    rdp = [sum(values) for values in zip(*(r.rdp_curve() for r in releases))] if releases else [0.0] * len(ORDERS)
    epsilon, order = rdp_epsilon(rdp, delta)
    return {
        "releases": len(releases),
        "basic": {"epsilon": sum(r.epsilon for r in releases), "delta": sum(r.delta for r in releases)},
        "zcdp": {"rho": rho, "epsilon": zcdp_epsilon(rho, delta), "delta": delta},
        "rdp": {"epsilon": epsilon if releases else 0.0, "order": order, "delta": delta},
    }


def ledger_summary(releases: dict[str, list[Release]], delta: float,
                   composed: dict[str, tuple[int, dict]] | None = None) -> dict:
    """Per client what it spent, and the largest totals over the clients. `composed`, kept by a
    caller that summarises a growing ledger again and again (after every round), holds each
    client's totals with the count of releases they cover: a ledger only grows, so a client with
    no new release is not composed again (700 clients' RDP curves after every round of the
    flagship were a second of the conductor's CPU every 5 rounds, and growing)."""
    per_client = {}
    for name, rs in sorted(releases.items()):
        if name == USER_LEVEL_ACTOR:
            continue
        known = composed.get(name) if composed is not None else None
        if known is None or known[0] != len(rs):
            known = (len(rs), _client_ledger(rs, delta))
            if composed is not None:
                composed[name] = known
        per_client[name] = known[1]
    return {
        "accounting_delta": delta,
        "clients": len(per_client),
        # the guarantee: proven releases only (a heuristic one never enters these)
        **_worst(per_client, "proven"),
        "heuristic": _worst(per_client, "heuristic"),
        "adjacency": sorted({a for c in per_client.values() for a in c["adjacency"]}),
        "per_client": per_client,
        **({"user_level": user_level_summary(releases[USER_LEVEL_ACTOR])} if releases.get(USER_LEVEL_ACTOR) else {}),
    }


USER_LEVEL_ACTOR = "server"  # whose releases protect every user at once (DP-FedAvg's noise on the aggregate)


def user_level_summary(releases: list[Release]) -> dict:
    """What the released models spent of every user's privacy: the rounds' sampled Gaussian
    releases composed in RDP, at their own delta (1 / N^1.1 unless set), and whether that is
    proven (a uniform cohort) or heuristic."""
    delta = releases[0].delta
    rdp = tuple(sum(r.rdp[i] for r in releases) for i in range(len(ORDERS)))
    epsilon, order = rdp_epsilon(rdp, delta)
    return {"releases": len(releases), "epsilon": epsilon, "delta": delta, "order": order,
            "guarantee": "proven" if all(r.guarantee == "proven" for r in releases) else "heuristic",
            "adjacency": "add_remove (a user's whole data)"}


def _client_ledger(releases: list[Release], delta: float) -> dict:
    """One client's totals: all its releases (as they were), and its proven and heuristic ones apart."""
    return {**compose(releases, delta),
            **{kind: compose([r for r in releases if r.guarantee == kind], delta) for kind in GUARANTEES},
            "adjacency": sorted({r.adjacency for r in releases})}


def _worst(per_client: dict, kind: str) -> dict:
    worst = lambda path: max((c[kind][path[0]][path[1]] for c in per_client.values()), default=0.0)  # noqa: E731
    return {"max_basic_epsilon": worst(("basic", "epsilon")), "max_basic_delta": worst(("basic", "delta")),
            "max_zcdp_epsilon": worst(("zcdp", "epsilon")), "max_rdp_epsilon": worst(("rdp", "epsilon"))}


# ---- user-level DP (DP-FedAvg: McMahan et al. 2018; adaptive clipping: Andrew et al. 2021) -----------
def user_level_delta(population: int) -> float:
    """The default delta of a user-level guarantee: 1 / N^1.1, below one over the number of users."""
    return 1.0 / max(2, population) ** 1.1


def user_level_release(q: float, noise_multiplier: float, delta: float, guarantee: str = "proven") -> Release:
    """One round of DP-FedAvg as a release: the sampled Gaussian mechanism on the sum of clipped
    updates, a user in the cohort with probability q, the noise's std z times the clip. Its RDP is
    the sampled Gaussian's (the same curve as a DP-SGD step); its epsilon is that curve's at delta."""
    curve = dpsgd_rdp(q, noise_multiplier, 1)
    epsilon = rdp_epsilon(curve, delta)[0]
    return Release("model", "dpfedavg", epsilon, delta, 1.0 / (2.0 * noise_multiplier**2), curve, guarantee, "add_remove")


def update_noise_multiplier(total: float, count_noise: float) -> float:
    """Andrew et al. 2021, Thm. 1: with adaptive clipping, the clipped-count query costs privacy
    too; the update's noise multiplier z_delta = (z^-2 - (2 sigma_b)^-2)^-1/2 keeps the two
    together at z. Needs z < 2 sigma_b."""
    if count_noise <= 0:
        return total
    rest = total**-2 - (2.0 * count_noise) ** -2
    if rest <= 0:
        raise ValueError(f"noise multiplier {total} needs count noise above {total / 2} (got {count_noise})")
    return rest**-0.5


def adapted_clip(clip: float, unclipped_share: float, target_quantile: float, lr: float) -> float:
    """Andrew et al. 2021, geometric update: C <- C exp(-lr (b - gamma)), b the (noised) share of
    updates at or under C; it moves C toward the gamma-quantile of the update norms."""
    return clip * math.exp(-lr * (unclipped_share - target_quantile))
