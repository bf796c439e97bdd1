"""FedAvg policy as pure functions: who takes part, and how updates combine."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def select_random(candidates: Sequence[str], k: int, rng: np.random.Generator) -> list[str]:
    """k distinct clients uniformly at random (all of them when k >= len), in name order."""
    pool = sorted(candidates)
    if k >= len(pool):
        return pool
    return sorted(pool[i] for i in rng.choice(len(pool), size=k, replace=False))


class WeightedAverage:
    """Running sum of weight * state; result() is the weighted mean (FedAvg, Eq. 1.12)."""

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.total = 0.0

    def add(self, state: Mapping[str, np.ndarray], weight: float) -> None:
        for name, value in state.items():
            contribution = np.asarray(value, dtype=np.float64) * weight
            if name in self.sums:
                self.sums[name] += contribution
            else:
                self.sums[name] = contribution
        self.total += weight

    def result(self, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.total <= 0:
            return dict(like)
        return {name: (self.sums[name] / self.total).astype(np.asarray(like[name]).dtype) for name in like}
