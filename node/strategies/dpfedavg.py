"""DP-FedAvg with user-level differential privacy (McMahan et al., ICLR 2018), server-side: each
client's model update is clipped to L2 norm C, the server adds Gaussian noise of std z C to their
sum and divides by the expected cohort, so one user's whole data changes the model by a bounded,
noised amount. With `adaptive_clip`, C follows a target quantile of the update norms (Andrew et
al., NeurIPS 2021), the clipped count noised and charged to the same budget.

Two trust models (algorithm.options.noise):
- server: the server clips each update and adds all the noise; it sees each client's clipped
  update before the noise, so the guarantee is about what the released models reveal of a user,
  to everyone but the server.
- client: each client clips its own update and adds its share of the noise, std z C / sqrt(m), m
  the cohort the round selected; under secure aggregation the server sees only the sum, whose
  noise has std z C when all m contribute (z sqrt(k/m) when k of them do: the ledger charges the
  noise that was added). Without secure aggregation the server sees each client's update with its
  share of the noise only: little protection from the server itself.
Each round is a release in the run's ledger (node/accounting.py's user_level_release): the
sampled Gaussian mechanism with q = cohort / the clients it was drawn from (those checked in and
alive; the whole population without check-in), composed over rounds in RDP."""
from __future__ import annotations

import math
from typing import Literal, Optional

import numpy as np
from pydantic import Field, model_validator

from .. import accounting
from .base import Capabilities, ClientUpdate, Options, RoundControl, State, Strategy, register


@register("dpfedavg")
class DpFedAvg(Strategy):
    uniform_weights = True  # its sensitivity is the clip: each client counts once
    capabilities = Capabilities(
        topologies=("star",), privacy=("none",), secure_aggregation=True,
        privacy_why="dpfedavg adds its own noise at the server (algorithm.options.noise_multiplier); "
                    "algorithm.privacy is local DP on each client")

    class Options(Options):
        clip: float = Field(1.0, gt=0, description="C: each client's update is clipped to this L2 norm (the start, "
                                                    "with adaptive_clip)")
        noise_multiplier: float = Field(1.0, gt=0, description="z: the noise on the sum of clipped updates has std z C")
        server_lr: float = Field(1.0, gt=0, description="the step along the noised mean update")
        adaptive_clip: bool = Field(False, description="move C toward target_quantile of the update norms (Andrew et al.)")
        target_quantile: float = Field(0.5, gt=0, lt=1, description="gamma: the share of updates C should leave unclipped")
        clip_lr: float = Field(0.2, gt=0, description="eta_C of the geometric clip update")
        count_noise: Optional[float] = Field(
            None, gt=0, description="sigma_b: std of the noise on the unclipped count; null: the cohort / 20, as Andrew "
                                    "et al., and at least noise_multiplier (the count then takes a quarter of the budget)")
        delta: Optional[float] = Field(None, gt=0, lt=1, description="the user-level delta; null: 1 / population^1.1")
        noise: Literal["server", "client"] = Field(
            "server", description="server: the server clips and noises; client: each client clips and adds std z C / "
                                  "sqrt(cohort), which composes with secure aggregation")

        @model_validator(mode="after")
        def _count_noise_leaves_room(self):
            if self.adaptive_clip and self.count_noise is not None and self.count_noise <= self.noise_multiplier / 2:
                raise ValueError(f"count_noise must be above noise_multiplier / 2 = {self.noise_multiplier / 2:g}: the "
                                 "clipped count and the update share one budget (Andrew et al. 2021, Thm. 1)")
            return self

        @model_validator(mode="after")
        def _client_noise_fixed_clip(self):
            if self.noise == "client" and self.adaptive_clip:
                raise ValueError("adaptive_clip: with noise client the clipped count would need a secure sum of its "
                                 "own; use a fixed clip")
            return self

    STATE = ("clip", "steps")

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        self.clip = self.options.clip
        self.steps = 0
        self._sum: dict[str, np.ndarray] = {}
        self._unclipped = 0
        self._contributors = 0  # noise client: the clients whose noise is in the sum
        self._cohort = 0
        self._population = 0
        self._eligible = 0
        self._releases: list = []

    @classmethod
    def secure_sum_why(cls, options: Options) -> str | None:
        if options.noise == "server":
            return ("dpfedavg with noise server clips each update at the server, which secure aggregation hides; set "
                    "algorithm.options.noise: client")
        return None

    def configure_round(self, control: RoundControl, global_state: State) -> dict:
        self._cohort, self._population, self._eligible = len(control.selected), control.population, control.eligible
        return {"dp_cohort": self._cohort, "dp_clip": self.clip} if self.options.noise == "client" else {}

    # ---- noise: client ----------------------------------------------------------------------------
    def client_release(self, global_state, new_state, task_body, rng, info):
        """Clip this client's update to C and add its share of the noise, std z C / sqrt(m)."""
        if self.options.noise != "client":
            return new_state, None
        clip, cohort = float(task_body["dp_clip"]), max(1, int(task_body["dp_cohort"]))
        floats = [k for k, v in new_state.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
        delta = {k: np.asarray(new_state[k], dtype=np.float64) - global_state[k] for k in floats}
        norm = math.sqrt(sum(float(np.square(d).sum()) for d in delta.values()))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        std = self.options.noise_multiplier * clip / math.sqrt(cohort)
        out = dict(new_state)
        for k in floats:
            noised = delta[k] * scale + rng.normal(0.0, std, size=delta[k].shape)
            out[k] = (global_state[k] + noised).astype(np.asarray(new_state[k]).dtype)
        info.update(update_norm=norm, noise_scale=std)
        return out, None

    def on_secure_sum(self, state: State, delta: State, weight: float, count: int, extras: State | None = None) -> None:
        """The cohort's sum of clipped, noised updates: mean change times the count (uniform weights)."""
        for k, d in delta.items():
            if np.issubdtype(np.asarray(d).dtype, np.floating):
                self._sum[k] = np.asarray(d, dtype=np.float64) * weight
        self._contributors = count

    def on_update(self, update: ClientUpdate) -> None:
        if self.options.noise == "client":  # clipped and noised on the client: summed as it is
            for k, d in update.delta.items():
                if np.issubdtype(np.asarray(d).dtype, np.floating):
                    self._sum[k] = self._sum.get(k, 0.0) + np.asarray(d, dtype=np.float64)
            self._contributors += 1
            return
        floats = [k for k, v in update.delta.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
        norm = math.sqrt(sum(float(np.square(update.delta[k], dtype=np.float64).sum()) for k in floats))
        scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
        self._unclipped += norm <= self.clip
        for k in floats:
            part = np.asarray(update.delta[k], dtype=np.float64) * scale
            self._sum[k] = self._sum[k] + part if k in self._sum else part

    def aggregate(self, global_state: State) -> State:
        """w + server_lr (sum of clipped updates + N(0, (z_delta C)^2)) / expected cohort."""
        cohort = max(1, self._cohort)
        o = self.options
        rng = np.random.default_rng([self.seed, self.steps, 0xD9])
        count_noise = (o.count_noise or max(cohort / 20.0, o.noise_multiplier)) if o.adaptive_clip else 0.0
        z = accounting.update_noise_multiplier(o.noise_multiplier, count_noise)
        out = dict(global_state)
        for k, w in global_state.items():
            if not np.issubdtype(w.dtype, np.floating):
                continue
            total = self._sum.get(k, np.zeros(w.shape))
            if o.noise == "server":
                total = total + rng.normal(0.0, z * self.clip, size=w.shape)
            out[k] = (w + o.server_lr * total / cohort).astype(w.dtype)
        if o.adaptive_clip:
            share = (self._unclipped + rng.normal(0.0, count_noise)) / cohort
            self.clip = accounting.adapted_clip(self.clip, share, o.target_quantile, o.clip_lr)
        if self._population:
            # the cohort is a uniform draw from the clients that could be selected (checked in, alive)
            q = min(1.0, cohort / (self._eligible or self._population))
            delta = o.delta or accounting.user_level_delta(self._population)
            # noise client: the k clients that contributed added k shares of z^2 C^2 / m
            z_added = o.noise_multiplier if o.noise == "server" else o.noise_multiplier * math.sqrt(self._contributors / cohort)
            if z_added > 0:
                self._releases.append(accounting.user_level_release(q, z_added, delta))
        self.steps += 1
        self._sum, self._unclipped, self._contributors = {}, 0, 0
        return out

    def take_releases(self) -> list:
        """The user-level releases since the last call (the server actor puts them in the ledger)."""
        out, self._releases = self._releases, []
        return out
