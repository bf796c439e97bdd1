"""Bit-length schedules of the core paper (docs/algorithms.md 1.3-1.4) as pure functions.

Download uses the server schedule (Eq. 1.5), upload the client schedule (Eq. 1.6), which scales
the cosine by the client's importance nu_i (Eq. 1.7) in the dynamic mode."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

SCHEDULES = ("static", "cosine", "dynamic")
ENTROPY_EPSILON = 1e-10  # inside the log, as the authors' code does


def cosine_bits(t: int, rounds: int, b_min: int, b_max: int, importance: float = 1.0) -> int:
    """Eq. 1.5 (importance = 1) and Eq. 1.6: b = int(round(b_min + (b_max - b_min) * nu * (1 + cos(pi t / T)) / 2)).

    Python's round (half to even), as in the paper's code; t runs 0 .. T-1 and the division is by T."""
    return int(round(b_min + (b_max - b_min) * importance * (1 + math.cos(math.pi * t / rounds)) / 2))


def label_entropy(labels: Sequence[int] | np.ndarray, classes: int) -> float:
    """Entropy (bits) of the label distribution, normalised by log2 K (the entropy of the uniform
    distribution over K classes), so 1 means perfectly balanced. Only present classes contribute."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=classes).astype(np.float64)
    if counts.sum() == 0:
        return 0.0
    p = counts[counts > 0] / counts.sum()
    h = float(-(p * np.log2(p + ENTROPY_EPSILON)).sum())
    uniform = np.full(classes, 1.0 / classes)
    return h / float(-(uniform * np.log2(uniform + ENTROPY_EPSILON)).sum())


def importance(labels: Sequence[int] | np.ndarray, classes: int, samples: int, max_samples: int, lambda_h: float) -> float:
    """Eq. 1.7: nu_i = lambda_h * H(p_i)/log2 K + (1 - lambda_h) * n_i / n_max (n_max over the round's selected clients)."""
    size_term = samples / max_samples if max_samples > 0 else 0.0
    return lambda_h * label_entropy(labels, classes) + (1.0 - lambda_h) * size_term


@dataclass(frozen=True)
class BitSchedule:
    kind: str = "static"  # static | cosine | dynamic
    rounds: int = 1
    b_min: int = 8
    b_max: int = 32

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.kind!r}")

    @property
    def adaptive(self) -> bool:
        return self.kind != "static"

    def server_bits(self, t: int, static_bits: int) -> int:
        return static_bits if not self.adaptive else cosine_bits(t, self.rounds, self.b_min, self.b_max)

    def client_bits(self, t: int, static_bits: int, nu: float = 1.0) -> int:
        if not self.adaptive:
            return static_bits
        return cosine_bits(t, self.rounds, self.b_min, self.b_max, nu if self.kind == "dynamic" else 1.0)
