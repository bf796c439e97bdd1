"""Devices in emulated time, as pure functions and small seeded processes: availability (always,
two-state Markov, FedScale-style traces) and the battery. Background CPU load is node/compute.py:
the clients follow it to time their own training.

The network process owns one DeviceState per client and asks these what happens when; nothing
here touches sockets or wall time."""
from __future__ import annotations

import json
import math
import pickle
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from node.seeding import park, unpark

INF = math.inf


# ---- availability -------------------------------------------------------------------------------
class Availability:
    """A device's on/off timeline: initially_on, then the transition times in increasing order."""

    initially_on: bool = True

    def transitions(self) -> Iterator[float]:
        return iter(())


class AlwaysOn(Availability):
    pass


class MarkovAvailability(Availability):
    """Two-state continuous-time Markov chain: on-periods ~ Exp(mean_on_s), off-periods ~
    Exp(mean_off_s); starts on with the stationary probability mean_on / (mean_on + mean_off)."""

    def __init__(self, mean_on_s: float, mean_off_s: float, rng: np.random.Generator):
        self.mean_on, self.mean_off, self.rng = mean_on_s, mean_off_s, rng
        self.initially_on = bool(rng.random() < mean_on_s / (mean_on_s + mean_off_s))
        self.parked: tuple | None = None

    # A population's devices travel to the network process and wait there for their rare
    # transitions: as the generator's state (two integers) rather than a Generator (about 1 KB and
    # 60 us to unpickle each), made again for each draw. The draws are the same.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        rng = state.pop("rng")
        if rng is not None:
            state["parked"] = park(rng)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.rng = None

    def park_stream(self) -> None:
        """Keep the generator's state rather than the generator (one the caller lends, such as
        node.seeding's scratch generator, is then free for other draws)."""
        if self.rng is not None:
            self.parked, self.rng = park(self.rng), None

    def _exponential(self, scale: float) -> float:
        if self.rng is not None:
            return float(self.rng.exponential(scale))
        rng = unpark(self.parked)
        value = float(rng.exponential(scale))
        self.parked = park(rng)
        return value

    def transitions(self) -> Iterator[float]:
        return MarkovSteps(self)


class MarkovSteps:
    """A Markov device's transition times, drawn one at a time: t += Exp(the mean of the state it
    leaves). An iterator of three slots rather than a generator, whose frame is about 250 bytes: a
    population's network process holds one per device for the whole run (a quarter of a GB at a
    million devices)."""

    __slots__ = ("chain", "t", "on")

    def __init__(self, chain: MarkovAvailability):
        self.chain, self.t, self.on = chain, 0.0, chain.initially_on

    def __iter__(self) -> MarkovSteps:
        return self

    def __next__(self) -> float:
        chain = self.chain
        self.t += chain._exponential(chain.mean_on if self.on else chain.mean_off)
        self.on = not self.on
        return self.t


class TraceAvailability(Availability):
    """FedScale's client behaviour trace: on from each active[i] until the next inactive time,
    repeating with period finish_time (FedScale takes the time modulo finish_time)."""

    def __init__(self, active: list[float], inactive: list[float], finish_time: float):
        if finish_time <= 0:
            raise ValueError(f"finish_time must be > 0, got {finish_time}")
        events = sorted([(float(t), True) for t in active] + [(float(t), False) for t in inactive])
        if any(not 0 <= t <= finish_time for t, _ in events):
            raise ValueError("active/inactive times must lie within [0, finish_time]")
        self.period = float(finish_time)
        self.events = events
        self.initially_on = self.on_at(0.0)

    def on_at(self, t: float) -> bool:
        phase = t % self.period
        state = False
        for at, on in self.events:
            if at > phase:
                break
            state = on
        return state

    def transitions(self) -> Iterator[float]:
        state, base = self.initially_on, 0.0
        while True:
            changed = False
            for at, on in self.events:
                t = base + at
                if t > 0 and on != state:
                    state, changed = on, True
                    yield t
            if not changed and base > 0:
                return  # a whole period without a change: the state never changes again
            base += self.period


def load_trace_file(path: str | Path) -> dict[str, Any]:
    """A FedScale trace: a pickle (as FedScale ships them) or JSON with the same structure."""
    path = Path(path)
    data = path.read_bytes()
    try:
        obj = json.loads(data)
    except ValueError:  # not JSON: undecodable bytes, bad syntax, or a number past Python's digit limit
        try:
            obj = pickle.loads(data)  # noqa: S301  (a local file the user named, never the wire)
        except Exception as exc:  # pickle raises many unrelated types
            raise ValueError(f"{path}: neither JSON nor a pickle ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{path}: expected a non-empty mapping of client id to record")
    return {str(k): v for k, v in obj.items()}


def behaviour_from_trace(record: Any, where: str) -> TraceAvailability:
    if not isinstance(record, dict) or not {"active", "inactive", "finish_time"} <= set(record):
        raise ValueError(f"{where}: a behaviour record needs 'active', 'inactive' and 'finish_time'")
    return TraceAvailability(list(record["active"]), list(record["inactive"]), float(record["finish_time"]))


def capacity_from_trace(record: Any, where: str) -> tuple[float, float]:
    """(ms per sample, kbit/s) of a FedScale capacity record."""
    if not isinstance(record, dict) or not {"computation", "communication"} <= set(record):
        raise ValueError(f"{where}: a capacity record needs 'computation' and 'communication'")
    comp, comm = float(record["computation"]), float(record["communication"])
    if comp <= 0 or comm <= 0:
        raise ValueError(f"{where}: computation and communication must be > 0")
    return comp, comm


# ---- battery ------------------------------------------------------------------------------------
@dataclass
class Battery:
    capacity_j: float
    level_j: float
    charging: bool = False
    charge_w: float = 0.0
    idle_w: float = 0.0
    t: float = 0.0  # time of level_j

    def advance(self, t: float) -> None:
        """Idle drain (or charging) from self.t to t."""
        dt = max(0.0, t - self.t)
        if self.charging:
            self.level_j = min(self.capacity_j, self.level_j + self.charge_w * dt)
        else:
            self.level_j = max(0.0, self.level_j - self.idle_w * dt)
        self.t = max(self.t, t)

    def spend(self, joules: float) -> float:
        """Take `joules`; returns how much could not be paid (0 unless the battery ran dry).
        A charging device runs on mains power and never runs dry."""
        if self.charging:
            return 0.0
        short = max(0.0, joules - self.level_j)
        self.level_j = max(0.0, self.level_j - joules)
        return short

    @property
    def fraction(self) -> float:
        return self.level_j / self.capacity_j if self.capacity_j > 0 else 1.0


def seconds_until_empty(level_j: float, power_w: float) -> float:
    return INF if power_w <= 0 else level_j / power_w


@dataclass
class DeviceSpec:
    """Everything the network needs about one client's device (from profiles and the world)."""

    index: int
    device: str
    link: str
    availability: Availability = field(default_factory=AlwaysOn)
    battery: Battery | None = None  # None: mains powered, no battery model
    train_w: float = 0.0  # power while training
    j_per_mb_up: float = 0.0
    j_per_mb_down: float = 0.0
    load_mean: float = 0.0
    load_period_s: float = 60.0


def stable_key(*parts: Any) -> int:
    """A seed component from strings and ints that is the same in every process."""
    return zlib.crc32("|".join(map(str, parts)).encode())
