"""Compression as a channel (after FLSim's channels): one object per direction of one sender owns
the codec, its per-tensor overrides, the bit schedule, whether a message carries the sender's
weights or a delta against what the receiver holds, the sender's error feedback, and what went
through it. The server, the clients, the edges, the ring and the asynchronous server all send
models through one, so that bit-length and delta rules are written once."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from protocol.codecs import Codec, CodecError, ErrorFeedback, decode_state, encode_state
from protocol.codecs.state import EncodedState
from .schedule import BitSchedule

State = Mapping[str, np.ndarray]


@dataclass
class ChannelStats:
    """What left through a channel (messages whose send was committed)."""
    messages: int = 0
    payload_bytes: int = 0
    fp32_bytes: int = 0
    bits: list[int] = field(default_factory=list)  # the bit-length of each message, where the codec has one

    @property
    def saving_vs_fp32(self) -> float | None:
        return 1 - self.payload_bytes / self.fp32_bytes if self.fp32_bytes else None

    def as_dict(self) -> dict:
        return {"messages": self.messages, "payload_bytes": self.payload_bytes, "fp32_bytes": self.fp32_bytes,
                "saving_vs_fp32": self.saving_vs_fp32,
                "mean_bits": float(np.mean(self.bits)) if self.bits else None}


@dataclass
class Outgoing:
    """An encoded model ready for a Send, with its bit-length; commit() once it really leaves
    (it keeps the error-feedback residual and counts the message)."""
    encoded: EncodedState
    bits: int | None
    commit: Callable[[], None]
    extras_from: int | None = None  # the frame where the arrays sent beside the model begin (None: there are none)


class Channel:
    def __init__(self, codec: Codec, *, layers: Mapping[str, Codec] | None = None, schedule: BitSchedule | None = None,
                 side: str = "server", feedback: ErrorFeedback | None = None, stats: ChannelStats | None = None):
        """side: server (the schedule's b_t) or client (b_t scaled by the client's importance nu).
        feedback: the sender's error-feedback memory, if it keeps one; stats: where to count (the
        sender's, when it rebuilds its channel)."""
        self.codec = codec
        self.layers = dict(layers or {})
        self.schedule = schedule or BitSchedule()
        self.side = side
        self.feedback = feedback
        self.stats = stats if stats is not None else ChannelStats()

    @property
    def carries_delta(self) -> bool:
        """Whether a model goes as a delta against the receiver's: a sparsifier (it encodes updates)
        or error feedback (the residual is a delta's) asks for it."""
        return self.feedback is not None or self.codec.encodes_delta or any(c.encodes_delta for c in self.layers.values())

    def bits(self, round_: int, nu: float = 1.0) -> int | None:
        """This round's bit-length: the codec's own, or the schedule's (Eq. 1.5-1.7)."""
        base = getattr(self.codec, "bits", None)
        if not self.schedule.adaptive:
            return base
        return self.schedule.server_bits(round_, base) if self.side == "server" else self.schedule.client_bits(round_, base, nu)

    def encode(self, state: State, rng: np.random.Generator, *, bits: int | None = None, reference: State | None = None,
               delta: bool = False, is_delta: bool = False, extras: State | None = None) -> Outgoing:
        """`state` for the wire. is_delta: it already is one. Otherwise it goes as a delta against
        `reference` when the channel carries deltas or `delta` asks for it, else as weights.
        `extras`: a strategy's named arrays beside the model, encoded after it with the same codec
        and bit-length, in frames of their own; they count in the message's bytes."""
        codec = self.codec.with_bits(bits) if self.schedule.adaptive else self.codec
        if is_delta:
            payload, basis = state, "delta"
        elif reference is not None and (delta or self.carries_delta):
            payload, basis = {k: state[k] - reference[k] for k in state}, "delta"
        else:
            payload, basis = state, "weights"
        residual = None
        if self.feedback is not None and basis == "delta":
            encoded, residual = self.feedback.compress(payload, codec, rng, self.layers)
        else:
            encoded = encode_state(payload, codec, rng, basis=basis, codec_for=self.layers)
        extras_from = None
        if extras:
            extra = encode_state(extras, codec, rng)
            extras_from = len(encoded.frames)
            encoded = EncodedState(encoded.frames + extra.frames, encoded.payload_bytes + extra.payload_bytes,
                                   encoded.fp32_bytes + extra.fp32_bytes)

        def commit() -> None:
            if residual is not None:
                self.feedback.residual = residual
            self.stats.messages += 1
            self.stats.payload_bytes += encoded.payload_bytes
            self.stats.fp32_bytes += encoded.fp32_bytes
            if bits is not None:
                self.stats.bits.append(int(bits))

        return Outgoing(encoded, bits, commit, extras_from)


def decode_with_extras(frames, split, model_spec, extras_spec, what: str) -> tuple[dict, str, dict]:
    """A message's model (state, basis) and the arrays its strategy sends beside it (Channel.encode's
    extras, from frame `split` on, as the body's extras_from says). Without an extras spec the whole
    message is the model."""
    if not extras_spec:
        return (*decode_state(frames, model_spec), {})
    if not (isinstance(split, int) and 1 <= split < len(frames)):
        raise CodecError(f"the {what} does not carry the arrays its strategy sends beside the model "
                         f"(extras_from {split!r} of {len(frames)} frames)")
    state, basis = decode_state(frames[:split], model_spec)
    return state, basis, decode_state(frames[split:], extras_spec)[0]
