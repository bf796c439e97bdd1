"""A client device's compute model as pure functions: the full-speed seconds of local training
(per sample and per batch), background CPU load as a seeded piecewise-constant process, and how
long work takes while that load takes its share of the device."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .seeding import drawing

MIN_SHARE = 0.05  # background load never takes more than 95 % of the device


def cpu_load(seed: int, device: int, t: float, period_s: float, mean: float, concentration: float = 10.0) -> float:
    """Background CPU load at emulated time t: piecewise constant over periods of period_s, each a
    Beta draw with the given mean (concentration a + b), keyed by (seed, device, period) so any
    process computes the same value."""
    if mean <= 0:
        return 0.0
    return _period_load(seed, device, int(t // period_s) if period_s > 0 else 0, mean, concentration)


@functools.lru_cache(maxsize=1 << 17)
def _period_load(seed: int, device: int, k: int, mean: float, concentration: float) -> float:
    """Remembered: the network asks for a device's load at every delivery to it, and a seeded
    generator costs tens of microseconds to make."""
    rng = drawing([seed, device, k, 0xC0])
    a, b = mean * concentration, (1 - mean) * concentration
    return float(min(rng.beta(a, b), 1.0 - MIN_SHARE))


@dataclass(frozen=True)
class LoadModel:
    """A device's background load process, as the network describes it in the device status."""
    seed: int
    device: int
    period_s: float
    mean: float

    def at(self, t: float) -> float:
        return cpu_load(self.seed, self.device, t, self.period_s, self.mean)

    def as_status(self) -> list:
        return [self.seed, self.device, self.period_s, self.mean]

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> "LoadModel | None":
        spec = (status or {}).get("load")
        if not spec:
            return None
        seed, device, period_s, mean = spec
        return cls(int(seed), int(device), float(period_s), float(mean))


def full_speed_seconds(ms_per_sample: float, samples: int, epochs: float, batch_size: int = 1,
                       ms_per_batch: float = 0.0) -> float:
    """Local training on an unloaded device: a cost per sample and a fixed cost per batch (kernel
    launches, optimizer step, Python), which dominates for small models."""
    batches = math.ceil(samples / batch_size) if samples else 0
    return (ms_per_sample * samples + ms_per_batch * batches) * epochs / 1000.0


def loaded_duration(work_s: float, start: float, load: LoadModel | None, constant: float = 0.0) -> float:
    """Emulated seconds to do work_s of full-speed work from `start`, the device's background load
    taking its share period by period (a constant load when no process is given)."""
    if work_s <= 0:
        return 0.0
    if load is None or load.period_s <= 0:
        return work_s / max(MIN_SHARE, 1.0 - constant)
    t, left = start, work_s
    while True:
        period_end = (math.floor(t / load.period_s) + 1) * load.period_s
        share = max(MIN_SHARE, 1.0 - load.at(t))
        if left <= share * (period_end - t):
            return t + left / share - start
        left -= share * (period_end - t)
        t = period_end
