"""The device timeline: which client devices are online, their batteries and the energy they spend,
and the link faults that cut an actor off. It schedules its own changes on the clock and says who
went offline and why; what that means for transfers in flight is the caller's business."""
from __future__ import annotations

from typing import Any, Callable

from node.compute import LoadModel, cpu_load

from .clock import DeviceChange, EventClock, LinkChange, Notice
from .devices import DeviceSpec
from .flows.links import INF
from .netconfig import NetworkConfig

MB = 1e6


class DeviceTimeline:
    def __init__(self, cfg: NetworkConfig, clock: EventClock, record: Callable[[dict[str, Any]], None]):
        self.cfg = cfg
        self.clock = clock
        self.record = record  # a row for the conductor's records
        self.devices: dict[str, DeviceSpec] = cfg.devices
        self.online = {a: True for a in cfg.devices}
        self.battery_dead: set[str] = set()
        self.offline_since: dict[str, float] = {}
        self.last_delivery: dict[str, float] = {}
        self.links_down: dict[str, int] = {}  # actor -> active link_down faults
        self.availability = {a: d.availability.transitions() for a, d in cfg.devices.items()}
        self.availability_used = {a: 0 for a in cfg.devices}  # transitions drawn so far (a checkpoint's cursor)

    # ---- in time -------------------------------------------------------------------------------
    def start(self) -> None:
        """At t = 0: each device's first state and its next transition, and the link faults."""
        for actor in sorted(self.devices):
            spec = self.devices[actor]
            self.online[actor] = spec.availability.initially_on
            if not self.online[actor]:
                self.offline_since[actor] = 0.0
            else:
                self._deliver_later(actor, "online", 0.0)
            self._schedule_next_transition(actor)
        for i, fault in enumerate(self.cfg.faults):
            if fault.kind == "link_down":
                self.clock.push(fault.start, fault.actor, i, 0, LinkChange(fault.actor, True))
                if fault.end < INF:
                    self.clock.push(fault.end, fault.actor, i, 1, LinkChange(fault.actor, False))

    def _deliver_later(self, actor: str, kind: str, t: float) -> None:
        self.clock.push_own(t, actor, Notice(actor, kind))

    def _schedule_next_transition(self, actor: str) -> None:
        nxt = next(self.availability[actor], None)
        self.availability_used[actor] += 1
        if nxt is not None:
            self.clock.push_own(nxt, actor, DeviceChange(actor, "toggle"))

    def change(self, actor: str, what: str, dead: set[str] = frozenset()) -> str | None:
        """A toggle of availability or an empty battery: the reason the actor went offline
        ("offline" | "battery"), or None."""
        if actor in dead or actor in self.battery_dead:
            return None
        if what == "toggle":
            self._schedule_next_transition(actor)
            if self.online[actor]:
                return self._go_offline(actor, "offline")
            self.online[actor] = True
            self._record_device(actor, "online")
            self._deliver_later(actor, "online", self.clock.now)
        elif what == "battery" and self.online[actor]:
            self.battery_dead.add(actor)
            return self._go_offline(actor, "battery")
        return None

    def _go_offline(self, actor: str, why: str) -> str:
        self.online[actor] = False
        self.offline_since[actor] = self.clock.now
        self._record_device(actor, why)
        return why

    def link_change(self, actor: str, down: bool) -> str | None:
        """A link fault begins or ends: "link_down" when the actor is cut off, else None."""
        self.links_down[actor] = self.links_down.get(actor, 0) + (1 if down else -1)
        self._record_device(actor, "link_down" if down else "link_up")
        return "link_down" if down else None

    # ---- questions -------------------------------------------------------------------------------
    def reachable(self, actor: str) -> bool:
        return self.online.get(actor, True) and not self.links_down.get(actor)

    def why_unreachable(self, actor: str) -> str:
        if self.links_down.get(actor):
            return "link_down"
        return "battery" if actor in self.battery_dead else "offline"

    def went_off_since_work(self, actor: str) -> bool:
        """Whether the device went off after it was last given work (the work died with it)."""
        return self.offline_since.get(actor, -INF) > self.last_delivery.get(actor, -INF)

    def delivered(self, actor: str) -> None:
        self.last_delivery[actor] = self.clock.now

    def status(self, actor: str) -> dict[str, Any] | None:
        """What a delivery tells the actor about its device now (None for an actor without one)."""
        spec = self.devices.get(actor)
        if spec is None:
            return None
        link, now = self.cfg.link(actor), self.clock.now
        status: dict[str, Any] = {"link": spec.link, "device": spec.device, "up_mbps": link.up_bps / MB,
                                  "down_mbps": link.down_bps / MB,
                                  "cpu_load": cpu_load(self.cfg.seed, spec.index, now, spec.load_period_s, spec.load_mean)}
        if spec.load_mean > 0:  # the process itself, so a client can follow its load through a long task
            status["load"] = LoadModel(self.cfg.seed, spec.index, spec.load_period_s, spec.load_mean).as_status()
        if spec.battery is not None:
            spec.battery.advance(now)
            status.update(battery=spec.battery.fraction, charging=spec.battery.charging)
        return status

    # ---- energy ----------------------------------------------------------------------------------
    def _record_device(self, actor: str, event: str, **extra: Any) -> None:
        spec = self.devices.get(actor)
        battery = spec.battery if spec else None
        self.record({"devices": [{"t": self.clock.now, "client": actor, "event": event,
                                  "battery": battery.fraction if battery else None, **extra}]})

    def _spend(self, actor: str, joules: float, what: str, t_empty: float) -> None:
        spec = self.devices.get(actor)
        if spec is None or spec.battery is None or joules <= 0 or actor in self.battery_dead:
            return
        spec.battery.advance(self.clock.now)
        short = spec.battery.spend(joules)
        self._record_device(actor, what, energy_j=joules)
        if short > 0:
            self.clock.push_own(t_empty, actor, DeviceChange(actor, "battery"))

    def drain_compute(self, actor: str, start: float, until: float, busy_s: float) -> None:
        spec = self.devices.get(actor)
        if spec is None or spec.battery is None or until <= start:
            return
        spec.battery.advance(self.clock.now)
        level = spec.battery.level_j
        joules = spec.train_w * busy_s
        # the battery runs dry after level / train_w busy seconds, stretched like the whole task
        stretch = (until - start) / busy_s if busy_s > 0 else 1.0
        self._spend(actor, joules, "train", start + (level / spec.train_w * stretch if spec.train_w > 0 else 0.0))

    def drain_transfer(self, src: str, dst: str, link_bytes: int) -> None:
        for actor, attr in ((src, "j_per_mb_up"), (dst, "j_per_mb_down")):
            spec = self.devices.get(actor)
            if spec is not None:
                self._spend(actor, getattr(spec, attr) * link_bytes / MB, "send" if actor == src else "receive",
                            self.clock.now)

    # ---- checkpoints -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"online": self.online, "battery_dead": self.battery_dead, "offline_since": self.offline_since,
                "last_delivery": self.last_delivery, "links_down": self.links_down,
                "availability_used": self.availability_used,
                "batteries": {a: spec.battery for a, spec in self.devices.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        for name in ("online", "battery_dead", "offline_since", "last_delivery", "links_down"):
            setattr(self, name, state[name])
        for actor, used in state["availability_used"].items():
            for _ in range(used):  # the same seeded draws as before, skipped
                next(self.availability[actor], None)
            self.availability_used[actor] = used
        for actor, battery in state["batteries"].items():
            self.devices[actor].battery = battery
