"""The actors' holds on the emulated clock (docs/design.md 3): a delivery the actor has not answered
yet, or the busy-until it declared. The network may only run an event that no held actor can
still precede; this is the bookkeeping that answers that question in O(log H), not O(H).

A hold is unanswered from its delivery until the actor's first `done`. Unanswered holds can
only exist at the current instant, so their answers (and what the network records because of
them) are put back into the order the deliveries went out in: see `Network._on_done`."""
from __future__ import annotations

import heapq
from collections import Counter
from typing import Iterator

INF = float("inf")


class Holds:
    def __init__(self) -> None:
        self._by_id: dict[int, tuple[str, float]] = {}
        self._heap: list[tuple[float, int]] = []  # (time, hold id), superseded entries dropped lazily
        self._per_actor: Counter[str] = Counter()
        self.unanswered: set[int] = set()

    # ---- a mapping of hold id -> (actor, time) ------------------------------------------------
    def __setitem__(self, hid: int, value: tuple[str, float]) -> None:
        old = self._by_id.get(hid)
        if old is not None:
            self._release(old[0])
        self._by_id[hid] = value
        self._per_actor[value[0]] += 1
        heapq.heappush(self._heap, (value[1], hid))

    def __delitem__(self, hid: int) -> None:
        actor, _ = self._by_id.pop(hid)
        self._release(actor)
        self.unanswered.discard(hid)

    def _release(self, actor: str) -> None:
        """One hold fewer for the actor; none left means it holds nothing (see `holding`)."""
        self._per_actor[actor] -= 1
        if not self._per_actor[actor]:
            del self._per_actor[actor]

    def __getitem__(self, hid: int) -> tuple[str, float]:
        return self._by_id[hid]

    def get(self, hid: int, default=None):
        return self._by_id.get(hid, default)

    def __contains__(self, hid: object) -> bool:
        return hid in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)

    def items(self):
        return self._by_id.items()

    def values(self):
        return self._by_id.values()

    # ---- the clock's questions ---------------------------------------------------------------
    def deliver(self, hid: int, actor: str, t: float) -> None:
        """A delivery went out: the actor holds the clock at t until it answers."""
        self[hid] = (actor, t)
        self.unanswered.add(hid)

    def answer(self, hid: int) -> None:
        self.unanswered.discard(hid)

    def earliest(self) -> float:
        """The lower bound: the earliest time any actor still holds (INF when none does)."""
        heap, by_id = self._heap, self._by_id
        while heap:
            t, hid = heap[0]
            held = by_id.get(hid)
            if held is not None and held[1] == t:
                return t
            heapq.heappop(heap)  # released or moved since
        return INF

    def holding(self, actor: str) -> bool:
        return actor in self._per_actor
