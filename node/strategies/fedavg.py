"""FedAvg (McMahan et al. 2017) and FedProx (Li et al. 2020)."""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from ..strategy import WeightedAverage
from .base import Capabilities, ClientUpdate, Options, State, Strategy, register


@register("fedavg")
class FedAvg(Strategy):
    """The sample-weighted mean of the clients' models (Eq. 1.12), optionally a server step
    along it: w <- w + server_lr (mean - w). The cohort's mean from secure aggregation is the same
    mean (Strategy.on_secure_sum), so it and its subclasses take it unless they say otherwise."""

    capabilities = Capabilities(secure_aggregation=True)

    class Options(Options):
        server_lr: float = Field(1.0, gt=0, description="step along the averaged update; 1 is plain FedAvg")

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        self.average = WeightedAverage()

    @property
    def server_lr(self) -> float:
        return self.options.server_lr

    def on_update(self, update: ClientUpdate) -> None:
        self.average.add(update.state, update.weight)

    def round_mean(self, global_state: State) -> State | None:
        """The weighted mean of the models taken since the last call (None if none came); forgets them."""
        average, self.average = self.average, WeightedAverage()
        return average.result(global_state) if average.total > 0 else None

    def aggregate(self, global_state: State) -> State:
        mean = self.round_mean(global_state)
        lr = self.server_lr
        if mean is None or lr == 1.0:
            return mean or dict(global_state)
        return {k: (global_state[k] + lr * (mean[k] - global_state[k])).astype(global_state[k].dtype) for k in mean}


@register("fedprox")
class FedProx(FedAvg):
    """FedAvg whose clients add (mu/2) ||w - w_global||^2 to their local loss."""

    class Options(FedAvg.Options):
        mu: float = Field(0.01, ge=0, description="proximal weight")

    def local_update(self, state, config, train):
        return train(state, replace(config, prox_mu=self.options.mu))
