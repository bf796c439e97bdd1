"""The emulated clock: one queue of typed events, the actors' holds that bound it, and (realtime
mode) the wall clock it is paced against.

Conservative discrete-event protocol (docs/design.md 3): an event at time t is processed
only while t is strictly below every actor's lower bound (an unanswered delivery, or a declared
busy-until). Everything an actor can still send therefore arrives before any event it could precede,
and ties are broken by a key made of (time, event order, actor name, per-actor counter, sub-index),
never by arrival order, so a run is a deterministic function of its scenario and seed.

One relaxation: a delivery at the bound itself may go out to an actor that holds nothing. What a
held actor can still cause at that instant (transfer starts, timers, checkpoints) sorts after
every delivery, so the deliveries of one instant (a population checking in at once, a round's
broadcast arriving together) go out without waiting for each other's answers, in the same order.

Each event carries its handler: `run(net, sock)` calls the part of the network process that owns
what it changes (transfers, the device timeline, checkpoints, delivery)."""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .holds import Holds
from .netconfig import network_message

# the order events run in at equal times: finish transfers, change devices and links, deliver,
# start transfers, take a checkpoint, fire timers
FLOW_DONE, DEVICE, DELIVER, FLOW_START, CHECKPOINT, TIMER = range(6)


def _as_bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(memoryview(f)) for f in frames]


class Event:
    """An event on the clock. Two events compare only where their keys tie (a flow rescheduled to
    the same instant): then by kind and fields, as (kind, *fields) tuples."""
    __slots__ = ()  # (so that a subclass with slots has no __dict__ either)
    kind = ""
    order = -1

    def __lt__(self, other: "Event") -> bool:
        return self._key() < other._key()

    def _key(self) -> tuple:
        names = type(self).__dict__.get("_field_names")
        if names is None:  # looked up once per class: dataclasses.fields() is slow on the heap's path
            names = tuple(f.name for f in fields(self))
            type(self)._field_names = names
        return (self.kind, *(getattr(self, name) for name in names))

    def portable(self) -> "Event":
        """The event as a checkpoint saves it (see Deliver and FlowStart)."""
        return self


@dataclass(eq=False)
class Deliver(Event):
    """A message reaches its destination actor."""
    kind = "deliver"
    env: dict[str, Any]
    frames: list[Any]
    order = DELIVER

    def run(self, net, sock) -> None:
        net.deliver(sock, self.env, self.frames)

    def portable(self) -> "Deliver":
        """With its frames as bytes (ZeroMQ buffers do not pickle)."""
        return Deliver(self.env, _as_bytes(self.frames))


@dataclass(eq=False, slots=True)
class Notice(Event):
    """A message of the network's own with nothing in its body ("online" when a device comes
    back), its envelope made when it is delivered: a population's check-in wave queues one per
    device at once, and a Deliver holding its envelope takes about 400 bytes more each."""
    kind = "notice"
    dst: str
    what: str
    order = DELIVER

    @property
    def env(self) -> dict[str, Any]:  # (what the clock reads of a queued delivery: its "dst")
        return network_message(self.dst, self.what)

    def run(self, net, sock) -> None:
        net.deliver(sock, self.env, [])


@dataclass(eq=False)
class Tick(Event):
    """A timer an actor set goes off."""
    kind = "tick"
    actor: str
    tag: Any
    order = TIMER

    def run(self, net, sock) -> None:
        net.deliver(sock, network_message(self.actor, "tick", {"tag": self.tag}), [])


@dataclass(eq=False)
class FlowStart(Event):
    """A sent message's transfer begins (its Transfer is in emulator/transfers.py)."""
    kind = "flow_start"
    transfer: Any
    order = FLOW_START

    def run(self, net, sock) -> None:
        net.transfers.start(self.transfer)

    def portable(self) -> "FlowStart":
        tr = self.transfer
        return FlowStart(replace(tr, frames=_as_bytes(tr.frames)))


@dataclass(eq=False)
class FlowDue(Event):
    """The earliest flow event the transfers expect (a finish or a window change)."""
    kind = "flow_done"
    fid: int
    version: int
    order = FLOW_DONE

    def run(self, net, sock) -> None:
        net.transfers.on_flow_due(self.fid, self.version)

    def __lt__(self, other: Event) -> bool:
        # A flow whose head goes back on the clock at the time it had ties with its earlier entry
        # (tens of thousands of times in a check-in wave): the same order as _key's, cheaper.
        if type(other) is FlowDue:
            return (self.fid, self.version) < (other.fid, other.version)
        return super().__lt__(other)


@dataclass(eq=False)
class DeviceChange(Event):
    """A device's availability toggles, or its battery runs dry ("toggle" | "battery")."""
    kind = "device"
    actor: str
    what: str
    order = DEVICE

    def run(self, net, sock) -> None:
        gone = net.timeline.change(self.actor, self.what, net.dead)
        if gone:
            net.transfers.abort_flows_of(self.actor, gone)


@dataclass(eq=False)
class LinkChange(Event):
    """A link_down fault begins (down) or ends."""
    kind = "link"
    actor: str
    down: bool
    order = DEVICE

    def run(self, net, sock) -> None:
        gone = net.timeline.link_change(self.actor, self.down)
        if gone:
            net.transfers.abort_flows_of(self.actor, gone)


@dataclass(eq=False)
class CapacityChange(Event):
    """A trace-driven link's rate moves to its next bin (only while a flow uses the link)."""
    kind = "capacity"
    link: tuple
    order = DEVICE

    def run(self, net, sock) -> None:
        net.transfers.capacity_change(self.link)


@dataclass(eq=False)
class TakeCheckpoint(Event):
    kind = "checkpoint"
    round: int
    order = CHECKPOINT

    def run(self, net, sock) -> None:
        net.checkpoints.begin(sock, self.round)


@dataclass(eq=False)
class Halt(Event):
    """The end of the run the server announced: no event after it runs."""
    kind = "halt"
    order = CHECKPOINT

    def run(self, net, sock) -> None:
        net.halted = True


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
class EventClock:
    """The queue of (time, order, name, n, sub, event) entries, the holds that bound it, and the
    emulated time `now`. Names and counters make every key unique, so events never compare."""
    realtime_speedup: float | None = None  # None: virtual time (jump to the next event)
    now: float = 0.0
    queue: list[tuple] = field(default_factory=list)
    holds: Holds = field(default_factory=Holds)
    wall_start: float | None = None  # realtime mode: wall clock at emulated time 0
    lag: LagMeter = field(default_factory=LagMeter)
    events: int = 0  # events processed: the network's work, for benchmarks
    _counter: Any = field(default_factory=itertools.count)

    def push(self, t: float, name: str, n: int, sub: int, event: Any) -> None:
        heapq.heappush(self.queue, (t, event.order, name, n, sub, event))

    def push_own(self, t: float, name: str, event: Any, sub: int = 0) -> None:
        """An event of the network's own (no actor numbers it): numbered by the network's counter."""
        self.push(t, name, next(self._counter), sub, event)

    def may_run_head(self) -> bool:
        """Whether the earliest queued event may run now: before the lower bound, or a delivery at
        the bound to an actor holding nothing (the module's docstring says why that is safe)."""
        t, order, _, _, _, event = self.queue[0]
        bound = self.holds.earliest()
        if t < bound:
            return True
        return t == bound and order == DELIVER and not self.holds.holding(event.env["dst"])

    def due_in(self) -> float:
        """Realtime mode: wall seconds until the next event is due (0 in virtual mode)."""
        if not self.realtime_speedup or not self.queue or self.wall_start is None:
            return 0.0
        return self.wall_start + self.queue[0][0] / self.realtime_speedup - time.monotonic()

    def pop(self) -> Any:
        """The head event, with the clock moved to its time."""
        if self.realtime_speedup:
            self.lag.add(-self.due_in())
        t, _, _, _, _, event = heapq.heappop(self.queue)
        self.now = max(self.now, t)
        self.events += 1
        return event

    # ---- checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"now": self.now, "queue": [(*e[:5], e[5].portable()) for e in self.queue],
                "net_counter": peek(self, "_counter")}

    def restore(self, state: dict[str, Any]) -> None:
        self.now = state["now"]
        self.queue = list(state["queue"])
        heapq.heapify(self.queue)
        self._counter = itertools.count(state["net_counter"])


def peek(owner: Any, name: str) -> int:
    """The next value of a counter attribute, leaving the counter where it was."""
    value = next(getattr(owner, name))
    setattr(owner, name, itertools.count(value))
    return value
