"""Actors are small reactive state machines: a delivered message in, a Reaction out.

An actor never touches a socket or a clock. Work that takes emulated time (training,
aggregation) is returned as `work` with its modelled duration `work_s`, declared before the
work is done; the runtime runs it and sends its outcome stamped t + work_s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, Union


@dataclass
class Message:
    src: str
    dst: str
    kind: str
    round: int
    t: float  # emulated arrival time
    body: dict[str, Any]
    frames: Sequence[Any] = ()
    device: dict[str, Any] | None = None  # the receiving device's state at t (battery, charging, cpu_load, link)


@dataclass
class Send:
    dst: Union[str, list[str]]  # a list multicasts one payload to several actors
    kind: str
    round: int
    body: dict[str, Any] = field(default_factory=dict)
    frames: Sequence[Any] = ()
    payload_bytes: int = 0  # encoded tensor values only
    fp32_bytes: int = 0  # what the same tensors would cost as fp32
    # What the emulator records beside the message and never delivers: a client's diagnostics (its
    # loss, lambda, noise scale, epsilon), which a real deployment would not send. They reach the
    # run's records with the transfer's record and count in no byte of the message.
    notes: dict[str, Any] = field(default_factory=dict)


Report = Union[dict[str, Any], Callable[[], dict[str, Any]]]


@dataclass
class Reaction:
    sends: list[Send] = field(default_factory=list)
    timers: list[tuple[float, str]] = field(default_factory=list)  # (emulated time, tag)
    reports: list[Report] = field(default_factory=list)  # to the conductor, off the emulated clock, in order
    work_s: float = 0.0
    busy_s: float | None = None  # of work_s, the seconds the device computes at full speed (its energy); None: all
    # Runs on the worker thread. It returns the outcome, or a continuation that the runtime calls on its
    # own thread (for outcomes that change actor state, like starting the next round).
    work: Callable[[], "Reaction | Callable[[], Reaction]"] | None = None
    checkpoint: int | None = None  # ask for a checkpoint of the whole run at this instant, after this round
    # wait for every actor of the run's barrier group to reach barrier N; the run is checkpointed at the
    # last one's instant, then each gets the tick "barrier:N" (emulator/barriers.py)
    barrier: int | None = None
    halt: bool = False  # the run is over at this instant: nothing after it happens
    cohort: bool = False  # the work may run together with other cohort work of its process (node/cohort.py)


def portable(value: Any) -> Any:
    """`value` with message frames (ZeroMQ buffers) copied to bytes, so that it can be pickled."""
    if isinstance(value, Message):
        return Message(value.src, value.dst, value.kind, value.round, value.t, value.body,
                       [bytes(memoryview(f.buffer if hasattr(f, "buffer") else f)) for f in value.frames], value.device)
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(portable(v) for v in value)
    if isinstance(value, list):
        return [portable(v) for v in value]
    return value


class Checkpointable:
    """An actor whose mutable state is the attributes named in STATE; everything else it rebuilds
    from the scenario (data, models, configuration)."""

    STATE: tuple[str, ...] = ()

    def snapshot(self) -> dict[str, Any]:
        return {name: portable(getattr(self, name)) for name in self.STATE}

    def restore(self, state: dict[str, Any]) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])


class Actor(Protocol):
    name: str

    def react(self, msg: Message) -> Reaction: ...


def quiet_kinds(actor: Any) -> frozenset[str]:
    """The message kinds an actor declares quiet (class attribute `quiet_kinds`): its reaction to
    them changes its own state and may report, but never sends, sets a timer, works, asks for a
    checkpoint or barrier, or halts. The network then need not wait for its answer before moving
    the clock on (a population's check-ins reach the server one after another, each a round trip
    between two processes otherwise). The runtime checks every such reaction."""
    return frozenset(getattr(actor, "quiet_kinds", ()))


def moves_clock(reaction: Reaction) -> list[str]:
    """What in a reaction the network would have to wait for (empty for a quiet one)."""
    parts = {"a send": reaction.sends, "a timer": reaction.timers, "work": reaction.work is not None,
             "a checkpoint": reaction.checkpoint is not None, "a barrier": reaction.barrier is not None,
             "a halt": reaction.halt}
    return [name for name, present in parts.items() if present]
