"""A payload sent to several actors crosses to each peer once: the network sends its frames with
the first delivery to a peer and a reference with the others, and the peer's runtime reuses the
frames it kept. Real runs give the same results with it (the exact integration tests)."""
import io

import msgpack
import zmq

from emulator.netconfig import CONDUCTOR, Link, NetworkConfig
from emulator.network import Network
from node.runtime import Runtime
from protocol import envelope

PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0", "c1"], "host1": ["c2"]}


class Wire:
    def __init__(self):
        self.sent: list[tuple[str, dict, list[bytes]]] = []

    def send_multipart(self, frames, copy=True):
        env = msgpack.unpackb(frames[1])
        if env["op"] == "batch":  # frameless deliveries, queued by the network and sent together
            self.sent += [(frames[0].decode(), msgpack.unpackb(p), []) for p in env["parts"]]
            return
        self.sent.append((frames[0].decode(), env, [bytes(f) for f in frames[2:]]))


def network() -> Network:
    cfg = NetworkConfig("inproc://unused", PEERS, {a: Link() for a in ("server", "c0", "c1", "c2")})
    net = Network(cfg)
    net.guard.log = io.StringIO()
    for peer, actors in PEERS.items():
        net.receive(peer.encode(), [zmq.Frame(envelope.pack("hello", peer=peer, actors=actors))])
    net.queue.clear()
    return net


def send(net: Network, dst, payload: bytes, n: int) -> None:
    header = envelope.pack("send", src="server", dst=dst, kind="task", round=n, t=net.now, n=n, body={},
                           payload=len(payload), fp32=len(payload))
    net.receive(b"server", [zmq.Frame(header), zmq.Frame(payload)])


def deliveries(net: Network) -> list[tuple[str, str, int, list[bytes]]]:
    wire = Wire()
    while net.step(wire):
        net.batches.flush(wire)
        for _, env, _ in wire.sent:
            if env["op"] == "deliver":  # answer at once: these actors do no modelled work
                net.receive(_peer(env["dst"]).encode(), [zmq.Frame(envelope.pack(
                    "done", actor=env["dst"], hold=env["hold"], busy_until=None, busy_s=None))])
        yield from ((peer, env["dst"], env["shared"], frames) for peer, env, frames in wire.sent if env["op"] == "deliver")
        wire.sent.clear()


def _peer(actor: str) -> str:
    return next(p for p, actors in PEERS.items() if actor in actors)


def test_a_fanout_payload_crosses_to_each_peer_once_and_a_unicast_is_never_shared():
    net = network()
    send(net, ["c0", "c1", "c2"], b"model-1", 0)
    first = sorted(deliveries(net), key=lambda d: (d[1]))
    assert [(p, a) for p, a, _, _ in first] == [("host0", "c0"), ("host0", "c1"), ("host1", "c2")]
    host0 = [d for d in first if d[0] == "host0"]
    assert sorted(len(frames) for *_, frames in host0) == [0, 1]  # the frames once, then a reference
    assert host0[0][2] == host0[1][2] > 0
    assert [d[3] for d in first if d[0] == "host1"] == [[b"model-1"]]
    # the next fan-out carries new frames; a unicast carries its own and does not replace the kept one
    send(net, ["c0", "c1"], b"model-2", 1)
    send(net, "c0", b"update", 2)
    later = list(deliveries(net))
    assert len(later) == 3
    shared = [(a, frames) for _, a, s, frames in later if s]
    assert sorted(len(f) for _, f in shared) == [0, 1] and [b"model-2"] in [f for _, f in shared]
    assert [(a, frames) for _, a, s, frames in later if not s] == [("c0", [b"update"])]


def test_the_runtime_keeps_the_shared_payload_and_refuses_a_reference_it_does_not_hold():
    rt = Runtime("host0", "inproc://unused", [])
    rt._refuse = lambda reason: refusals.append(reason)
    refusals = []
    base = {"dst": "c0", "hold": 1}
    assert rt._shared_payload({**base, "shared": 0}, [b"own"]) == [b"own"]
    first = rt._shared_payload({**base, "shared": 3}, [b"kept"])
    assert first == [b"kept"]
    first[0][:] = b"XXXX"  # an actor that writes into its payload changes its own copy only
    assert rt._shared_payload({**base, "shared": 3}, []) == [b"kept"]
    assert rt._shared_payload({**base, "shared": 0}, [b"other"]) == [b"other"]  # a unicast leaves it in place
    assert rt._shared_payload({**base, "shared": 3}, []) == [b"kept"]
    assert rt._shared_payload({**base, "shared": 4}, []) is None
    assert refusals and "shared payload 4" in refusals[0]
