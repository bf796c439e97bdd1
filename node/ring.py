"""The serverless ring client of the FIRMA family (FibFL, FibFL+, FibFL++; docs/algorithms.md part 2).

Each client owns its model and its persistent Adam optimizers. A round is: local training
(two-phase, or full-model during FibFL++'s warm-up), then K gossip passes in which it sends its
extractor to both ring neighbours and blends in theirs, then it evaluates itself on its own test
split and begins the next round. Nothing waits on a global barrier: a pass completes when both
neighbours' messages of that pass are in, which gives exactly the synchronous passes of the
paper's simulation (each pass reads the previous pass's parameters of self and neighbours).

Warm-up rounds (FibFL++) are a FedAvg of the full model, heads included, run by an aggregator:
everyone sends it their model, it averages weighted by samples and sends the result back. The
aggregator is a server-like actor with a link of its own (`WarmupAggregator`, the default, as in
FIRMA's simulation, where a central FedAvg precedes the gossip) or an elected peer, the first client
on the ring, whose access link then carries every model both ways. Both average with one
`WarmupRound`. The head never leaves a client after warm-up: the gossip payload is built from the
extractor's keys only."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from protocol.codecs import Codec, CodecError, decode_state, make_codec
from .channel import Channel
from . import firma
from .actor import Message, Reaction, Send, portable
from .client import ClientProfile, TaskSpec
from .compute import full_speed_seconds
from .models import load_numpy_state, state_spec, state_to_numpy
from .strategy import WeightedAverage
from .training import accuracy_on, train_part


WARMUP_AGGREGATOR = "server"  # the warm-up aggregator's actor name: the server process's, with the server's link


@dataclass
class RingConfig:
    variant: str  # fibfl | fibfl+ | fibfl++
    rounds: int
    order: list[str]  # client names in ring order
    seed: int
    epochs_head: int = 1
    epochs_extractor: int = 20
    lr: float = 0.01
    batch_size: int = 64
    gamma: float = 0.5  # FibFL, FibFL+
    gamma_start: float = 0.4  # FibFL++
    gamma_end: float = 0.05
    tau: float = 0.35
    codec: Codec = field(default_factory=lambda: make_codec("fp32"))
    eval_every: int = 1
    private_prefix: str = "head."
    pass_timeout_s: float | None = None  # give up waiting for a neighbour (or the warm-up aggregator) after this
    head_epoch_share: float = 1.0  # cost of a head-only epoch against a full one (the frozen extractor: forward only)
    init: str = "independent"  # independent: each client its own initial model (FIRMA's code); shared: one for all
    warmup_via: str = "peer"  # server: the warm-up's own aggregator actor (WARMUP_AGGREGATOR); peer: the first client
    # after every this many rounds all clients meet at a barrier, where the run is checkpointed
    checkpoint_every: int | None = None

    @property
    def passes(self) -> int:
        return firma.passes(len(self.order), self.variant)

    @property
    def warmup(self) -> int:
        return firma.warmup_rounds(self.rounds, self.variant)

    @property
    def aggregator(self) -> str:
        return WARMUP_AGGREGATOR if self.warmup_via == "server" else self.order[0]

    def aggregator_wait_s(self) -> float | None:
        """How long a client waits for the warm-up average after sending its model: the aggregator
        may itself wait out a silent peer (one timeout), then sends to N - 1 (or N) clients through
        its uplink, where a pass sends to two."""
        timeout = self.pass_timeout_s
        return None if timeout is None else timeout * (1 + (len(self.order) - 1) / 2)

    def neighbours(self, name: str) -> tuple[str, str]:
        p = self.order.index(name)
        n = len(self.order)
        return self.order[(p - 1) % n], self.order[(p + 1) % n]


class WarmupRound:
    """The models of one warm-up round as they come in, and their sample-weighted average (FedAvg)
    once every live client's model is in, or, forced by a timeout, of those that are."""

    def __init__(self) -> None:
        self.models: dict[str, tuple[dict[str, np.ndarray], float]] = {}

    def add(self, name: str, state: dict[str, np.ndarray], samples: float) -> None:
        self.models[name] = (state, samples)

    def average(self, order: list[str], lost: set[str], force: bool = False) -> dict[str, np.ndarray] | None:
        alive = [n for n in order if n not in lost and (not force or n in self.models)]
        if not alive or any(n not in self.models for n in alive):
            return None
        average = WeightedAverage()
        for name in alive:
            average.add(*self.models[name])
        return average.result(self.models[alive[0]][0])


class WarmupAggregator:
    """FibFL++'s warm-up FedAvg as an actor of its own, in the server process with the server's link
    (`algorithm.firma.warmup_aggregator: server`). It waits for every live client's model of a
    warm-up round, or with a pass timeout for those in by then (counted from the first), averages
    them by samples after `aggregate_s` of modelled work, and sends the average to every live client."""
    name = WARMUP_AGGREGATOR

    def __init__(self, cfg: RingConfig, task: TaskSpec, aggregate_s: float = 0.0):
        self.cfg = cfg
        self.aggregate_s = aggregate_s
        self.spec = state_spec(task.build())
        self.channel = Channel(cfg.codec)
        self.rounds: dict[int, WarmupRound] = defaultdict(WarmupRound)
        self.lost: set[str] = set()
        self.averaged = -1  # the last warm-up round averaged
        self.ready: dict[int, dict[str, np.ndarray]] = {}  # averages waiting out the aggregation time

    def snapshot(self) -> dict[str, Any]:
        return {"rounds": dict(self.rounds), "lost": self.lost, "averaged": self.averaged, "ready": self.ready}

    def restore(self, state: dict[str, Any]) -> None:
        self.rounds = defaultdict(WarmupRound, state["rounds"])
        self.lost, self.averaged, self.ready = state["lost"], state["averaged"], state["ready"]

    def react(self, msg: Message) -> Reaction:
        if msg.kind == "warmup_update":
            return self._on_update(msg)
        if msg.kind == "peer_down":
            self.lost |= set(msg.body.get("actors", []))
            reaction = Reaction()
            for index in sorted(self.rounds):
                reaction.timers += self._maybe_average(index, msg.t).timers
            return reaction
        if msg.kind == "tick":
            kind, _, rest = msg.body.get("tag", "").partition(":")
            if kind == "warmup" and int(rest) in self.rounds:
                return self._maybe_average(int(rest), msg.t, force=True)
            if kind == "send" and int(rest) in self.ready:
                return self._send(int(rest))
        return Reaction()

    def _on_update(self, msg: Message) -> Reaction:
        if msg.round <= self.averaged:
            return Reaction()  # came after the round was averaged without it
        try:
            state, _ = decode_state(msg.frames, self.spec)
        except CodecError as exc:
            return Reaction(reports=[{"type": "rejected", "actor": self.name, "round": msg.round,
                                      "error": f"warm-up update from {msg.src}: {exc}"}])
        first = msg.round not in self.rounds
        self.rounds[msg.round].add(msg.src, state, float(msg.body["samples"]))
        reaction = self._maybe_average(msg.round, msg.t)
        if first and msg.round in self.rounds and self.cfg.pass_timeout_s is not None:
            reaction.timers.append((msg.t + self.cfg.pass_timeout_s, f"warmup:{msg.round}"))
        return reaction

    def _maybe_average(self, index: int, t: float, force: bool = False) -> Reaction:
        """The average is formed now and leaves after the modelled aggregation time (a timer)."""
        state = self.rounds[index].average(self.cfg.order, self.lost, force)
        if state is None:
            return Reaction()
        del self.rounds[index]
        self.averaged = max(self.averaged, index)
        self.ready[index] = state
        return Reaction(timers=[(t + self.aggregate_s, f"send:{index}")])

    def _send(self, index: int) -> Reaction:
        state = self.ready.pop(index)
        targets = [n for n in self.cfg.order if n not in self.lost]
        if not targets:
            return Reaction()
        out = self.channel.encode(state, np.random.default_rng([self.cfg.seed, index, len(self.cfg.order), 1]))
        out.commit()
        encoded = out.encoded
        return Reaction(sends=[Send(targets, "warmup_model", index, {}, encoded.frames, encoded.payload_bytes,
                                    encoded.fp32_bytes)])


class Evaluator:
    """One evaluation model per host, used only on the runtime's reporter thread."""

    def __init__(self, task: TaskSpec):
        self.task = task
        self.model = task.build()

    def __call__(self, state: dict[str, np.ndarray], indices: np.ndarray) -> tuple[float, float]:
        load_numpy_state(self.model, state)
        return accuracy_on(self.model, self.task.test, indices)


class RingClientActor:
    def __init__(self, profile: ClientProfile, task: TaskSpec, cfg: RingConfig, evaluator: Evaluator):
        self.name = profile.name
        self.profile = profile
        self.task = task
        self.cfg = cfg
        self.evaluate = evaluator
        # FIRMA's code builds the clients one after another after one torch.manual_seed, so each
        # starts from its own initialisation (init: independent); init: shared gives all one.
        self.model = task.build() if cfg.init == "shared" else task.build(seed=task.seed * 1_000_003 + profile.index + 1)
        self.data, self.indices = profile.training_data(task.train, cfg.seed)
        self.spec = state_spec(self.model)
        self.shared_keys = [k for k in self.spec if not k.startswith(cfg.private_prefix)]
        self.channel = Channel(cfg.codec)  # gossip carries weights (validation refuses delta codecs here)
        self.shared_spec = {k: self.spec[k] for k in self.shared_keys}
        named = dict(self.model.named_parameters())
        head = [p for k, p in named.items() if k.startswith(cfg.private_prefix)]
        extractor = [p for k, p in named.items() if not k.startswith(cfg.private_prefix)]
        self.head_params, self.extractor_params = head, extractor
        self.opt_head = torch.optim.Adam(head, lr=cfg.lr)
        self.opt_extractor = torch.optim.Adam(extractor, lr=cfg.lr)
        self.opt_warmup = torch.optim.Adam(list(self.model.parameters()), lr=cfg.lr)
        self.left, self.right = cfg.neighbours(self.name)
        self.lost: set[str] = set()
        self.round = -1
        self.pass_index = 0
        self.round_start = 0.0
        self.trained_at = 0.0
        self.accuracy = 0.0  # a_i: train-set accuracy after this round's training
        self.loss: float | None = None
        self.last_weights: tuple[float, float] | None = None
        self.inbox: dict[tuple[int, int], dict[str, tuple[dict, float]]] = defaultdict(dict)
        self.warm_models: dict[int, WarmupRound] = defaultdict(WarmupRound)  # the elected peer only
        self.timeouts = 0  # passes (or warm-ups) of this round that went on without a silent neighbour
        self.device: dict | None = None  # the device's state, as last delivered
        self.phase = "idle"  # idle | training | gossip | warmup_wait | barrier | finished

    # ---- checkpoints: taken at a barrier, where no client is working -----------------------------
    STATE = ("lost", "round", "pass_index", "round_start", "trained_at", "accuracy", "loss", "last_weights",
             "timeouts", "device", "phase")

    def snapshot(self) -> dict[str, Any]:
        return {**{name: portable(getattr(self, name)) for name in self.STATE},
                "inbox": portable(dict(self.inbox)), "warm_models": dict(self.warm_models),
                "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
                "optimizers": [o.state_dict() for o in (self.opt_head, self.opt_extractor, self.opt_warmup)]}

    def restore(self, state: dict[str, Any]) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])
        self.inbox = defaultdict(dict, state["inbox"])
        self.warm_models = defaultdict(WarmupRound, state["warm_models"])
        self.model.load_state_dict(state["model"])
        for optimizer, saved in zip((self.opt_head, self.opt_extractor, self.opt_warmup), state["optimizers"]):
            optimizer.load_state_dict(saved)

    # ---- reactions ---------------------------------------------------------------------------
    def react(self, msg: Message) -> Reaction:
        if msg.device:
            self.device = msg.device
        if msg.kind == "start":
            return self._begin(0, msg.t)
        if msg.kind == "gossip":
            return self._on_gossip(msg)
        if msg.kind == "warmup_update":
            return self._on_warmup_update(msg)
        if msg.kind == "warmup_model":
            return self._on_warmup_model(msg)
        if msg.kind == "tick":
            return self._on_timeout(msg.body.get("tag", ""), msg.t)
        if msg.kind == "peer_down":
            self.lost |= set(msg.body.get("actors", [])) - {self.name}
            if self.phase == "warmup_wait" and self.name == self.cfg.aggregator:
                return self._maybe_average(self.round, msg.t)
            if self.phase == "warmup_wait" and self.cfg.aggregator in self.lost:
                return self._finish(msg.t, None)  # no average will come: keep the own model
            return self._advance(msg.t)
        return Reaction()

    def _begin(self, index: int, t: float) -> Reaction:
        self.round, self.pass_index, self.round_start, self.timeouts = index, 0, t, 0
        if index >= self.cfg.rounds:
            self.phase = "finished"
            return Reaction(reports=[{"type": "ring_finished", "client": self.name, "t": t}])
        self.phase = "training"
        warm = index < self.cfg.warmup
        epochs = max(self.cfg.epochs_head, self.cfg.epochs_extractor) if warm else self.cfg.epochs_head + self.cfg.epochs_extractor
        n, bs = int(self.profile.indices.size), self.cfg.batch_size
        if warm:
            busy = full_speed_seconds(self.profile.ms_per_sample, n, epochs, bs, self.profile.ms_per_batch)
        else:  # a head-only epoch runs the frozen extractor forward only
            busy = full_speed_seconds(self.profile.ms_per_sample * self.cfg.head_epoch_share, n, self.cfg.epochs_head, bs,
                                      self.profile.ms_per_batch) \
                + full_speed_seconds(self.profile.ms_per_sample, n, self.cfg.epochs_extractor, bs, self.profile.ms_per_batch)
        duration = self.profile.duration(busy, t, self.device)
        rng = np.random.default_rng([self.cfg.seed, index, self.profile.index])
        data, idx, bs = self.data, self.indices, self.cfg.batch_size

        def work():
            if warm:
                loss = train_part(self.model, list(self.model.parameters()), self.opt_warmup, data, idx, epochs, bs, rng)
            else:
                train_part(self.model, self.head_params, self.opt_head, data, idx, self.cfg.epochs_head, bs, rng)
                loss = train_part(self.model, self.extractor_params, self.opt_extractor, data, idx,
                                  self.cfg.epochs_extractor, bs, rng)
            accuracy, _ = accuracy_on(self.model, data, idx)

            def trained() -> Reaction:
                self.loss, self.accuracy = loss, accuracy
                self.trained_at = t + duration
                return self._after_warmup_training(t + duration) if warm else self._send_pass(1, t + duration)

            return trained

        return Reaction(work_s=duration, busy_s=busy, work=work)

    def _reject(self, msg: Message, error: str) -> Reaction:
        """A message that does not decode is an incident of the run; the client goes on without it."""
        return Reaction(reports=[{"type": "rejected", "actor": self.name, "round": msg.round, "error": error}])

    def _encode(self, state, rng):
        out = self.channel.encode(state, rng)
        out.commit()
        return out.encoded

    # ---- gossip ------------------------------------------------------------------------------
    def _send_pass(self, k: int, t: float) -> Reaction:
        self.phase, self.pass_index = "gossip", k
        state = state_to_numpy(self.model)
        shared = {key: state[key] for key in self.shared_keys}
        rng = np.random.default_rng([self.cfg.seed, self.round, self.profile.index, k])
        encoded = self._encode(shared, rng)
        targets = [n for n in dict.fromkeys([self.left, self.right]) if n not in self.lost]
        sends = [Send(targets, "gossip", self.round, {"pass": k, "acc": self.accuracy}, encoded.frames,
                      encoded.payload_bytes, encoded.fp32_bytes)] if targets else []
        reaction = self._advance(t)
        reaction.sends[:0] = sends
        if self.cfg.pass_timeout_s is not None and self.pass_index == k and self.phase == "gossip":
            reaction.timers.append((t + self.cfg.pass_timeout_s, f"pass:{self.round}:{k}"))
        return reaction

    def _on_timeout(self, tag: str, t: float) -> Reaction:
        """A neighbour (or the aggregator) stayed silent too long: go on with what has arrived."""
        kind, _, rest = tag.partition(":")
        if kind == "barrier" and self.phase == "barrier" and rest == str(self.round):
            return self._begin(self.round + 1, t)  # every client is here and the run is checkpointed
        if kind == "pass" and self.phase == "gossip" and rest == f"{self.round}:{self.pass_index}":
            self.timeouts += 1
            return self._advance(t, force=True)
        if kind == "warmup" and self.phase == "warmup_wait" and rest == str(self.round):
            self.timeouts += 1
            if self.name == self.cfg.aggregator:
                return self._maybe_average(self.round, t, force=True)
            return self._finish(t, None)  # no average came back: keep the own model
        return Reaction()

    def _on_gossip(self, msg: Message) -> Reaction:
        try:
            state, _ = decode_state(msg.frames, self.shared_spec)
        except CodecError as exc:
            return self._reject(msg, f"gossip from {msg.src}: {exc}")
        self.inbox[(msg.round, int(msg.body["pass"]))][msg.src] = (state, float(msg.body["acc"]))
        return self._advance(msg.t)

    def _advance(self, t: float, force: bool = False) -> Reaction:
        """Complete the current pass if both neighbours' messages (or news of their loss) are in, or,
        forced by the pass timeout, with whatever has arrived."""
        if self.phase != "gossip":
            return Reaction()
        key = (self.round, self.pass_index)
        got = self.inbox[key]
        if not force and any(n not in got and n not in self.lost for n in (self.left, self.right)):
            return Reaction()
        del self.inbox[key]
        for stale in [k for k in self.inbox if k < key]:  # messages that came after their pass timed out
            del self.inbox[stale]
        left, right = got.get(self.left), got.get(self.right)
        weights = firma.neighbour_weights(left[1] if left else None, right[1] if right else None,
                                          gated=self.cfg.variant != "fibfl", tau=self.cfg.tau)
        gamma_r = firma.retention(self.round, self.cfg.rounds, self.cfg.variant, self.cfg.gamma,
                                  self.cfg.gamma_start, self.cfg.gamma_end)
        gamma_in = firma.per_pass_retention(gamma_r, self.cfg.passes)
        state = state_to_numpy(self.model)
        own = {k: state[k] for k in self.shared_keys}
        state.update(firma.blend(own, left[0] if left else None, right[0] if right else None, weights, gamma_in))
        load_numpy_state(self.model, state)
        self.last_weights = weights
        if self.pass_index < self.cfg.passes:
            return self._send_pass(self.pass_index + 1, t)
        return self._finish(t, gamma_r)

    # ---- FibFL++ warm-up: FedAvg through the aggregator (its own actor, or the elected peer) -----
    def _after_warmup_training(self, t: float) -> Reaction:
        self.phase = "warmup_wait"
        state = state_to_numpy(self.model)
        samples = float(self.profile.indices.size)
        timeout = self.cfg.pass_timeout_s
        if self.name == self.cfg.aggregator:
            self.warm_models[self.round].add(self.name, state, samples)
            reaction = self._maybe_average(self.round, t)
            if self.phase == "warmup_wait" and timeout is not None:
                reaction.timers.append((t + timeout, f"warmup:{self.round}"))
            return reaction
        if self.cfg.aggregator in self.lost:
            return self._finish(t, None)  # nobody to average with: keep the own model
        wait = self.cfg.aggregator_wait_s()
        timers = [(t + wait, f"warmup:{self.round}")] if wait is not None else []
        rng = np.random.default_rng([self.cfg.seed, self.round, self.profile.index, 0])
        encoded = self._encode(state, rng)
        return Reaction(sends=[Send(self.cfg.aggregator, "warmup_update", self.round, {"samples": samples},
                                    encoded.frames, encoded.payload_bytes, encoded.fp32_bytes)], timers=timers)

    def _on_warmup_update(self, msg: Message) -> Reaction:
        if msg.round < self.round or (msg.round == self.round and self.phase not in ("training", "warmup_wait")):
            return Reaction()  # came after the aggregator gave up waiting for it
        try:
            state, _ = decode_state(msg.frames, self.spec)
        except CodecError as exc:
            return self._reject(msg, f"warm-up update from {msg.src}: {exc}")
        self.warm_models[msg.round].add(msg.src, state, float(msg.body["samples"]))
        return self._maybe_average(msg.round, msg.t)

    def _maybe_average(self, index: int, t: float, force: bool = False) -> Reaction:
        if self.phase != "warmup_wait" or index != self.round or index not in self.warm_models:
            return Reaction()
        state = self.warm_models[index].average(self.cfg.order, self.lost, force)
        if state is None:
            return Reaction()
        del self.warm_models[index]
        load_numpy_state(self.model, state)
        others = [n for n in self.cfg.order if n != self.name and n not in self.lost]
        rng = np.random.default_rng([self.cfg.seed, index, self.profile.index, 1])
        encoded = self._encode(state, rng)
        reaction = self._finish(t, None)
        if others:
            reaction.sends.insert(0, Send(others, "warmup_model", index, {}, encoded.frames, encoded.payload_bytes, encoded.fp32_bytes))
        return reaction

    def _on_warmup_model(self, msg: Message) -> Reaction:
        if self.phase != "warmup_wait" or msg.round != self.round:
            return Reaction()
        try:
            state, _ = decode_state(msg.frames, self.spec)
        except CodecError as exc:
            return self._reject(msg, f"warm-up model: {exc}")
        load_numpy_state(self.model, state)
        return self._finish(msg.t, None)

    # ---- round end ---------------------------------------------------------------------------
    def _finish(self, t: float, gamma_r: float | None) -> Reaction:
        index = self.round
        base: dict[str, Any] = {
            "type": "ring_round", "client": self.name, "round": index, "t_start": self.round_start, "t_end": t,
            "compute_end": self.trained_at, "samples": int(self.profile.indices.size), "loss": self.loss,
            "train_accuracy": self.accuracy, "gamma": gamma_r, "warmup": index < self.cfg.warmup,
            "weight_left": self.last_weights[0] if self.last_weights and gamma_r is not None else None,
            "timeouts": self.timeouts,
        }
        due = self.cfg.eval_every > 0 and (index % self.cfg.eval_every == 0 or index + 1 == self.cfg.rounds)
        report: Any = base
        if due and self.profile.test_indices is not None:
            snapshot = state_to_numpy(self.model)
            test = self.profile.test_indices

            def evaluated() -> dict[str, Any]:
                acc, loss = self.evaluate(snapshot, test)
                return {**base, "accuracy": acc, "test_loss": loss}

            report = evaluated
        every = self.cfg.checkpoint_every
        if every and (index + 1) % every == 0 and index + 1 < self.cfg.rounds:
            self.phase = "barrier"  # wait for the others there: the next round begins after the checkpoint
            return Reaction(reports=[report], barrier=index)
        reaction = self._begin(index + 1, t)
        reaction.reports.insert(0, report)
        return reaction
