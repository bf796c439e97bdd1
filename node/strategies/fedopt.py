"""Adaptive server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021): the
mean of the clients' updates is a pseudo-gradient, and the server steps along it with Adagrad, Adam
or Yogi. With Δ the sample-weighted mean update of the round (mean - w):

    m <- beta1 m + (1 - beta1) Δ
    v <- v + Δ²                                   (FedAdagrad)
    v <- beta2 v + (1 - beta2) Δ²                 (FedAdam)
    v <- v - (1 - beta2) Δ² sign(v - Δ²)          (FedYogi)
    w <- w + server_lr m / (sqrt(v) + tau)

m starts at 0 and v at tau² (the paper's v_-1 >= tau²), without bias correction, as in the paper's
Algorithm 2. Tensors that are not floating point (BatchNorm's counters) take the plain mean."""
from __future__ import annotations

import numpy as np
from pydantic import Field

from .base import State, register
from .fedavg import FedAvg


def second_moment(rule: str, v: np.ndarray, delta: np.ndarray, beta2: float) -> np.ndarray:
    """The next v of Adagrad, Adam or Yogi from the last v and this round's pseudo-gradient."""
    square = delta * delta
    if rule == "adagrad":
        return v + square
    if rule == "adam":
        return beta2 * v + (1 - beta2) * square
    if rule == "yogi":
        return v - (1 - beta2) * square * np.sign(v - square)
    raise ValueError(f"unknown rule {rule!r}")


@register("fedadam")
class FedAdam(FedAvg):
    """FedAvg's clients, Adam on the server."""
    rule = "adam"

    class Options(FedAvg.Options):
        server_lr: float = Field(0.01, gt=0, description="eta: the server's step size")
        beta1: float = Field(0.9, ge=0, lt=1, description="decay of the first moment m")
        beta2: float = Field(0.99, ge=0, lt=1, description="decay of the second moment v (not used by fedadagrad)")
        tau: float = Field(1e-3, gt=0, description="adaptivity: added to sqrt(v), and v starts at tau^2")

    STATE = ("m", "v")

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        self.m: State = {}
        self.v: State = {}

    def aggregate(self, global_state: State) -> State:
        mean = self.round_mean(global_state)
        if mean is None:  # nobody answered: the model and the moments stay
            return dict(global_state)
        o = self.options
        out = {}
        for k, w in global_state.items():
            if not np.issubdtype(w.dtype, np.floating):
                out[k] = mean[k]
                continue
            delta = mean[k].astype(np.float64) - w
            self.m[k] = o.beta1 * self.m.get(k, 0.0) + (1 - o.beta1) * delta
            self.v[k] = second_moment(self.rule, self.v.get(k, np.full(w.shape, o.tau ** 2)), delta, o.beta2)
            out[k] = (w + o.server_lr * self.m[k] / (np.sqrt(self.v[k]) + o.tau)).astype(w.dtype)
        return out


@register("fedyogi")
class FedYogi(FedAdam):
    """FedAvg's clients, Yogi on the server: v grows or shrinks by (1 - beta2) Δ² toward Δ²."""
    rule = "yogi"


@register("fedadagrad")
class FedAdagrad(FedAdam):
    """FedAvg's clients, Adagrad on the server: v sums every round's Δ²."""
    rule = "adagrad"
