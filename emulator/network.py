"""The network process: the only clock, the event queue, the link model and byte accounting.

Conservative discrete-event protocol (DESIGN.md 3): an event at time t is processed only while
t is strictly below every actor's lower bound (an unanswered delivery, or a declared busy-until).
Everything an actor can still send therefore arrives before any event it could precede, and
ties are broken by a key made of (time, event class, actor name, per-actor counter), never by
arrival order, so a run is a deterministic function of its scenario and seed.

One relaxation: a delivery at the bound itself may go out to an actor that holds nothing. What a
held actor can still cause at that instant (transfer starts, timers, checkpoints) sorts after
every delivery, so the deliveries of one instant (a population checking in at once, a round's
broadcast arriving together) go out without waiting for each other's answers, in the same order."""
from __future__ import annotations

import heapq
import itertools
import math
import os
import pickle
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import zmq

import numpy as np

from protocol import envelope
from protocol.curve import RunKeys, ZapHandler
from node.compute import LoadModel, cpu_load

from .devices import DeviceSpec, stable_key
from .holds import Holds
from .levelflows import IncrementalFlowModel
from .links import INF, FlowModel, Framing
from .peers import PeerGuard
from .transport import TcpParams, TcpTransport

CONDUCTOR = "conductor"
SERVER = "server"
POLL_MS = 200

# event classes, in the order they run at equal times: finish transfers, change devices and links,
# deliver, start transfers, take a checkpoint, fire timers
FLOW_DONE, DEVICE, DELIVER, FLOW_START, CHECKPOINT, TIMER = range(6)
MB = 1e6


@dataclass(frozen=True)
class Link:
    up_bps: float = INF
    down_bps: float = INF
    latency_s: float = 0.0
    jitter_s: float = 0.0  # mean of an exponential extra delay per message
    loss: float = 0.0  # probability that a segment is lost and retransmitted
    queue_s: float = 0.1  # bottleneck buffer in seconds of the link's rate (tcp transport)


@dataclass(frozen=True)
class Fault:
    kind: str  # "truncate" | "link_down"
    actor: str
    start: float
    end: float

    def active(self, actor: str, t: float) -> bool:
        return actor == self.actor and self.start <= t < self.end


ALIVE_ACK = envelope.pack("alive_ack")


def truncated(frames: list[Any]) -> list[Any]:
    """The message with its last payload byte gone: what a cut-off or mis-framed message looks like."""
    if not frames:
        return frames
    last = bytes(memoryview(frames[-1]).cast("B"))
    return [*frames[:-1], last[:-1]]


@dataclass
class NetworkConfig:
    endpoint: str
    peers: dict[str, list[str]]  # every peer that must say hello before the clock starts -> the actors it may claim
    links: dict[str, Link]  # access link of each actor
    framing: Framing = field(default_factory=Framing)
    parent_pid: int | None = None
    faults: list[Fault] = field(default_factory=list)
    realtime_speedup: float | None = None  # None: virtual time (jump to the next event)
    devices: dict[str, DeviceSpec] = field(default_factory=dict)  # client devices (availability, battery, load)
    seed: int = 0
    rto_s: float = 0.2  # fluid transport: the delay a lost segment costs (Linux's minimum retransmission timeout)
    tcp: TcpParams | None = None  # the tcp transport's parameters; None: the fluid transport
    flow_solver: str = "scratch"  # "incremental": emulator/levelflows.py
    group_queue_s: dict[str, float] = field(default_factory=dict)  # buffers of the shared bottlenecks
    groups: dict[str, float] = field(default_factory=dict)  # shared bottleneck links: name -> bit/s
    group_of: dict[str, list[str]] = field(default_factory=dict)  # actor -> shared links its traffic crosses
    starters: list[str] = field(default_factory=lambda: [SERVER])  # who gets "start" at t = 0
    watchers: list[str] = field(default_factory=lambda: [SERVER])  # who learns of a lost host ("peer_down")
    peer_timeout_s: float | None = 30.0  # a peer silent this long (wall) is reported to the conductor as lost
    max_message_bytes: int = -1  # larger frames make ZeroMQ drop the sender's connection (-1: no limit)
    checkpoint_dir: str | None = None  # where checkpoints go (written to CHECKPOINT_DIR.new first)
    restore: str | None = None  # a checkpoint's network state to continue from
    listen: str | None = None  # a TCP endpoint for hosts on other machines, bound besides `endpoint`, CURVE only
    run_keys: RunKeys | None = None  # with listen: the run's key pair and the host keys it admits
    previews: bool = True  # run.speculate: show early sends to their receivers' hosts as their transfers begin


class LagMeter:
    """Realtime mode: how late (wall seconds) each event ran against its due wall time t0 + t/k."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    def add(self, lateness: float) -> None:
        self.samples.append(max(0.0, lateness))

    def stats(self) -> dict[str, float]:
        if not self.samples:
            return {"events": 0, "mean_s": 0.0, "p99_s": 0.0, "max_s": 0.0}
        ordered = sorted(self.samples)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return {"events": len(ordered), "mean_s": sum(ordered) / len(ordered), "p99_s": p99, "max_s": ordered[-1]}


@dataclass
class Transfer:
    tid: int
    src: str
    dst: str
    kind: str
    round: int
    t_start: float
    payload_bytes: int
    fp32_bytes: int
    wire_bytes: int
    link_bytes: int
    deliver_env: dict[str, Any]
    frames: list[Any]
    key: tuple = ()  # (src, n, i): a name for the transfer that does not depend on arrival order
    extra_delay: float = 0.0  # jitter and retransmission delays

    def record(self, t_end: float, outcome: str, wasted: int = 0) -> dict[str, Any]:
        return {
            "id": self.tid, "round": self.round, "kind": self.kind, "src": self.src, "dst": self.dst,
            "payload_bytes": self.payload_bytes, "fp32_bytes": self.fp32_bytes, "wire_bytes": self.wire_bytes,
            "link_bytes": self.link_bytes, "t_start": self.t_start, "t_end": t_end, "outcome": outcome,
            "wasted_bytes": wasted,
        }


class Network:
    def __init__(self, cfg: NetworkConfig):
        self.cfg = cfg
        self.now = 0.0
        self.queue: list[tuple] = []
        # Every rebalance reschedules the flows whose rate changed: on a shared server link, all of
        # them. Their due times wait in a heap of their own, and only the earliest valid one is in
        # the event queue, with the key it would have had there, so the order of events is the same
        # and the queue does not fill with superseded ones.
        self.flow_heap: list[tuple] = []  # (done_at, src, tid, version, fid)
        self.flow_head: tuple | None = None  # the entry of flow_heap that stands in the queue
        self.holds = Holds()
        self._outbox: list[bytes] = []
        self._to_peers: list[tuple[str, list[Any]]] = []  # heartbeat answers and previews, sent before any delivery
        self.preview_ids = itertools.count(1)
        self.zap: ZapHandler | None = None  # with cfg.listen: who may connect over TCP (see run)
        self._answer_records: list[tuple[int, bytes]] = []  # see _on_done
        self.events = 0  # events processed: the network's work, for benchmarks
        self.waited: Counter[str] = Counter()  # wall seconds the loop waited, by what it waited for (_waiting_for)
        self.hold_ids = itertools.count()
        self.transfer_ids = itertools.count()
        self.net_counter = itertools.count()
        # A payload sent to several actors crosses to each peer once: the peer keeps the latest
        # shared payload it received, and this mirrors it (peer -> (payload frames, id)). Not saved
        # in a checkpoint: after a restore every peer is sent the frames again.
        self.peer_payload: dict[str, tuple[list[Any], int]] = {}
        self.payload_ids = itertools.count(1)
        self.guard = PeerGuard(cfg.peers)
        self.actor_peer = self.guard.owner
        self.peer_actors: dict[str, list[str]] = {}
        self.last_heard: dict[str, float] = {}  # wall time of each peer's last message
        self.busy_for: dict[str, float] = {}  # what its last heartbeat said about its current job
        self.reported_silent: set[str] = set()
        self.dead: set[str] = set()
        self.transfers: dict[int, Transfer] = {}
        self.flows_of: dict[str, set[int]] = {}  # actor -> its transfers in flight (a device's toggle aborts them)
        model = IncrementalFlowModel if cfg.flow_solver == "incremental" else FlowModel
        self.flows = model(self._capacities(), TcpTransport(cfg.tcp) if cfg.tcp else None, self._queues())
        self.started = False
        self.stopping = False
        self.wall_start: float | None = None  # realtime mode: wall clock at emulated time 0
        self.lag = LagMeter()
        self.devices = cfg.devices
        self.online = {a: True for a in cfg.devices}
        self.battery_dead: set[str] = set()
        self.offline_since: dict[str, float] = {}
        self.last_delivery: dict[str, float] = {}
        self.links_down: dict[str, int] = {}  # actor -> active link_down faults
        self.availability = {a: d.availability.transitions() for a, d in cfg.devices.items()}
        self.availability_used = {a: 0 for a in cfg.devices}  # transitions drawn so far (a checkpoint's cursor)
        self.snapshot_waiting: set[str] = set()  # peers still writing their part of a checkpoint
        self.snapshot_failed: list[str] = []
        self.snapshot_round = -1
        self.halt_pending = False  # the server said when the run ends...
        self.halted = False  # ...and the clock got there: no event after it runs

    def _capacities(self) -> dict[tuple[str, str], float]:
        caps = {}
        for actor, link in self.cfg.links.items():
            caps[("up", actor)] = link.up_bps
            caps[("down", actor)] = link.down_bps
        for name, bps in self.cfg.groups.items():
            caps[("group", name)] = bps
        return caps

    def _queues(self) -> dict[tuple[str, str], float]:
        queues = {}
        for actor, link in self.cfg.links.items():
            queues[("up", actor)] = queues[("down", actor)] = link.queue_s
        for name, q in self.cfg.group_queue_s.items():
            queues[("group", name)] = q
        return queues

    def link(self, actor: str) -> Link:
        return self.cfg.links.get(actor, Link())

    # ---- the lower bound ---------------------------------------------------------------------
    def lower_bound(self) -> float:
        return self.holds.earliest()

    def may_run_head(self) -> bool:
        """Whether the earliest queued event may run now: before the lower bound, or a delivery at
        the bound to an actor holding nothing (the module's docstring says why that is safe)."""
        t, cls, _, _, _, event = self.queue[0]
        bound = self.holds.earliest()
        if t < bound:
            return True
        return t == bound and cls == DELIVER and not self.holds.holding(event[1][0]["dst"])

    def push(self, t: float, cls: int, name: str, n: int, sub: int, event: tuple) -> None:
        heapq.heappush(self.queue, (t, cls, name, n, sub, event))

    # ---- messages from peers -----------------------------------------------------------------
    def receive(self, identity: bytes, frames: list[Any]) -> None:
        """One message as the ROUTER socket gives it. Nothing a peer sends can raise here: what is
        refused is counted and logged by the guard."""
        if identity in self.guard.banned:
            return
        peer = self.guard.known(identity)
        if peer is None:
            self.guard.refuse(identity, "not a peer of this run", sum(memoryview(f.buffer).nbytes for f in frames))
            return
        self.last_heard[peer] = time.monotonic()
        self.reported_silent.discard(peer)
        if not frames:
            self._refuse(peer, "an empty message")
            return
        self.on_message(peer, frames)

    def _refuse(self, peer: str, reason: str) -> None:
        self.guard.refuse(peer.encode(), reason)

    def on_message(self, peer: str, frames: list[Any]) -> None:
        try:
            env = envelope.unpack(frames[0].buffer)
        except envelope.ProtocolError as exc:
            self._refuse(peer, str(exc))
            return
        op = env["op"]
        if op == "alive":
            self.busy_for[peer] = float(env["busy_s"])
            self._to_peers.append((peer, [ALIVE_ACK]))
        elif op == "hello":
            refused = (f"{peer} said hello as {env['peer']!r}" if env["peer"] != peer else
                       self.guard.claim(peer, list(env["actors"])))
            if refused:
                self._refuse(peer, refused)
                self.to_conductor("report", {"type": "refused_claim", "peer": peer, "reason": refused, "t_net": self.now})
                return
            self.peer_actors[peer] = list(env["actors"])
            if not self.started and set(self.cfg.peers) <= self.guard.greeted:
                self.started = True
                self.wall_start = time.monotonic()
                if self.cfg.restore:
                    self._restore(self.cfg.restore)
                    self.to_conductor("report", {"type": "clock_started", "t_net": self.now, "resumed": True})
                    return
                self.to_conductor("report", {"type": "clock_started", "t_net": 0.0})
                self._start_devices()
                for actor in self.cfg.starters:
                    self.push(0.0, DELIVER, "", next(self.net_counter), 0, ("deliver", self._net_message(actor, "start", {})))
        elif op == "send":
            self._on_send(peer, env, frames[1:])
        elif op == "done":
            self._on_done(peer, env)
        elif op == "timer":
            if self._owns(peer, env["actor"]):
                at = max(float(env["at"]), self.now)
                self.push(at, TIMER, env["actor"], next(self.net_counter), 0, ("tick", env["actor"], env["tag"]))
        elif op == "report":
            extra = {"lag": self.lag.stats()} if self.cfg.realtime_speedup else {}
            self.to_conductor("report", {**env["body"], "t_net": self.now, **extra})
        elif op == "checkpoint":
            if self._owns(peer, env["actor"]):
                at = max(float(env["at"]), self.now)
                self.push(at, CHECKPOINT, env["actor"], next(self.net_counter), 0, ("checkpoint", env["round"]))
        elif op == "halt":
            if env["actor"] == SERVER and self._owns(peer, SERVER):
                self.halt_pending = True
                self.push(max(float(env["at"]), self.now), CHECKPOINT, SERVER, next(self.net_counter), 1, ("halt",))
            else:
                self._refuse(peer, "only the server ends a run")
        elif op == "snapshot_done":
            if peer in self.snapshot_waiting:
                self.snapshot_waiting.discard(peer)
                if not env["ok"]:
                    self.snapshot_failed.append(env["why"])
                if not self.snapshot_waiting:
                    self._finish_snapshot()
            else:
                self._refuse(peer, f"{peer} answered a snapshot it was not asked for")
        elif op == "peer_lost" and peer == CONDUCTOR:
            self._on_peer_lost(env["peer"])
        elif op == "stop" and peer == CONDUCTOR:
            self.stopping = True
        else:
            self._refuse(peer, f"op {op!r} is not one a peer may send")

    def _owns(self, peer: str, actor: str) -> bool:
        if self.actor_peer.get(actor) != peer:
            self._refuse(peer, f"{peer} may not act for {actor!r}")
            return False
        return True

    def _on_send(self, peer: str, env: dict[str, Any], payload: list[Any]) -> None:
        src = env["src"]
        if not self._owns(peer, src) or src in self.dead:
            return
        t = max(float(env["t"]), self.now)  # a send can never land in the past
        if self.offline_since.get(src, -INF) > self.last_delivery.get(src, -INF):
            # the device went off after it was given this work: the work died with it
            self.to_conductor("record", {"transfers": [{
                "id": -1, "round": env["round"], "kind": env["kind"], "src": src, "dst": str(env["dst"]),
                "payload_bytes": 0, "fp32_bytes": 0, "wire_bytes": 0, "link_bytes": 0, "t_start": t, "t_end": t,
                "outcome": "battery" if src in self.battery_dead else "offline", "wasted_bytes": 0}]})
            return
        dsts = env["dst"] if isinstance(env["dst"], list) else [env["dst"]]
        unknown = [d for d in dsts if d not in self.cfg.links]
        if unknown or not dsts:
            self._refuse(peer, f"send from {src} to {'no actor' if not dsts else 'unknown actors ' + repr(unknown[:3])}")
            return
        payload = [f.buffer for f in payload]
        if any(f.kind == "truncate" and f.active(src, t) for f in self.cfg.faults):
            payload = truncated(payload)
        payload_frame_bytes = sum(memoryview(f).nbytes for f in payload)
        preview = 0
        if env.get("early") and self.cfg.previews and payload_frame_bytes:
            preview = self._show_early(src, dsts, env, payload, t, payload_frame_bytes)
        for i, dst in enumerate(dsts):
            deliver_env = {"src": src, "dst": dst, "kind": env["kind"], "round": env["round"], "t": 0.0, "body": env["body"],
                           "fanout": len(dsts) > 1 and payload_frame_bytes > 0, "preview": preview}
            unicast = envelope.pack("send", src=src, dst=dst, kind=env["kind"], round=env["round"], t=t, n=env["n"],
                                    body=env["body"], payload=env["payload"], fp32=env["fp32"])
            wire = len(unicast) + payload_frame_bytes
            tr = Transfer(-1, src, dst, env["kind"], env["round"], t, env["payload"], env["fp32"],
                          wire, self.cfg.framing.link_bytes(wire), deliver_env, payload, (src, env["n"], i))
            self.push(t, FLOW_START, src, env["n"], i, ("flow_start", tr))

    def _show_early(self, src: str, dsts: list[str], env: dict[str, Any], payload: list[Any], t: float,
                    payload_bytes: int) -> int:
        """Preview an early send to the hosts of its reachable receivers, once per host with the
        payload, and return the preview's id (its deliveries carry it). A host may use it while its
        worker would idle (run.speculate); the emulation does not see it. Each receiver's eta is
        when the message would arrive alone on its links: a host works through the earliest first."""
        key = next(self.preview_ids)
        up_bps = self.link(src).up_bps
        by_peer: dict[str, tuple[list[str], list[float]]] = {}
        for dst in dsts:
            peer = self.actor_peer.get(dst)
            if peer is None or peer == CONDUCTOR or dst in self.dead or not self.reachable(dst):
                continue
            rate = min(up_bps, self.link(dst).down_bps)
            names, etas = by_peer.setdefault(peer, ([], []))
            names.append(dst)
            etas.append(t + self._one_way(src, dst) + (payload_bytes * 8.0 / rate if rate < INF else 0.0))
        for peer, (names, etas) in by_peer.items():
            header = envelope.pack("preview", src=src, dst=names, kind=env["kind"], round=env["round"], body=env["body"],
                                   preview=key, eta=etas)
            self._to_peers.append((peer, [header, *payload]))
        return key

    def _on_done(self, peer: str, env: dict[str, Any]) -> None:
        hid = env["hold"]
        hold = self.holds.get(hid)
        if hold is None or self.actor_peer.get(hold[0]) != peer or hold[0] != env["actor"]:
            self._refuse(peer, f"done for hold {hid}, which is not {peer}'s")
            return
        # While deliveries of this instant are unanswered, answers come in whatever order the hosts
        # send them; what they make the network record waits and goes out in delivery order, as
        # if each delivery had been answered before the next went out.
        pipelined = bool(self.holds.unanswered)
        if pipelined:
            mark = len(self._outbox)
        self.holds.answer(hid)
        if env["busy_until"] is None:
            del self.holds[hid]
        else:
            until = max(float(env["busy_until"]), hold[1])
            self.holds[hid] = (hold[0], until)
            # training power for the full-speed seconds only: under background load the rest of the
            # stretched interval runs other apps, whose energy is not this task's
            busy = until - hold[1] if env["busy_s"] is None else min(float(env["busy_s"]), until - hold[1])
            self._drain_compute(hold[0], hold[1], until, busy)
        if pipelined:
            self._answer_records.extend((hid, header) for header in self._outbox[mark:])
            del self._outbox[mark:]
            self._release_answer_records()

    def _release_answer_records(self) -> None:
        if self._answer_records and not self.holds.unanswered:
            self._answer_records.sort(key=lambda item: item[0])  # stable: one answer's records keep their order
            self._outbox.extend(header for _, header in self._answer_records)
            self._answer_records.clear()

    def _on_peer_lost(self, peer: str) -> None:
        if peer in self.snapshot_waiting:
            self.snapshot_waiting.discard(peer)
            self.snapshot_failed.append(f"{peer} was lost")
            if not self.snapshot_waiting:
                self._finish_snapshot()
        lost = [a for a in self.peer_actors.get(peer, []) if a not in self.dead]
        self.dead.update(lost)
        for hid in [h for h, (actor, _) in self.holds.items() if actor in lost]:
            del self.holds[hid]
        self._release_answer_records()
        self.flows.advance(self.now)
        for fid in self._transfers_of(lost):
            self._abort(fid, f"{'src' if self.transfers[fid].src in lost else 'dst'}_lost")
        if not lost:
            return
        for watcher in self.cfg.watchers:
            if watcher not in self.dead:
                msg = self._net_message(watcher, "peer_down", {"actors": lost, "peer": peer})
                self.push(self.now, DELIVER, "", next(self.net_counter), 0, ("deliver", msg))

    def _net_message(self, dst: str, kind: str, body: dict) -> tuple[dict, list]:
        return {"src": "network", "dst": dst, "kind": kind, "round": -1, "t": 0.0, "body": body}, []

    # ---- events --------------------------------------------------------------------------------
    def due_in(self) -> float:
        """Realtime mode: wall seconds until the next event is due (0 in virtual mode)."""
        if not self.cfg.realtime_speedup or not self.queue or self.wall_start is None:
            return 0.0
        return self.wall_start + self.queue[0][0] / self.cfg.realtime_speedup - time.monotonic()

    def step(self, sock: zmq.Socket) -> bool:
        """Process at most one event; False when the lower bound forbids it, the queue is empty, or
        (realtime) the event is not yet due."""
        if self.flows.unsettled:
            following = self.queue[0] if self.queue else None
            if following is None or following[0] > self.now or following[1] != FLOW_START:
                self._reschedule(self.flows.settle())  # the last transfer of this instant has started
        if self.halted or self.snapshot_waiting or not self.queue or not self.may_run_head() or self.due_in() > 0:
            return False
        if self.cfg.realtime_speedup:
            self.lag.add(-self.due_in())
        t, _, _, _, _, event = heapq.heappop(self.queue)
        self.now = max(self.now, t)
        self.events += 1
        kind = event[0]
        if kind == "flow_start":
            self._start_flow(event[1])
        elif kind == "flow_done":
            self._on_flow_due(event[1], event[2])
        elif kind == "deliver":
            self._deliver(sock, *event[1])
        elif kind == "tick":
            self._deliver(sock, {"src": "network", "dst": event[1], "kind": "tick", "round": -1, "t": 0.0,
                                 "body": {"tag": event[2]}}, [])
        elif kind == "device":
            self._device_change(*event[1:])
        elif kind == "link":
            self._link_change(*event[1:])
        elif kind == "checkpoint":
            self._begin_snapshot(sock, event[1])
        elif kind == "halt":
            self.halted = True
        return True

    # ---- checkpoints ---------------------------------------------------------------------------
    def _begin_snapshot(self, sock: zmq.Socket, round_: int) -> None:
        """A checkpoint of the run at this instant: every event before it is done, and (the lower
        bound says so) no actor can still send anything earlier. It is taken only when nothing is
        under way: no transfer in flight and no actor working, so that every process's state is data.
        Events already queued for later (timers, device changes, deliveries of finished transfers)
        are part of the network's state."""
        why = ("transfers in flight" if self.flows.flows else f"{len(self.holds)} actors working" if self.holds else
               "no checkpoint directory" if not self.cfg.checkpoint_dir else None)
        if why:
            self.to_conductor("report", {"type": "checkpoint_skipped", "round": round_, "t": self.now, "why": why})
            return
        staging = self.cfg.checkpoint_dir + ".new"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        self.snapshot_round, self.snapshot_failed = round_, []
        self.snapshot_waiting = {p for p in self.peer_actors if p != CONDUCTOR and not set(self.peer_actors[p]) <= self.dead}
        for peer in sorted(self.snapshot_waiting):
            sock.send_multipart([peer.encode(), envelope.pack("snapshot", round=round_, path=os.path.join(staging, f"{peer}.pkl"))])
        if not self.snapshot_waiting:
            self._finish_snapshot()

    def _finish_snapshot(self) -> None:
        staging = self.cfg.checkpoint_dir + ".new"
        if not self.snapshot_failed:
            try:
                with open(os.path.join(staging, "network.pkl"), "wb") as f:
                    pickle.dump(self.snapshot_state(), f, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # a full disk must not end the run
                self.snapshot_failed.append(f"network: {type(exc).__name__}: {exc}")
        if self.snapshot_failed:
            shutil.rmtree(staging, ignore_errors=True)
            self.to_conductor("report", {"type": "checkpoint_skipped", "round": self.snapshot_round, "t": self.now,
                                         "why": "; ".join(self.snapshot_failed)})
        else:
            self.to_conductor("report", {"type": "checkpoint", "round": self.snapshot_round, "t": self.now, "dir": staging})

    def snapshot_state(self) -> dict[str, Any]:
        return {
            "now": self.now, "queue": [(*e[:5], _portable_event(e[5])) for e in self.queue],
            "hold_ids": _peek(self, "hold_ids"), "transfer_ids": _peek(self, "transfer_ids"),
            "net_counter": _peek(self, "net_counter"), "dead": self.dead, "flows": self.flows, "online": self.online,
            "battery_dead": self.battery_dead, "offline_since": self.offline_since, "last_delivery": self.last_delivery,
            "links_down": self.links_down, "availability_used": self.availability_used,
            "batteries": {a: spec.battery for a, spec in self.devices.items()},
        }

    def _restore(self, path: str) -> None:
        with open(path, "rb") as f:
            state = pickle.load(f)
        self.now = state["now"]
        self.queue = state["queue"]
        heapq.heapify(self.queue)
        for name in ("hold_ids", "transfer_ids", "net_counter"):
            setattr(self, name, itertools.count(state[name]))
        for name in ("dead", "flows", "online", "battery_dead", "offline_since", "last_delivery", "links_down"):
            setattr(self, name, state[name])
        for actor, used in state["availability_used"].items():
            for _ in range(used):  # the same seeded draws as before, skipped
                next(self.availability[actor], None)
            self.availability_used[actor] = used
        for actor, battery in state["batteries"].items():
            self.devices[actor].battery = battery

    def _path(self, tr: Transfer) -> tuple:
        ups = [("group", f"{g}:up") for g in self.cfg.group_of.get(tr.src, [])]
        downs = [("group", f"{g}:down") for g in self.cfg.group_of.get(tr.dst, [])]
        return (("up", tr.src), *ups, *downs, ("down", tr.dst))

    def reachable(self, actor: str) -> bool:
        return self.online.get(actor, True) and not self.links_down.get(actor)

    def _loss(self, tr: Transfer) -> float:
        up, down = self.link(tr.src), self.link(tr.dst)
        return 1 - (1 - up.loss) * (1 - down.loss)

    def _rng(self, tr: Transfer, *stream: int) -> np.random.Generator:
        """A generator named by the transfer (and a stream tag), so that its draws do not depend on
        the order in which messages reached this process."""
        return np.random.default_rng([self.cfg.seed, stable_key(*tr.key), stable_key(tr.dst), *stream])

    def _impairments(self, tr: Transfer) -> None:
        """Jitter of both access links, and (fluid transport) the cost of lost segments: each is
        sent again and delays the message by one RTO. The tcp transport handles loss in its window."""
        up, down = self.link(tr.src), self.link(tr.dst)
        if not (up.jitter_s or down.jitter_s or up.loss or down.loss):
            return
        rng = self._rng(tr, 1)  # a stream apart from the tcp transport's loss draws
        delay = sum(float(rng.exponential(j)) for j in (up.jitter_s, down.jitter_s) if j > 0)
        loss = self._loss(tr)
        mss = self.cfg.framing.mss or 1448
        if loss > 0 and self.cfg.tcp is None:
            segments = max(1, -(-tr.wire_bytes // mss))
            lost = int(rng.binomial(segments, loss))
            tr.link_bytes += lost * (mss + self.cfg.framing.segment_overhead)  # each lost segment is sent again
            delay += lost * self.cfg.rto_s
        tr.extra_delay = delay

    def _reschedule(self, changed) -> None:
        heap, transfers = self.flow_heap, self.transfers
        for fid, done_at, version in changed:
            heapq.heappush(heap, (done_at, transfers[fid].src, fid, version, fid))
        if len(heap) > 4 * len(self.flows.flows) + 256:
            # A rebalance reschedules every flow whose rate moved, so most entries go stale within a
            # few events: dropping them all at once keeps the heap near the number of flows (its
            # order is total, so the same entries come out first either way).
            flows = self.flows.flows
            self.flow_heap = heap = [e for e in heap if e[4] in flows and flows[e[4]].version == e[3]]
            heapq.heapify(heap)
        self._sync_flow_head()

    def _sync_flow_head(self) -> None:
        heap, flows = self.flow_heap, self.flows.flows
        while heap and (heap[0][4] not in flows or flows[heap[0][4]].version != heap[0][3]):
            heapq.heappop(heap)  # superseded or gone
        top = heap[0] if heap else None
        if top is not None and top != self.flow_head:
            done_at, src, tid, version, fid = top
            self.push(done_at, FLOW_DONE, src, tid, 0, ("flow_done", fid, version))
        self.flow_head = top

    def _on_flow_due(self, fid: int, version: int) -> None:
        head = self.flow_head
        if head is None or head[4] != fid or head[3] != version:
            return  # a stand-in that an earlier event replaced
        heapq.heappop(self.flow_heap)
        self.flow_head = None
        self._flow_event(fid, version)
        self._sync_flow_head()

    def _start_flow(self, tr: Transfer) -> None:
        # numbered in event order, not in the order messages reached this process, which differs
        # between runs when several processes send at once
        tr.tid = next(self.transfer_ids)
        if tr.src in self.dead or tr.dst in self.dead:
            self.to_conductor("record", {"transfers": [tr.record(self.now, "dst_lost" if tr.dst in self.dead else "src_lost")]})
            return
        for actor in (tr.src, tr.dst):
            if not self.reachable(actor):
                self.to_conductor("record", {"transfers": [tr.record(self.now, self._why_unreachable(actor))]})
                return
        self._impairments(tr)
        self.transfers[tr.tid] = tr
        for actor in (tr.src, tr.dst):
            self.flows_of.setdefault(actor, set()).add(tr.tid)
        self.flows.advance(self.now)
        tcp = {}
        if self.cfg.tcp is not None:
            framing = self.cfg.framing
            tcp = dict(connection=(tr.src, tr.dst), rtt=2 * self._one_way(tr.src, tr.dst), seg_bits=(framing.mss + framing.segment_overhead) * 8.0,
                       mss=framing.mss, loss=self._loss(tr), rng=self._rng(tr))
        # the rates wait for the other transfers starting at this instant (step settles them)
        self._reschedule(self.flows.add(tr.tid, tr.link_bytes * 8.0, self._path(tr), settle=False, **tcp))

    def _one_way(self, src: str, dst: str) -> float:
        return self.link(src).latency_s + self.link(dst).latency_s

    def _flow_event(self, fid: int, version: int) -> None:
        flow = self.flows.flows.get(fid)
        if flow is None or flow.version != version:
            return  # rescheduled or aborted since
        self.flows.advance(self.now)
        finished, changed = self.flows.fire(fid)
        self._reschedule(changed)
        if not finished:
            return  # a window event: the flow goes on at its new rate
        _, changed = self.flows.remove(fid)
        self._reschedule(changed)
        tr = self._pop_transfer(fid)
        tr.link_bytes += int(round(flow.resent_bits / 8))
        self._drain_transfer(tr, tr.link_bytes)
        arrival = max(self.now, flow.floor) + self._one_way(tr.src, tr.dst) + tr.extra_delay
        self.to_conductor("record", {"transfers": [tr.record(arrival, "ok")]})
        tr.deliver_env["t"] = arrival
        self.push(arrival, DELIVER, tr.src, tr.tid, 1, ("deliver", (tr.deliver_env, tr.frames)))

    def _pop_transfer(self, fid: int) -> Transfer:
        tr = self.transfers.pop(fid)
        for actor in (tr.src, tr.dst):
            mine = self.flows_of.get(actor)
            if mine is not None:
                mine.discard(fid)
                if not mine:
                    del self.flows_of[actor]
        return tr

    def _abort(self, fid: int, outcome: str) -> None:
        flow, changed = self.flows.remove(fid)
        self._reschedule(changed)
        tr = self._pop_transfer(fid)
        sent_bits = tr.link_bytes * 8.0 + (flow.resent_bits - flow.remaining_bits if flow else 0.0)
        self.to_conductor("record", {"transfers": [tr.record(self.now, outcome, int(sent_bits // 8))]})
        self._drain_transfer(tr, int(sent_bits // 8))

    def _deliver(self, sock: zmq.Socket, env: dict[str, Any], frames: list[Any]) -> None:
        dst = env["dst"]
        peer = self.actor_peer.get(dst)
        if peer is None or dst in self.dead:
            return
        if env["src"] != "network" and not self.reachable(dst):
            return  # went off while the message was in flight (its transfer was already recorded)
        if self._to_peers:
            self._flush_peers(sock)  # a preview goes out before any delivery of its message
        env["t"] = self.now
        hold = next(self.hold_ids)
        self.holds.deliver(hold, dst, self.now)
        self.last_delivery[dst] = self.now
        shared = 0
        if env.pop("fanout", False):
            held = self.peer_payload.get(peer)
            if held is not None and held[0] is frames:
                shared, frames = held[1], []  # the peer holds these frames already
            else:
                shared = next(self.payload_ids)
                self.peer_payload[peer] = (frames, shared)
        header = envelope.pack("deliver", hold=hold, device=self.device_status(dst), shared=shared, **env)
        try:
            sock.send_multipart([peer.encode(), header, *frames], copy=False)
        except zmq.ZMQError:
            # its host is gone (killed before the conductor could tell us): nobody will answer this
            # delivery, and the conductor's peer_lost follows
            del self.holds[hold]

    # ---- devices and links in time ------------------------------------------------------------
    def _start_devices(self) -> None:
        for actor in sorted(self.devices):
            spec = self.devices[actor]
            self.online[actor] = spec.availability.initially_on
            if not self.online[actor]:
                self.offline_since[actor] = 0.0
            else:
                self._deliver_later(actor, "online", 0.0)
            self._schedule_next_transition(actor)
        for i, fault in enumerate(self.cfg.faults):
            if fault.kind == "link_down":
                self.push(fault.start, DEVICE, fault.actor, i, 0, ("link", fault.actor, True))
                if fault.end < INF:
                    self.push(fault.end, DEVICE, fault.actor, i, 1, ("link", fault.actor, False))

    def _deliver_later(self, actor: str, kind: str, t: float) -> None:
        msg = {"src": "network", "dst": actor, "kind": kind, "round": -1, "t": 0.0, "body": {}}
        self.push(t, DELIVER, actor, next(self.net_counter), 0, ("deliver", (msg, [])))

    def _schedule_next_transition(self, actor: str) -> None:
        nxt = next(self.availability[actor], None)
        self.availability_used[actor] += 1
        if nxt is not None:
            self.push(nxt, DEVICE, actor, next(self.net_counter), 0, ("device", actor, "toggle"))

    def device_status(self, actor: str) -> dict[str, Any] | None:
        spec = self.devices.get(actor)
        if spec is None:
            return None
        link = self.link(actor)
        status: dict[str, Any] = {"link": spec.link, "device": spec.device, "up_mbps": link.up_bps / MB,
                                  "down_mbps": link.down_bps / MB,
                                  "cpu_load": cpu_load(self.cfg.seed, spec.index, self.now, spec.load_period_s, spec.load_mean)}
        if spec.load_mean > 0:  # the process itself, so a client can follow its load through a long task
            status["load"] = LoadModel(self.cfg.seed, spec.index, spec.load_period_s, spec.load_mean).as_status()
        if spec.battery is not None:
            spec.battery.advance(self.now)
            status.update(battery=spec.battery.fraction, charging=spec.battery.charging)
        return status

    def _device_change(self, actor: str, what: str) -> None:
        if actor in self.dead or actor in self.battery_dead:
            return
        if what == "toggle":
            self._schedule_next_transition(actor)
            if self.online[actor]:
                self._go_offline(actor, "offline")
            else:
                self.online[actor] = True
                self._record_device(actor, "online")
                self._deliver_later(actor, "online", self.now)
        elif what == "battery" and self.online[actor]:
            self.battery_dead.add(actor)
            self._go_offline(actor, "battery")

    def _go_offline(self, actor: str, why: str) -> None:
        self.online[actor] = False
        self.offline_since[actor] = self.now
        self._record_device(actor, why)
        self._abort_flows_of(actor, why)

    def _link_change(self, actor: str, down: bool) -> None:
        self.links_down[actor] = self.links_down.get(actor, 0) + (1 if down else -1)
        self._record_device(actor, "link_down" if down else "link_up")
        if down:
            self._abort_flows_of(actor, "link_down")

    def _transfers_of(self, actors) -> list[int]:
        """The transfers in flight to or from any of these actors, in the order they started (fids
        are numbered so), without a pass over every flow: an idle device of a large population
        goes off while thousands of others transfer."""
        return sorted(set().union(*(self.flows_of.get(a, ()) for a in actors)))

    def _abort_flows_of(self, actor: str, outcome: str) -> None:
        self.flows.advance(self.now)
        for fid in self._transfers_of([actor]):
            self._abort(fid, outcome)

    def _why_unreachable(self, actor: str) -> str:
        if self.links_down.get(actor):
            return "link_down"
        return "battery" if actor in self.battery_dead else "offline"

    def _record_device(self, actor: str, event: str, **extra: Any) -> None:
        spec = self.devices.get(actor)
        battery = spec.battery if spec else None
        self.to_conductor("record", {"devices": [{"t": self.now, "client": actor, "event": event,
                                                  "battery": battery.fraction if battery else None, **extra}]})

    def _spend(self, actor: str, joules: float, what: str, t_empty: float) -> None:
        spec = self.devices.get(actor)
        if spec is None or spec.battery is None or joules <= 0 or actor in self.battery_dead:
            return
        spec.battery.advance(self.now)
        short = spec.battery.spend(joules)
        self._record_device(actor, what, energy_j=joules)
        if short > 0:
            self.push(t_empty, DEVICE, actor, next(self.net_counter), 0, ("device", actor, "battery"))

    def _drain_compute(self, actor: str, start: float, until: float, busy_s: float) -> None:
        spec = self.devices.get(actor)
        if spec is None or spec.battery is None or until <= start:
            return
        spec.battery.advance(self.now)
        level = spec.battery.level_j
        joules = spec.train_w * busy_s
        # the battery runs dry after level / train_w busy seconds, stretched like the whole task
        stretch = (until - start) / busy_s if busy_s > 0 else 1.0
        self._spend(actor, joules, "train", start + (level / spec.train_w * stretch if spec.train_w > 0 else 0.0))

    def _drain_transfer(self, tr: Transfer, link_bytes: int) -> None:
        for actor, attr in ((tr.src, "j_per_mb_up"), (tr.dst, "j_per_mb_down")):
            spec = self.devices.get(actor)
            if spec is not None:
                self._spend(actor, getattr(spec, attr) * link_bytes / MB, "send" if actor == tr.src else "receive", self.now)

    # ---- to the conductor ----------------------------------------------------------------------
    def to_conductor(self, op: str, body: dict) -> None:
        self._outbox.append(envelope.pack(op, body=body))

    def run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_message_bytes)
        sock.bind(self.cfg.endpoint)
        self._outbox: list[bytes] = []
        if self.cfg.listen:
            self.zap = ZapHandler(ctx, self.cfg.run_keys.hosts, "network")
            # security options apply to the endpoints bound after them: the local ipc one stays plain
            self.cfg.run_keys.serve(sock)
            try:
                sock.bind(self.cfg.listen)
            except zmq.ZMQError as exc:
                self.to_conductor("report", {"type": "fatal", "peer": "network",
                                             "error": f"the network cannot listen on {self.cfg.listen}: {exc}", "t_net": 0.0})
            else:
                self.to_conductor("report", {"type": "listening", "endpoint": sock.getsockopt_string(zmq.LAST_ENDPOINT),
                                             "t_net": 0.0})
        try:
            while not self.stopping:
                timeout, pacing = POLL_MS, False
                if self.queue and self.may_run_head():
                    timeout, pacing = min(POLL_MS, max(0, math.ceil(self.due_in() * 1000))), True
                waiting_for = ("realtime" if pacing else self._waiting_for()) if timeout else None
                began = time.monotonic()
                ready = sock.poll(timeout)
                if waiting_for is not None:
                    self.waited[waiting_for] += time.monotonic() - began
                if ready:
                    while sock.poll(0):
                        frames = sock.recv_multipart(copy=False)
                        self.receive(bytes(frames[0].buffer), frames[1:])
                elif timeout and self.cfg.parent_pid is not None and os.getppid() != self.cfg.parent_pid:
                    return
                self._watch_peers()
                # Process a bounded batch before looking at the socket again, so replies flow in.
                for _ in range(64):
                    if not self.step(sock):
                        break
                self._flush(sock)
            if self.halt_pending:  # everything up to the end of the run is recorded, however soon the stop came
                while self.step(sock):
                    pass
            if self.guard.changed:
                self.to_conductor("report", {"type": "refused_messages", **self.guard.counts(), "t_net": self.now})
            self.to_conductor("report", {"type": "network_stats", "events": self.events, "t_net": self.now,
                                         "cpu_s": time.process_time(), "clock_s": time.monotonic() - (self.wall_start or time.monotonic()),
                                         "waited_s": dict(self.waited)})
            self._flush(sock)
            for peer in self.peer_actors:
                if peer != CONDUCTOR:
                    try:
                        sock.send_multipart([peer.encode(), envelope.pack("stop")])
                    except zmq.ZMQError:
                        pass
            time.sleep(0.05)
        finally:
            if self.zap is not None:
                self.zap.close()
            ctx.destroy(linger=0)

    def _waiting_for(self) -> str:
        """Why the clock stands still while this process waits for a message (and no event is
        only waiting for its wall-clock time, in realtime mode): the run has not started, an actor
        has not answered a delivery yet (its host's reply is on the clock's path), an actor's
        declared work is not finished (real training), or nothing at all is pending."""
        if not self.started:
            return "start"
        if self.holds.unanswered:
            return "answers"
        return "work" if self.holds else "messages"

    def _watch_peers(self) -> None:
        """Once a second: tell the conductor of refused messages, and of peers gone silent. A peer
        whose last heartbeat said it was in the middle of a long job gets as long again."""
        now = time.monotonic()
        if now - getattr(self, "_last_watch", 0.0) < 1.0:
            return
        self._last_watch = now
        for refusal in self.zap.refusals() if self.zap is not None else []:
            self.to_conductor("report", {"type": "refused_key", "by": "network", **refusal, "t_net": self.now})
        if self.guard.changed:
            self.to_conductor("report", {"type": "refused_messages", **self.guard.counts(), "t_net": self.now})
        if self.cfg.peer_timeout_s is None:
            return
        for peer in self.guard.greeted:
            if peer == CONDUCTOR or peer in self.reported_silent or peer not in self.last_heard:
                continue
            silent = now - self.last_heard[peer]
            if silent > max(self.cfg.peer_timeout_s, 2 * self.busy_for.get(peer, 0.0)):
                self.reported_silent.add(peer)
                self.to_conductor("report", {"type": "peer_silent", "peer": peer, "silent_s": silent, "t_net": self.now})

    def _flush_peers(self, sock: zmq.Socket) -> None:
        for peer, parts in self._to_peers:
            try:
                sock.send_multipart([peer.encode(), *parts], zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                pass  # a peer that is gone or not keeping up: an answer or preview it does not need
        self._to_peers.clear()

    def _flush(self, sock: zmq.Socket) -> None:
        self._flush_peers(sock)
        if CONDUCTOR not in self.guard.greeted:
            return  # a host can report (its device, a fatal error) before the conductor has connected: keep it
        for header in self._outbox:
            try:
                sock.send_multipart([CONDUCTOR.encode(), header])
            except zmq.ZMQError:
                pass
        self._outbox.clear()


def _peek(owner: Any, name: str) -> int:
    """The next value of a counter attribute, leaving the counter where it was."""
    value = next(getattr(owner, name))
    setattr(owner, name, itertools.count(value))
    return value


def _portable_event(event: tuple) -> tuple:
    """A queued event with its message frames as bytes (ZeroMQ buffers do not pickle)."""
    as_bytes = lambda frames: [bytes(memoryview(f)) for f in frames]  # noqa: E731
    # A restored run's hosts hold no previews, and its network numbers them from 1 again.
    if event[0] == "flow_start":
        tr = event[1]
        return ("flow_start", Transfer(**{**tr.__dict__, "frames": as_bytes(tr.frames),
                                          "deliver_env": {**tr.deliver_env, "preview": 0}}))
    if event[0] == "deliver":
        env, frames = event[1]
        return ("deliver", ({**env, "preview": 0} if "preview" in env else env, as_bytes(frames)))
    return event


def network_main(cfg: NetworkConfig) -> None:
    from node.lifecycle import detach_from_terminal_signals, keep_freed_memory  # noqa: PLC0415  (as node processes)

    detach_from_terminal_signals(cfg.parent_pid, "network")
    keep_freed_memory()  # it relays model-sized frames
    Network(cfg).run()
