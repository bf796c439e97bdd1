"""Link arithmetic as pure functions: framing overhead, max-min fair rates, and a flow model.

A transfer of B wire bytes becomes link_bytes(B) bytes on the link (TCP/IP/Ethernet framing by
default), is transmitted at the max-min fair rate of its path (rates recomputed whenever a flow
starts or ends, as in SimGrid's flow-level model), and arrives one path latency after its last
byte left."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Sequence

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
    """Max-min fair rate of each flow (progressive filling). A flow's path lists the links it
    crosses; links absent from `capacity` or with infinite capacity never constrain it."""
    rates = [INF] * len(paths)
    remaining = {link: float(capacity.get(link, INF)) for path in paths for link in path}
    users: dict[Hashable, set[int]] = {}
    for i, path in enumerate(paths):
        for link in set(path):
            if remaining[link] < INF:
                users.setdefault(link, set()).add(i)
    active = set(range(len(paths)))
    while active:
        shares = {link: remaining[link] / len(us & active) for link, us in users.items() if us & active}
        if not shares:
            break
        best = min(shares.values())
        fixed = set().union(*(users[link] & active for link, share in shares.items() if share <= best * (1 + 1e-12)))
        for i in fixed:
            rates[i] = max(best, 0.0)
            for link in set(paths[i]):
                if link in users:
                    remaining[link] -= best
        active -= fixed
    return rates


@dataclass
class Flow:
    path: tuple[Hashable, ...]
    remaining_bits: float
    rate: float = 0.0
    version: int = 0
    done_at: float = INF


@dataclass
class FlowModel:
    """Active flows and their fair rates. Callers advance time, add or remove flows, and
    reschedule the completions this returns (flow id, done_at, version)."""

    capacity: dict[Hashable, float]
    t: float = 0.0
    flows: dict[Hashable, Flow] = field(default_factory=dict)

    def advance(self, t: float) -> None:
        dt = t - self.t
        if dt > 0:
            for flow in self.flows.values():
                if flow.rate < INF:
                    flow.remaining_bits = max(0.0, flow.remaining_bits - flow.rate * dt)
        self.t = max(self.t, t)

    def add(self, fid: Hashable, bits: float, path: Sequence[Hashable]) -> list[tuple[Hashable, float, int]]:
        self.flows[fid] = Flow(tuple(path), float(bits))
        return self._rebalance()

    def remove(self, fid: Hashable) -> tuple[Flow | None, list[tuple[Hashable, float, int]]]:
        flow = self.flows.pop(fid, None)
        return flow, self._rebalance()

    def _rebalance(self) -> list[tuple[Hashable, float, int]]:
        ids = list(self.flows)
        rates = max_min_rates([self.flows[i].path for i in ids], self.capacity)
        changed = []
        for fid, rate in zip(ids, rates):
            flow = self.flows[fid]
            if rate == flow.rate and flow.done_at < INF:
                continue
            flow.rate = rate
            flow.version += 1
            if flow.remaining_bits <= 0 or rate == INF:
                flow.done_at = self.t
            elif rate > 0:
                flow.done_at = self.t + flow.remaining_bits / rate
            else:
                flow.done_at = INF
            if flow.done_at < INF:
                changed.append((fid, flow.done_at, flow.version))
        return changed
