"""The ground floor of the network process: who the actors are, what their links and faults are,
and the process's configuration. World building and the conductor import this module; only the
conductor's process specs name the network process itself (emulator/network.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from protocol.curve import RunKeys

from .devices import DeviceSpec
from .flows.links import INF, Framing
from .flows.traces import TraceRef
from .flows.transport import TcpParams

CONDUCTOR = "conductor"
SERVER = "server"


def client_name_width(population: int) -> int:
    """The digits of a client's name, c0000 .. c(N-1): at least four."""
    return max(4, len(str(population - 1)))
NETWORK = "network"  # the sender of the network's own messages (start, online, tick, peer_down)


def network_message(dst: str, kind: str, body: dict | None = None) -> dict:
    """The envelope fields of a message the network itself delivers (its time is set on delivery)."""
    return {"src": NETWORK, "dst": dst, "kind": kind, "round": -1, "t": 0.0, "body": body or {}}


@dataclass(frozen=True)
class Link:
    up_bps: float = INF
    down_bps: float = INF
    latency_s: float = 0.0
    jitter_s: float = 0.0  # mean of an exponential extra delay per message
    loss: float = 0.0  # probability that a segment is lost and retransmitted
    queue_s: float = 0.1  # bottleneck buffer in seconds of the link's rate (tcp transport)
    congestion_control: str | None = None  # what this actor sends with (tcp transport); None: network.tcp's


NO_LINK = Link()  # an actor without a link of its own (one instance: Link is frozen)


@dataclass(frozen=True)
class Fault:
    kind: str  # "truncate" | "link_down"
    actor: str
    start: float
    end: float

    def active(self, actor: str, t: float) -> bool:
        return actor == self.actor and self.start <= t < self.end


@dataclass
class NetworkConfig:
    endpoint: str
    peers: dict[str, list[str]]  # every peer that must say hello before the clock starts -> the actors it may claim
    links: dict[str, Link]  # access link of each actor
    framing: Framing = field(default_factory=Framing)
    parent_pid: int | None = None
    faults: list[Fault] = field(default_factory=list)
    realtime_speedup: float | None = None  # None: virtual time (jump to the next event)
    devices: dict[str, DeviceSpec] = field(default_factory=dict)  # client devices (availability, battery, load)
    seed: int = 0
    rto_s: float = 0.2  # fluid transport: the delay a lost segment costs (Linux's minimum retransmission timeout)
    tcp: TcpParams | None = None  # the tcp transport's parameters; None: the fluid transport
    flow_solver: str = "scratch"  # "incremental": emulator/flows/levelflows.py
    group_queue_s: dict[str, float] = field(default_factory=dict)  # buffers of the shared bottlenecks
    groups: dict[str, float] = field(default_factory=dict)  # shared bottleneck links: name -> bit/s
    group_of: dict[str, list[str]] = field(default_factory=dict)  # actor -> shared links its traffic crosses
    starters: list[str] = field(default_factory=lambda: [SERVER])  # who gets "start" at t = 0
    watchers: list[str] = field(default_factory=lambda: [SERVER])  # who learns of a lost host ("peer_down")
    peer_timeout_s: float | None = 30.0  # a peer silent this long (wall) is reported to the conductor as lost
    max_message_bytes: int = -1  # larger frames make ZeroMQ drop the sender's connection (-1: no limit)
    checkpoint_dir: str | None = None  # where checkpoints go (written to CHECKPOINT_DIR.new first)
    restore: str | None = None  # a checkpoint's network state to continue from
    listen: str | None = None  # a TCP endpoint for hosts on other machines, bound besides `endpoint`, CURVE only
    run_keys: RunKeys | None = None  # with listen: the run's key pair and the host keys it admits
    slot_keys: dict[str, str] = field(default_factory=dict)  # host slot -> the one key its messages may come with
    traces: dict[tuple[str, str], TraceRef] = field(default_factory=dict)  # ("up"|"down", actor) -> its rate's trace
    barrier_group: tuple[str, ...] = ()  # actors that meet at barriers for checkpoints (emulator/barriers.py)
    remote_peers: frozenset[str] = frozenset()  # hosts on other machines: they send their checkpoint part in messages

    def link(self, actor: str) -> Link:
        return self.links.get(actor, NO_LINK)

    def one_way(self, src: str, dst: str) -> float:
        """The latency of a message from src to dst: both access links'."""
        return self.link(src).latency_s + self.link(dst).latency_s

    def link_tables(self) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        """Each link's capacity (bit/s) and buffer (s), keyed by ("up" | "down", actor) and ("group",
        name). The two tables share their keys: two tuples per device, not four (at a million
        devices, 128 MB of the network process)."""
        caps, queues = {}, {}
        for actor, link in self.links.items():
            up, down = ("up", actor), ("down", actor)
            caps[up], caps[down] = link.up_bps, link.down_bps
            queues[up] = queues[down] = link.queue_s
        for name, bps in self.groups.items():
            caps[("group", name)] = bps
        for name, q in self.group_queue_s.items():
            queues[("group", name)] = q
        return caps, queues

    def path(self, src: str, dst: str) -> tuple:
        """The links a transfer crosses: src's uplink, the shared bottlenecks of both, dst's downlink."""
        ups = [("group", f"{g}:up") for g in self.group_of.get(src, [])]
        downs = [("group", f"{g}:down") for g in self.group_of.get(dst, [])]
        return (("up", src), *ups, *downs, ("down", dst))
