"""Oort's participant selection (Lai et al., OSDI 2021), as pure math plus a small stateful
selector the server consults each round.

A client's statistical utility is |B_i| sqrt(mean of its per-sample training loss squared) over
the samples B_i of its last participation. Its selection score is that utility, min-max
normalised over the explored clients, plus a staleness bonus sqrt(c ln R / L_i) (R: this round,
L_i: its last round, both counted from 1), times (T / d_i)^alpha when its duration d_i exceeds the
preferred round duration T. A share epsilon of the slots (decaying each round to a floor) goes to
clients never tried, faster ones more likely; the rest is drawn, with probability proportional to
the score, among the clients scoring at least `cutoff` times the k-th best. The pacer relaxes T
by delta whenever the utility collected over the last W rounds fell below the W before."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np


@dataclass(frozen=True)
class OortParams:
    preferred_duration_s: float | None = None  # T; None: the median expected duration of the first round's pool
    alpha: float = 2.0  # penalty exponent for clients slower than T
    exploration: float = 0.9  # epsilon at round 0
    exploration_decay: float = 0.98
    exploration_min: float = 0.3
    cutoff: float = 0.95
    staleness_bonus: float = 0.1  # c of sqrt(c ln R / L)
    pacer_window: int = 20  # W
    pacer_delta_s: float | None = None  # None: a tenth of the initial T


def statistical_utility(samples: int, loss_rms: float) -> float:
    """|B_i| sqrt((1/|B_i|) sum_k loss_k^2), from the root mean square of the per-sample losses."""
    return float(samples) * float(loss_rms)


def system_factor(duration: float | None, preferred: float, alpha: float) -> float:
    """1 for a client no slower than T, else (T / d)^alpha; unknown durations are not penalised."""
    if duration is None or duration <= preferred:
        return 1.0
    return (preferred / duration) ** alpha


def exploration_share(round_: int, p: OortParams) -> float:
    return max(p.exploration_min, p.exploration * p.exploration_decay ** round_)


def scores(explored: Mapping[str, "Arm"], round_: int, preferred: float, p: OortParams) -> dict[str, float]:
    """Each explored client's selection score at round `round_` (0-based)."""
    if not explored:
        return {}
    values = [a.utility for a in explored.values()]
    low, high = min(values), max(values)
    out = {}
    for name, arm in explored.items():
        base = (arm.utility - low) / (high - low) if high > low else 1.0
        bonus = math.sqrt(p.staleness_bonus * math.log(round_ + 1) / (arm.last_round + 1))
        out[name] = (base + bonus) * system_factor(arm.duration, preferred, p.alpha)
    return out


@dataclass
class Arm:
    utility: float
    last_round: int
    duration: float | None


@dataclass
class OortSelector:
    params: OortParams
    arms: dict[str, Arm] = field(default_factory=dict)  # explored clients
    preferred: float | None = None  # T now
    delta: float = 0.0  # the pacer's step
    collected: dict[int, float] = field(default_factory=dict)  # round -> statistical utility of its updates
    last_pacer_round: int = -1

    def feedback(self, client: str, round_: int, samples: int, loss_rms: float | None, duration: float) -> None:
        """A client's update arrived: its utility, round and duration are now known."""
        utility = statistical_utility(samples, loss_rms or 0.0)
        self.arms[client] = Arm(utility, round_, duration)
        self.collected[round_] = self.collected.get(round_, 0.0) + utility

    def _pace(self, round_: int) -> None:
        w = self.params.pacer_window
        if round_ < 2 * w or round_ % w or round_ == self.last_pacer_round:
            return
        self.last_pacer_round = round_
        recent = sum(self.collected.get(r, 0.0) for r in range(round_ - w, round_))
        before = sum(self.collected.get(r, 0.0) for r in range(round_ - 2 * w, round_ - w))
        if recent < before:
            self.preferred += self.delta

    def select(self, pool: Mapping[str, Mapping], k: int, round_: int, rng: np.random.Generator,
               expected: Mapping[str, float]) -> list[str]:
        """k clients of `pool` (name order). `expected`: each one's expected round seconds, where known."""
        names = sorted(pool)
        k = min(k, len(names))
        self._fix_preferred([expected[n] for n in names if n in expected])
        if self.preferred is not None:
            self._pace(round_)
        explored = {n: self.arms[n] for n in names if n in self.arms}
        fresh = [n for n in names if n not in self.arms]
        n_explore = min(len(fresh), int(round(exploration_share(round_, self.params) * k)))
        n_exploit = min(len(explored), k - n_explore)
        n_explore = min(len(fresh), k - n_exploit)  # too few explored: try more new ones
        chosen = self._exploit(explored, n_exploit, round_, rng) + self._explore(fresh, n_explore, rng, expected)
        return sorted(chosen)

    def _fix_preferred(self, expected: list[float]) -> None:
        """T: as given; else the median expected duration of the first pool that reports any (check-ins),
        else the median duration of the first clients tried. Unknown until then (no penalty)."""
        if self.preferred is not None:
            return
        given = self.params.preferred_duration_s
        known = expected or [a.duration for a in self.arms.values() if a.duration is not None]
        if given is None and not known:
            return
        self.preferred = float(given if given is not None else np.median(known))
        self.delta = self.params.pacer_delta_s if self.params.pacer_delta_s is not None else 0.1 * self.preferred

    def _exploit(self, explored: Mapping[str, Arm], n: int, round_: int, rng: np.random.Generator) -> list[str]:
        if n <= 0:
            return []
        score = scores(explored, round_, math.inf if self.preferred is None else self.preferred, self.params)
        ranked = sorted(score, key=lambda c: (-score[c], c))
        floor = self.params.cutoff * score[ranked[n - 1]]
        eligible = [c for c in ranked if score[c] >= floor]
        weights = np.array([score[c] for c in eligible], dtype=float)
        if weights.sum() <= 0:
            weights = np.ones(len(eligible))
        pick = rng.choice(len(eligible), size=n, replace=False, p=weights / weights.sum())
        return [eligible[i] for i in pick]

    @staticmethod
    def _explore(fresh: list[str], n: int, rng: np.random.Generator, expected: Mapping[str, float]) -> list[str]:
        """Never-tried clients, with probability proportional to their speed (1 / expected seconds)
        where known, uniform otherwise."""
        if n <= 0:
            return []
        speed = np.array([1.0 / max(expected[c], 1e-9) if c in expected else 0.0 for c in fresh])
        if speed.sum() <= 0 or (speed == 0).any():
            speed = np.ones(len(fresh))
        pick = rng.choice(len(fresh), size=n, replace=False, p=speed / speed.sum())
        return [fresh[i] for i in pick]
