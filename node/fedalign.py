"""The pure math of FedAlign (ALGORITHMS.md part 3): the four moments of a client's unsampled
data, their clipping and Gaussian noise, the server's weighted aggregate, the alignment of the
sampled data to the global moments, and the clipped, noised update.

Where the paper is silent the choice is a parameter, with the spec's INFERRED form as default."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from protocol.codecs import make_codec

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


def stat_noise_scale(clip: float, samples: int, epsilon: float, delta: float) -> float:
    """INFERRED 3.2: replace-one sensitivity 2S/|U| of a clamped mean, Gaussian mechanism."""
    return (2.0 * clip / max(samples, 1)) * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def privatize_moments(m: Mapping[str, np.ndarray], clip: float, samples: int, epsilon: float | None,
                      delta: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Eq. 3.2: clamp each statistic to [-S, S], then add N(0, sigma^2) (none when epsilon is None)."""
    sigma = 0.0 if epsilon is None else stat_noise_scale(clip, samples, epsilon, delta)
    out = {}
    for key in MOMENTS:
        value = np.clip(np.asarray(m[key], dtype=np.float64), -clip, clip)
        if sigma > 0:
            value = value + rng.normal(0.0, sigma, size=value.shape)
        out[key] = value.astype(np.float32)
    return out


def aggregate_moments(reports: Sequence[tuple[Mapping[str, np.ndarray], float]]) -> dict[str, np.ndarray]:
    """Eq. 3.3: the n_k-weighted mean of each statistic over the reporting clients, variance floored."""
    total = sum(n for _, n in reports)
    out = {key: sum(np.asarray(m[key], dtype=np.float64) * n for m, n in reports) / total for key in MOMENTS}
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
    """Eq. 3.6: sigma with sigma^2 = 8 C^2 ln(1.25/delta) / eps^2 (Gaussian mechanism, sensitivity 2C)."""
    return math.sqrt(8.0 * clip**2 * math.log(1.25 / delta)) / epsilon


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
    stat_clip: float = 10.0
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
