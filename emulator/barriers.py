"""Barriers: a group of actors that run on their own (a ring's clients) meets at an instant where
none of them is working, so that the run can be checkpointed there. Each member says when it has
reached barrier N and then waits; once every live member has, a checkpoint of the run is taken at
the last one's instant and each member gets the tick `barrier:N` at that same instant (after the
checkpoint: timers sort after it). A member lost while the others wait no longer counts."""
from __future__ import annotations

from typing import Any

from .clock import TakeCheckpoint, Tick


class Barriers:
    def __init__(self, net: Any):
        self.net = net  # the network process (emulator/network.py)
        self.arrived: dict[int, dict[str, float]] = {}  # barrier -> member -> the instant it got there

    def arrive(self, actor: str, barrier: int, at: float) -> None:
        self.arrived.setdefault(barrier, {})[actor] = at
        self._release(barrier)

    def members_lost(self) -> None:
        for barrier in sorted(self.arrived):
            self._release(barrier)

    def _release(self, barrier: int) -> None:
        net = self.net
        arrivals = self.arrived[barrier]
        if any(a not in arrivals and a not in net.dead for a in net.cfg.barrier_group):
            return
        del self.arrived[barrier]
        t = max([net.now, *arrivals.values()])
        net.clock.push_own(t, "", TakeCheckpoint(barrier))
        for actor in sorted(a for a in arrivals if a not in net.dead):
            net.clock.push_own(t, actor, Tick(actor, f"barrier:{barrier}"))
