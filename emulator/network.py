"""The network process: peers' messages in, deliveries and records out, around the emulated clock.

Its parts, each owning its state, with calls going one way (this module -> the others):
- emulator/clock.py: the queue of typed events, the holds that bound it, realtime pacing;
- emulator/transfers.py: messages in flight as flows (emulator/flows/), their impairments and
  outcomes;
- emulator/timeline.py: devices online and offline, batteries and energy, link faults;
- emulator/checkpoints.py: taking and restoring a checkpoint;
- emulator/netshell.py: the ZeroMQ socket and its loop.
This module checks what peers send (emulator/peers.py's guard) and dispatches it by its op."""
from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Callable

import zmq

from node.lifecycle import settle_heap
from protocol import envelope
from protocol import curve
from protocol.batch import RouterBatches
from protocol.curve import ZapHandler

from .barriers import Barriers
from .checkpoints import Checkpoints
from .clock import Deliver, EventClock, FlowStart, Halt, TakeCheckpoint, Tick
from .netconfig import CONDUCTOR, NETWORK, SERVER, NetworkConfig, network_message
from .peers import PeerGuard
from .timeline import DeviceTimeline
from .transfers import Transfer, Transfers, truncated

log = logging.getLogger(__name__)

ALIVE_ACK = envelope.pack("alive_ack")


class Network:
    def __init__(self, cfg: NetworkConfig):
        self.cfg = cfg
        self.clock = EventClock(cfg.realtime_speedup)
        self.dead: set[str] = set()  # actors whose host was lost
        self.timeline = DeviceTimeline(cfg, self.clock, lambda body: self.to_conductor("record", body))
        self.transfers = Transfers(cfg, self.clock, self.timeline, self.dead, lambda body: self.to_conductor("record", body))
        self.checkpoints = Checkpoints(self)
        self.barriers = Barriers(self)
        self._outbox: list[bytes] = []
        self._to_peers: list[tuple[str, list[Any]]] = []  # heartbeat answers, sent before any delivery
        # frameless deliveries wait per peer and cross as one message (protocol/batch.py); one that
        # cannot reach its peer (gone) releases its hold, as a failed send does
        self.batches = RouterBatches(self._unreachable)
        self.zap: ZapHandler | None = None  # with cfg.listen: who may connect over TCP (emulator/netshell.py)
        self._answer_records: list[tuple[int, bytes]] = []  # see _on_done
        self.hold_ids = itertools.count()
        # A payload sent to several actors crosses to each peer once: the peer keeps the latest
        # shared payload it received, and this mirrors it (peer -> (payload frames, id)). Not saved
        # in a checkpoint: after a restore every peer is sent the frames again.
        self.peer_payload: dict[str, tuple[list[Any], int]] = {}
        self.payload_ids = itertools.count(1)
        self.guard = PeerGuard(cfg.peers)
        self.actor_peer = self.guard.owner
        self.peer_actors: dict[str, list[str]] = {}
        self._hello_so_far: dict[str, list[str]] = {}  # the parts of a hello said in parts, until its last
        self.quiet = self.guard.quiet  # actor -> the kinds it answers without moving the clock
        self.last_heard: dict[str, float] = {}  # wall time of each peer's last message
        self.busy_for: dict[str, float] = {}  # what its last heartbeat said about its current job
        self.reported_silent: set[str] = set()
        self.impostors: set[str] = set()  # slots a message came as with another key (reported once each)
        self.started = False
        self.own_process = False  # network_main's: the process is this network's (see settle_heap)
        self.stopping = False
        self.halt_pending = False  # the server said when the run ends...
        self.halted = False  # ...and the clock got there: no event after it runs
        self.handlers: dict[str, Callable[[str, dict[str, Any], list[Any]], None]] = {
            "alive": self._on_alive, "hello": self._on_hello, "send": self._on_send, "done": self._on_done,
            "timer": self._on_timer, "report": self._on_report, "checkpoint": self._on_checkpoint,
            "halt": self._on_halt, "snapshot_done": self._on_snapshot_done, "snapshot_part": self._on_snapshot_part,
            "barrier": self._on_barrier, "batch": self._on_batch,
        }
        self.conductor_handlers = {"peer_lost": lambda env: self._on_peer_lost(env["peer"]),
                                   "stop": lambda env: setattr(self, "stopping", True)}

    # the clock's, under the names the tests and tools know
    now = property(lambda self: self.clock.now)
    queue = property(lambda self: self.clock.queue)
    holds = property(lambda self: self.clock.holds)
    flows = property(lambda self: self.transfers.flows)

    def push(self, t: float, name: str, n: int, sub: int, event: Any) -> None:
        self.clock.push(t, name, n, sub, event)

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
        bound = self.cfg.slot_keys.get(peer)
        if bound is not None and frames and curve.user_key(frames[0]) != bound:  # another slot's key: an impostor
            reason = f"a message as {peer} that did not come with {peer}'s key"
            self.guard.refuse(identity, reason, sum(memoryview(f.buffer).nbytes for f in frames))
            if peer not in self.impostors:
                self.impostors.add(peer)
                self.to_conductor("report", {"type": "refused_claim", "peer": peer, "reason": reason, "t_net": self.now})
            return
        self.last_heard[peer] = time.monotonic()
        self.reported_silent.discard(peer)
        if not frames:
            self._refuse(peer, "an empty message")
            return
        self.on_message(peer, frames)

    def _on_batch(self, peer: str, env: dict[str, Any], payload: list[Any]) -> None:
        """A peer's frameless envelopes in one message: each handled as if it had come alone."""
        if payload:
            self._refuse(peer, "a batch with payload frames")
            return
        for part in env["parts"]:
            self.on_envelope(peer, part, [], nested=True)

    def _unreachable(self, holds: list[int]) -> None:
        for hold in holds:
            if hold is not None and hold in self.holds:  # (None: a quiet delivery, which holds nothing)
                del self.holds[hold]

    def _refuse(self, peer: str, reason: str) -> None:
        self.guard.refuse(peer.encode(), reason)

    def on_message(self, peer: str, frames: list[Any]) -> None:
        self.on_envelope(peer, frames[0].buffer, frames[1:])

    def on_envelope(self, peer: str, header: Any, payload: list[Any], nested: bool = False) -> None:
        try:
            env = envelope.unpack(header)
        except envelope.ProtocolError as exc:
            self._refuse(peer, str(exc))
            return
        op = env["op"]
        if nested and op == "batch":
            self._refuse(peer, "a batch inside a batch")
            return
        handler = self.handlers.get(op)
        if handler is not None:
            handler(peer, env, payload)
        elif peer == CONDUCTOR and op in self.conductor_handlers:
            self.conductor_handlers[op](env)
        else:
            self._refuse(peer, f"op {op!r} is not one a peer may send")

    def _owns(self, peer: str, actor: str) -> bool:
        if self.actor_peer.get(actor) != peer:
            self._refuse(peer, f"{peer} may not act for {actor!r}")
            return False
        return True

    def _on_alive(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        self.busy_for[peer] = float(env["busy_s"])
        self._to_peers.append((peer, [ALIVE_ACK]))

    def _on_hello(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        actors = self._hello_so_far.pop(peer, []) + list(env["actors"])
        if env["more"] and env["peer"] == peer and len(actors) <= self.guard.expected(peer):
            self._hello_so_far[peer] = actors  # the next part follows
            return
        refused = (f"{peer} said hello as {env['peer']!r}" if env["peer"] != peer else
                   self.guard.claim(peer, actors, env["quiet"]))
        if refused:
            self._refuse(peer, refused)
            self.to_conductor("report", {"type": "refused_claim", "peer": peer, "reason": refused, "t_net": self.now})
            return
        self.peer_actors[peer] = actors
        if not self.started and set(self.cfg.peers) <= self.guard.greeted:
            self._start_clock()

    def _start_clock(self) -> None:
        self.started = True
        self.clock.wall_start = time.monotonic()
        if self.cfg.restore:
            self.checkpoints.restore(self.cfg.restore)
            if self.clock.realtime_speedup:  # realtime: the clock goes on from the checkpoint's instant, now
                self.clock.wall_start = time.monotonic() - self.clock.now / self.clock.realtime_speedup
            self.to_conductor("report", {"type": "clock_started", "t_net": self.now, "resumed": True})
            return
        self.to_conductor("report", {"type": "clock_started", "t_net": 0.0})
        self.timeline.start()
        if self.own_process:
            settle_heap()  # every device's next change is on the clock now
        for actor in self.cfg.starters:
            self.clock.push_own(0.0, "", Deliver(network_message(actor, "start"), []))

    def _on_timer(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        if self._owns(peer, env["actor"]):
            self.clock.push_own(max(float(env["at"]), self.now), env["actor"], Tick(env["actor"], env["tag"]))

    def _on_report(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        extra = {"lag": self.clock.lag.stats()} if self.cfg.realtime_speedup else {}
        self.to_conductor("report", {**env["body"], "t_net": self.now, **extra})

    def _on_checkpoint(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        if self._owns(peer, env["actor"]):
            self.clock.push_own(max(float(env["at"]), self.now), env["actor"], TakeCheckpoint(env["round"]))

    def _on_barrier(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        if self._owns(peer, env["actor"]) and env["actor"] in self.cfg.barrier_group:
            self.barriers.arrive(env["actor"], env["round"], max(float(env["at"]), self.now))
        else:
            self._refuse(peer, f"{env['actor']} is not an actor of {peer} that meets at barriers")

    def _on_halt(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        if env["actor"] == SERVER and self._owns(peer, SERVER):
            self.halt_pending = True
            self.clock.push_own(max(float(env["at"]), self.now), SERVER, Halt(), sub=1)
        else:
            self._refuse(peer, "only the server ends a run")

    def _on_snapshot_done(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
        if not self.checkpoints.answered(peer, env["ok"], env["why"] if not env["ok"] else None):
            self._refuse(peer, f"{peer} answered a snapshot it was not asked for")

    def _on_snapshot_part(self, peer: str, _: dict[str, Any], payload: list[Any]) -> None:
        if not self.checkpoints.part(peer, payload):
            self._refuse(peer, f"{peer} sent a checkpoint part it was not asked for")

    def _on_send(self, peer: str, env: dict[str, Any], payload: list[Any]) -> None:
        src = env["src"]
        if not self._owns(peer, src) or src in self.dead:
            return
        t = max(float(env["t"]), self.now)  # a send can never land in the past
        if self.timeline.went_off_since_work(src):
            # the device went off after it was given this work: the work died with it
            self.to_conductor("record", {"transfers": [{
                "id": -1, "round": env["round"], "kind": env["kind"], "src": src, "dst": str(env["dst"]),
                "payload_bytes": 0, "fp32_bytes": 0, "wire_bytes": 0, "link_bytes": 0, "t_start": t, "t_end": t,
                "outcome": "battery" if src in self.timeline.battery_dead else "offline", "wasted_bytes": 0}]})
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
        for i, dst in enumerate(dsts):
            deliver_env = {"src": src, "dst": dst, "kind": env["kind"], "round": env["round"], "t": 0.0, "body": env["body"],
                           "fanout": len(dsts) > 1 and payload_frame_bytes > 0}
            unicast = envelope.pack("send", src=src, dst=dst, kind=env["kind"], round=env["round"], t=t, n=env["n"],
                                    body=env["body"], payload=env["payload"], fp32=env["fp32"])
            wire = len(unicast) + payload_frame_bytes
            tr = Transfer(-1, src, dst, env["kind"], env["round"], t, env["payload"], env["fp32"],
                          wire, self.cfg.framing.link_bytes(wire), deliver_env, payload, (src, env["n"], i),
                          notes=env["notes"] or None)
            self.clock.push(t, src, env["n"], i, FlowStart(tr))

    def _on_done(self, peer: str, env: dict[str, Any], _: list[Any]) -> None:
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
            self.timeline.drain_compute(hold[0], hold[1], until, busy)
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
        self.checkpoints.peer_lost(peer)
        lost = [a for a in self.peer_actors.get(peer, []) if a not in self.dead]
        self.dead.update(lost)
        for hid in [h for h, (actor, _) in self.holds.items() if actor in lost]:
            del self.holds[hid]
        self._release_answer_records()
        self.transfers.abort_lost(lost)
        if not lost:
            return
        self.barriers.members_lost()
        for watcher in self.cfg.watchers:
            if watcher not in self.dead:
                self.clock.push_own(self.now, "", Deliver(network_message(watcher, "peer_down", {"actors": lost, "peer": peer}), []))

    # ---- events --------------------------------------------------------------------------------
    def step(self, sock: zmq.Socket) -> bool:
        """Process at most one event; False when the lower bound forbids it, the queue is empty, or
        (realtime) the event is not yet due."""
        self.transfers.settle_if_last()
        if (self.halted or self.checkpoints.waiting or not self.queue or not self.clock.may_run_head()
                or self.clock.due_in() > 0):
            return False
        self.clock.pop().run(self, sock)
        return True

    def deliver(self, sock: zmq.Socket, env: dict[str, Any], frames: list[Any]) -> None:
        dst = env["dst"]
        peer = self.actor_peer.get(dst)
        if peer is None or dst in self.dead:
            return
        if env["src"] != NETWORK and not self.timeline.reachable(dst):
            return  # went off while the message was in flight (its transfer was already recorded)
        if self._to_peers:
            self._flush_peers(sock)
        env["t"] = self.now
        quiet = env["kind"] in self.quiet.get(dst, ())  # holds nothing: its answer precedes no event
        hold = 0 if quiet else next(self.hold_ids)
        if not quiet:
            self.holds.deliver(hold, dst, self.now)
        self.timeline.delivered(dst)
        shared = 0
        if env.pop("fanout", False):
            held = self.peer_payload.get(peer)
            if held is not None and held[0] is frames:
                shared, frames = held[1], []  # the peer holds these frames already
            else:
                shared = next(self.payload_ids)
                self.peer_payload[peer] = (frames, shared)
        header = envelope.pack("deliver", hold=hold, device=self.timeline.status(dst), shared=shared,
                               **({"quiet": True} if quiet else {}), **env)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("t=%.6f deliver %s -> %s %s (round %s) to %s", self.now, env["src"], dst, env["kind"], env["round"], peer)
        if not frames:
            self.batches.add(sock, peer, header, None if quiet else hold)
            return
        self.batches.flush_peer(sock, peer)  # what was queued for the peer goes first
        try:
            sock.send_multipart([peer.encode(), header, *frames], copy=False)
        except zmq.ZMQError:
            # its host is gone (killed before the conductor could tell us): nobody will answer this
            # delivery, and the conductor's peer_lost follows
            if not quiet:
                del self.holds[hold]

    # ---- to the conductor and the peers -------------------------------------------------------
    def to_conductor(self, op: str, body: dict) -> None:
        self._outbox.append(envelope.pack(op, body=body))

    def _flush_peers(self, sock: zmq.Socket) -> None:
        self.batches.flush(sock)
        for peer, parts in self._to_peers:
            try:
                sock.send_multipart([peer.encode(), *parts], zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                pass  # a peer that is gone or not keeping up: an answer it does not need
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

    def run(self) -> None:
        from .netshell import serve  # noqa: PLC0415  (the socket loop)
        serve(self)


def network_main(cfg: NetworkConfig) -> None:
    from node.lifecycle import building, detach_from_terminal_signals, keep_freed_memory  # noqa: PLC0415  (as node processes)

    detach_from_terminal_signals(cfg.parent_pid, "network")
    keep_freed_memory()  # it relays model-sized frames
    with building():  # (its configuration was unpickled with the collector off: see FreshProcess)
        net = Network(cfg)
    net.own_process = True
    net.run()
