"""Client-side stages around local training (in the spirit of Flower's mods): a stage may change
how a client trains and what it does with the trained model before it is encoded. The core
paper's local DP is one (Algorithm 1 of docs/algorithms.md 1.1: clip while training, estimate the
Lipschitz constant, noise the weights); compression is the upload channel (node/channel.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from . import accounting
from .privacy import add_noise, noise_scale, sensitivity, worst_case_sensitivity
from .training import DpSgd, LocalTraining, TrainingResult, epoch_steps, poisson_rate


@dataclass(frozen=True)
class Privacy:
    mechanism: str = "none"  # none | laplace | gaussian
    epsilon: float = math.inf
    delta: float = 0.0
    clip: float | None = None  # xi; L1 for laplace, L2 for gaussian
    factor: float = 1.0  # c_T of Eq. 1.11, already resolved for this run
    noise_multiplier: float = 0.0  # dpsgd: sigma (the noise std is sigma * clip)
    sampling: str = "poisson"  # dpsgd: poisson | shuffle
    accounting_delta: float = 1e-5  # the delta at which spent privacy is reported as epsilon
    compute_factor: float = 1.0  # a session's modelled compute time under this mechanism, relative to plain SGD
    calibration: str = "paper"  # laplace/gaussian: paper (Eq. 1.10's estimate) or worst_case (a bound: proven)

    @property
    def clip_norm(self) -> float:
        return 1.0 if self.mechanism == "laplace" else 2.0


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
        if p.calibration == "worst_case":  # a bound on what one record can change: the release is proven
            sens, guarantee = worst_case_sensitivity(result.samples_seen, local.batch_size, local.lr, local.epochs,
                                                     p.clip), "proven"
        else:
            # heuristic: Eq. 1.10's sensitivity, from an estimated Lipschitz constant and the batch
            # mean's clipping, is not a bound on what one record can change
            sens, guarantee = sensitivity(result.samples_seen, result.lipschitz, local.lr, local.epochs, p.clip), "heuristic"
        scale = noise_scale(p.mechanism, sens, p.factor, p.epsilon, p.delta)
        info.update(lipschitz=result.lipschitz, sensitivity=sens, noise_scale=scale)
        per_round = p.epsilon / p.factor  # Eq. 1.11 spends epsilon / c_T each round
        release = accounting.laplace_release("update", per_round, guarantee) if p.mechanism == "laplace" else \
            accounting.gaussian_release("update", scale, sens, per_round, p.delta, guarantee)
        return add_noise(state, p.mechanism, scale, rng), release


class DpSgdStage:
    """DP-SGD (Abadi et al. 2016) as a stage: per-sample clipping and Gaussian noise at every step
    of local training (node/cohort.py), nothing added afterwards. Its release is the sampled
    Gaussian mechanism over this round's steps, accounted in Renyi DP (node/accounting.py):
    with Poisson sampling at rate q = B/n per step; with shuffled batches, where sampling
    amplification is not proven, each record is in one batch per epoch, so an epoch is one
    Gaussian mechanism of sensitivity C and the epochs compose (RDP a E / (2 sigma^2))."""

    def __init__(self, privacy: Privacy):
        self.p = privacy

    def training(self, local: LocalTraining) -> LocalTraining:
        return replace(local, dpsgd=DpSgd(self.p.noise_multiplier, self.p.clip, self.p.sampling))

    def privatize(self, state, result: TrainingResult, local: LocalTraining, rng, info: dict[str, Any]):
        p = self.p
        sigma = p.noise_multiplier
        if p.sampling == "poisson":
            steps = local.epochs * epoch_steps(result.samples_seen, local)
            rdp = accounting.dpsgd_rdp(poisson_rate(result.samples_seen, local.batch_size), sigma, steps)
            rho = steps / (2.0 * sigma**2)  # zCDP without amplification: a valid, looser bound
        else:
            rho = local.epochs / (2.0 * sigma**2)
            rdp = tuple(a * rho for a in accounting.ORDERS)
        epsilon, _ = accounting.rdp_epsilon(rdp, p.accounting_delta)
        info.update(noise_multiplier=sigma, dp_epsilon=epsilon)
        # Poisson sampling's bound is about one record added or removed; shuffled fixed batches are
        # accounted for a record zeroed out (its batch keeps its size)
        adjacency = "add_remove" if p.sampling == "poisson" else "zero_out"
        return state, accounting.Release("update", "dpsgd", epsilon, p.accounting_delta, rho, rdp, "proven", adjacency)


def privacy_stage(privacy: Privacy) -> "LocalDP | DpSgdStage":
    """The client stage of the configured mechanism."""
    return DpSgdStage(privacy) if privacy.mechanism == "dpsgd" else LocalDP(privacy)
