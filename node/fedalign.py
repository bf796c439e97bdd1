"""The pure math of FedAlign (docs/algorithms.md part 3): the four moments of a client's unsampled
data, their clipping and Gaussian noise, the server's weighted aggregate, the alignment of the
sampled data to the global moments, and the clipped, noised update.

Where the paper is silent the choice is a parameter, with the spec's INFERRED form as default."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from protocol.codecs import make_codec
from .accounting import analytic_gaussian_sigma

MOMENTS = ("mean", "var", "skew", "kurt")
MOMENTS_CODEC = make_codec("fp32")  # statistics travel at full precision both ways: a handful of numbers
VAR_FLOOR = 1e-6  # noise can push an aggregated variance to zero or below (INFERRED safeguard of 3.3)


def _axes(x: np.ndarray, granularity: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """Per channel: reduce over samples and pixels of (n, C, ...) data; per dimension: over samples only."""
    if granularity == "channel":
        return x, (0,) + tuple(range(2, x.ndim))
    if granularity == "dimension":
        return x.reshape(x.shape[0], -1), (0,)
    raise ValueError(f"granularity must be channel or dimension, got {granularity!r}")


def moments(x: np.ndarray, granularity: str = "channel") -> dict[str, np.ndarray]:
    """Eq. 3.1: mean, population variance, skewness and kurtosis (not excess) of the samples."""
    data, axes = _axes(np.asarray(x, dtype=np.float64), granularity)
    mean = data.mean(axis=axes, keepdims=True)
    centred = data - mean
    var = (centred**2).mean(axis=axes, keepdims=True)
    std = np.sqrt(np.maximum(var, 1e-12))
    z = centred / std
    squeeze = lambda a: a.reshape(-1)  # noqa: E731
    return {"mean": squeeze(mean), "var": squeeze(var), "skew": squeeze((z**3).mean(axis=axes, keepdims=True)),
            "kurt": squeeze((z**4).mean(axis=axes, keepdims=True))}


RAW = ("m1", "m2", "m3", "m4")  # what a client releases: E[x^k] of its clamped inputs, per element


def raw_moments(x: np.ndarray, granularity: str, order: int, low: float, high: float) -> dict[str, np.ndarray]:
    """E[x^k], k = 1..order, of the inputs clamped to [low, high], per channel or per dimension.
    Clamping each input bounds what one sample can change; the central moments are computed from
    these afterwards (post-processing, free under DP)."""
    data, axes = _axes(np.clip(np.asarray(x, dtype=np.float64), low, high), granularity)
    return {RAW[k - 1]: (data**k).mean(axis=axes).reshape(-1) for k in range(1, order + 1)}


def raw_moment_ranges(low: float, high: float, order: int) -> list[float]:
    """R_k = max - min of x^k over [low, high]: how far one sample can move a per-sample term."""
    out = []
    for k in range(1, order + 1):
        ends = (low**k, high**k)
        floor = 0.0 if k % 2 == 0 and low <= 0.0 <= high else min(ends)
        out.append(max(ends) - floor)
    return out


def stat_sensitivity(samples: int, values: int, order: int) -> float:
    """L2 sensitivity of the released vector (E[x^k] / R_k for every k and element) when one of the
    `samples` inputs is replaced: each of the order x values entries moves by at most 1/samples
    (per channel, the sample's pixels are its share of the channel's average, so the bound is the same)."""
    return math.sqrt(order * values) / max(samples, 1)


@dataclass
class PrivateStatistics:
    raw: dict[str, np.ndarray]  # noised E[x^k], in the inputs' units
    sigma: float  # noise std in units of R_k (0: no noise)
    sensitivity: float  # of the normalised vector


def privatize_moments(raw: Mapping[str, np.ndarray], ranges: Sequence[float], samples: int, epsilon: float | None,
                      delta: float, rng: np.random.Generator) -> PrivateStatistics:
    """One analytic Gaussian mechanism over all the released moments together: E[x^k] / R_k gets
    N(0, sigma^2) with sigma calibrated to (epsilon, delta) for the whole vector's L2 sensitivity."""
    keys = [k for k in RAW if k in raw]
    values = int(np.asarray(raw[keys[0]]).size)
    sens = stat_sensitivity(samples, values, len(keys))
    sigma = 0.0 if epsilon is None else analytic_gaussian_sigma(epsilon, delta, sens)
    out = {}
    for key, r in zip(keys, ranges):
        value = np.asarray(raw[key], dtype=np.float64)
        if sigma > 0:
            value = value + r * rng.normal(0.0, sigma, size=value.shape)
        out[key] = value.astype(np.float32)
    return PrivateStatistics(out, sigma, sens)


def central_moments(raw: Mapping[str, np.ndarray], clip: float) -> dict[str, np.ndarray]:
    """Mean, variance (floored) and, from four raw moments, skewness and kurtosis clamped to
    [-clip, clip] (noise can make them anything)."""
    r = {k: np.asarray(v, dtype=np.float64) for k, v in raw.items()}
    mean = r["m1"]
    var = np.maximum(r["m2"] - mean**2, VAR_FLOOR)
    out = {"mean": mean, "var": var}
    if "m4" in r:
        m3 = r["m3"] - 3 * mean * r["m2"] + 2 * mean**3
        m4 = r["m4"] - 4 * mean * r["m3"] + 6 * mean**2 * r["m2"] - 3 * mean**4
        out["skew"] = np.clip(m3 / var**1.5, -clip, clip)
        out["kurt"] = np.clip(m4 / var**2, -clip, clip)
    return out


def aggregate_moments(reports: Sequence[tuple[Mapping[str, np.ndarray], float]]) -> dict[str, np.ndarray]:
    """Eq. 3.3: the n_k-weighted mean of each statistic over the reporting clients, variance floored."""
    total = sum(n for _, n in reports)
    keys = [k for k in MOMENTS if k in reports[0][0]]
    out = {key: sum(np.asarray(m[key], dtype=np.float64) * n for m, n in reports) / total for key in keys}
    out["var"] = np.maximum(out["var"], VAR_FLOOR)
    return {k: v.astype(np.float32) for k, v in out.items()}


def align(x: np.ndarray, target: Mapping[str, np.ndarray], granularity: str = "channel", higher: bool = False) -> np.ndarray:
    """Eq. 3.4 (INFERRED): standardise with the sample's own moments, then give it the global mean
    and variance. With `higher`, a first-order Cornish-Fisher step moves skewness and kurtosis
    toward the global ones before re-standardising."""
    x = np.asarray(x, dtype=np.float64)
    shape = x.shape
    own = moments(x, granularity)
    data, axes = _axes(x, granularity)
    bshape = [1] * data.ndim
    bshape[1] = -1
    b = lambda a: np.asarray(a, dtype=np.float64).reshape(bshape)  # noqa: E731
    z = (data - b(own["mean"])) / np.sqrt(np.maximum(b(own["var"]), 1e-12))
    if higher:
        z = z + b((np.asarray(target["skew"]) - own["skew"]) / 6.0) * (z**2 - 1) \
            + b((np.asarray(target["kurt"]) - own["kurt"]) / 24.0) * (z**3 - 3 * z)
        zm = z.mean(axis=axes, keepdims=True)
        z = (z - zm) / np.sqrt(np.maximum(((z - zm) ** 2).mean(axis=axes, keepdims=True), 1e-12))
    out = b(target["mean"]) + np.sqrt(b(target["var"])) * z
    return out.reshape(shape).astype(np.float32)


def update_noise_scale(clip: float, epsilon: float, delta: float) -> float:
    """Eq. 3.6's Gaussian mechanism of sensitivity 2C, calibrated analytically: the paper's
    sigma^2 = 8 C^2 ln(1.25/delta) / eps^2 is the classic bound, not DP for epsilon > 1."""
    return analytic_gaussian_sigma(epsilon, delta, 2.0 * clip)


@dataclass
class PrivateUpdate:
    delta: dict[str, np.ndarray]  # the model change to send, -(eta_l tau) times the noised pseudo-gradient
    norm: float  # L2 norm of the pseudo-gradient before clipping
    noise_scale: float  # sigma in pseudo-gradient units


def private_update(before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray], step: float,
                   clip: float | None, epsilon: float | None, delta: float, rng: np.random.Generator) -> PrivateUpdate:
    """Eqs. 3.5-3.6: g = (w_t - w_tau) / (eta_l tau), clipped to L2 norm C, plus N(0, sigma^2 I);
    returned as the model change -(eta_l tau) g~ so the server can step along it."""
    keys = [k for k in before if np.issubdtype(np.asarray(before[k]).dtype, np.floating)]
    g = {k: (np.asarray(before[k], np.float64) - np.asarray(after[k], np.float64)) / step for k in keys}
    norm = math.sqrt(sum(float((v**2).sum()) for v in g.values()))
    if clip is not None and norm > clip:
        g = {k: v * (clip / norm) for k, v in g.items()}
    sigma = update_noise_scale(clip, epsilon, delta) if epsilon is not None and clip is not None else 0.0
    if sigma > 0:
        g = {k: v + rng.normal(0.0, sigma, size=v.shape) for k, v in g.items()}
    change = {k: (-step * v).astype(np.float32) for k, v in g.items()}
    for k in before:  # integer buffers travel unchanged as a zero change
        if k not in change:
            change[k] = np.zeros_like(np.asarray(before[k]))
    return PrivateUpdate(change, norm, sigma)


@dataclass(frozen=True)
class FedAlignConfig:
    sample_fraction: float = 0.8
    rho: float = 1.0
    granularity: str = "channel"
    moments: int = 2
    stat_clip: float = 10.0  # bound on the derived skewness and kurtosis
    input_range: tuple[float, float] = (0.0, 1.0)  # inputs are clamped to it before the statistics
    stat_epsilon: float | None = None
    stat_delta: float = 1e-5
    clip: float | None = None
    epsilon: float | None = None
    delta: float = 1e-5


def split_round(indices: np.ndarray, cfg: FedAlignConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """This round's sampled part S_k (trained on) and the rho share of the rest U_k (statistics only)."""
    order = rng.permutation(indices)
    s = min(order.size - 1, max(1, int(round(cfg.sample_fraction * order.size))))
    rest = order[s:]
    u = max(1, int(round(cfg.rho * rest.size)))
    return np.sort(order[:s]), np.sort(rest[:u])
