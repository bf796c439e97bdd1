"""A robust aggregation strategy: the coordinate-wise trimmed mean (Yin et al., ICML 2018). Each
coordinate of the next model is the mean of the clients' values after dropping the `trim` share of
the largest and of the smallest: a few clients sending wild values cannot drag the model along."""
import math

import numpy as np
from pydantic import Field

from node.strategies import ClientUpdate, Options, Strategy


class TrimmedMean(Strategy):
    class Options(Options):
        trim: float = Field(0.1, ge=0, lt=0.5, description="share of clients dropped at each end, per coordinate")

    def __init__(self, options=None, *, seed: int = 0):
        super().__init__(options, seed=seed)
        self.states: list[dict[str, np.ndarray]] = []

    def on_update(self, update: ClientUpdate) -> None:
        self.states.append(update.state)

    def aggregate(self, global_state):
        states, self.states = self.states, []
        if not states:
            return dict(global_state)
        drop = math.floor(self.options.trim * len(states))
        out = {}
        for name, old in global_state.items():
            stacked = np.sort(np.stack([np.asarray(s[name], np.float64) for s in states]), axis=0)
            kept = stacked[drop:len(states) - drop]
            out[name] = kept.mean(axis=0).astype(old.dtype)
        return out
