"""Client-side stages around local training (in the spirit of Flower's mods): a stage may change
how a client trains and what it does with the trained model before it is encoded. The core
paper's local DP is one (Algorithm 1 of ALGORITHMS.md 1.1: clip while training, estimate the
Lipschitz constant, noise the weights); compression is the upload channel (node/channel.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from . import accounting
from .privacy import add_noise, noise_scale, sensitivity
from .training import LocalTraining, TrainingResult


@dataclass(frozen=True)
class Privacy:
    mechanism: str = "none"  # none | laplace | gaussian
    epsilon: float = math.inf
    delta: float = 0.0
    clip: float | None = None  # xi; L1 for laplace, L2 for gaussian
    factor: float = 1.0  # c_T of Eq. 1.11, already resolved for this run

    @property
    def clip_norm(self) -> float:
        return 2.0 if self.mechanism == "gaussian" else 1.0


class LocalDP:
    """The core paper's local DP as a stage: gradient clipping (Eq. 1.8) and the Lipschitz estimate
    (Eq. 1.9) during training, then noise on the weights from this round's sensitivity (Eq. 1.10-1.11)."""

    def __init__(self, privacy: Privacy):
        self.p = privacy

    def training(self, local: LocalTraining) -> LocalTraining:
        return replace(local, clip=self.p.clip, clip_norm=self.p.clip_norm, estimate_lipschitz=self.p.mechanism != "none")

    def privatize(self, state, result: TrainingResult, local: LocalTraining, rng, info: dict[str, Any]):
        """(noised state, the release for the privacy ledger or None); records what it used in info."""
        p = self.p
        if p.mechanism == "none":
            return state, None
        sens = sensitivity(result.samples_seen, result.lipschitz, local.lr, local.epochs, p.clip)
        scale = noise_scale(p.mechanism, sens, p.factor, p.epsilon, p.delta)
        info.update(lipschitz=result.lipschitz, sensitivity=sens, noise_scale=scale)
        per_round = p.epsilon / p.factor  # Eq. 1.11 spends epsilon / c_T each round (with the estimated sensitivity)
        release = accounting.laplace_release("update", per_round) if p.mechanism == "laplace" else \
            accounting.gaussian_release("update", scale, sens, per_round, p.delta)
        return add_noise(state, p.mechanism, scale, rng), release
