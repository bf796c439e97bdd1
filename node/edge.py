"""HierFAVG's edge aggregator (Liu et al. 2020): a server to its own clients for `edge_rounds`
rounds, then a client of the cloud server, to which it sends its model weighted by its clients'
data. Everything between is the synchronous server's (selection, deadlines, strategy)."""
from __future__ import annotations

from typing import Any

import numpy as np

from protocol.codecs import Codec, CodecError, decode_state
from .actor import Message, Reaction, Send
from .channel import Channel
from .server import ServerActor

CLOUD = "server"


class EdgeServer(ServerActor):
    STATE = ServerActor.STATE + ("cloud_round",)

    def __init__(self, name: str, cfg, clients: list[str], task, edge_rounds: int, cloud_codec: Codec):
        super().__init__(cfg, clients, task)
        self.name = name
        self.edge_rounds = edge_rounds
        self.to_cloud = Channel(cloud_codec)
        self.cloud_round = -1
        self.weight = float(sum(cfg.samples.get(c, 0) for c in clients))  # |D_e|

    def react(self, msg: Message) -> Reaction:
        if msg.kind == "start":
            return Reaction()  # the cloud starts each cloud round
        if msg.kind == "task" and msg.src == CLOUD:
            return self._on_cloud_model(msg)
        return super().react(msg)

    def _on_cloud_model(self, msg: Message) -> Reaction:
        try:
            state, basis = decode_state(msg.frames, self.spec)
            if basis != "weights":
                raise CodecError("the cloud's model must be weights")
        except CodecError as exc:
            return Reaction(reports=[{"type": "rejected", "actor": self.name, "round": msg.round, "error": str(exc)}])
        self.global_state = state
        self.cloud_round = msg.round
        first = msg.round * self.edge_rounds
        return self._wait_then_begin(first, msg.t) if self.cfg.checkin else self._begin(first, msg.t)

    def _after_round(self, index: int, t_end: float) -> Reaction:
        if (index + 1) % self.edge_rounds:
            return self._begin(index + 1, t_end)
        rng = np.random.default_rng([self.cfg.seed, self.cloud_round, 0xED])
        out = self.to_cloud.encode(self.global_state, rng)
        out.commit()
        encoded = out.encoded
        return Reaction(sends=[Send(CLOUD, "update", self.cloud_round, {"samples": self.weight},
                                    encoded.frames, encoded.payload_bytes, encoded.fp32_bytes)])

    def _report(self, rnd, t_end: float):
        report: dict[str, Any] = super()._report(rnd, t_end)  # edges do not evaluate: a dict
        report.update(type="edge_round", edge=self.name, cloud_round=self.cloud_round)
        return report
