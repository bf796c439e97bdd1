"""Link arithmetic as pure functions: framing overhead, max-min fair rates, and a flow model.

A transfer of B wire bytes becomes link_bytes(B) bytes on the link (TCP/IP/Ethernet framing by
default), is transmitted at the max-min fair rate of its path (rates recomputed whenever a flow
starts or ends, as in SimGrid's flow-level model), and arrives one path latency after its last
byte left. With a transport (emulator/flows/transport.py), a flow's rate is further capped by its
connection's congestion window: the window is one more constraint in the same max-min filling,
so capacity a window-limited flow cannot use goes to the others."""
from __future__ import annotations

import functools
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from .records import FLOW_FIELDS, FlowRecord, Record
from .records import native as _flowfill  # without it: the Python filling, the same numbers
from .transport import EPS_BITS, Connection, TcpState, TcpTransport

_compiled_fill = _flowfill.max_min_fill if _flowfill else None
_compiled_rebalance = _flowfill.rebalance if _flowfill else None
_bind_types = _flowfill.bind_types if _flowfill else None

INF = math.inf


@dataclass(frozen=True)
class Framing:
    """Bytes on the link for a message: payload + per-segment headers + a per-transfer constant.

    Default: TCP/IPv4 with timestamps over Ethernet, 1514 bytes on the wire per 1448 of payload."""

    mss: int = 1448
    segment_overhead: int = 66
    per_transfer_bytes: int = 0

    def link_bytes(self, wire_bytes: int) -> int:
        if self.mss <= 0:
            return wire_bytes + self.per_transfer_bytes
        segments = max(1, -(-wire_bytes // self.mss))
        return wire_bytes + segments * self.segment_overhead + self.per_transfer_bytes


def max_min_rates(paths: Sequence[Sequence[Hashable]], capacity: Mapping[Hashable, float]) -> list[float]:
    """Max-min fair rate of each flow (water-filling, max_min_fill). A flow's path lists the links
    it crosses; links absent from `capacity` or with infinite capacity never constrain it."""
    return max_min_fill(paths, capacity)[0]


def max_min_fill(paths: Sequence[Sequence[Hashable]], capacity: Mapping[Hashable, float],
                 override: Mapping[Hashable, float] | None = None) -> tuple[list[float], list[Hashable | None]]:
    """Max-min fair rates and, for each flow, the link whose saturation fixed its rate (None when
    nothing constrains it); a link's capacity is looked up in `override` first. The compiled
    emulator/flows/_flowfill.c when it is built (bit for bit the same numbers), else `max_min_fill_py`."""
    if _compiled_fill is not None:
        return _compiled_fill(paths, capacity, override)
    return max_min_fill_py(paths, capacity, override)


def max_min_fill_py(paths: Sequence[Sequence[Hashable]], capacity: Mapping[Hashable, float],
                    override: Mapping[Hashable, float] | None = None) -> tuple[list[float], list[Hashable | None]]:
    """max_min_fill in Python. Water-filling with a heap of links by fair share: the link with the
    smallest share fixes all its unfixed flows at that share, which updates only the links on their
    paths, so each flow is fixed once: O(flows x path length x log links). Ties go to the link
    that appears first (flows in order, each path in order)."""
    import heapq

    if override:
        def get(link: Hashable, default: float) -> float:
            return override[link] if link in override else capacity.get(link, default)
    else:
        get = capacity.get
    n = len(paths)
    rates = [INF] * n
    bottleneck: list[Hashable | None] = [None] * n
    remaining: dict[Hashable, float] = {}
    users: dict[Hashable, list[int]] = {}
    links_of: list[list[Hashable]] = []  # each flow's finite links, once each
    for i, path in enumerate(paths):
        mine = []
        for link in path:
            flows = users.get(link)
            if flows is not None:
                if flows[-1] != i:  # a link twice on one path counts once
                    flows.append(i)
                    mine.append(link)
                continue
            cap = get(link, INF)
            if cap < INF:
                remaining[link] = float(cap)
                users[link] = [i]
                mine.append(link)
        links_of.append(mine)
    # A link only one flow crosses is a fixed cap on it: those wait in one sorted list instead of
    # the heap, and only links that flows share are updated as flows get fixed.
    order = {link: k for k, link in enumerate(users)}
    count: dict[Hashable, int] = {}
    heap, private = [], []
    for link, us in users.items():
        if len(us) == 1:
            private.append((remaining[link], order[link], link, us[0]))
        else:
            count[link] = len(us)
            heap.append((remaining[link] / len(us), order[link], link))
    private.sort()
    heapq.heapify(heap)
    shared_of = [[link for link in mine if link in count] for mine in links_of]
    push, pop = heapq.heappush, heapq.heappop
    fixed = [False] * n
    k, m = 0, len(private)

    def fix(i: int, share: float, link: Hashable) -> None:
        fixed[i] = True
        rates[i] = share
        bottleneck[i] = link
        for other in shared_of[i]:
            remaining[other] -= share
            left = count[other] - 1
            count[other] = left
            if left > 0 and other != link:
                push(heap, (remaining[other] / left, order[other], other))

    while heap or k < m:
        if k < m and (not heap or private[k][:2] < heap[0][:2]):
            cap, _, link, i = private[k]
            k += 1
            if not fixed[i]:
                fix(i, max(cap, 0.0), link)
            continue
        share, _, link = pop(heap)
        left = count[link]
        if left == 0 or share != remaining[link] / left:
            continue  # stale entry
        share = max(share, 0.0)
        for i in users[link]:
            if not fixed[i]:
                fix(i, share, link)
    return rates, bottleneck


class Flow(Record, FlowRecord):
    """A message's bits on its path (records.py holds its fields)."""

    __slots__ = ()
    FIELDS = FLOW_FIELDS

    def __init__(self, path: tuple[Hashable, ...], remaining_bits: float, rate: float = 0.0, *, synced_t: float = 0.0):
        self.path = path
        self.remaining_bits = remaining_bits
        self.rate = rate
        self.version = 0
        self.done_at = INF  # when its next event is due: the last bit, or a window event (tcp)
        self.tcp: TcpState | None = None
        self.active = True  # False while it waits for its connection (messages on one connection go in order)
        self.share = 0.0  # its last fair share not held down by its own window (bit/s)
        self.bottleneck: Hashable | None = None  # what fixed its rate: a link, its window ("window", id), or None
        self.link_bottleneck: Hashable | None = None  # the last link that fixed its rate
        self.synced_t = synced_t  # remaining_bits (and the window's counters) are as of this time

    @property
    def floor(self) -> float:
        """The last byte cannot leave before this (a retransmission still to come)."""
        return self.tcp.floor if self.tcp else -INF

    @property
    def resent_bits(self) -> float:
        return self.tcp.resent_bits if self.tcp else 0.0


if _bind_types is not None:
    _bind_types(Flow, TcpState, Connection)


@dataclass
class FlowModel:
    """Active flows and their rates. Callers advance time, add or remove flows, fire a flow's due
    event, and reschedule the events this returns (flow id, due time, version). Without a
    transport every event is a completion (the fluid model)."""

    capacity: dict[Hashable, float]
    transport: TcpTransport | None = None
    queue_s: dict[Hashable, float] = field(default_factory=dict)  # buffer of each link, in seconds of its rate
    t: float = 0.0
    flows: dict[Hashable, Flow] = field(default_factory=dict)
    qdelay: dict[Hashable, float] = field(default_factory=dict)
    load: dict[Hashable, float] = field(default_factory=dict)  # bit/s through each link, as last filled
    pinned: set = field(default_factory=set)  # links that fix some flow's rate (saturated), as last filled
    # standing queues (tcp): each flow's window beyond its BDP, waiting at its bottleneck link
    excess: dict[Hashable, tuple[Hashable, float]] = field(default_factory=dict)
    held: dict[Hashable, list] = field(default_factory=dict)  # link -> [bits its flows' windows hold, how many]
    fill: dict[Hashable, float] = field(default_factory=dict)  # link -> the part of what they hold its buffer takes
    unsettled: bool = False  # flows were added whose rates are not computed yet
    # a link whose capacity follows a trace: the rate its segment serialization in a flow's RTT is
    # counted at (the trace's mean), not the rate of the moment (an outage would put 12 s in it for good)
    nominal: dict[Hashable, float] = field(default_factory=dict)
    flow_class = Flow

    def advance(self, t: float) -> None:
        """Time moves on. A flow's bits are counted when something looks at it (sync): between
        its events a flow's rate is constant, so catching up at once is the same sum, and an
        event costs O(1) instead of a pass over every flow."""
        self.t = max(self.t, t)

    def sync(self, flow: Flow) -> None:
        """Bring the flow's remaining bits and window counters up to the current time."""
        dt = self.t - flow.synced_t
        if dt > 0 and flow.active and flow.rate > 0:
            bits = flow.rate * dt if flow.rate < INF else self._instant_bits(flow)
            bits = min(bits, flow.remaining_bits)
            flow.remaining_bits -= bits
            if flow.tcp:
                self.transport.sent(flow, bits)
        flow.synced_t = self.t

    def _instant_bits(self, flow: Flow) -> float:
        return self.transport.instant_bits(flow) if flow.tcp else flow.remaining_bits

    def add(self, fid: Hashable, bits: float, path: Sequence[Hashable], *, connection: Hashable = None,
            rtt: float = 0.0, seg_bits: float = 1514 * 8.0, mss: int = 1448, loss: float = 0.0,
            rng: np.random.Generator | None = None, settle: bool = True,
            control: str | None = None) -> list[tuple[Hashable, float, int]]:
        """A new flow of `bits` along `path`. With a transport, `connection` names the connection it
        uses (its window persists across flows), `rtt` the path's propagation RTT, `seg_bits` the
        link bits of a full segment (`mss` its payload bytes), `loss` the probability that a segment is
        lost and `control` the congestion control a new connection's sender runs (None: the transport's).
        With settle=False the rates are recomputed later, by `settle` or the next change: flows that
        start at one instant then cost one max-min filling together, not one each."""
        flow = self.flow_class(tuple(path), float(bits), synced_t=self.t)
        self.flows[fid] = flow
        if self.transport is not None:
            conn = self.transport.connection(connection, control)
            narrowest = min((self.nominal.get(link, self.capacity.get(link, INF)) for link in path), default=INF)
            serialization = seg_bits / narrowest if narrowest < INF else 0.0
            flow.tcp = TcpState(conn, rtt + serialization if rtt > 0 else 0.0, seg_bits, mss, loss, rng,
                                queues=self, fid=fid, path=flow.path)
            if conn.active is not None:
                flow.active = False
                if conn.waiting is None:
                    conn.waiting = deque()
                conn.waiting.append(fid)
                return []
            self._begin(fid)
        if not settle:
            self.unsettled = True
            return []
        return self._rebalance()

    def set_capacity(self, link: Hashable, bps: float) -> list[tuple[Hashable, float, int]]:
        """The link's rate is `bps` from now on (a trace's next bin): every flow's rate afresh, each
        flow's bits so far counted at the rate it had."""
        self.capacity[link] = bps
        if self.transport is not None:  # the bits standing in its buffer now drain at the new rate
            self._link_queue(link)
        return self._rebalance()

    def set_idle_capacity(self, link: Hashable, bps: float) -> None:
        """The rate of a link no flow crosses (a trace's bin, looked up as a flow starts on an idle
        traced link): nothing moves, so nothing is rebalanced."""
        self.capacity[link] = bps

    def settle(self) -> list[tuple[Hashable, float, int]]:
        """The rates after flows added with settle=False (nothing when none is pending)."""
        return self._rebalance() if self.unsettled else []

    def _begin(self, fid: Hashable) -> None:
        flow = self.flows[fid]
        flow.active = True
        flow.synced_t = self.t
        flow.tcp.conn.active = fid
        self.transport.begin(flow, self.t)

    def fire(self, fid: Hashable) -> tuple[bool, list[tuple[Hashable, float, int]]]:
        """The flow's due event, at the current time: True when its last bit has left."""
        flow = self.flows[fid]
        self.sync(flow)
        if flow.rate == INF:  # an unconstrained path moves its bits without time passing
            bits = min(flow.remaining_bits, self._instant_bits(flow))
            flow.remaining_bits -= bits
            if flow.tcp:
                self.transport.sent(flow, bits)
        self._snap(flow)
        if flow.tcp is None:
            return True, []  # the fluid model's only event is the last bit
        held = flow.bottleneck == ("window", fid)
        self.transport.fire(flow, self.t, flow.share * flow.tcp.rtt_base, self._queue_allowance(flow))
        if flow.remaining_bits <= EPS_BITS:
            return True, []
        window = self.transport.cap(flow, self.t)
        if not held and flow.rate > 0 and window >= flow.rate:
            # its window neither held it back nor does now: every rate stays as it is (only the
            # queue its window holds may have changed)
            self._queue_of(fid, flow)
            return False, self._reschedule_alone(fid, flow)
        if held and self._window_moves_alone(flow, window):
            for link in flow.path:
                if link in self.load:
                    self.load[link] += window - flow.rate
            flow.rate = window
            self.transport.after_rates(flow, self.t, True)
            # no standing queue changes: a window-limited flow keeps none, before and after
            return False, self._reschedule_alone(fid, flow)
        flow.done_at = INF  # forces a fresh schedule
        return False, self._rebalance(force=fid)

    def _reschedule_alone(self, fid: Hashable, flow: Flow) -> list[tuple[Hashable, float, int]]:
        """The flow's next event when no other flow's rate changed."""
        flow.version += 1
        flow.done_at = self.transport.next_event(flow, self.t)
        return [(fid, flow.done_at, flow.version)] if flow.done_at < INF else []

    def _window_moves_alone(self, flow: Flow, window: float) -> bool:
        """A flow its window held, whose new window still holds it, on links that fix nobody's rate
        and keep room for the change: the max-min solution of everyone else stays as it is (so
        there is nothing to recompute; one window event per RTT and loss makes this the common case)."""
        if not 0 <= flow.rate < INF or window >= INF:
            return False
        for link in flow.path:
            cap = self.capacity.get(link, INF)
            if cap >= INF:
                continue
            if link in self.pinned or self.load.get(link, 0.0) - flow.rate + window > cap * (1 - 1e-9):
                return False
        return True

    def _snap(self, flow: Flow) -> None:
        """What is left to send at an event that falls due now is zero when sending it would not
        move the clock: below one ulp of the time, t + bits/rate == t, and the event would come
        back at the same time for ever."""
        if not 0 < flow.rate < INF:
            return
        tol = flow.rate * math.ulp(max(abs(self.t), 1.0)) * 4 + EPS_BITS
        if flow.remaining_bits <= tol:
            flow.remaining_bits = 0.0
        if flow.tcp:
            st = flow.tcp
            if st.budget <= tol:
                st.budget = 0.0
            if st.loss_in <= tol:
                st.loss_in = 0.0

    def _queue_allowance(self, flow: Flow) -> float:
        """Bits of its bottleneck's buffer that fall to this flow: its part of the link's rate."""
        link = flow.link_bottleneck
        if link is None or self.capacity.get(link, INF) >= INF or flow.share <= 0:
            return 0.0
        return self.queue_s.get(link, 0.0) * flow.share

    def remove(self, fid: Hashable) -> tuple[Flow | None, list[tuple[Hashable, float, int]]]:
        flow = self.flows.get(fid)
        if flow is not None:
            self.sync(flow)  # its queue stays until the rebalance below recounts them all
        flow = self.flows.pop(fid, None)
        if flow is not None and flow.tcp is not None:
            conn = flow.tcp.conn
            if flow.active:
                self.transport.end(flow, self.t)
                while conn.waiting and conn.waiting[0] not in self.flows:
                    conn.waiting.popleft()
                if conn.waiting:
                    self._begin(conn.waiting.popleft())
            elif conn.waiting and fid in conn.waiting:
                conn.waiting.remove(fid)
        return flow, self._rebalance()

    def _rebalance(self, force: Hashable = None) -> list[tuple[Hashable, float, int]]:
        """Every active flow's rate afresh: emulator/flows/_flowfill.c's `rebalance` when it is built and
        none of the hooks it writes out is overridden, else `_rebalance_py` (the same numbers)."""
        if _compiled_rebalance is not None and _hooks_are_ours(type(self), type(self.transport)):
            return _compiled_rebalance(self, force)
        return self._rebalance_py(force)

    def _rebalance_py(self, force: Hashable = None) -> list[tuple[Hashable, float, int]]:
        """Every active flow's rate afresh. This runs at nearly every event of a tcp flow on a
        saturated link (hundreds of flows each time, most of the network's own work in a flagship
        round), so what `sync`, `TcpTransport.cap`, `TcpState.rtt` and `own_qdelay` compute is written
        out in its two passes, with the same float operations in the same order: a change to one of
        them must be made there too, and in emulator/flows/_flowfill.c's `rebalance`, which writes out
        this method."""
        self.unsettled = False
        active, paths, caps = self._synced_paths()
        rates, bottlenecks = max_min_fill(paths, self.capacity, caps)
        return self._apply_rates(active, rates, bottlenecks, force)

    def _synced_paths(self) -> tuple[list[tuple[Hashable, Flow]], list, dict]:
        """The first pass: each active flow synced to now, and the path it is filled on (its links,
        or its window's, where the window caps it)."""
        t, qdelay = self.t, self.qdelay
        standing, fill, capacity = self.excess, self.fill, self.capacity  # as of the last rebalance
        active: list[tuple[Hashable, Flow]] = []
        paths, caps = [], {}
        for fid, flow in self.flows.items():
            if not flow.active:
                continue
            active.append((fid, flow))
            st = flow.tcp
            dt = t - flow.synced_t
            rate = flow.rate
            if dt > 0 and rate > 0:  # sync
                bits = rate * dt if rate < INF else self._instant_bits(flow)
                remaining = flow.remaining_bits
                if bits > remaining:
                    bits = remaining
                flow.remaining_bits = remaining - bits
                if st is not None:
                    if st.budget < INF:
                        st.budget = max(0.0, st.budget - bits)
                    if st.loss_in < INF:
                        st.loss_in -= bits
            flow.synced_t = t
            if st is None or st.phase == "open":
                paths.append(flow.path)
                continue
            if st.phase == "ss":  # TcpTransport.cap: the pacing rate while the round's budget lasts
                cap = st.pacing if st.budget > EPS_BITS else 0.0
            else:
                # TcpTransport.cap: W over the RTT (path_qdelay's sum, in its order) less the flow's
                # own standing queue (own_qdelay)
                queued = 0.0
                if qdelay:
                    for link in flow.path:
                        queued += qdelay.get(link, 0.0)
                own = 0.0
                part = standing.get(fid)
                if part is not None and part[0] in fill:
                    own = part[1] * fill[part[0]] / capacity[part[0]]
                cap = st.conn.cwnd * st.seg_bits / ((st.rtt_base + queued) - own)
                if st.pacing < cap:
                    cap = st.pacing
            if cap < INF:
                caps[st.window_key] = cap
                paths.append(st.window_path)
            else:
                paths.append(flow.path)
        return active, paths, caps

    def _apply_rates(self, active: list[tuple[Hashable, Flow]], rates: list[float], bottlenecks: list,
                     force: Hashable) -> list[tuple[Hashable, float, int]]:
        """The second pass: the new rates, the windows' reaction to them (after_rates), the flows
        to reschedule, and (tcp) the links' load and standing queues afresh."""
        t, transport = self.t, self.transport
        changed: list[tuple[Hashable, float, int]] = []
        tcp = transport is not None
        if tcp:
            load: dict[Hashable, float] = {}
            pinned: set = set()
            self.load, self.pinned = load, pinned
            # the standing queues afresh: the window beyond a flow's share of the BDP waits in its
            # bottleneck's buffer, and that queue delays every flow through the link (for their next
            # rounds). In place once every flow's window has seen its new rate: until then its RTT
            # is the one it had
            excess: dict[Hashable, tuple[Hashable, float]] = {}
            held: dict[Hashable, list] = {}
        for (fid, flow), rate, link in zip(active, rates, bottlenecks):
            st = flow.tcp
            limited = link is not None and st is not None and link == st.window_key
            flow.bottleneck = link
            if not limited:
                flow.link_bottleneck = link
                if rate > 0:
                    flow.share = rate
            if st is not None and st.phase == "ca":  # TcpTransport.after_rates acts in "ca" only
                transport.after_rates(flow, t, limited)
            if rate != flow.rate or flow.done_at >= INF or fid == force:
                flow.rate = rate
                self._schedule(fid, flow, changed)
            if tcp:
                if link is not None and not limited:
                    pinned.add(link)
                if rate < INF:
                    for on in flow.path:
                        load[on] = load.get(on, 0.0) + rate
                if st is not None and st.phase == "ca":  # _excess_of is None in the other phases
                    part = self._excess_of(flow)
                    if part is not None:
                        _add_excess(excess, held, fid, part)
        if tcp:
            self.excess, self.held, self.qdelay, self.fill = excess, held, {}, {}
            for link in held:
                self._link_queue(link)
        return changed

    def _schedule(self, fid: Hashable, flow: Flow, changed: list) -> None:
        """The flow's next event at its current rate, appended to `changed` when there is one."""
        flow.version += 1
        rate = flow.rate
        if flow.tcp:
            flow.done_at = self.transport.next_event(flow, self.t)
        elif flow.remaining_bits <= 0 or rate == INF:
            flow.done_at = self.t
        elif rate > 0:
            flow.done_at = self.t + flow.remaining_bits / rate
        else:
            flow.done_at = INF
        if flow.done_at < INF:
            changed.append((fid, flow.done_at, flow.version))

    def _excess_of(self, flow: Flow) -> tuple[Hashable, float] | None:
        st = flow.tcp
        if st is None or st.phase != "ca" or st.limited or flow.link_bottleneck is None or flow.rate >= INF:
            return None
        # what stands in flight: the window, or less where the pacing keeps less there (BBR)
        inflight = st.conn.cwnd * st.seg_bits
        paced = st.pacing * st.rtt_base
        if paced < inflight:
            inflight = paced
        excess = inflight - flow.rate * st.rtt_base
        return (flow.link_bottleneck, excess) if excess > 0 else None

    def _queue_of(self, fid: Hashable, flow: Flow) -> None:
        self._drop_excess(fid)
        part = self._excess_of(flow)
        if part is not None:
            _add_excess(self.excess, self.held, fid, part)
            self._link_queue(part[0])

    def _drop_excess(self, fid: Hashable) -> None:
        part = self.excess.pop(fid, None)
        if part is None:
            return
        entry = self.held[part[0]]
        entry[0] -= part[1]
        entry[1] -= 1
        if entry[1] == 0:
            del self.held[part[0]]
        self._link_queue(part[0])

    def _link_queue(self, link: Hashable) -> None:
        entry = self.held.get(link)
        cap = self.capacity.get(link, INF)
        if entry is None or cap >= INF or entry[0] <= 0:
            self.qdelay.pop(link, None)
            self.fill.pop(link, None)
            return
        queued = min(entry[0], self.queue_s.get(link, 0.0) * cap)
        self.qdelay[link] = queued / cap
        self.fill[link] = queued / entry[0]

    # what a flow's window state reads (TcpState.qdelay and own_qdelay)
    def path_qdelay(self, path: tuple[Hashable, ...]) -> float:
        total, qdelay = 0.0, self.qdelay
        for link in path:  # sum()'s order (and its start: 0 + x is x)
            total += qdelay.get(link, 0.0)
        return total

    def own_qdelay(self, fid: Hashable) -> float:
        # _rebalance writes this out inline (its hot path)
        part = self.excess.get(fid)
        if part is None or part[0] not in self.fill:
            return 0.0
        return part[1] * self.fill[part[0]] / self.capacity[part[0]]


@functools.cache
def _hooks_are_ours(model_type: type, transport_type: type) -> bool:
    """Whether the compiled rebalance may stand in for `_rebalance_py`: it writes out these methods,
    so a subclass that overrides one of them must get the Python version."""
    model_hooks = ("_schedule", "_excess_of", "_link_queue", "_instant_bits", "sync", "_rebalance_py", "_synced_paths",
                   "_apply_rates", "path_qdelay")
    if any(getattr(model_type, name) is not getattr(FlowModel, name) for name in model_hooks):
        return False
    if transport_type is type(None):
        return True
    transport_hooks = ("after_rates", "next_event", "cap", "sent")
    return issubclass(transport_type, TcpTransport) and all(
        getattr(transport_type, name) is getattr(TcpTransport, name) for name in transport_hooks)


def _add_excess(excess: dict, held: dict, fid: Hashable, part: tuple[Hashable, float]) -> None:
    """Count a flow's window beyond its BDP (`part`: its bottleneck link, bits) in the link's total."""
    excess[fid] = part
    entry = held.setdefault(part[0], [0.0, 0])
    entry[0] += part[1]
    entry[1] += 1


def _add_transfer(model: FlowModel, i: int, tr: Mapping[str, Any], settle: bool, then_settle: bool) -> list:
    """simulate's start of transfer i: its flow added, and the events the rates that follow give."""
    extra = {k: v for k, v in tr.items() if k not in ("start", "after", "gap", "bits", "path", "latency")}
    changed = model.add(i, tr["bits"], tr["path"], settle=settle, **extra)
    return [*changed, *model.settle()] if then_settle else changed


def simulate(model: FlowModel, transfers: Sequence[Mapping[str, Any]], traces: Any = None,
             together: bool = False) -> list[tuple[float, float]]:
    """Run transfers alone through a flow model (no network process): each is a mapping with
    `start` (seconds, or `after`: the index of a transfer whose arrival starts it, plus `gap`),
    `bits`, `path`, `latency` (one way) and the keyword arguments of FlowModel.add. With `traces`
    (a traces.TraceRates), its links' capacities follow it as the network process makes them
    (emulator/transfers.py): a flow starting on a traced link looks its rate up, and the rate
    changes at the trace's bin boundaries while a flow uses the link. With `together`, flows that
    start at one instant get their rates once, as the network process adds them. Returns each
    transfer's (start, arrival): for tests, benchmarks and the validation tool's model side."""
    out: list[list[float]] = [[INF, INF] for _ in transfers]
    # (t, kind, flow, n, payload): one instant's events in flow order (capacity changes first), as the network
    # takes them by sender and transfer, not as a solver hands them out (flows in lockstep would swap roles)
    events: list[tuple[float, int, int, int, Any]] = []
    seq, on_link, watched = 0, {}, set()  # traced link -> flows on it; traced links with a change on the clock

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, kind, payload[1] if payload[0] == "flow" else -1, seq, payload))

    for link in (traces.refs if traces is not None else ()):
        model.nominal[link] = traces.mean(link)

    def watch(path: Sequence[Hashable], t: float, step: int) -> None:
        for link in path if traces is not None else ():
            if link not in traces:
                continue
            on_link[link] = on_link.get(link, 0) + step
            if step > 0 and link not in watched:  # idle until now: its rate as of now, and its next change
                model.set_idle_capacity(link, traces.rate(link, t))
                next_capacity(link, t)

    def next_capacity(link: Hashable, t: float) -> None:
        at = traces.next_change(link, t)
        if at < INF:
            push(at, 0, ("capacity", link))
            watched.add(link)

    followers: dict[int, list[int]] = {}
    for i, tr in enumerate(transfers):
        if "after" in tr:
            followers.setdefault(tr["after"], []).append(i)
        else:
            push(float(tr["start"]), 1, ("start", i))
    while events:
        t, _, _, _, (what, *rest) = heapq.heappop(events)
        model.advance(t)
        if what == "start":
            i = rest[0]
            tr = transfers[i]
            out[i][0] = t
            watch(tr["path"], t, 1)
            more = together and events and events[0][0] == t and events[0][1] == 1  # another start now
            for fid, due, version in _add_transfer(model, i, tr, settle=not more, then_settle=together and not more):
                push(due, 0, ("flow", fid, version))
        elif what == "capacity":
            link = rest[0]
            watched.discard(link)
            if on_link.get(link):  # (an idle link's next flow looks its rate up)
                for fid, due, version in model.set_capacity(link, traces.rate(link, t)):
                    push(due, 0, ("flow", fid, version))
                next_capacity(link, t)
        else:
            fid, version = rest
            flow = model.flows.get(fid)
            if flow is None or flow.version != version:
                continue
            finished, changed = model.fire(fid)
            if finished:
                arrival = max(t, flow.floor) + transfers[fid].get("latency", 0.0)
                out[fid][1] = arrival
                watch(transfers[fid]["path"], t, -1)
                _, changed = model.remove(fid)
                for j in followers.get(fid, []):
                    push(arrival + transfers[j].get("gap", 0.0), 1, ("start", j))
            for f2, due, v2 in changed:
                push(due, 0, ("flow", f2, v2))
    return [(a, b) for a, b in out]
