"""The FedAvg server actor: select, broadcast, collect, aggregate, evaluate, repeat."""
from __future__ import annotations

import dataclasses

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol.codecs import Codec, CodecError, decode_state
from .actor import Checkpointable, Message, Reaction, Send
from .client import TaskSpec
from .models import load_numpy_state, state_spec, state_to_numpy
from .schedule import BitSchedule
from .strategies import ClientUpdate, RoundControl, Strategy
from .strategies.base import Difference
from .strategies.fedavg import FedAvg
from .channel import Channel, decode_with_extras
from .selection import SelectionContext, Selector, Uniform
from .secure.actor import SecureRounds
from .secure.config import SecureConfig
from .secure.server import SERVER_KINDS, TIMER, SecureRound
from .training import accuracy_on, evaluate

log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    rounds: int
    clients_per_round: int
    epochs: int
    batch_size: int
    lr: float
    down_codec: Codec
    seed: int
    eval_every: int = 1
    eval_max_samples: int | None = None
    round_timeout_s: float | None = None  # deadline after the round starts; None waits for everyone
    aggregate_s: float = 0.0  # modelled aggregation time
    schedule: BitSchedule = field(default_factory=BitSchedule)
    samples: dict[str, int] = field(default_factory=dict)  # n_i of each client, for n_max (Eq. 1.7)
    selector: Selector = field(default_factory=Uniform)  # selection.policy: who of the pool takes part
    over_selection: float = 1.0  # select ceil(K * this)
    round_policy: str = "all"  # all: wait for every selected client (or the deadline); first_k: close at K updates
    notify_closed: bool = False  # tell the clients still working on a round that it closed (they stop, upload nothing)
    checkin: bool = False  # True: only clients that checked in are eligible, with their reported status
    checkin_wait_s: float = 0.0  # how long to collect check-ins before a round when too few are eligible
    min_clients: int = 1  # a round needs this many eligible clients...
    wait_s: float = 300.0  # ...and waits this long (emulated, for check-ins) before it runs with fewer or is skipped
    strategy: Strategy = field(default_factory=FedAvg)  # the algorithm: what rounds send, how updates combine
    eval_shards: list[np.ndarray] | None = None  # evaluate on each client's test split and average
    down_layers: dict[str, Codec] = field(default_factory=dict)  # mixed precision: tensor name -> its own codec
    checkpoint_every: int | None = None  # ask for a checkpoint after every this many rounds
    secure: SecureConfig | None = None  # algorithm.secure_aggregation: the round's sum through node/secure/server.py


# What an update's body tells the server of its client: its aggregation weight and the bit-length of
# its payload. Its diagnostics (loss, lambda, noise, epsilon) reach the run's records beside the
# message, never the server (node/actor.py's Send.notes).
CLIENT_FIELDS = ("samples", "bits")


@dataclass
class RoundState:
    index: int
    t_start: float
    selected: list[str]
    waiting: set[str]
    completed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rejected: int = 0
    bits_down: int | None = None
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)  # per selected client: what it reported, outcome
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # check-in status each was selected on
    stale: list[dict[str, Any]] = field(default_factory=list)  # late updates of earlier rounds that joined this one
    secure: dict[str, Any] | None = None  # secure aggregation's phases (node/secure/server.py)
    eligible: int = 0  # the clients the round selected from (the sampling rate's denominator)


class ServerActor(SecureRounds, Checkpointable):
    name = "server"
    # a check-in only joins the pool (node/actor.py quiet_kinds): the clock need not wait for it
    quiet_kinds = frozenset({"checkin"})
    STATE = ("global_state", "pool", "down", "round", "late", "last_round_end", "short_since", "rounds_with_clients",
             "strategy_state", "selector_state", "overdue", "carried")

    def __init__(self, cfg: ServerConfig, clients: list[str], task: TaskSpec):
        self.cfg = cfg
        self.clients = list(clients)
        self.task = task
        self.strategy = cfg.strategy
        model = task.build()
        self.spec = state_spec(model)
        self.global_state = state_to_numpy(model)
        self.eval_model = task.build()
        self.down: set[str] = set()
        self.round: RoundState | None = None
        self.late = 0
        # who may be selected, with their last reported status; without check-in, everyone
        self.pool: dict[str, dict[str, Any]] = {} if cfg.checkin else {c: {} for c in self.clients}
        self.last_round_end = 0.0
        self.short_since: float | None = None  # when the current round began waiting for eligible clients
        self.rounds_with_clients = 0
        self.selector = cfg.selector
        self.overdue: dict[str, list[int]] = {}  # keeps_late strategies: client -> rounds whose deadline cut it off
        self.carried: list[tuple] = []  # late updates that came between rounds, for the next one
        self.downlink = Channel(cfg.down_codec, layers=cfg.down_layers, schedule=cfg.schedule, side="server")
        self.model_bytes = 4 * sum(int(np.prod(shape)) for shape, _ in self.spec.values())
        self.secure: SecureRound | None = None  # the round's secure aggregation, while it runs

    @property
    def selector_state(self) -> dict[str, Any]:
        return self.selector.snapshot()

    @selector_state.setter
    def selector_state(self, state: dict[str, Any]) -> None:
        self.selector.restore(state)

    @property
    def strategy_state(self) -> dict[str, Any]:
        return self.strategy.snapshot()

    @strategy_state.setter
    def strategy_state(self, state: dict[str, Any]) -> None:
        self.strategy.restore(state)

    def _control(self, rnd: RoundState) -> RoundControl:
        return RoundControl(rnd.index, rnd.selected, self.cfg.seed,
                            lambda client, what, error: self._reject(rnd, client, what, error, {}), len(self.clients),
                            rnd.eligible)

    # ---- reactions --------------------------------------------------------------------------
    def react(self, msg: Message) -> Reaction:
        if msg.kind == "start":
            return self._wait_then_begin(0, msg.t) if self.cfg.checkin else self._begin(0, msg.t)
        if msg.kind == "checkin":
            if msg.src not in self.down:
                self.pool[msg.src] = {**msg.body, "checkin_t": msg.t}
            return Reaction()
        if msg.kind == "tick" and msg.body.get("tag", "").startswith("begin:"):
            index = int(msg.body["tag"].split(":")[1])
            return self._begin(index, msg.t) if self.round is None else Reaction()
        if msg.kind == "update":
            return self._on_update(msg)
        if msg.kind in SERVER_KINDS or msg.kind == "tick" and msg.body.get("tag", "").startswith(TIMER):
            return self._on_secure(msg)
        if msg.kind in self.strategy.message_kinds:
            return self._on_strategy_message(msg)
        if msg.kind == "peer_down":
            return self._on_down(msg)
        if msg.kind == "tick" and self.round and msg.body.get("tag") == f"deadline:{self.round.index}":
            return self._secure_step(self.secure.on_deadline(msg.t), msg.t) if self.secure else self._close(msg.t)
        return Reaction()

    def _wait_then_begin(self, index: int, t: float) -> Reaction:
        return Reaction(timers=[(t + self.cfg.checkin_wait_s, f"begin:{index}")])

    def _begin(self, index: int, t: float) -> Reaction:
        rng = np.random.default_rng([self.cfg.seed, index])
        pool = {c: st for c, st in self.pool.items() if c not in self.down}
        fit = self.selector.eligible(pool)
        notice = None
        if len(fit) < self.cfg.min_clients:
            since = self.short_since = t if self.short_since is None else self.short_since
            if self.cfg.checkin and t < since + self.cfg.wait_s:  # check-ins may still bring enough
                step = self.cfg.checkin_wait_s or self.cfg.wait_s
                return Reaction(timers=[(min(t + step, since + self.cfg.wait_s), f"begin:{index}")])
            notice = self._no_eligible_clients(index, since, t, pool, fit)
            if not fit:
                self.short_since = None
                self.round = RoundState(index, since, [], set())
                reaction = self._close(t)
                reaction.reports.insert(0, notice)
                return reaction
        self.short_since = None
        asked = min(len(pool), int(np.ceil(self.cfg.clients_per_round * self.cfg.over_selection)))
        selected = self.selector.select(pool, asked, SelectionContext(index, rng, self.cfg.epochs, self.model_bytes))
        statuses = {name: pool[name] for name in selected}
        log.info("[server] round %d at t=%.3f s: selected %d of %d eligible", index, t, len(selected), len(pool))
        if self.cfg.checkin:
            for name in selected:  # a client must check in (or report back) again to be chosen again
                self.pool.pop(name, None)
        self.round = RoundState(index, t, selected, set(selected), eligible=len(pool))
        self.round.statuses = statuses
        for late in self.carried:
            self._join(self.round, *late)
        self.carried = []
        if not selected:
            return self._close(t)
        self.rounds_with_clients += 1
        bits = self.round.bits_down = self.downlink.bits(index)
        extras = self.strategy.round_extras(self.global_state)
        out = self.downlink.encode(self.global_state, rng, bits=bits, extras=extras)
        out.commit()
        encoded = out.encoded
        n_max = max((self.cfg.samples.get(c, 0) for c in selected), default=0)
        body = {"epochs": self.cfg.epochs, "batch_size": self.cfg.batch_size, "lr": self.cfg.lr,
                "bits": bits, "n_max": n_max, **self.strategy.configure_round(self._control(self.round), self.global_state)}
        if out.extras_from is not None:
            body["extras_from"] = out.extras_from
        timers = [(t + self.cfg.round_timeout_s, f"deadline:{index}")] if self.cfg.round_timeout_s else []
        if self.cfg.secure is not None:
            self.secure = SecureRound(self.cfg.secure, index, selected, self.spec, self.cfg.seed, t,
                                      self.strategy.extras_spec(self.spec, "up"))
            body["secure"] = self.secure.task_fields()
            timers += self.secure.timers(t)
        return Reaction(sends=[Send(selected, "task", index, body, encoded.frames, encoded.payload_bytes, encoded.fp32_bytes)],
                        timers=timers, reports=[notice] if notice else [])

    def _no_eligible_clients(self, index: int, since: float, t: float, pool: dict, fit: list[str]) -> dict[str, Any]:
        """What the round found: who had checked in, how many failed each threshold, what it did."""
        failing = self.selector.shortfall(pool)
        return {"type": "no_eligible_clients", "round": index, "t": t, "waited_s": t - since,
                "population": len(self.clients), "lost": len(self.down),
                "checked_in": len(pool) if self.cfg.checkin else None, "eligible": len(fit),
                "min_clients": self.cfg.min_clients, "failing": {k: v for k, v in failing.items() if v},
                "action": "ran with fewer" if fit else "skipped"}

    def _on_update(self, msg: Message) -> Reaction:
        rnd = self.round
        self._reported_back(msg)
        if msg.round in self.overdue.get(msg.src, ()) and (rnd is None or msg.round != rnd.index):
            return self._on_overdue(msg)
        if rnd is None or msg.round != rnd.index or msg.src not in rnd.waiting:
            self.late += 1
            return Reaction()
        rnd.waiting.discard(msg.src)
        record = {k: msg.body.get(k) for k in CLIENT_FIELDS}
        try:
            state, basis, extras = decode_with_extras(msg.frames, msg.body.get("extras_from"), self.spec,
                                                      self.strategy.extras_spec(self.spec, "up"), "update")
        except CodecError as exc:
            self._reject(rnd, msg.src, "update", str(exc), record)
        else:
            if basis == "delta":
                delta, state = state, {k: self.global_state[k] + state[k] for k in state}
            else:
                delta = Difference(state, self.global_state)
            self.strategy.on_update(ClientUpdate(msg.src, state, delta, float(msg.body.get("samples", 1)), record,
                                                 extras=extras))
            rnd.completed.append(msg.src)
            rnd.clients[msg.src] = {**record, "t_update": msg.t, "outcome": "ok"}
            self.selector.feedback(msg.src, rnd.index, int(msg.body.get("samples", 1)), msg.body.get("loss_rms"),
                                   msg.t - rnd.t_start)
        enough = self.cfg.round_policy == "first_k" and len(rnd.completed) >= self.cfg.clients_per_round
        return self._close(msg.t) if enough or not rnd.waiting else Reaction()

    def _reported_back(self, msg: Message) -> None:
        """With check-in, a client's upload (an update, or a masked input) carries its status: reporting
        back is a check-in."""
        if self.cfg.checkin and msg.body.get("status") and msg.src not in self.down:
            self.pool[msg.src] = {**msg.body["status"], "checkin_t": msg.t}

    def _on_overdue(self, msg: Message) -> Reaction:
        """keeps_late: the update of a client a deadline cut off joins the round in progress (or the next)."""
        self.overdue[msg.src].remove(msg.round)
        try:
            delta, basis = decode_state(msg.frames, self.spec)
            if basis != "delta":
                raise CodecError("a late update must be a delta (the model has moved on)")
        except CodecError as exc:
            log.warning("[server] rejected late update from %s: %s", msg.src, exc)
            self.late += 1
            return Reaction()
        late = (msg.src, msg.round, delta, float(msg.body.get("samples", 1)),
                {k: msg.body.get(k) for k in CLIENT_FIELDS}, msg.t)
        if self.round is None:
            self.carried.append(late)
        else:
            self._join(self.round, *late)
        return Reaction()

    def _join(self, rnd: RoundState, client: str, origin: int, delta, samples: float, record: dict, t: float) -> None:
        staleness = rnd.index - origin
        outcome = "stale"
        if self.strategy.accepts(staleness):
            state = {k: self.global_state[k] + delta[k] for k in delta}
            self.strategy.on_update(ClientUpdate(client, state, delta, samples, record, staleness))
            outcome = "ok_stale"
        rnd.stale.append({"client": client, **record, "t_update": t, "outcome": outcome, "staleness": staleness})

    def _on_strategy_message(self, msg: Message) -> Reaction:
        """A message of the strategy's own phases (FedAlign's statistics), during its round."""
        rnd = self.round
        if rnd is None or msg.round != rnd.index:
            return Reaction()
        sends = self.strategy.on_message(msg, self._control(rnd))
        return self._close(msg.t) if not rnd.waiting else Reaction(sends=sends)

    def _reject(self, rnd: RoundState, client: str, what: str, error: str, record: dict) -> None:
        rnd.rejected += 1
        rnd.waiting.discard(client)
        rnd.failed.append(client)
        rnd.clients[client] = {**record, "outcome": "rejected"}
        log.warning("[server] rejected %s from %s: %s", what, client, error)

    def _on_down(self, msg: Message) -> Reaction:
        lost = set(msg.body.get("actors", []))
        self.down |= lost
        rnd = self.round
        if rnd is None:
            return Reaction()
        if self.secure is not None:
            return self._secure_step(self.secure.on_lost(lost, msg.t), msg.t)
        gone = sorted(lost & rnd.waiting)
        rnd.waiting -= lost
        rnd.failed.extend(gone)
        for name in gone:
            rnd.clients[name] = {"outcome": "host_crash"}
        if gone and not rnd.waiting:
            return self._close(msg.t)
        return Reaction(sends=self.strategy.on_lost(lost, self._control(rnd)))

    # ---- round end --------------------------------------------------------------------------
    def _close(self, t: float) -> Reaction:
        rnd = self.round
        if rnd is None:
            return Reaction()
        self.round = None
        told = sorted(rnd.waiting - self.down) if self.cfg.notify_closed else []
        rnd.failed.extend(sorted(rnd.waiting))  # deadline or enough updates: whoever has not answered
        for name in rnd.waiting:
            rnd.clients[name] = {"outcome": "no_update"}
            if self.strategy.keeps_late:
                self.overdue.setdefault(name, []).append(rnd.index)
        for name, rounds in list(self.overdue.items()):  # forget what would be too stale to use anyway
            rounds[:] = [r for r in rounds if self.strategy.accepts(rnd.index + 1 - r)]
            if not rounds:
                del self.overdue[name]
        t_end = t + self.cfg.aggregate_s

        def work():
            new_state = self.strategy.aggregate(self.global_state)
            released = self._released(rnd.index, self.strategy.take_releases())

            def advance() -> Reaction:
                self.global_state = new_state
                report = self._report(rnd, t_end)
                reaction = self._after_round(rnd.index, t_end)
                reaction.reports[0:0] = [report, *released]
                return reaction

            return advance

        # the clients still at work hear that the round closed: they stop and upload nothing
        return Reaction(sends=[Send(told, "closed", rnd.index)] if told else [], work_s=self.cfg.aggregate_s, work=work)

    def _released(self, index: int, releases: list) -> list[dict[str, Any]]:
        """The ledger's reports of a strategy's user-level releases this round. Their sampling
        amplification assumes a uniform choice of the cohort: under any other selection policy they
        are heuristic, and say why."""
        out = []
        for release in releases:
            why = None
            if not self.selector.uniform:
                release = dataclasses.replace(release, guarantee="heuristic")
                why = f"selection.policy {self.selector.name} is not uniform: q = cohort / population does not hold"
            out.append({"type": "privacy", "actor": "server", "round": index, **dataclasses.asdict(release),
                        **({"why": why} if why else {})})
        return out

    def _finished(self, t: float, why: str | None = None) -> dict[str, Any]:
        finished = {"type": "finished", "t": t, "rounds_with_clients": self.rounds_with_clients,
                    "channels": {"server_down": self.downlink.stats.as_dict()}}
        return {**finished, "reason": why} if why else finished

    def _after_round(self, index: int, t_end: float) -> Reaction:
        """What follows round `index`, with the new model in place: the next round, a checkpoint
        first, or the end of the run."""
        every = self.cfg.checkpoint_every
        if index + 1 >= self.cfg.rounds:
            return Reaction(halt=True, reports=[self._finished(t_end)])
        if every and (index + 1) % every == 0:
            # the next round begins at the same instant, after the checkpoint
            return Reaction(timers=[(t_end, f"begin:{index + 1}")], checkpoint=index)
        return self._begin(index + 1, t_end)

    def _report(self, rnd: RoundState, t_end: float):
        base: dict[str, Any] = {
            "type": "round", "round": rnd.index, "t_start": rnd.t_start, "t_end": t_end,
            "selected": len(rnd.selected), "completed": len(rnd.completed), "failed": len(rnd.failed),
            "rejected": rnd.rejected, "bits_down": rnd.bits_down,
            "arrivals": rnd.completed,  # the order the server took the updates in (the run's records average losses so)
            "clients": [{"client": name, **rnd.clients.get(name, {"outcome": "unknown"}),
                         "status": rnd.statuses.get(name) or None, "checkin_t": (rnd.statuses.get(name) or {}).get("checkin_t")}
                        for name in rnd.selected] + rnd.stale,
        }
        if rnd.secure is not None:
            base["secure"] = rnd.secure
        if rnd.stale:
            ages = [c["staleness"] for c in rnd.stale]
            base.update(staleness_mean=float(np.mean(ages)), staleness_max=max(ages))
        return self._with_evaluation(base, rnd.index)

    def _with_evaluation(self, base: dict[str, Any], index: int):
        """The report of round `index`, or a callable that adds the global model's test figures to it
        (run off the actor's thread) when the round is due for evaluation."""
        due = self.cfg.eval_every > 0 and (index % self.cfg.eval_every == 0 or index + 1 == self.cfg.rounds)
        if not due:
            return base
        snapshot = self.global_state

        def evaluated() -> dict[str, Any]:
            load_numpy_state(self.eval_model, snapshot)
            if self.cfg.eval_shards:  # the same metric as a ring: mean over clients of their own test split
                scores = [accuracy_on(self.eval_model, self.task.test, shard) for shard in self.cfg.eval_shards]
                acc, loss = float(np.mean([a for a, _ in scores])), float(np.mean([b for _, b in scores]))
            else:
                acc, loss = evaluate(self.eval_model, self.task.test, self.cfg.eval_max_samples)
            return {**base, "accuracy": acc, "test_loss": loss}

        return evaluated
