"""The server and client actors of a star, with secure aggregation, driven in one process by a
small event loop: each message arrives 10 ms after it leaves, work takes its declared time, timers
fire, and a test may lose any message (a client that drops out in a phase) by a predicate. No
network process: these tests are about the protocol's state machines, byte for byte; the real
processes run in tests/test_secure_aggregation.py."""
from __future__ import annotations

import heapq
import itertools
from typing import Callable

import numpy as np

from node.actor import Message, Reaction
from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
from node.data import synthetic
from node.secure.client import SecureClient
from node.secure.config import SecureConfig
from node.server import ServerActor, ServerConfig
from protocol.codecs import make_codec

HOP_S = 0.01


class Star:
    def __init__(self, secure: SecureConfig | None, clients: int = 5, rounds: int = 1, seed: int = 3,
                 lose: Callable[[Message], bool] = lambda msg: False, strategy=None, timeout_s: float | None = None,
                 alter: Callable[[Message], Message] = lambda msg: msg):
        train, test = synthetic(40 * clients, 40, (1, 4, 4), 3, seed=seed)
        self.task = TaskSpec("mlp", train, test, seed=seed)
        names = [f"c{i}" for i in range(clients)]
        extra = {"strategy": strategy} if strategy is not None else {}
        cfg = ServerConfig(rounds=rounds, clients_per_round=clients, epochs=1, batch_size=20, lr=0.3,
                           down_codec=make_codec("fp32"), seed=seed, secure=secure, round_timeout_s=timeout_s,
                           samples={n: 40 - 5 * (i % 3) for i, n in enumerate(names)}, **extra)
        self.server = ServerActor(cfg, names, self.task)
        trainer = Trainer(self.task)
        ccfg = ClientConfig(make_codec("fp32"), seed=seed, secure=SecureClient(secure, seed) if secure else None, **extra)
        self.clients = {n: ClientActor(ClientProfile(n, i, np.arange(i * 40, i * 40 + 40 - 5 * (i % 3)), 1.0),
                                       trainer, ccfg) for i, n in enumerate(names)}
        self.actors = {"server": self.server, **self.clients}
        self.lose, self.alter = lose, alter
        self.reports: list[dict] = []
        self.sent: list[Message] = []
        self.queue: list = []
        self.seq = itertools.count()
        self.halted = False

    def push(self, msg: Message) -> None:
        heapq.heappush(self.queue, (msg.t, next(self.seq), msg))

    def apply(self, name: str, reaction: Reaction, t: float) -> None:
        for at, tag in reaction.timers:
            self.push(Message(name, name, "tick", -1, at, {"tag": tag}))
        for rep in reaction.reports:
            self.reports.append(rep() if callable(rep) else rep)
        for send in reaction.sends:
            for dst in send.dst if isinstance(send.dst, list) else [send.dst]:
                msg = self.alter(Message(name, dst, send.kind, send.round, t + HOP_S, send.body, list(send.frames), None))
                self.sent.append(msg)
                if not self.lose(msg):
                    self.push(msg)
        self.halted |= reaction.halt
        if reaction.work is not None:
            out = reaction.work()
            if callable(out):
                out = out()
            self.apply(name, out or Reaction(), t + reaction.work_s)

    def run(self, until_s: float = 10_000.0) -> "Star":
        self.apply("server", self.server.react(Message("server", "server", "start", -1, 0.0, {})), 0.0)
        while self.queue and not self.halted:
            t, _, msg = heapq.heappop(self.queue)
            if t > until_s:
                break
            self.apply(msg.dst, self.actors[msg.dst].react(msg), t)
        return self

    def rounds(self) -> list[dict]:
        return [r for r in self.reports if r.get("type") == "round"]

    def of_type(self, kind: str) -> list[dict]:
        return [r for r in self.reports if r.get("type") == kind]


def protocol(name: str, **kw) -> SecureConfig:
    return SecureConfig(protocol=name, bits=kw.pop("bits", 16), clip=kw.pop("clip", 0.5), **kw)


def lose_from(client: str, kind: str) -> Callable[[Message], bool]:
    """`client` drops out as it would send its first message of `kind` (and sends nothing after)."""
    gone = {"yes": False}

    def lose(msg: Message) -> bool:
        if msg.src == client and msg.kind == kind:
            gone["yes"] = True
        return gone["yes"] and client in (msg.src, msg.dst)

    return lose
