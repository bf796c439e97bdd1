"""Max-min fair rates kept up to date as flows come and go, instead of recomputed from scratch.

A link is shared when two or more flows cross it. Three cases, from cheapest:
- A flow on no shared link runs at its narrowest link (its own access link, say).
- A star: a shared link L whose flows cross no other shared link (the server link of a round's
  uploads, each also on its own access link). With p_i the narrowest other link of flow i, max-min
  gives min(p_i, s_L), where the water level s_L solves sum_i min(p_i, s_L) = C_L (no level: L is
  not saturated). The p_i of L's flows are kept sorted in blocks with their sums, so a flow
  arriving or leaving costs O(sqrt F) and s_L is found in O(sqrt F); no other flow's number is
  touched, and a rate is read in O(1).
- Anything else (a flow on two shared links, as behind a shared cell and the server): its
  connected component (flows linked by shared links) is solved again from scratch with
  `max_min_fill`, and only that component.

`rates()` equals `links.max_min_rates` on the same flows (tests/test_maxmin.py checks it on random
topologies); rounding differs (sums are taken in another order), within 1e-9 relative."""
from __future__ import annotations

import bisect
import itertools
import operator
from typing import Hashable, Mapping, Sequence

INF = float("inf")
_cap = operator.itemgetter(0)  # a (cap, seq) item's cap: summed in C, in the same order as a loop would
BLOCK = 64  # sorted blocks hold BLOCK..2 BLOCK values: O(sqrt F) with a small constant in Python


class _SortedCaps:
    """The private caps of a star's flows, sorted, in blocks with their sums; and the water level."""

    def __init__(self) -> None:
        self.blocks: list[list[tuple[float, int]]] = []
        self.maxes: list[tuple[float, int]] = []
        self.sums: list[float] = []
        self.finite = 0
        self.infinite = 0  # flows with no other link: they take whatever the level is

    def __len__(self) -> int:
        return self.finite + self.infinite

    def insert(self, cap: float, seq: int) -> None:
        if cap >= INF:
            self.infinite += 1
            return
        item = (cap, seq)
        self.finite += 1
        if not self.blocks:
            self.blocks, self.maxes, self.sums = [[item]], [item], [cap]
            return
        b = min(bisect.bisect_left(self.maxes, item), len(self.blocks) - 1)
        block = self.blocks[b]
        bisect.insort(block, item)
        if len(block) > 2 * BLOCK:
            half = len(block) // 2
            low, high = block[:half], block[half:]
            self.blocks[b:b + 1] = [low, high]
            self.maxes[b:b + 1] = [low[-1], high[-1]]
            self.sums[b:b + 1] = [sum(map(_cap, low)), sum(map(_cap, high))]
        else:
            self.maxes[b] = block[-1]
            self.sums[b] = sum(map(_cap, block))  # summed afresh: no drift from running updates

    def remove(self, cap: float, seq: int) -> None:
        if cap >= INF:
            self.infinite -= 1
            return
        item = (cap, seq)
        b = bisect.bisect_left(self.maxes, item)
        block = self.blocks[b] if b < len(self.blocks) else []
        i = bisect.bisect_left(block, item)
        if i >= len(block) or block[i] != item:
            raise KeyError(item)
        del block[i]
        self.finite -= 1
        if block:
            self.maxes[b] = block[-1]
            self.sums[b] = sum(map(_cap, block))
        else:
            del self.blocks[b], self.maxes[b], self.sums[b]

    def between(self, low: float, high: float) -> list[int]:
        """The seqs of the finite caps in (low, high]."""
        out = []
        for block in self.blocks:
            if block[-1][0] <= low:
                continue
            if block[0][0] > high:
                break
            out += [seq for cap, seq in block if low < cap <= high]
        return out

    def level(self, capacity: float) -> float:
        """s with sum_i min(p_i, s) = capacity, or INF when every flow fits under its own cap.
        Flow k (in increasing p) is held by its own cap when S_k + p_k (n - k) < C, a condition
        that only gets harder with k: find the last such k, block by block."""
        n = self.finite + self.infinite
        below, held = 0.0, 0  # sum and count of the caps known to hold their flows
        for block, total in zip(self.blocks, self.sums):
            if below + total + block[-1][0] * (n - held - len(block)) < capacity:
                below += total
                held += len(block)
                continue
            for cap, _ in block:
                if below + cap + cap * (n - held - 1) >= capacity:
                    return max(capacity - below, 0.0) / (n - held)
                below += cap
                held += 1
        return (capacity - below) / (n - held) if n > held else INF


class IncrementalMaxMin:
    """Max-min fair rates of a changing set of flows. `add`, `remove` and `set_capacity` change
    it; `rate(fid)` reads one flow's rate, `rates()` all of them."""

    def __init__(self, capacity: Mapping[Hashable, float]):
        self.capacity: dict[Hashable, float] = {k: float(v) for k, v in capacity.items()}
        self.routes: dict[Hashable, tuple[Hashable, ...]] = {}  # as given
        self.paths: dict[Hashable, tuple[Hashable, ...]] = {}  # its finite links, each once
        self.users: dict[Hashable, dict[Hashable, None]] = {}  # link -> its flows, in arrival order
        self.seq: dict[Hashable, int] = {}
        self._seqs = itertools.count()
        self.attached: dict[Hashable, tuple[Hashable, ...]] = {}  # flow -> its shared links when placed
        self.impure: dict[Hashable, int] = {}  # link -> its flows that cross another shared link too
        self.caps: dict[Hashable, _SortedCaps] = {}  # link -> the other caps of its flows with one shared link
        self.private: dict[Hashable, float] = {}  # flow -> its narrowest link but its one shared link
        self.levels: dict[Hashable, float] = {}  # star link -> its water level, while valid
        self.general: dict[Hashable, float] = {}  # rates of flows in other components, while valid
        self.dirty: set[Hashable] = set()  # flows whose component must be solved again
        self.general_bottleneck: dict[Hashable, Hashable | None] = {}
        self.by_seq: dict[int, Hashable] = {}
        # what changed since the caller last looked (the flow model reads and clears these)
        self.touched_links: set[Hashable] = set()
        self.touched_flows: set[Hashable] = set()

    # ---- changes -----------------------------------------------------------------------------
    def add(self, fid: Hashable, path: Sequence[Hashable], seq: int | None = None) -> None:
        """A flow along `path`. Flows are taken in `seq` order where ties must be broken (as a
        from-scratch filling takes them in its list's order); by default, in the order added."""
        if fid in self.paths:
            raise KeyError(f"flow {fid!r} is already there")
        links = tuple(dict.fromkeys(link for link in path if self.capacity.get(link, INF) < INF))
        self.routes[fid] = tuple(path)
        self.paths[fid] = links
        self.seq[fid] = next(self._seqs) if seq is None else seq
        self.by_seq[self.seq[fid]] = fid
        newly_shared = []
        for link in links:
            users = self.users.setdefault(link, {})
            users[fid] = None
            if len(users) == 2:
                newly_shared.append(next(iter(users)))
        for first in dict.fromkeys(newly_shared):  # its link is shared now: it changes case
            self._detach(first)
            self._attach(first)
        self._attach(fid)

    def remove(self, fid: Hashable) -> None:
        self._detach(fid)
        alone = []
        for link in self.paths[fid]:
            users = self.users[link]
            del users[fid]
            if len(users) == 1:
                alone.append(next(iter(users)))
            elif not users:
                del self.users[link]
        for last in dict.fromkeys(alone):  # its link is private again
            self._detach(last)
            self._attach(last)
        del self.by_seq[self.seq[fid]]
        for table in (self.routes, self.paths, self.seq):
            del table[fid]

    def set_own_capacity(self, fid: Hashable, link: Hashable, capacity: float) -> None:
        """The new capacity of a link only `fid` crosses (its window): the state `remove(fid)`, the
        new capacity and `add(fid)` again leave, step for step (the flows it shares a link with
        two by two detached and attached twice, every table's order as after a new add), without
        taking its route apart. A window that becomes finite or infinite changes the flow's finite
        links: that case is the remove and add themselves."""
        if (self.capacity.get(link, INF) < INF) != (capacity < INF):
            route, seq = self.routes[fid], self.seq[fid]
            self.remove(fid)
            self.capacity[link] = capacity
            self.add(fid, route, seq)
            return
        self.capacity[link] = capacity
        if self._star_member_recapped(fid):
            return
        links = self.paths[fid]
        self._detach(fid)
        self._reattach_partners(fid, links, leaving=True)
        seq = self.seq[fid]
        for table, key in ((self.by_seq, seq), (self.routes, fid), (self.paths, fid), (self.seq, fid)):
            table[key] = table.pop(key)  # (to the end, as a removed and added entry goes)
        self._reattach_partners(fid, links, leaving=False)
        self._attach(fid)

    def _star_member_recapped(self, fid: Hashable) -> bool:
        """set_own_capacity's common case, a member of a star of three flows or more whose window
        moved (a queue on its path moved, at every event on a busy server link): no other flow
        changes case when it leaves and joins again, so only its private cap is moved in the star's
        sorted caps, and the tables are left in the order the general case leaves them. False (and
        nothing done) in any other case."""
        shared = self.attached.get(fid, ())
        if len(shared) != 1:
            return False
        star = shared[0]
        caps = self.caps.get(star)
        if star in self.impure or caps is None or len(caps) < 2 or len(self.users[star]) < 3:
            return False
        self.touched_flows.add(fid)
        links = self.paths[fid]
        users = self.users
        for other in links:  # to the end of each link's users, as leaving and joining leaves it
            on = users.pop(other) if len(users[other]) == 1 else users[other]
            del on[fid]
            users[other] = on
            on[fid] = None
        seq = self.seq[fid]
        for table, key in ((self.attached, fid), (self.by_seq, seq), (self.routes, fid), (self.paths, fid), (self.seq, fid)):
            table[key] = table.pop(key)
        caps.remove(self.private.pop(fid), seq)
        own = self.private[fid] = self._private_cap(links, star)
        caps.insert(own, seq)
        self._changed(star)
        self.general.pop(fid, None)
        self.general_bottleneck.pop(fid, None)
        self.dirty.discard(fid)
        return True

    def _reattach_partners(self, fid: Hashable, links: tuple, leaving: bool) -> None:
        """`fid` leaves (or joins again) its links' users: a link it shared with one other flow
        changes that flow's case, which is placed again (as remove and add do)."""
        partners = []
        for link in links:
            if leaving:
                users = self.users[link]
                del users[fid]
                if not users:
                    del self.users[link]
            else:
                users = self.users.setdefault(link, {})
                users[fid] = None
            if len(users) == (1 if leaving else 2):
                partners.append(next(iter(users)))
        for other in dict.fromkeys(partners):
            self._detach(other)
            self._attach(other)

    def set_capacity(self, link: Hashable, capacity: float) -> None:
        """A link's new capacity (a trace's next bin, a fault, a repair). Its flows are placed again:
        removed, then added with their sequence numbers, in the order they joined the link."""
        if self.capacity.get(link, INF) < INF:
            on = list(self.users.get(link, ()))  # (a finite link's users are all the flows on it)
        else:
            on = [fid for fid, route in self.routes.items() if link in route]
        routes = [self.routes[fid] for fid in on]
        seqs = [self.seq[fid] for fid in on]
        for fid in on:
            self.remove(fid)
        self.capacity[link] = float(capacity)
        for fid, route, seq in zip(on, routes, seqs):
            self.add(fid, route, seq)

    def __len__(self) -> int:
        return len(self.paths)

    # ---- placing a flow in its case ----------------------------------------------------------
    def _attach(self, fid: Hashable) -> None:
        self.touched_flows.add(fid)
        shared = tuple(link for link in self.paths[fid] if len(self.users[link]) >= 2)
        self.attached[fid] = shared
        if len(shared) >= 2:
            for link in shared:
                self.impure[link] = self.impure.get(link, 0) + 1
        elif len(shared) == 1:
            own = self.private[fid] = self._private_cap(self.paths[fid], shared[0])
            self.caps.setdefault(shared[0], _SortedCaps()).insert(own, self.seq[fid])
        for link in shared:
            self._changed(link)

    def _private_cap(self, links: tuple, star: Hashable) -> float:
        """The narrowest of a star member's links but the star's (a loop: min() over a generator
        costs twice as much, and this runs for every member each time a busy link's queue moves)."""
        capacity, own = self.capacity, INF
        for other in links:
            if other != star and capacity[other] < own:
                own = capacity[other]
        return own

    def _detach(self, fid: Hashable) -> None:
        self.touched_flows.add(fid)
        shared = self.attached.pop(fid, ())
        if len(shared) >= 2:
            for link in shared:
                self.impure[link] -= 1
                if not self.impure[link]:
                    del self.impure[link]
        elif len(shared) == 1:
            caps = self.caps[shared[0]]
            caps.remove(self.private.pop(fid), self.seq[fid])
            if not len(caps):
                del self.caps[shared[0]]
        for link in shared:
            self._changed(link)
        self.general.pop(fid, None)
        self.general_bottleneck.pop(fid, None)
        self.dirty.discard(fid)

    def _changed(self, link: Hashable) -> None:
        self.touched_links.add(link)
        self.levels.pop(link, None)
        if link in self.impure:
            self.dirty.update(self.users.get(link, ()))

    # ---- rates --------------------------------------------------------------------------------
    def rate(self, fid: Hashable) -> float:
        shared = self.attached[fid]
        if not shared:
            return min((self.capacity[link] for link in self.paths[fid]), default=INF)
        if len(shared) == 1 and shared[0] not in self.impure:
            link = shared[0]
            level = self.levels.get(link)
            if level is None:
                level = self.levels[link] = self.caps[link].level(self.capacity[link])
            return min(self.private[fid], level)
        while self.dirty:
            self._solve_component(next(iter(self.dirty)))
        return self.general[fid]

    def rates(self) -> dict[Hashable, float]:
        return {fid: self.rate(fid) for fid in self.paths}

    def level(self, link: Hashable) -> float:
        """The water level of a star link (INF: it is not saturated)."""
        level = self.levels.get(link)
        if level is None:
            level = self.levels[link] = self.caps[link].level(self.capacity[link])
        return level

    def solve_dirty(self) -> list[Hashable]:
        """Solve every component that changed; the flows whose rates were computed again."""
        solved: list[Hashable] = []
        while self.dirty:
            solved += self._solve_component(next(iter(self.dirty)))
        return solved

    def _solve_component(self, start: Hashable) -> list[Hashable]:
        """Max-min from scratch over the flows linked to `start` through shared links."""
        from .links import max_min_fill

        seen, todo, links_seen = {start}, [start], set()
        while todo:
            for link in self.attached[todo.pop()]:
                if link in links_seen:
                    continue
                links_seen.add(link)
                for other in self.users[link]:
                    if other not in seen:
                        seen.add(other)
                        todo.append(other)
        members = sorted(seen, key=self.seq.__getitem__)  # arrival order, as a from-scratch solve takes them
        rates, bottlenecks = max_min_fill([self.paths[f] for f in members], self.capacity)
        for fid, r, link in zip(members, rates, bottlenecks):
            self.general[fid] = r
            self.general_bottleneck[fid] = link
            self.dirty.discard(fid)
        return members
