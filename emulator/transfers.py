"""Transfers in flight: a sent message becomes a flow on its path (emulator/flows/), is impaired
(jitter, and the fluid transport's lost segments), finishes into a delivery or is aborted, and each
outcome becomes one row of transfers.csv. The flow model says when flows finish; this module keeps
the earliest of those times on the clock."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from node.seeding import parked, unpark

from .clock import FLOW_START, CapacityChange, Deliver, EventClock, FlowDue, peek
from .devices import stable_key
from .flows.levelflows import IncrementalFlowModel
from .flows.links import FlowModel
from .flows.traces import TraceRates
from .flows.transport import TcpTransport
from .netconfig import NetworkConfig
from .timeline import DeviceTimeline


@dataclass(slots=True)  # (a check-in wave holds one per device in flight: no __dict__ each)
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
    notes: dict[str, Any] | None = None  # the sender's records of the message (never delivered, never counted)

    def record(self, t_end: float, outcome: str, wasted: int = 0) -> dict[str, Any]:
        return {
            "id": self.tid, "round": self.round, "kind": self.kind, "src": self.src, "dst": self.dst,
            "payload_bytes": self.payload_bytes, "fp32_bytes": self.fp32_bytes, "wire_bytes": self.wire_bytes,
            "link_bytes": self.link_bytes, "t_start": self.t_start, "t_end": t_end, "outcome": outcome,
            "wasted_bytes": wasted, **({"notes": self.notes} if self.notes else {}),
        }


def truncated(frames: list[Any]) -> list[Any]:
    """The message with its last payload byte gone: what a cut-off or mis-framed message looks like."""
    if not frames:
        return frames
    last = bytes(memoryview(frames[-1]).cast("B"))
    return [*frames[:-1], last[:-1]]


class Transfers:
    def __init__(self, cfg: NetworkConfig, clock: EventClock, timeline: DeviceTimeline, dead: set[str],
                 record: Callable[[dict[str, Any]], None]):
        self.cfg, self.clock, self.timeline, self.dead, self.record = cfg, clock, timeline, dead, record
        model = IncrementalFlowModel if cfg.flow_solver == "incremental" else FlowModel
        capacities, queues = cfg.link_tables()
        self.flows = model(capacities, TcpTransport(cfg.tcp) if cfg.tcp else None, queues)
        self.in_flight: dict[int, Transfer] = {}
        self.flows_of: dict[str, set[int]] = {}  # actor -> its transfers in flight (a device's toggle aborts them)
        self.ids = itertools.count()
        # Every rebalance reschedules the flows whose rate changed: on a shared server link, all of
        # them. Their due times wait in a heap of their own, and only the earliest valid one is in
        # the event queue, with the key it would have had there, so the order of events is the same
        # and the queue does not fill with superseded ones.
        self.flow_heap: list[tuple] = []  # (done_at, src, tid, version, fid)
        self.flow_head: tuple | None = None  # the entry of flow_heap that stands in the queue
        # Trace-driven links: each one's rate is looked up when a flow starts on it while it has
        # none, then moves at its trace's bin boundaries while it has flows (an idle link costs no event).
        self.traces = TraceRates(cfg.traces) if cfg.traces else None
        for (direction, actor) in cfg.traces:  # a traced link's nominal rate is its trace's mean (world.py)
            link = cfg.link(actor)
            self.flows.nominal[(direction, actor)] = link.up_bps if direction == "up" else link.down_bps
        self.on_link: dict[tuple, set[int]] = {}  # trace-driven link -> the transfers using it
        self.change_pending: set[tuple] = set()  # trace-driven links whose next change is on the clock

    # ---- start -----------------------------------------------------------------------------------
    def start(self, tr: Transfer) -> None:
        # numbered in event order, not in the order messages reached this process, which differs
        # between runs when several processes send at once
        tr.tid = next(self.ids)
        now = self.clock.now
        if tr.src in self.dead or tr.dst in self.dead:
            self._record(tr.record(now, "dst_lost" if tr.dst in self.dead else "src_lost"))
            return
        for actor in (tr.src, tr.dst):
            if not self.timeline.reachable(actor):
                self._record(tr.record(now, self.timeline.why_unreachable(actor)))
                return
        self._impairments(tr)
        self.in_flight[tr.tid] = tr
        for actor in (tr.src, tr.dst):
            self.flows_of.setdefault(actor, set()).add(tr.tid)
        self.flows.advance(now)
        tcp = {}
        if self.cfg.tcp is not None:
            framing = self.cfg.framing
            loss = self._loss(tr)  # (a loss-free path draws nothing: it has no stream)
            tcp = dict(connection=(tr.src, tr.dst), rtt=2 * self.cfg.one_way(tr.src, tr.dst),
                       seg_bits=(framing.mss + framing.segment_overhead) * 8.0, mss=framing.mss, loss=loss,
                       rng=self._stream(tr) if loss > 0 else None, control=self.cfg.link(tr.src).congestion_control)
        path = self.cfg.path(tr.src, tr.dst)
        if self.traces is not None:
            self._watch_traced_links(tr.tid, path)
        # the rates wait for the other transfers starting at this instant (settle_if_last settles them)
        self._reschedule(self.flows.add(tr.tid, tr.link_bytes * 8.0, path, settle=False, **tcp))

    # ---- trace-driven links --------------------------------------------------------------------
    def _watch_traced_links(self, tid: int, path: tuple) -> None:
        """A transfer starts on these links: a traced one that had no flow takes its current rate,
        and its next change goes on the clock."""
        now = self.clock.now
        for link in path:
            if link not in self.traces:
                continue
            if link not in self.change_pending:  # idle past its last change: its rate as of now
                self.flows.set_idle_capacity(link, self.traces.rate(link, now))
                self._next_capacity_change(link)
            self.on_link.setdefault(link, set()).add(tid)

    def _next_capacity_change(self, link: tuple) -> None:
        at = self.traces.next_change(link, self.clock.now)
        if at < float("inf"):
            self.clock.push_own(at, link[1], CapacityChange(link), sub=0 if link[0] == "up" else 1)
            self.change_pending.add(link)

    def capacity_change(self, link: tuple) -> None:
        """A traced link's next bin: its new rate moves every flow (while it has flows)."""
        self.change_pending.discard(link)
        if not self.on_link.get(link):
            self.on_link.pop(link, None)
            return  # idle since: the next flow on it looks its rate up
        self.flows.advance(self.clock.now)
        self._reschedule(self.flows.set_capacity(link, self.traces.rate(link, self.clock.now)))
        self._next_capacity_change(link)

    def settle_if_last(self) -> None:
        """Compute the rates once the last transfer of this instant has started."""
        if self.flows.unsettled:
            following = self.clock.queue[0] if self.clock.queue else None
            if following is None or following[0] > self.clock.now or following[1] != FLOW_START:
                self._reschedule(self.flows.settle())

    def _loss(self, tr: Transfer) -> float:
        up, down = self.cfg.link(tr.src), self.cfg.link(tr.dst)
        return 1 - (1 - up.loss) * (1 - down.loss)

    def _stream(self, tr: Transfer, *stream: int) -> tuple:
        """A random stream named by the transfer (and a stream tag), so that its draws do not depend
        on the order in which messages reached this process: parked (node/seeding.py), the state
        np.random.default_rng of the same integers starts in."""
        return parked([self.cfg.seed, stable_key(*tr.key), stable_key(tr.dst), *stream])

    def _impairments(self, tr: Transfer) -> None:
        """Jitter of both access links, and (fluid transport) the cost of lost segments: each is
        sent again and delays the message by one RTO. The tcp transport handles loss in its window."""
        up, down = self.cfg.link(tr.src), self.cfg.link(tr.dst)
        if not (up.jitter_s or down.jitter_s or up.loss or down.loss):
            return
        rng = unpark(self._stream(tr, 1))  # a stream apart from the tcp transport's loss draws
        delay = sum(float(rng.exponential(j)) for j in (up.jitter_s, down.jitter_s) if j > 0)
        loss = self._loss(tr)
        mss = self.cfg.framing.mss or 1448
        if loss > 0 and self.cfg.tcp is None:
            segments = max(1, -(-tr.wire_bytes // mss))
            lost = int(rng.binomial(segments, loss))
            tr.link_bytes += lost * (mss + self.cfg.framing.segment_overhead)  # each lost segment is sent again
            delay += lost * self.cfg.rto_s
        tr.extra_delay = delay

    # ---- the earliest flow event on the clock -------------------------------------------------
    def _reschedule(self, changed) -> None:
        heap, transfers = self.flow_heap, self.in_flight
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
            self.clock.push(done_at, src, tid, 0, FlowDue(fid, version))
        self.flow_head = top

    def on_flow_due(self, fid: int, version: int) -> None:
        head = self.flow_head
        if head is None or head[4] != fid or head[3] != version:
            return  # a stand-in that an earlier event replaced
        heapq.heappop(self.flow_heap)
        self.flow_head = None
        self._flow_event(fid, version)
        self._sync_flow_head()

    # ---- finish and abort ------------------------------------------------------------------------
    def _flow_event(self, fid: int, version: int) -> None:
        flow = self.flows.flows.get(fid)
        if flow is None or flow.version != version:
            return  # rescheduled or aborted since
        now = self.clock.now
        self.flows.advance(now)
        finished, changed = self.flows.fire(fid)
        self._reschedule(changed)
        if not finished:
            return  # a window event: the flow goes on at its new rate
        _, changed = self.flows.remove(fid)
        self._reschedule(changed)
        tr = self._pop(fid)
        tr.link_bytes += int(round(flow.resent_bits / 8))
        self.timeline.drain_transfer(tr.src, tr.dst, tr.link_bytes)
        arrival = max(now, flow.floor) + self.cfg.one_way(tr.src, tr.dst) + tr.extra_delay
        self._record(tr.record(arrival, "ok"))
        tr.deliver_env["t"] = arrival
        self.clock.push(arrival, tr.src, tr.tid, 1, Deliver(tr.deliver_env, tr.frames))

    def _pop(self, fid: int) -> Transfer:
        tr = self.in_flight.pop(fid)
        if self.traces is not None:
            for link in self.cfg.path(tr.src, tr.dst):
                users = self.on_link.get(link)
                if users is not None:
                    users.discard(fid)
        for actor in (tr.src, tr.dst):
            mine = self.flows_of.get(actor)
            if mine is not None:
                mine.discard(fid)
                if not mine:
                    del self.flows_of[actor]
        return tr

    def abort(self, fid: int, outcome: str) -> None:
        flow, changed = self.flows.remove(fid)
        self._reschedule(changed)
        tr = self._pop(fid)
        sent_bits = tr.link_bytes * 8.0 + (flow.resent_bits - flow.remaining_bits if flow else 0.0)
        self._record(tr.record(self.clock.now, outcome, int(sent_bits // 8)))
        self.timeline.drain_transfer(tr.src, tr.dst, int(sent_bits // 8))

    def of(self, actors: Iterable[str]) -> list[int]:
        """The transfers in flight to or from any of these actors, in the order they started (fids
        are numbered so), without a pass over every flow: an idle device of a large population
        goes off while thousands of others transfer."""
        return sorted(set().union(*(self.flows_of.get(a, ()) for a in actors)))

    def abort_flows_of(self, actor: str, outcome: str) -> None:
        self.flows.advance(self.clock.now)
        for fid in self.of([actor]):
            self.abort(fid, outcome)

    def abort_lost(self, lost: list[str]) -> None:
        """The transfers of actors whose host was lost end as src_lost or dst_lost."""
        self.flows.advance(self.clock.now)
        for fid in self.of(lost):
            self.abort(fid, f"{'src' if self.in_flight[fid].src in lost else 'dst'}_lost")

    def _record(self, row: dict[str, Any]) -> None:
        self.record({"transfers": [row]})

    # ---- checkpoints -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"flows": self.flows, "transfer_ids": peek(self, "ids"), "on_link": self.on_link,
                "change_pending": self.change_pending}

    def restore(self, state: dict[str, Any]) -> None:
        self.flows = state["flows"]
        self.ids = itertools.count(state["transfer_ids"])
        self.on_link = state.get("on_link", {})
        self.change_pending = state.get("change_pending", set())

