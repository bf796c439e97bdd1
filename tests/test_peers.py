"""Peer rules of the network process, on the Network object itself with real ZeroMQ frames: who
may speak, for which actors, once; and that nothing a peer sends can raise."""
import io
import math

import msgpack
import pytest
import zmq

from emulator.flows.links import INF
from emulator.clock import FlowStart, Tick
from emulator.netconfig import CONDUCTOR, Link, NetworkConfig
from emulator.network import Network
from emulator.netshell import watch_peers
from emulator.peers import PeerGuard, identity_label
from protocol import envelope

PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0", "c1"], "host1": ["c2"]}


def network() -> Network:
    cfg = NetworkConfig("inproc://unused", PEERS, {a: Link() for a in ("server", "c0", "c1", "c2")})
    net = Network(cfg)
    net.guard.log = io.StringIO()
    net._outbox = []
    return net


def frames(*parts: bytes) -> list[zmq.Frame]:
    return [zmq.Frame(p) for p in parts]


def hello(net: Network, peer: str, actors: list[str], as_peer: str | None = None) -> None:
    net.receive(peer.encode(), frames(envelope.pack("hello", peer=as_peer or peer, actors=actors)))


def reports(net: Network) -> list[dict]:
    return [msgpack.unpackb(m)["body"] for m in net._outbox]


def greet_all(net: Network) -> None:
    for peer, actors in PEERS.items():
        hello(net, peer, actors)
    assert net.started


def test_anonymous_and_binary_identities_are_refused_never_raised():
    net = network()
    anonymous = b"\x00\x8bE\xe7\xd3"  # what ZeroMQ gives a DEALER that sets no identity
    net.receive(anonymous, frames(b""))
    net.receive(anonymous, [])
    net.receive(b"\xff\xfe", frames(envelope.pack("hello", peer="server", actors=["server"])))
    net.receive(b"host7", frames(envelope.pack("hello", peer="host7", actors=["c0"])))
    counts = net.guard.counts()
    assert counts["total"] == 4
    assert set(counts["by_peer"]) == {"0x008b45e7d3", "0xfffe", "host7"}
    assert net.actor_peer == {}  # nothing was bound
    assert identity_label(b"server") == "server" and identity_label(b"\x00a") == "0x0061"


def test_a_stranger_that_keeps_sending_is_banned_and_then_ignored_unread():
    guard = PeerGuard(PEERS, log=io.StringIO(), ban_after=10)
    for _ in range(10):
        guard.refuse(b"\x00abc", "garbage")
    assert guard.banned == {b"\x00abc"}
    net = network()
    net.guard = guard
    net.receive(b"\x00abc", frames(b"more"))
    assert guard.counts()["by_peer"]["0x00616263"]["messages"] == 10  # not even counted any more
    # a peer of the run is never banned, however much it gets wrong
    for _ in range(20):
        guard.refuse(b"host0", "garbage")
    assert b"host0" not in guard.banned


def test_logging_is_rate_limited_per_peer():
    now = [0.0]
    log = io.StringIO()
    guard = PeerGuard(PEERS, log=log, log_every_s=5.0, clock=lambda: now[0])
    for i in range(100):
        now[0] = i * 0.1  # 10 s of refusals
        guard.refuse(b"\x00x", "bad")
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "more refused since the last line" in lines[1]


def test_a_peer_claims_only_its_own_actors_and_only_once():
    net = network()
    hello(net, "host0", ["c0", "server"])  # a host claiming the server
    hello(net, "host1", ["c2"], as_peer="host0")  # speaking as another peer
    assert net.actor_peer == {}
    claims = [r for r in reports(net) if r["type"] == "refused_claim"]
    assert [c["peer"] for c in claims] == ["host0", "host1"]
    assert "actors it was not given (['server'])" in claims[0]["reason"]
    greet_all(net)
    assert net.actor_peer == {"server": "server", "c0": "host0", "c1": "host0", "c2": "host1"}
    net._outbox.clear()
    hello(net, "host1", ["c2"])  # a second hello, even for its own actors
    hello(net, "host1", ["c0"])  # an actor host0 holds
    refused = [r["reason"] for r in reports(net) if r["type"] == "refused_claim"]
    assert "host1 said hello a second time" in refused[0] and "second time" in refused[1]
    assert net.actor_peer["c0"] == "host0"


def test_a_hello_in_parts_binds_every_actor_once_the_last_part_comes(monkeypatch):
    monkeypatch.setattr(envelope, "HELLO_PART_ACTORS", 1)
    net = network()
    parts = envelope.hello_parts("host0", ["c0", "c1"])
    assert len(parts) == 2
    net.receive(b"host0", frames(parts[0]))
    assert net.actor_peer == {} and "host0" not in net.guard.greeted  # the first of two parts
    net.receive(b"host0", frames(parts[1]))
    assert net.actor_peer == {"c0": "host0", "c1": "host0"}
    for part in envelope.hello_parts("host1", ["c2", "c2"]):  # more parts than it has actors
        net.receive(b"host1", frames(part))
    claims = [r for r in reports(net) if r["type"] == "refused_claim"]
    assert [c["peer"] for c in claims] == ["host1"] and "c2" not in net.actor_peer


def test_a_host_of_150000_clients_says_hello_within_the_envelope_limit():
    actors = [f"c{i:06d}" for i in range(150_000)]
    parts = envelope.hello_parts("host0", actors)
    assert len(parts) > 1  # one envelope would be about 1.2 MB
    said = [envelope.unpack(p) for p in parts]
    assert all(len(p) <= envelope.MAX_ENVELOPE_BYTES for p in parts)
    assert [a for s in said for a in s["actors"]] == actors
    assert [s["more"] for s in said] == [True] * (len(parts) - 1) + [False]


def test_acting_for_others_is_refused():
    net = network()
    greet_all(net)
    before = net.guard.counts()["total"]
    net.receive(b"host1", frames(envelope.pack("timer", actor="c0", at=1.0, tag="x")))  # host0's actor
    net.receive(b"host1", frames(envelope.pack("send", src="server", dst="c2", kind="task", round=0, t=0.0, n=0, body={},
                                               payload=0, fp32=0)))
    net.receive(b"host1", frames(envelope.pack("done", actor="c2", hold=12345, busy_until=None, busy_s=None)))
    net.receive(b"host1", frames(envelope.pack("send", src="c2", dst="c9", kind="update", round=0, t=0.0, n=0, body={},
                                               payload=0, fp32=0)))  # to nobody
    net.receive(b"host1", frames(envelope.pack("stop")))  # only the conductor stops the network
    net.receive(b"host1", frames(envelope.pack("peer_lost", peer="host0")))
    net.receive(b"host1", frames(envelope.pack("deliver", src="a", dst="c2", kind="task", round=0, t=0.0, hold=1, body={},
                                               device=None, shared=0)))
    assert net.guard.counts()["total"] - before == 7
    assert not net.stopping and not net.dead
    assert [e for e in net.queue if isinstance(e[5], (Tick, FlowStart))] == []
    # and a hold is released only by the peer of the actor it belongs to
    hold = 99
    net.holds[hold] = ("server", 0.0)  # what delivering the server's start leaves
    net.receive(b"host0", frames(envelope.pack("done", actor="server", hold=hold, busy_until=None, busy_s=None)))
    assert hold in net.holds
    net.receive(b"server", frames(envelope.pack("done", actor="server", hold=hold, busy_until=None, busy_s=None)))
    assert hold not in net.holds


@pytest.mark.parametrize("field,value", [("t", math.nan), ("t", math.inf), ("t", -1.0), ("n", 2**63), ("n", -1),
                                         ("payload", -5), ("round", 2**64 - 1)])
def test_out_of_range_numbers_are_protocol_errors(field, value):
    fields = dict(src="c0", dst="server", kind="update", round=0, t=0.0, n=0, body={}, payload=0, fp32=0)
    fields[field] = value
    with pytest.raises(envelope.ProtocolError, match=field):
        envelope.unpack(envelope.pack("send", **fields))
    with pytest.raises(envelope.ProtocolError, match="at"):
        envelope.unpack(envelope.pack("timer", actor="c0", at=INF, tag="x"))
    with pytest.raises(envelope.ProtocolError, match="actor names"):
        envelope.unpack(envelope.pack("hello", peer="host0", actors=[1, 2]))


def test_heartbeats_keep_a_peer_alive_and_silence_is_reported_once(monkeypatch):
    net = network()
    net.cfg.peer_timeout_s = 5.0
    clock = [1000.0]
    monkeypatch.setattr("emulator.network.time.monotonic", lambda: clock[0])
    greet_all(net)
    net._outbox.clear()
    clock[0] += 4.0
    net.receive(b"host0", frames(envelope.pack("alive", busy_s=0.0)))
    net.receive(b"host1", frames(envelope.pack("alive", busy_s=8.0)))  # 8 s into a long job
    clock[0] += 4.0
    watch_peers(net)  # server: silent 8 s; host0: 4 s; host1: 4 s
    assert [r["peer"] for r in reports(net) if r["type"] == "peer_silent"] == ["server"]
    clock[0] += 6.0
    net._last_watch = 0.0
    watch_peers(net)  # host0 now 10 s silent; host1 10 s but allowed 16 s; server already reported
    assert sorted(r["peer"] for r in reports(net) if r["type"] == "peer_silent") == ["host0", "server"]
