"""The flow model with rates kept up to date incrementally, for rounds where thousands of flows
share one link (network.flow_solver: incremental).

`links.FlowModel` fills max-min rates from scratch over every flow at every change and reschedules
every flow whose rate moved: O(F log F) per event, and O(F) new events whenever a shared link's
fair share moves, which it does at nearly every event. Here:
- rates come from `maxmin.IncrementalMaxMin`: a change costs O(sqrt F) on a star (a shared link
  whose flows cross no other shared link) and a from-scratch solve of its component elsewhere;
- the flows a star's water level holds ("level flows") carry no rate of their own: they all move
  at the level, so the star keeps one virtual clock (bits per level flow sent so far), a flow's
  progress is the clock's advance since it last looked, and its bit-driven events (last bit, the
  slow-start round's budget, the next lost segment) wait in the star's heap in clock units. Only
  the star's earliest is scheduled with the network process, so a level change reschedules one
  flow, not all of them;
- only flows whose rate really changes are touched: the changed flow, flows whose case changed,
  flows of a re-solved component, and the flows whose own cap lies between a star's old and new
  level (they switch between being held by the level and by their own link or window).

Under tcp it follows the from-scratch model's rules exactly where they read state, so that both
give the same times (tests/test_levelflows.py checks it on random workloads):
- a window's cap is read again at the events where the from-scratch model fills every rate afresh
  (a start, an end, a window event it cannot take alone), for every flow whose cap's inputs moved
  since (its own window, or a queue on its path), except that a level flow whose cap rose with a
  shorter queue keeps its lower cap (a cap above the level does not enter the filling, and the
  flow's cap is read afresh whenever the level reaches it); its two shortcuts (an event that moves
  no other flow's rate) are taken on the same conditions, and then nothing else is read;
- a standing queue is the sum of its flows' parts taken from zero in the order the flows were
  added, as the from-scratch model sums it, so the two read the same float;
- ties are broken in the order flows were added; a flow that leaves its star's level at the rate
  it had keeps the event it had.
What still differs: the last bits in places (a star's level is (C - sum of the held caps) /
(n - held), not the scratch filling's subtractions in its order; a level flow's part of a standing
queue is taken at that level, and a part of 1e-10 bits may be counted by one model and not the
other). Where a window equals a fair share to those bits (BBR paces at the rate it measured),
the two can decide a tie differently. Measured on the random workloads of tests/flow_scenarios.py:
CUBIC 200 of 200 within 1e-12 s; a mix of CUBIC, BBR and Reno senders 198 of 200 (the others
within 0.2 ms); BBR alone 97 of 100 (the others within 0.2 ms); Reno alone 100 of 100.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from .links import INF, Flow, FlowModel
from .maxmin import IncrementalMaxMin
from .scratchrules import ScratchShortcuts, SummedQueues, window_link
from .transport import EPS_BITS


class StarClock:
    """A star link's water level and the bits each of its level flows has sent since the clock began."""

    __slots__ = ("link", "level", "v", "tv", "heap", "budgets", "head", "ca", "before", "epoch")

    def __init__(self, link: Hashable, t: float) -> None:
        self.link = link
        self.level = INF
        self.v = 0.0
        self.tv = t
        self.heap: list[tuple[float, int, Hashable, int]] = []  # (clock value due, seq, flow, key)
        self.budgets: list[tuple[float, int, Hashable, int]] = []  # the same, when slow-start budgets run out
        self.head: Hashable | None = None  # the level flow whose clock event is scheduled
        self.ca: dict[Hashable, Flow] = {}  # level flows in congestion avoidance: their windows' excess queues here
        self.before = INF  # the level before the rebalance `epoch` moved it
        self.epoch = -1

    def at(self, t: float) -> float:
        if 0 < self.level < INF and t > self.tv:
            return self.v + self.level * (t - self.tv)
        return self.v

    def set_level(self, t: float, level: float, epoch: int) -> None:
        if epoch != self.epoch:
            self.before, self.epoch = self.level, epoch
        self.v = self.at(t)
        self.tv = t
        self.level = level

    def due(self, v_due: float, t: float) -> float:
        if not 0 < self.level < INF:
            return INF if self.level <= 0 else t
        return t + max(v_due - self.at(t), 0.0) / self.level


class LevelFlow(Flow):
    """A flow whose rate and fair share are its star's level while the level holds it."""

    # slots, not a __dict__ per flow: a check-in wave holds hundreds of thousands of flows at once
    __slots__ = ("star", "v_synced", "v_due", "order", "vkey", "mode", "watched", "_rate", "_share")

    def __init__(self, path: tuple[Hashable, ...], remaining_bits: float, rate: float = 0.0, *, synced_t: float = 0.0):
        self.star: StarClock | None = None
        self.v_synced = 0.0
        self.v_due = INF  # its star clock's value when its bit-driven event falls due
        self.order = 0  # when it was added, among all flows
        self.vkey = 0
        self.mode = ""  # "" (not placed), "alone", "star", "general"
        self.watched = False  # in `watchers` (IncrementalFlowModel): its cap reads a queue on its path
        self._rate = 0.0
        self._share = 0.0
        super().__init__(path, remaining_bits, rate, synced_t=synced_t)

    @property
    def rate(self) -> float:  # type: ignore[override]
        return self.star.level if self.star is not None else self._rate

    @rate.setter
    def rate(self, value: float) -> None:
        self._rate = value

    @property
    def share(self) -> float:  # type: ignore[override]
        return self.star.level if self.star is not None else self._share

    @share.setter
    def share(self, value: float) -> None:
        self._share = value


@dataclass
class IncrementalFlowModel(ScratchShortcuts, SummedQueues, FlowModel):
    flow_class = LevelFlow
    mm: IncrementalMaxMin = field(init=False)
    stars: dict[Hashable, StarClock] = field(default_factory=dict)
    pending: dict[Hashable, None] = field(default_factory=dict)  # active flows not yet placed
    was_impure: set = field(default_factory=set)
    # window-limited flows in congestion avoidance, by link: their cap reads the link's queue, so
    # they are read again when it moves (as the from-scratch model reads every cap at every change)
    watchers: dict[Hashable, dict[Hashable, None]] = field(default_factory=dict)
    queue_moved: set = field(default_factory=set)
    epoch: int = 0  # rebalances so far
    added: int = 0  # flows added so far
    # flows whose part of a standing queue is counted again at the end of the rebalance: until
    # then every window reads the queues as the last rebalance left them, as in the scratch model
    requeue: dict[Hashable, None] = field(default_factory=dict)
    ca_of: dict[Hashable, StarClock] = field(default_factory=dict)  # level flow -> the star whose queue it is in
    parts_at: dict[Hashable, dict[Hashable, None]] = field(default_factory=dict)  # link -> flows with a part in its queue
    stale_links: set = field(default_factory=set)  # links whose sum must be taken afresh at the next rebalance
    due: list = field(default_factory=list)  # heap of (due, order, flow, version): events scheduled outside the stars

    def __post_init__(self) -> None:
        self.mm = IncrementalMaxMin(self.capacity)

    # ---- progress -------------------------------------------------------------------------------
    def sync(self, flow: Flow) -> None:
        star = getattr(flow, "star", None)
        if star is None:
            super().sync(flow)
            return
        v = star.at(self.t)
        bits = min(max(v - flow.v_synced, 0.0), flow.remaining_bits)
        flow.v_synced = v
        if bits > 0 and flow.active:
            flow.remaining_bits -= bits
            if flow.tcp:
                self.transport.sent(flow, bits)
        flow.synced_t = self.t

    # ---- changes --------------------------------------------------------------------------------
    def add(self, fid: Hashable, bits: float, path: Sequence[Hashable], *, settle: bool = True, **kw):
        super().add(fid, bits, path, settle=False, **kw)
        # ties are broken in the order flows were added, as the from-scratch model lists them
        self.flows[fid].order = self.added = self.added + 1
        if not self.flows[fid].active:  # it waits for its connection: nothing moves (as in FlowModel.add)
            return []
        self.pending[fid] = None
        return self._rebalance() if settle else []

    def _begin(self, fid: Hashable) -> None:
        super()._begin(fid)
        self.pending[fid] = None

    def remove(self, fid: Hashable):
        flow = self.flows.get(fid)
        if flow is not None:
            self.sync(flow)
            self._unplace(fid, flow)
        self.pending.pop(fid, None)
        return super().remove(fid)

    def fire(self, fid: Hashable):
        flow = self.flows[fid]
        self.sync(flow)
        if flow.rate == INF:
            bits = min(flow.remaining_bits, self._instant_bits(flow))
            flow.remaining_bits -= bits
            if flow.tcp:
                self.transport.sent(flow, bits)
        self._snap(flow)
        if flow.tcp is None:
            return True, []
        held = flow.bottleneck == window_link(fid)
        self.transport.fire(flow, self.t, flow.share * flow.tcp.rtt_base, self._queue_allowance(flow))
        if flow.remaining_bits <= EPS_BITS:
            return True, []
        # the from-scratch model's two shortcuts, taken where it takes them: no other flow's rate
        # or cap is read again until the next change that fills the rates afresh
        window = self.transport.cap(flow, self.t)
        alone = held and self._window_moves_alone(fid, flow, window)  # (on the rates as they were)
        self._replace_if_capped(fid, flow, window)  # the solver follows the window either way
        if not held and flow.rate > 0 and window >= flow.rate:
            self._queue_alone(fid, flow)
            return False, self._reschedule_alone(fid, flow)
        if alone:
            flow.rate = window
            self.transport.after_rates(flow, self.t, True)
            return False, self._reschedule_alone(fid, flow)
        self.mm.touched_flows.add(fid)
        return False, self._rebalance(force=fid)

    def set_capacity(self, link: Hashable, bps: float) -> list[tuple[Hashable, float, int]]:
        """A traced link's next bin: its flows placed again in the solver, then FlowModel's (the queue
        drains at the new rate, which moves the caps of the windows that read it, and a rebalance)."""
        self.mm.set_capacity(link, bps)
        return super().set_capacity(link, bps)

    def set_idle_capacity(self, link: Hashable, bps: float) -> None:
        super().set_idle_capacity(link, bps)
        if link in self.mm.users:  # (a trace past its end without a loop holds its last rate)
            if self.mm.capacity.get(link) != float(bps):
                raise ValueError(f"link {link!r} carries flows: its rate moves by set_capacity")
            return
        self.mm.capacity[link] = float(bps)

    def _place(self, fid: Hashable, flow: Flow) -> None:
        cap = self.transport.cap(flow, self.t) if flow.tcp else INF
        self.mm.capacity[window_link(fid)] = cap
        self.mm.add(fid, (*flow.path, window_link(fid)), flow.order)

    def _watch(self, fid: Hashable, flow: Flow, on: bool) -> None:
        if on == flow.watched:
            return
        flow.watched = on
        for link in flow.path:
            if on:
                self.watchers.setdefault(link, {})[fid] = None
            else:
                self.watchers[link].pop(fid, None)

    def _unplace(self, fid: Hashable, flow: Flow) -> None:
        self._watch(fid, flow, False)
        if fid in self.mm.paths:
            self.mm.remove(fid)
            self.mm.capacity.pop(window_link(fid), None)
        self._leave_star(fid, flow)
        flow.mode = ""
        self.requeue[fid] = None  # its queue goes at the end of the rebalance that follows

    def _leave_star(self, fid: Hashable, flow: Flow) -> None:
        star = flow.star
        if star is None:
            return
        self.sync(flow)
        flow.star = None
        # its fair share stays what the level was when it last held the flow, before this
        # rebalance moved it (as the from-scratch model keeps a flow's last link-held rate)
        flow._rate = flow._share = star.before if star.epoch == self.epoch else star.level
        if star.head == fid:
            star.head = None

    def _replace_if_capped(self, fid: Hashable, flow: Flow, cap: float | None = None) -> bool:
        """Place the flow again when its window's cap (`cap`, if the caller has just read it) moved."""
        if cap is None:
            cap = self.transport.cap(flow, self.t)
        window = window_link(fid)
        if cap == self.mm.capacity.get(window):
            return False
        self.mm.set_own_capacity(fid, window, cap)
        return True

    def _recap_after_queue(self, fid: Hashable, flow: Flow) -> bool:
        """Read a watched flow's cap again after a queue on its path moved. A level flow whose cap
        rose keeps the lower cap the solver has (a cap above the level does not enter it): should
        the level ever rise to that cap, the flow is touched and its cap read afresh before it is
        settled (as every touched flow's is), so the solver never holds a cap above the true one."""
        cap = self.transport.cap(flow, self.t)
        star = flow.star
        if star is not None and star.level < self.mm.capacity.get(window_link(fid), -INF) < cap:
            return False
        return self._replace_if_capped(fid, flow, cap)

    # ---- the rates after changes ----------------------------------------------------------------
    def _rebalance(self, force: Hashable = None) -> list[tuple[Hashable, float, int]]:
        self.unsettled = False
        self.epoch += 1
        mm, flows = self.mm, self.flows
        moved, self.queue_moved = self.queue_moved, set()
        exact = set()  # caps just read and placed: nothing moves them again in this rebalance
        for link in moved:
            for fid in list(self.watchers.get(link, ())):
                flow = flows.get(fid)
                if flow is not None and fid in mm.paths:
                    self.sync(flow)
                    if self._recap_after_queue(fid, flow):
                        mm.touched_flows.add(fid)
                        exact.add(fid)
        self._catch_up_due()
        for fid in self.pending:
            flow = flows.get(fid)
            if flow is not None and flow.active and fid not in mm.paths:
                self.sync(flow)
                self._place(fid, flow)
        self.pending.clear()
        touched: set[Hashable] = set()
        stars_changed: set[Hashable] = set()
        while mm.touched_flows or mm.touched_links or mm.dirty:
            found = self._collect(stars_changed)
            # a touched flow's window may have moved as it caught up (a slow-start round's budget
            # spent): read its cap again, as the from-scratch model reads every cap
            for fid in found - touched:
                flow = flows.get(fid)
                if flow is not None and fid in mm.paths and fid not in exact:
                    self.sync(flow)
                    if flow.tcp is not None:
                        self._replace_if_capped(fid, flow)
            touched |= found
        changed: list[tuple[Hashable, float, int]] = []
        for fid in touched:
            flow = flows.get(fid)
            if flow is None or fid not in mm.paths:
                continue
            self.sync(flow)
            old_star = flow.star
            self._settle_flow(fid, flow, changed, force == fid)
            if old_star is not None:
                stars_changed.add(old_star.link)
            if flow.star is not None:
                stars_changed.add(flow.star.link)
        if force is not None and force not in touched and force in flows:
            self._settle_flow(force, flows[force], changed, True)
        for link in stars_changed:
            star = self.stars.get(link)
            if star is not None:
                self._reschedule_head(star, changed)
        self._requeue_all(stars_changed)
        return changed

    def _collect(self, stars_changed: set) -> set:
        """The flows whose rates the changes recorded in the solver may have moved; new levels set."""
        mm = self.mm
        touched = mm.touched_flows
        for link in mm.touched_links:
            if link in mm.impure:
                self.was_impure.add(link)
                continue
            if link in self.was_impure:  # its last flow on another shared link left: a star again
                self.was_impure.discard(link)
                touched.update(mm.users.get(link, ()))
            if link not in mm.caps:
                continue
            new = mm.level(link)
            star = self.stars.get(link)
            if star is None:
                star = self.stars[link] = StarClock(link, self.t)
            old = star.level
            if new != old:
                low, high = min(old, new), max(old, new)
                touched.update(mm.by_seq[seq] for seq in mm.caps[link].between(low, high))
                star.set_level(self.t, new, self.epoch)
            stars_changed.add(link)
        touched.update(mm.solve_dirty())
        mm.touched_links = set()
        mm.touched_flows = set()
        return touched

    def _settle_flow(self, fid: Hashable, flow: Flow, changed: list, force: bool) -> None:
        """The flow's rate, what fixes it and its next event, after the changes."""
        mm = self.mm
        shared = mm.attached[fid]
        window = window_link(fid)
        was_level = flow.star is not None
        kept = self._level_due(flow) if was_level else INF  # its event, should its rate not move
        if not shared:
            rate, link = self._own_cap(fid, flow, None)
            self._leave_star(fid, flow)
            flow.mode = "alone"
        elif len(shared) == 1 and shared[0] not in mm.impure:
            star_link = shared[0]
            star = self.stars.get(star_link)
            if star is None:
                star = self.stars[star_link] = StarClock(star_link, self.t)
                star.set_level(self.t, mm.level(star_link), self.epoch)
            own, own_link = self._own_cap(fid, flow, star_link)
            flow.mode = "star"
            if own > star.level:
                link = star_link
                if flow.star is not star:
                    self._leave_star(fid, flow)
                    flow.star = star
                    flow.v_synced = star.at(self.t)
                self._after(fid, flow, link)
                self.requeue[fid] = None
                self._schedule_level(fid, flow, star, changed)
                return
            rate, link = own, own_link
            self._leave_star(fid, flow)
        else:
            self._leave_star(fid, flow)
            flow.mode = "general"
            rate, link = mm.general[fid], mm.general_bottleneck[fid]
        was = flow.rate
        flow.rate = rate
        if link != window and rate > 0:
            flow.share = rate
        self._after(fid, flow, link)
        if self.transport is not None:
            self.requeue[fid] = None
        if rate == was and not force and (flow.done_at < INF or was_level):
            if was_level:  # out of the level at the rate it had: its event stays when it was due
                flow.version += 1
                flow.done_at = kept
                if kept < INF:
                    changed.append((fid, kept, flow.version))
                    self._note_due(fid, flow)
            return
        self._schedule(fid, flow, changed)

    def _own_cap(self, fid: Hashable, flow: Flow, shared: Hashable) -> tuple[float, Hashable | None]:
        """The flow's narrowest link but `shared` (its window included), the first on its path on a tie."""
        best, which = INF, None
        cap = self.mm.capacity
        for link in flow.tcp.window_path if flow.tcp is not None else (*flow.path, window_link(fid)):
            if link != shared and cap.get(link, INF) < best:
                best, which = cap[link], link
        return best, which

    def _after(self, fid: Hashable, flow: Flow, link: Hashable) -> None:
        limited = link == window_link(fid)
        self._watch(fid, flow, flow.tcp is not None and flow.tcp.phase == "ca")
        flow.bottleneck = link
        if not limited:
            flow.link_bottleneck = link
        if flow.tcp:
            self.transport.after_rates(flow, self.t, limited)

    def _schedule_level(self, fid: Hashable, flow: Flow, star: StarClock, changed: list) -> None:
        """A level flow's bit-driven event goes to its star's heap; its own time-driven event
        (the slow-start round's end) straight to the network."""
        target = flow.remaining_bits
        st = flow.tcp
        if st is not None:
            if st.loss_in < INF:
                target = min(target, st.loss_in)
            if st.phase == "ss" and st.budget > EPS_BITS:
                target = min(target, st.budget)
        flow.vkey += 1
        v = star.at(self.t)
        flow.v_due = v + target
        heapq.heappush(star.heap, (flow.v_due, self.mm.seq[fid], fid, flow.vkey))
        if st is not None and st.phase == "ss" and EPS_BITS < st.budget < INF:
            heapq.heappush(star.budgets, (v + st.budget, self.mm.seq[fid], fid, flow.vkey))
        if star.head == fid:
            star.head = None  # its scheduled clock event is stale: the head is chosen again
        self._schedule_own(fid, flow, changed)

    def _own_time(self, flow: Flow) -> float:
        """Its next time-driven event (TcpTransport.next_event's, for a flow the level holds): the
        slow-start round's end, or a time its congestion control asked to decide at (BBR's cycles)."""
        st = flow.tcp
        if st is None:
            return INF
        own = st.round_end if st.phase == "ss" else INF
        return st.wakeup if st.wakeup < own else own

    def _schedule_own(self, fid: Hashable, flow: Flow, changed: list, also: float = INF) -> None:
        flow.version += 1
        flow.done_at = min(self._own_time(flow), also)
        if flow.done_at < INF:
            changed.append((fid, flow.done_at, flow.version))
            self._note_due(fid, flow)

    def _reschedule_head(self, star: StarClock, changed: list) -> None:
        heap, flows = star.heap, self.flows
        while heap:
            _, _, fid, key = heap[0]
            flow = flows.get(fid)
            if flow is not None and flow.star is star and flow.vkey == key:
                break
            heapq.heappop(heap)
        new = heap[0][2] if heap else None
        old = star.head
        if old is not None and old != new and old in flows and flows[old].star is star:
            self._schedule_own(old, flows[old], changed)  # no longer first: only its own time event
        star.head = new
        if new is not None:
            self._schedule_own(new, flows[new], changed, star.due(heap[0][0], self.t))
