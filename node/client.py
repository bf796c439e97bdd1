"""The client actor: receive the global model, declare the modelled training time, train for
real, send the model back."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

from protocol.codecs import Codec, CodecError, decode_state, encode_state
from .actor import Message, Reaction, Send
from .data import Dataset
from .models import build_model, load_numpy_state, state_spec, state_to_numpy
from .training import train_sgd


@dataclass
class ClientProfile:
    name: str
    index: int
    indices: np.ndarray  # the client's training samples
    ms_per_sample: float  # modelled compute speed of its device


@dataclass
class TaskSpec:
    model: str
    train: Dataset
    test: Dataset
    seed: int

    def build(self) -> torch.nn.Module:
        return build_model(self.model, self.train.input_shape, self.train.classes, seed=self.seed)


class Trainer:
    """One model instance shared by every client actor of a host (they train one at a time)."""

    def __init__(self, task: TaskSpec):
        self.task = task
        self.model = task.build()
        self.spec = state_spec(self.model)

    def train(self, state, indices, epochs, batch_size, lr, rng) -> tuple[dict[str, np.ndarray], float]:
        load_numpy_state(self.model, state)
        loss = train_sgd(self.model, self.task.train, indices, epochs, batch_size, lr, rng)
        return state_to_numpy(self.model), loss


def training_seconds(ms_per_sample: float, samples: int, epochs: int) -> float:
    return ms_per_sample * samples * epochs / 1000.0


class ClientActor:
    def __init__(self, profile: ClientProfile, trainer: Trainer, up_codec: Codec, seed: int):
        self.name = profile.name
        self.profile = profile
        self.trainer = trainer
        self.up_codec = up_codec
        self.seed = seed
        self.rejected = 0

    def react(self, msg: Message) -> Reaction:
        if msg.kind != "task":
            return Reaction()
        try:
            state, basis = decode_state(msg.frames, self.trainer.spec)
        except CodecError as exc:
            self.rejected += 1
            print(f"[{self.name}] rejected task of round {msg.round}: {exc}", file=sys.stderr)
            return Reaction(reports=[{"type": "rejected", "actor": self.name, "round": msg.round, "error": str(exc)}])
        if basis != "weights":
            return Reaction(reports=[{"type": "rejected", "actor": self.name, "round": msg.round, "error": "task must carry weights"}])
        epochs, batch_size, lr = int(msg.body["epochs"]), int(msg.body["batch_size"]), float(msg.body["lr"])
        samples = int(self.profile.indices.size)
        rng = np.random.default_rng([self.seed, msg.round, self.profile.index])

        def work() -> Reaction:
            new_state, loss = self.trainer.train(state, self.profile.indices, epochs, batch_size, lr, rng)
            if self.up_codec.encodes_delta:
                payload = {k: new_state[k] - state[k] for k in new_state}
                encoded = encode_state(payload, self.up_codec, rng, basis="delta")
            else:
                encoded = encode_state(new_state, self.up_codec, rng)
            body = {"samples": samples, "loss": loss}
            return Reaction(sends=[Send("server", "update", msg.round, body, encoded.frames,
                                       encoded.payload_bytes, encoded.fp32_bytes)])

        return Reaction(work_s=training_seconds(self.profile.ms_per_sample, samples, epochs), work=work)
