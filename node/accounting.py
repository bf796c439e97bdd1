"""Differential-privacy calibration and accounting as pure functions.

- The analytic Gaussian mechanism (Balle & Wang, ICML 2018, Theorem 8): the smallest sigma for
  which N(0, sigma^2) noise on a query of L2 sensitivity D is (epsilon, delta)-DP, for any
  epsilon > 0. The classic sigma = D sqrt(2 ln(1.25/delta)) / epsilon holds only for epsilon <= 1
  (and is loose there).
- Composition over a client's releases, two ways, both reported:
  basic: the epsilons and the deltas add up;
  zCDP (Bun & Steinke 2016): a Gaussian release of sensitivity D and noise sigma is
  D^2 / (2 sigma^2)-zCDP, a pure epsilon-DP release (Laplace) is epsilon^2 / 2-zCDP, the rhos add
  up, and rho-zCDP implies (rho + 2 sqrt(rho ln(1/delta)), delta)-DP for every delta > 0.
"""
from __future__ import annotations

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


@dataclass(frozen=True)
class Release:
    """One noised message a client sent: its own (epsilon, delta) and its zCDP rho."""
    what: str  # e.g. "update", "statistics"
    mechanism: str  # laplace | gaussian
    epsilon: float
    delta: float
    rho: float


def laplace_release(what: str, epsilon: float) -> Release:
    return Release(what, "laplace", epsilon, 0.0, epsilon**2 / 2.0)


def gaussian_release(what: str, sigma: float, sensitivity: float, epsilon: float, delta: float) -> Release:
    rho = 0.0 if sensitivity <= 0 else math.inf if sigma <= 0 else sensitivity**2 / (2.0 * sigma**2)
    return Release(what, "gaussian", epsilon, delta, rho)


def zcdp_epsilon(rho: float, delta: float) -> float:
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta)) if rho > 0 else 0.0


def compose(releases: Iterable[Release], delta: float) -> dict:
    """What a sequence of releases spent in total: basic composition and zCDP at `delta`."""
    releases = list(releases)
    rho = sum(r.rho for r in releases)
    return {
        "releases": len(releases),
        "basic": {"epsilon": sum(r.epsilon for r in releases), "delta": sum(r.delta for r in releases)},
        "zcdp": {"rho": rho, "epsilon": zcdp_epsilon(rho, delta), "delta": delta},
    }


def ledger_summary(releases: dict[str, list[Release]], delta: float) -> dict:
    """Per client what it spent, and the largest totals over the clients."""
    per_client = {name: compose(rs, delta) for name, rs in sorted(releases.items())}
    worst = lambda path: max((c[path[0]][path[1]] for c in per_client.values()), default=0.0)  # noqa: E731
    return {
        "accounting_delta": delta,
        "clients": len(per_client),
        "max_basic_epsilon": worst(("basic", "epsilon")), "max_basic_delta": worst(("basic", "delta")),
        "max_zcdp_epsilon": worst(("zcdp", "epsilon")),
        "per_client": per_client,
    }
