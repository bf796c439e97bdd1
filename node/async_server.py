"""The server of an asynchronous strategy (FedBuff): `concurrency` clients train at once; when one
finishes (or times out, or its host is lost) another is dispatched with the current model; the
strategy takes a server step whenever it is ready. A results "round" is one server step, and each
client row is one dispatch, reported in the step during which it concluded.

Checkpoints (run.checkpoint_every: K steps) need an instant when no client is training: after every
K-th step the server drains, dispatching no one until the clients in flight have answered, timed out
or been lost, then asks for the checkpoint and dispatches again at the same instant. The drain is
part of the run whether or not it is ever resumed, so a resumed run writes what an uninterrupted
one does; it costs the clients' idle time while the last ones of the drain finish."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.codecs import CodecError, decode_state
from .actor import Message, Reaction, Send
from .server import CLIENT_FIELDS, ServerActor
from .strategies import ClientUpdate
from .selection import SelectionContext

log = logging.getLogger(__name__)


@dataclass
class Dispatch:
    id: int  # the task's round number on the wire: unique per dispatch
    version: int  # server steps taken when the client got its model
    t: float
    status: dict[str, Any]  # the check-in status it was selected on


class AsyncServer(ServerActor):
    quiet_kinds = frozenset()  # a check-in may fill a free slot at once
    STATE = ServerActor.STATE + ("version", "dispatches", "inflight", "step_start", "concluded", "dispatched",
                                 "stepping", "finished", "rejected_in_step", "draining")

    def __init__(self, cfg, clients: list[str], task):
        super().__init__(cfg, clients, task)
        options = self.strategy.options
        self.concurrency = getattr(options, "concurrency", None) or cfg.clients_per_round
        self.version = 0  # server steps taken
        self.dispatches = 0
        self.inflight: dict[str, Dispatch] = {}
        self.step_start = 0.0
        self.concluded: list[dict[str, Any]] = []  # client rows of the step in progress
        self.dispatched = 0  # clients dispatched during the step in progress
        self.stepping = False  # an aggregation is under way (aggregate_s > 0)
        self.finished = False
        self.draining: int | None = None  # the step after which a checkpoint waits for the clients in flight
        self.n_max = max(cfg.samples.values(), default=0)

    def react(self, msg: Message) -> Reaction:
        if self.finished:
            return Reaction()
        if msg.kind == "start":
            return self._fill(msg.t)
        if msg.kind == "checkin":
            if msg.src not in self.down:
                self.pool[msg.src] = {**msg.body, "checkin_t": msg.t}
            return self._fill(msg.t)
        if msg.kind == "update":
            return self._on_async_update(msg)
        if msg.kind == "peer_down":
            return self._on_lost(msg)
        if msg.kind == "tick" and msg.body.get("tag", "").startswith("timeout:"):
            return self._on_timeout(int(msg.body["tag"].split(":")[1]), msg.t)
        if msg.kind == "tick" and msg.body.get("tag") == "drained":
            return self._fill(msg.t)
        return Reaction()

    # ---- dispatch ---------------------------------------------------------------------------
    def _fill(self, t: float) -> Reaction:
        """Dispatch clients with the current model until `concurrency` are training (while a drain
        for a checkpoint waits, none; once the last one is in, the checkpoint)."""
        if self.draining is not None:
            if self.inflight or self.stepping:
                return Reaction()
            step, self.draining = self.draining, None
            return Reaction(timers=[(t, "drained")], checkpoint=step)
        free = self.concurrency - len(self.inflight)
        if free <= 0 or self.stepping:
            return Reaction()
        pool = {c: st for c, st in self.pool.items() if c not in self.down and c not in self.inflight}
        rng = np.random.default_rng([self.cfg.seed, 0xA5, self.dispatches])
        chosen = self.selector.select(pool, min(free, len(pool)),
                                      SelectionContext(self.dispatches, rng, self.cfg.epochs, self.model_bytes))
        if not chosen:
            if not self.inflight and not self.cfg.checkin:  # every client is lost: nothing can happen any more
                return self._finish(t, "no client left to dispatch")
            return Reaction()
        out = self.downlink.encode(self.global_state, rng, bits=self.downlink.bits(self.version))
        encoded = out.encoded
        body = {"epochs": self.cfg.epochs, "batch_size": self.cfg.batch_size, "lr": self.cfg.lr,
                "bits": out.bits, "n_max": self.n_max, "version": self.version}
        sends, timers = [], []
        for name in chosen:
            d = Dispatch(self.dispatches, self.version, t, pool[name])
            self.dispatches += 1
            self.inflight[name] = d
            if self.cfg.checkin:
                self.pool.pop(name, None)  # it must check in (or report back) again to be chosen again
            sends.append(Send(name, "task", d.id, body, encoded.frames, encoded.payload_bytes, encoded.fp32_bytes))
            out.commit()
            if self.cfg.round_timeout_s:
                timers.append((t + self.cfg.round_timeout_s, f"timeout:{d.id}"))
        self.dispatched += len(chosen)
        self.rounds_with_clients = max(self.rounds_with_clients, 1)
        return Reaction(sends=sends, timers=timers)

    def _conclude(self, name: str, d: Dispatch, row: dict[str, Any]) -> None:
        status = d.status or {}
        self.concluded.append({"client": name, "dispatch": d.id, "selected_t": d.t, "status": status or None,
                               "checkin_t": status.get("checkin_t"), **row})

    # ---- arrivals ---------------------------------------------------------------------------
    def _on_async_update(self, msg: Message) -> Reaction:
        self._reported_back(msg)
        d = self.inflight.get(msg.src)
        if d is None or d.id != msg.round:
            self.late += 1
            return Reaction()
        del self.inflight[msg.src]
        staleness = self.version - d.version
        record = {k: msg.body.get(k) for k in CLIENT_FIELDS}
        row = {**record, "t_update": msg.t, "staleness": staleness}
        try:
            delta, basis = decode_state(msg.frames, self.spec)
            if basis != "delta":
                raise CodecError("an asynchronous update must be a delta (the server's model has moved on)")
        except CodecError as exc:
            self._conclude(msg.src, d, {**row, "outcome": "rejected"})
            self.rejected_in_step += 1
            log.warning("[server] rejected update from %s: %s", msg.src, exc)
        else:
            if self.strategy.accepts(staleness):
                state = {k: self.global_state[k] + delta[k] for k in delta}
                self.strategy.on_update(ClientUpdate(msg.src, state, delta, float(msg.body.get("samples", 1)), record, staleness))
                self._conclude(msg.src, d, {**row, "outcome": "ok"})
            else:
                self._conclude(msg.src, d, {**row, "outcome": "stale"})
        if self.strategy.ready() and not self.stepping:
            return self._step(msg.t)
        return self._fill(msg.t)

    def _on_timeout(self, dispatch: int, t: float) -> Reaction:
        name = next((n for n, d in self.inflight.items() if d.id == dispatch), None)
        if name is None:
            return Reaction()
        self._conclude(name, self.inflight.pop(name), {"outcome": "no_update"})
        return self._fill(t)

    def _on_lost(self, msg: Message) -> Reaction:
        lost = set(msg.body.get("actors", []))
        self.down |= lost
        for name in sorted(lost & set(self.inflight)):
            self._conclude(name, self.inflight.pop(name), {"outcome": "host_crash"})
        return self._fill(msg.t)

    # ---- server steps -----------------------------------------------------------------------
    rejected_in_step = 0

    def _step(self, t: float) -> Reaction:
        new_state = self.strategy.aggregate(self.global_state)
        t_end = t + self.cfg.aggregate_s

        def advance() -> Reaction:
            self.global_state = new_state
            self.stepping = False
            report = self._step_report(t_end)
            self.version += 1
            if self.version >= self.cfg.rounds:
                return self._finish(t_end, None, report)
            every = self.cfg.checkpoint_every
            if every and self.version % every == 0:
                self.draining = self.version - 1  # the checkpoint covers steps 0 .. version - 1
            reaction = self._step(t_end) if self.strategy.ready() else self._fill(t_end)
            reaction.reports.insert(0, report)
            return reaction

        if not self.cfg.aggregate_s:
            return advance()
        self.stepping = True
        return Reaction(work_s=self.cfg.aggregate_s, work=lambda: advance)

    def _step_report(self, t_end: float):
        rows, self.concluded = self.concluded, []
        ok = [r for r in rows if r["outcome"] == "ok"]
        stale = [r["staleness"] for r in ok]
        base: dict[str, Any] = {
            "type": "round", "round": self.version, "t_start": self.step_start, "t_end": t_end,
            "selected": self.dispatched, "completed": len(ok), "failed": len(rows) - len(ok),
            "rejected": self.rejected_in_step,
            "bits_down": getattr(self.cfg.down_codec, "bits", None), "clients": rows, "account": "dispatch",
            "staleness_mean": float(np.mean(stale)) if stale else None, "staleness_max": max(stale, default=None),
            # device events since the oldest dispatch still training may belong to a later step's rows
            "keep_since": min((d.t for d in self.inflight.values()), default=t_end),
        }
        self.step_start, self.dispatched, self.rejected_in_step = t_end, 0, 0
        return self._with_evaluation(base, self.version)

    def _finish(self, t: float, why: str | None, report=None) -> Reaction:
        self.finished = True
        if report is None and (self.concluded or self.dispatched):
            report = self._step_report(t)
        return Reaction(halt=True, reports=([report] if report is not None else []) + [self._finished(t, why)])
