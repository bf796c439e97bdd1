"""Error feedback: the sender keeps what compression dropped and adds it to its next update
(e <- (d + e) - C(d + e); docs/algorithms.md part 4)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .base import Codec
from .state import EncodedState, decode_state, encode_state


class ErrorFeedback:
    """The compression residual of one sender. It costs no bytes: the residual never leaves it.

    The codec is given per message, so a bit schedule may change it from round to round."""

    def __init__(self) -> None:
        self.residual: dict[str, np.ndarray] = {}

    def reset(self) -> None:
        self.residual = {}

    def compress(self, update: Mapping[str, np.ndarray], codec: Codec, rng: np.random.Generator,
                 codec_for: Mapping[str, Codec] | None = None) -> tuple[EncodedState, dict[str, np.ndarray]]:
        """update + residual encoded as a delta, and the residual that remains once it is sent
        (not kept yet: the sender keeps it only if the message really leaves)."""
        corrected = {}
        for name, value in update.items():
            value = np.asarray(value)
            if np.issubdtype(value.dtype, np.floating):
                value = value.astype(np.float32) + self.residual.get(name, 0.0)
            corrected[name] = value
        encoded = encode_state(corrected, codec, rng, "delta", codec_for)
        decoded, _ = decode_state(encoded.frames)
        remaining = {name: value - decoded[name] for name, value in corrected.items()
                     if np.issubdtype(value.dtype, np.floating)}
        return encoded, remaining

    def encode(self, update: Mapping[str, np.ndarray], codec: Codec, rng: np.random.Generator) -> EncodedState:
        encoded, self.residual = self.compress(update, codec, rng)
        return encoded
