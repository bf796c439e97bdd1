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

    CHUNK = 1 << 18  # elements per step of add(): its float64 scratch (2 MiB) stays in the cache

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.total = 0.0
        self._scratch = np.empty(0)

    def add(self, state: Mapping[str, np.ndarray], weight: float) -> None:
        for name, value in state.items():
            total = self.sums.get(name)
            if total is None:
                self.sums[name] = np.asarray(np.multiply(value, weight, dtype=np.float64))  # 0-d stays an array
                continue
            # sums += float64(value) * weight, a chunk at a time: the same two roundings per element
            # as the whole-array expression, without a model-sized temporary
            flat_total, flat_value = total.reshape(-1), np.asarray(value).reshape(-1)
            if self._scratch.size < min(self.CHUNK, flat_total.size):
                self._scratch = np.empty(min(self.CHUNK, flat_total.size))
            for start in range(0, flat_total.size, self.CHUNK):
                part = slice(start, start + self.CHUNK)
                scratch = self._scratch[:flat_total[part].size]
                np.multiply(flat_value[part], weight, out=scratch, dtype=np.float64)
                flat_total[part] += scratch
        self.total += weight

    def result(self, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.total <= 0:
            return dict(like)
        # divided in float64 and rounded once to the model's dtype, straight into the result
        return {name: np.divide(self.sums[name], self.total, out=np.empty(self.sums[name].shape, np.asarray(like[name]).dtype),
                                casting="unsafe") for name in like}


# ---- selection among checked-in clients -----------------------------------------------------------
SELECTION_POLICIES = ("random", "resource_aware", "fastest")


def meets_resources(status: Mapping, min_battery: float, max_cpu_load: float, min_up_mbps: float) -> bool:
    """Resource-aware eligibility from a check-in status; a charging device passes the battery test."""
    battery = status.get("battery")
    if battery is not None and not status.get("charging") and battery < min_battery:
        return False
    if status.get("cpu_load", 0.0) > max_cpu_load:
        return False
    return status.get("up_mbps", float("inf")) >= min_up_mbps


def eligible(policy: str, pool: Mapping[str, Mapping], min_battery: float = 0.0, max_cpu_load: float = 1.0,
             min_up_mbps: float = 0.0, **_: float) -> list[str]:
    """The clients of `pool` the policy may choose from: resource_aware's thresholds, or all."""
    if policy != "resource_aware":
        return sorted(pool)
    return sorted(n for n, st in pool.items() if meets_resources(st, min_battery, max_cpu_load, min_up_mbps))


def shortfall(pool: Mapping[str, Mapping], min_battery: float = 0.0, max_cpu_load: float = 1.0,
              min_up_mbps: float = 0.0, **_: float) -> dict[str, int]:
    """How many clients of `pool` fail each resource threshold (a client can fail several)."""
    tests = {"min_battery": lambda st: meets_resources(st, min_battery, 1.0, 0.0),
             "max_cpu_load": lambda st: meets_resources({"cpu_load": st.get("cpu_load", 0.0)}, 0.0, max_cpu_load, 0.0),
             "min_up_mbps": lambda st: meets_resources({"up_mbps": st.get("up_mbps", float("inf"))}, 0.0, 1.0, min_up_mbps)}
    return {name: sum(not test(st) for st in pool.values()) for name, test in tests.items()}


def expected_seconds(status: Mapping, epochs: int, down_bytes: int, up_bytes: int) -> float:
    """A client's expected round time from its check-in: download, compute slowed by its CPU
    load, upload. The `fastest` policy ranks by it."""
    compute = status.get("ms_per_sample", 0.0) * status.get("samples", 0) * epochs / 1000.0
    compute /= max(1e-3, 1.0 - status.get("cpu_load", 0.0))
    down = down_bytes * 8 / (status.get("down_mbps", float("inf")) * 1e6)
    up = up_bytes * 8 / (status.get("up_mbps", float("inf")) * 1e6)
    return down + compute + up


def select_clients(policy: str, pool: Mapping[str, Mapping], k: int, rng: np.random.Generator, *,
                   min_battery: float = 0.0, max_cpu_load: float = 1.0, min_up_mbps: float = 0.0,
                   explore: float = 0.1, epochs: int = 1, down_bytes: int = 0, up_bytes: int = 0) -> list[str]:
    """k clients from `pool` (name -> check-in status), in name order.

    random: uniform. resource_aware: uniform among those meeting the thresholds. fastest: the
    ceil((1 - explore) k) with the lowest expected round time, the rest uniform among the others
    (exploration keeps slow clients' data in the model, as Oort does)."""
    if policy == "random":
        return select_random(list(pool), k, rng)
    if policy == "resource_aware":
        return select_random(eligible(policy, pool, min_battery, max_cpu_load, min_up_mbps), k, rng)
    if policy == "fastest":
        ranked = sorted(pool, key=lambda n: (expected_seconds(pool[n], epochs, down_bytes, up_bytes), n))
        exploit = ranked[: min(k, int(np.ceil((1 - explore) * k)))]
        rest = [n for n in ranked if n not in set(exploit)]
        return sorted(exploit + select_random(rest, k - len(exploit), rng))
    raise ValueError(f"selection policy must be one of {SELECTION_POLICIES}, got {policy!r}")
