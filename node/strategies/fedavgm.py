"""FedAvgM (Hsu et al. 2019): FedAvg with server momentum. The "write your own strategy" example of
docs/guide/strategies.md: a strategy is one class in one file, registered by name."""
from __future__ import annotations

import numpy as np
from pydantic import Field

from .base import State, register
from .fedavg import FedAvg


@register("fedavgm")
class FedAvgM(FedAvg):
    """v <- beta v + (mean - w);  w <- w + server_lr v."""

    class Options(FedAvg.Options):
        momentum: float = Field(0.9, ge=0, lt=1, description="beta: the share of last round's velocity kept")

    STATE = ("velocity",)

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        self.velocity: State = {}

    def aggregate(self, global_state: State) -> State:
        mean = self.round_mean(global_state)
        if mean is None:  # nobody answered: the model and its velocity stay
            return dict(global_state)
        beta, lr = self.options.momentum, self.options.server_lr
        out = {}
        for k, w in global_state.items():
            step = mean[k].astype(np.float64) - w
            self.velocity[k] = beta * self.velocity.get(k, 0.0) + step
            out[k] = (w + lr * self.velocity[k]).astype(w.dtype)
        return out
