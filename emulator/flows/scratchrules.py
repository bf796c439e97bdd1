"""What the incremental flow model (levelflows.py) does so that, under tcp, it reads state where the
from-scratch model (links.FlowModel) reads it, and so gives its times: the scratch model's two
shortcuts for an event that moves no other flow's rate, taken on the same conditions; the events it
keeps when a rate does not move; the slow-start budgets that run out at the very instant of another
flow's event; and the standing queues, each summed from zero in the order the flows were added, as
the scratch model sums them. Mixins of `IncrementalFlowModel`, which holds the state they use."""
from __future__ import annotations

import heapq
import math
from typing import Hashable

from .links import INF, Flow
from .transport import EPS_BITS


def window_link(fid: Hashable) -> tuple[str, Hashable]:
    """A flow's window as a link of the max-min filling."""
    return ("window", fid)


class ScratchShortcuts:
    """The from-scratch model's event rules on the incremental model's state."""

    def _reschedule_alone(self, fid: Hashable, flow: Flow) -> list[tuple[Hashable, float, int]]:
        changed: list[tuple[Hashable, float, int]] = []
        if flow.star is not None:
            self._schedule_level(fid, flow, flow.star, changed)
            self._reschedule_head(flow.star, changed)
        else:
            self._schedule(fid, flow, changed)
        return changed

    def _window_moves_alone(self, fid: Hashable, flow: Flow, window: float) -> bool:
        """FlowModel._window_moves_alone on the solver's state: a window-held flow's new window
        still holds it, and none of its links is saturated or short of room for the change."""
        if not 0 <= flow.rate < INF or window >= INF:
            return False
        mm = self.mm
        for link in flow.path:
            cap = self.capacity.get(link, INF)
            if cap >= INF:
                continue
            users = mm.users.get(link, {})
            if len(users) <= 1:
                load = flow.rate
            elif link in mm.impure:
                mm.solve_dirty()
                if any(mm.general_bottleneck.get(u) == link for u in users):
                    return False
                load = sum(mm.general[u] for u in users if mm.general[u] < INF)
            else:
                star = self.stars.get(link)
                if (star.level if star is not None else mm.level(link)) < INF:
                    return False
                load = sum(mm.caps[link].sums)
            if load - flow.rate + window > cap * (1 - 1e-9):
                return False
        return True

    def _level_due(self, flow: Flow) -> float:
        """When a level flow's next event falls due at the level it had before this rebalance: the
        time the from-scratch model scheduled it at when its rate last moved."""
        star = flow.star
        level = star.before if star.epoch == self.epoch else star.level
        if not 0 < level < INF:
            bits_due = INF if level <= 0 else self.t
        else:
            bits_due = self.t + max(flow.v_due - star.at(self.t), 0.0) / level
        own = self._own_time(flow)
        return own if own < bits_due else bits_due

    def _schedule(self, fid: Hashable, flow: Flow, changed: list) -> None:
        super()._schedule(fid, flow, changed)  # type: ignore[misc]  (FlowModel's)
        self._note_due(fid, flow)

    def _note_due(self, fid: Hashable, flow: Flow) -> None:
        if flow.tcp is not None and flow.done_at < INF:
            heapq.heappush(self.due, (flow.done_at, flow.order, fid, flow.version))

    def _catch_up_due(self) -> None:
        """The flows whose own event falls due now, their windows read again: the from-scratch model
        brings every flow up to now at a rebalance, so a slow-start round's budget spent at this
        very instant (flows that started together with the same window) already stops its flow."""
        t, flows, mm = self.t, self.flows, self.mm
        due = []
        while self.due and self.due[0][0] <= t:
            _, _, fid, version = heapq.heappop(self.due)
            flow = flows.get(fid)
            if flow is not None and flow.version == version:
                due.append(fid)
        for star in self.stars.values():  # (a level flow's cap moves only when its budget runs out)
            budgets = star.budgets
            if not budgets:
                continue
            slack = EPS_BITS + (star.level * math.ulp(max(t, 1.0)) * 4 if star.level < INF else 0.0)
            v = star.at(t)
            while budgets and budgets[0][0] <= v + slack:
                _, _, fid, key = heapq.heappop(budgets)
                flow = flows.get(fid)
                if flow is not None and flow.star is star and flow.vkey == key:
                    due.append(fid)
        for fid in due:
            flow = flows[fid]
            if flow.tcp is not None and fid in mm.paths:
                self.sync(flow)
                if self._replace_if_capped(fid, flow):
                    mm.touched_flows.add(fid)


class SummedQueues:
    """Each flow's part of the standing queue of its bottleneck (its window beyond its share of the
    BDP; a star's level flows at the level), each link's sum taken afresh when its parts moved."""

    def _requeue_all(self, stars_changed: set) -> None:
        """Each changed flow's part of the standing queues (a star's members all, when its level or
        members moved: their parts are their windows beyond the level's BDP), then the sums of the
        links whose parts changed, afresh."""
        for link in stars_changed:
            star = self.stars.get(link)
            if star is not None:
                self.requeue.update(star.ca)
        flows = self.flows
        for fid in self.requeue:
            flow = flows.get(fid)
            placed = flow is not None and fid in self.mm.paths
            self._track_member(fid, flow if placed else None)
            self._set_part(fid, self._excess_of(flow) if placed and self.transport is not None else None)
        self.requeue.clear()
        self._sum_links()

    def _track_member(self, fid: Hashable, flow: Flow | None) -> None:
        """Keep a star's list of the level flows in congestion avoidance whose windows queue there."""
        star = flow.star if flow is not None else None
        member = star is not None and flow.tcp is not None and flow.tcp.phase == "ca" and not flow.tcp.limited
        old = self.ca_of.get(fid)
        if old is not None and (not member or old is not star):
            del old.ca[fid]
            del self.ca_of[fid]
        if member:
            star.ca[fid] = flow
            self.ca_of[fid] = star

    def _set_part(self, fid: Hashable, part: tuple[Hashable, float] | None) -> None:
        old = self.excess.get(fid)
        if old == part:
            return
        if part is None:
            self.excess.pop(fid, None)
        else:
            self.excess[fid] = part
        self._index_part(fid, old, part)

    def _index_part(self, fid: Hashable, old: tuple | None, new: tuple | None) -> None:
        """The flow's part moved from `old` to `new` ((link, bits) or None): which links hold it, and
        whose sums must be taken afresh."""
        if old is not None:
            del self.parts_at[old[0]][fid]
            self.stale_links.add(old[0])
        if new is not None:
            self.parts_at.setdefault(new[0], {})[fid] = None
            self.stale_links.add(new[0])

    def _sum_links(self) -> None:
        """The bits each changed link's flows hold, summed from zero in the order the flows were added
        (FlowModel._apply_rates' order: the same float sum), then its queue."""
        flows, excess = self.flows, self.excess
        for link in self.stale_links:
            fids = self.parts_at.get(link)
            if fids:
                total = 0.0
                for fid in sorted(fids, key=lambda f: flows[f].order):
                    total += excess[fid][1]
                self.held[link] = [total, len(fids)]
            else:
                self.parts_at.pop(link, None)
                self.held.pop(link, None)
            self._link_queue(link)
        self.stale_links.clear()

    def _queue_alone(self, fid: Hashable, flow: Flow) -> None:
        """The from-scratch model's update of one flow's part at an event no other rate follows: the
        link's sum changed in place (it is summed afresh at the next rebalance, as there)."""
        old = self.excess.get(fid)
        self._track_member(fid, flow)
        self._queue_of(fid, flow)
        self._index_part(fid, old, self.excess.get(fid))

    def _link_queue(self, link: Hashable) -> None:
        super()._link_queue(link)  # type: ignore[misc]  (FlowModel's)
        self.queue_moved.add(link)
