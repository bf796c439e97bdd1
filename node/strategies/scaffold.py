"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", ICML 2020) with option II control variates.

The server keeps a control variate c and each client its own c_i (zero at first), one array per
floating-point tensor of the model. A task carries c beside the model; the client trains with
every step's gradient corrected by c - c_i, then (option II)

    c_i+ = c_i - c + (x - y_i) / (K lr)      (x: the model it got, y_i: its trained model, K: its steps)

and sends its model with delta c_i = c_i+ - c_i beside it; c_i+ becomes its own once the update
leaves. The server moves the model as FedAvg does (the sample-weighted mean, with server_lr as the
paper's global step size) and c <- c + (1 / N) sum of the round's delta c_i, N the population. Both
arrays travel through the channel with the model's codec and bit-length: a round costs about twice
FedAvg's bytes each way."""
from __future__ import annotations

import numpy as np

from ..training import steps_per_epoch
from .base import Capabilities, ClientStep, ClientUpdate, RoundControl, State, register
from .fedavg import FedAvg

PREFIX = "c/"  # an array beside the model is the control variate of the tensor it names


@register("scaffold")
class Scaffold(FedAvg):
    # Its correction is added to every step's gradient, before any clipping, so the core paper's and
    # DP-SGD's sensitivities would not hold; its control variates are weights-like, not updates a
    # sparsifier could keep a few entries of; and its client state needs the synchronous star server.
    # Under secure aggregation, delta c_i travels in the same masked vector as the model's change,
    # and the server gets their sum (on_update of the one combined update adds it up as it is).
    capabilities = Capabilities(topologies=("star",), privacy=("none",), delta_codecs=False, communication_only=False,
                                secure_aggregation=True)
    STATE = ("c",)

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        self.c: State = {}
        self.population = 0
        self.delta_c_sum: dict[str, np.ndarray] = {}

    # ---- the arrays beside the model ----------------------------------------------------------
    def extras_spec(self, model_spec, direction: str):
        """Down: c; up: delta c_i. One float32 array per floating-point tensor of the model."""
        return {PREFIX + name: (shape, "f4") for name, (shape, dtype) in model_spec.items() if dtype == "f4"}

    def round_extras(self, global_state: State) -> State:
        return {PREFIX + name: self.c.get(name, np.zeros(w.shape, np.float32)).astype(np.float32)
                for name, w in global_state.items() if np.issubdtype(w.dtype, np.floating)}

    # ---- server ----------------------------------------------------------------------------------
    def configure_round(self, control: RoundControl, global_state: State) -> dict:
        self.population = control.population
        return {}

    def on_update(self, update: ClientUpdate) -> None:
        super().on_update(update)
        for key, value in update.extras.items():
            name = key[len(PREFIX):]
            self.delta_c_sum[name] = self.delta_c_sum.get(name, 0.0) + value.astype(np.float64)

    def aggregate(self, global_state: State) -> State:
        model = super().aggregate(global_state)
        sums, self.delta_c_sum = self.delta_c_sum, {}
        for name, total in sums.items():
            base = self.c.get(name, np.zeros(total.shape))
            self.c[name] = (base + total / max(1, self.population)).astype(np.float32)
        return model

    # ---- client ----------------------------------------------------------------------------------
    def client_step(self, state, config, train, extras, client_state) -> ClientStep:
        c = {key[len(PREFIX):]: value for key, value in extras.items()}
        c_i = client_state.get("c_i") or {name: np.zeros_like(value) for name, value in c.items()}
        correction = {name: c[name] - c_i[name] for name in c}
        new_state, result = train(state, config, correction=correction)
        steps = config.epochs * steps_per_epoch(result.samples_seen, config.batch_size)
        scale = 1.0 / (steps * config.lr)
        c_new = {name: (c_i[name] - c[name] + (state[name] - new_state[name]) * scale).astype(np.float32)
                 for name in c}
        delta = {PREFIX + name: c_new[name] - c_i[name] for name in c}
        return ClientStep(new_state, result, delta, {"c_i": c_new})
