"""FedBuff (Nguyen et al. 2022): asynchronous FL with a buffer. Clients train on whatever model
version they were given; each update is weighted down by its staleness (server steps taken since
the client got its model) and buffered; every K updates the server steps and forgets the buffer.
The server actor dispatches a new client whenever one finishes (node/server.py AsyncServer)."""
from __future__ import annotations

import dataclasses

from typing import Literal, Optional

import numpy as np
from pydantic import Field

from .base import ClientUpdate, Options, State, Strategy, register
from .fedavg import FedAvg


def staleness_weight(staleness: int, kind: str = "polynomial", exponent: float = 0.5, a: float = 10.0, b: float = 4.0) -> float:
    """polynomial: (1 + s)^-exponent (FedBuff's 1/sqrt(1 + s) at 0.5); constant: 1;
    hinge (FedAsync): 1 for s <= b, else 1 / (a (s - b) + 1)."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return (1.0 + staleness) ** -exponent
    if kind == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"staleness weighting must be polynomial, constant or hinge, got {kind!r}")


class StalenessOptions(Options):
    """How a stale update is weighted, shared by FedBuff and the semi-asynchronous FedAvg."""
    staleness: Literal["polynomial", "constant", "hinge"] = Field(
        "polynomial", description="update weight by staleness s: polynomial (1+s)^-exponent, constant 1, hinge (FedAsync)")
    exponent: float = Field(0.5, ge=0, description="polynomial: 0.5 is FedBuff's 1/sqrt(1+s)")
    hinge_a: float = Field(10.0, gt=0, description="hinge: slope a of 1/(a(s-b)+1)")
    hinge_b: float = Field(4.0, ge=0, description="hinge: staleness b up to which updates count fully")
    max_staleness: Optional[int] = Field(None, ge=0, description="updates staler than this are discarded; null: none are")


class StalenessWeighting:
    """The weight and admission of stale updates, from a strategy's StalenessOptions."""
    options: StalenessOptions

    def weight(self, staleness: int) -> float:
        o = self.options
        return staleness_weight(staleness, o.staleness, o.exponent, o.hinge_a, o.hinge_b)

    def accepts(self, staleness: int) -> bool:
        return self.options.max_staleness is None or staleness <= self.options.max_staleness


@register("fedbuff")
class FedBuff(StalenessWeighting, Strategy):
    asynchronous = True
    uploads_delta = True  # the server may have moved on: a client sends what it changed, not its model

    class Options(StalenessOptions):
        buffer_size: int = Field(10, ge=1, description="K: the server steps at every K-th buffered update")
        concurrency: Optional[int] = Field(
            None, ge=1, description="clients training at once; null: the selection's clients per round")
        server_lr: float = Field(1.0, gt=0, description="eta_g: w <- w + eta_g * buffered mean")
        weighting: Literal["equal", "samples"] = Field(
            "equal", description="equal: sum of weighted deltas / K (the paper); samples: also by each client's samples")

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        self.buffer: dict[str, np.ndarray] = {}
        self.count = 0
        self.mass = 0.0  # sum of sample weights (weighting: samples)

    def on_update(self, update: ClientUpdate) -> None:
        w = self.weight(update.staleness)
        if self.options.weighting == "samples":
            w *= update.weight
            self.mass += update.weight
        for name, value in update.delta.items():
            contribution = np.asarray(value, dtype=np.float64) * w
            if name in self.buffer:
                self.buffer[name] += contribution
            else:
                self.buffer[name] = contribution
        self.count += 1

    def ready(self) -> bool:
        return self.count >= self.options.buffer_size

    def aggregate(self, global_state: State) -> State:
        buffer, count, mass = self.buffer, self.count, self.mass
        self.buffer, self.count, self.mass = {}, 0, 0.0
        if not count:
            return dict(global_state)
        norm = mass if self.options.weighting == "samples" else count
        lr = self.options.server_lr
        return {k: (w + lr * buffer[k] / norm).astype(w.dtype) if k in buffer else w for k, w in global_state.items()}


@register("semiasync")
class SemiAsync(StalenessWeighting, FedAvg):
    """Semi-asynchronous FedAvg: rounds close at their deadline as usual, but an update the
    deadline cut off is not thrown away; when it arrives it joins the round in progress with
    staleness s (rounds since its own), weighted by samples x w(s) in the average."""
    capabilities = dataclasses.replace(FedAvg.capabilities, secure_aggregation=False)  # late updates join alone

    keeps_late = True
    uploads_delta = True  # applied to the model of the round it joins

    class Options(StalenessOptions, FedAvg.Options):
        max_staleness: Optional[int] = Field(4, ge=0, description="updates staler than this are discarded; null: none are")

    def on_update(self, update: ClientUpdate) -> None:
        self.average.add(update.state, update.weight * self.weight(update.staleness))
