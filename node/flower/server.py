"""The server actor of a Flower app: it runs the ServerApp (node/flower/grid.py), sends the
messages the app pushes through the emulated network, and hands the replies back as they arrive
in emulated time. Each round (a batch of train messages and the evaluation after it, see _new_round)
is a row of rounds.csv: its train messages are the selected clients, and the replies' metrics give its train loss and accuracy,
averaged with the weights Flower's strategies use (the samples metric)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol.codecs import Codec
from ..actor import Message as Delivery, Reaction, Send
from ..channel import Channel
from ..selection import Selector, Uniform
from .app import FlowerAppRef, load_component
from .identity import NODE_ID_BASE, RUN_ID, SUPERLINK_NODE_ID
from .records import decode_content, encode_content


@dataclass
class FlowerServerConfig:
    app: FlowerAppRef
    down_codec: Codec
    seed: int
    aggregate_s: float = 0.0  # emulated seconds charged each time the app runs between waits
    timeout_s: float | None = None  # caps the app's own timeouts (emulated seconds); None: the app's
    samples_metric: str = "num-examples"
    metrics: dict[str, str] = field(default_factory=lambda: {"train_loss": "train_loss", "accuracy": "eval_acc",
                                                              "test_loss": "eval_loss"})
    log_level: str = "WARNING"  # Flower's logger in this process
    checkin: bool = False  # the Grid's nodes are the clients that checked in (and meet the selection's thresholds)
    selector: Selector = field(default_factory=Uniform)  # its eligibility (resource_aware's thresholds) filters the nodes
    wait_for_nodes_s: float = 600.0  # emulated seconds the app may poll for nodes with nothing sent before the run ends


@dataclass
class Group:
    index: int
    group_id: str
    t_start: float
    sent: dict[str, tuple[str, str]] = field(default_factory=dict)  # message id -> (client, message type)
    replied: dict[str, dict[str, Any]] = field(default_factory=dict)  # message id -> {t, metrics, error}
    t_end: float = 0.0


def category(message_type: str) -> str:
    """train, evaluate or query: Flower's message types are CATEGORY or CATEGORY.ACTION."""
    return message_type.split(".")[0]


def weighted(replies: list[dict[str, Any]], key: str, weight: str) -> float | None:
    pairs = [(float(r["metrics"][key]), float(r["metrics"].get(weight, 1.0))) for r in replies
             if isinstance(r["metrics"].get(key), (int, float))]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if pairs and total > 0 else None


class FlowerServerActor:
    name = "server"

    def __init__(self, cfg: FlowerServerConfig, clients: list[str]):
        from flwr.app import Context, RecordDict  # noqa: PLC0415

        from .grid import AppThread  # noqa: PLC0415

        logging.getLogger("flwr").setLevel(cfg.log_level)
        self.cfg = cfg
        self.clients = list(clients)
        self.node_of = {name: NODE_ID_BASE + i for i, name in enumerate(self.clients)}
        self.client_of = {node: name for name, node in self.node_of.items()}
        self.down: set[str] = set()
        # who a node list offers, with their last reported status; without check-in, every client
        self.pool: dict[str, dict[str, Any]] = {} if cfg.checkin else {c: {} for c in self.clients}
        context = Context(run_id=RUN_ID, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                          run_config=dict(cfg.app.run_config))
        self.app = AppThread(load_component(cfg.app, "server"), context, self._node_ids, cfg.seed)
        self.downlink = Channel(cfg.down_codec, side="server")
        self.rng = np.random.default_rng([cfg.seed, 0xF10])
        self.current: Group | None = None  # the round under way (earlier ones are reported)
        self.message_group: dict[str, Group] = {}
        self.arrived: dict[str, Any] = {}  # message id -> the reply (a flwr Message), not yet handed to the app
        self.waiting: Any = None  # the app's Wait, while it waits
        self.wait_seq = 0
        self.running = False  # the app is running (between a resume and its next wait)
        self.rounds_with_clients = 0
        self.sent_at = 0.0  # emulated time the app last sent a message (or started)

    def _node_ids(self) -> list[int]:
        """The nodes a ServerApp sees: online as far as the server knows (not lost; with check-in,
        checked in since it was last given work, and meeting selection.* thresholds)."""
        pool = {c: status for c, status in self.pool.items() if c not in self.down}
        return [self.node_of[c] for c in self.cfg.selector.eligible(pool)]

    # ---- reactions --------------------------------------------------------------------------
    def react(self, msg: Delivery) -> Reaction:
        if msg.kind == "start":
            return self._resume(msg.t)
        if msg.kind == "checkin":
            self.pool[msg.src] = {**msg.body, "checkin_t": msg.t}
        elif msg.kind == "update":
            self._on_reply(msg)
        elif msg.kind == "peer_down":
            self.down.update(a for a in msg.body.get("actors", []) if a in self.node_of)
        elif msg.kind == "tick" and msg.body.get("tag") == f"deadline:{self.wait_seq}" and self.waiting is not None:
            return self._resume(msg.t)
        if self.waiting is not None and not self.running and self._satisfied():
            return self._resume(msg.t)
        return Reaction()

    def _on_reply(self, msg: Delivery) -> None:
        from flwr.app import Error, Message  # noqa: PLC0415
        from flwr.app.metadata import Metadata  # noqa: PLC0415

        head = msg.body.get("flower", {})
        asked = str(head.get("reply_to", ""))
        group = self.message_group.get(asked)
        if group is None or group.sent.get(asked, ("",))[0] != msg.src or asked in group.replied:
            return
        metadata = Metadata(run_id=RUN_ID, message_id=f"{asked}:reply", src_node_id=self.node_of[msg.src],
                            dst_node_id=SUPERLINK_NODE_ID, reply_to_message_id=asked, group_id=group.group_id,
                            created_at=time.time(), ttl=float(head.get("ttl", 43200.0)), message_type=str(head.get("type")))
        if head.get("error"):
            reply = Message(metadata=metadata, error=Error(code=0, reason=str(head["error"])))
            metrics = {}
        else:
            content = decode_content(head["content"], msg.frames)
            reply = Message(metadata=metadata, content=content)
            metrics = {k: v for record in content.metric_records.values() for k, v in record.items()}
        group.replied[asked] = {"t": msg.t, "metrics": metrics, "error": head.get("error")}
        if self.cfg.checkin and isinstance(head.get("status"), dict):  # reporting back is a check-in
            self.pool[msg.src] = {**head["status"], "checkin_t": msg.t}
        self.arrived[asked] = reply

    def _satisfied(self) -> bool:
        wait = self.waiting
        if wait.sleep:
            return False
        live = [i for i in wait.ids if self.message_group[i].sent[i][0] not in self.down or i in self.arrived]
        have = [i for i in wait.ids if i in self.arrived]
        return len(have) == len(live) if wait.every else bool(have) or not live

    def _resume(self, t: float) -> Reaction:
        """Run the app from here (with the replies it waited for) until it waits again or ends."""
        wait, self.waiting = self.waiting, None
        handed = {}
        if wait is not None:
            handed = {i: self.arrived.pop(i) for i in wait.ids if i in self.arrived}
            for i in wait.ids:
                self.message_group[i].t_end = t
        self.running = True
        ready = t + self.cfg.aggregate_s

        def work():
            step = self.app.advance(handed)
            encoded = [(m, encode_content(m.content, self.downlink, self.rng)) for m in step.pushed]
            return lambda: self._after_step(step, encoded, ready)

        return Reaction(work_s=self.cfg.aggregate_s, work=work)

    def _after_step(self, step: Any, encoded: list, t: float) -> Reaction:
        from .grid import Finished  # noqa: PLC0415

        self.running = False
        sends, reports = [], []
        if encoded:
            self.sent_at = t
        elif getattr(step, "sleep", False) and t - self.sent_at >= self.cfg.wait_for_nodes_s:
            return self._gave_up_waiting(t)
        if encoded and self._new_round([m for m, _ in encoded]):
            reports += self._close_current()
            index = self.current.index + 1 if self.current is not None else 0
            self.current = Group(index, encoded[0][0].metadata.group_id, t)
        for message, wire in encoded:
            meta = message.metadata
            group = self.current
            client = self.client_of[meta.dst_node_id]
            if self.cfg.checkin:  # given work: it checks in again when it is done or comes back
                self.pool.pop(client, None)
            group.sent[meta.message_id] = (client, meta.message_type)
            self.message_group[meta.message_id] = group
            wire.commit()
            head = {"id": meta.message_id, "type": meta.message_type, "group": meta.group_id, "ttl": meta.ttl,
                    "content": wire.body}
            sends.append(Send(client, "task", group.index, {"flower": head}, wire.frames, wire.payload_bytes,
                              wire.fp32_bytes))
        if isinstance(step, Finished):
            reports += self._close_current()
            if step.error:
                reports.append({"type": "error", "actor": self.name, "error": step.error})
            reports.append({"type": "finished", "t": t, "rounds_with_clients": self.rounds_with_clients,
                            "channels": {"server_down": self.downlink.stats.as_dict()},
                            **({"reason": "the ServerApp raised an exception"} if step.error else {})})
            return Reaction(sends=sends, reports=reports, halt=True)
        self.waiting = step
        self.wait_seq += 1
        timers = []
        limits = [x for x in (step.timeout_s, self.cfg.timeout_s) if x is not None]
        if step.sleep:
            timers.append((t + step.timeout_s, f"deadline:{self.wait_seq}"))
        elif limits and step.every:
            timers.append((t + min(limits), f"deadline:{self.wait_seq}"))
        if self._satisfied():  # nothing to wait for (no ids, or every addressee is gone)
            follow = self._resume(t)
            return Reaction(sends=sends, reports=reports, timers=timers, work_s=follow.work_s, work=follow.work)
        return Reaction(sends=sends, reports=reports, timers=timers)

    def _gave_up_waiting(self, t: float) -> Reaction:
        """The app has polled for nodes without sending anything for wait_for_nodes_s: the nodes it
        waits for are not coming (too few clients, or none eligible). The run ends here, saying so,
        rather than polling for ever."""
        seen = len(self._node_ids())
        why = (f"the ServerApp waited {t - self.sent_at:g} emulated s for nodes and sent nothing "
               f"(it sees {seen} of {len(self.clients)} clients; algorithm.flower.wait_for_nodes_s)")
        reports = self._close_current()
        reports.append({"type": "finished", "t": t, "rounds_with_clients": self.rounds_with_clients,
                        "channels": {"server_down": self.downlink.stats.as_dict()}, "no_nodes": why})
        return Reaction(reports=reports, halt=True)

    def _new_round(self, pushed: list) -> bool:
        """A batch of train messages begins a round (Flower's strategies send no group id; an
        app that does, begins one with each new id). Evaluation and queries join the round they
        follow."""
        if self.current is None:
            return True
        ids = {m.metadata.group_id for m in pushed}
        if ids - {"", self.current.group_id}:
            return True
        return any(category(m.metadata.message_type) == "train" for m in pushed) and \
            any(category(kind) == "train" for _, kind in self.current.sent.values())

    def _close_current(self) -> list[dict[str, Any]]:
        """The report of the round under way, which a new round or the app's end closes."""
        return [self._report(self.current)] if self.current is not None else []

    def _report(self, group: Group) -> dict[str, Any]:
        trains = {i: v for i, v in group.sent.items() if category(v[1]) == "train"}
        chosen = trains or group.sent
        ok = {i for i in chosen if i in group.replied and not group.replied[i]["error"]}
        if ok:
            self.rounds_with_clients += 1
        weight = self.cfg.samples_metric
        train_replies = [group.replied[i] for i in trains if i in ok]
        evals = [r for i, r in group.replied.items() if category(group.sent[i][1]) == "evaluate" and not r["error"]]
        m = self.cfg.metrics
        clients = []
        for i, (client, _) in chosen.items():
            reply = group.replied.get(i)
            row = {"client": client, "outcome": "ok" if i in ok else "no_update"}
            if reply is not None and not reply["error"]:
                samples = reply["metrics"].get(weight)
                loss = reply["metrics"].get(m["train_loss"])
                row.update(samples=int(samples) if isinstance(samples, (int, float)) else None,
                           loss=float(loss) if isinstance(loss, (int, float)) else None)
            clients.append(row)
        return {"type": "round", "round": group.index, "t_start": group.t_start, "t_end": max(group.t_end, group.t_start),
                "selected": len(chosen), "completed": len(ok), "failed": len(chosen) - len(ok), "rejected": 0,
                "train_loss": weighted(train_replies, m["train_loss"], weight),
                "accuracy": weighted(evals, m["accuracy"], weight), "test_loss": weighted(evals, m["test_loss"], weight),
                "bits_down": None, "clients": clients}
