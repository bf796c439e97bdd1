"""The clock's holds and the one relaxation of the conservative rule: deliveries of one instant go
out without waiting for each other's answers, to actors that hold nothing, and what their answers
make the network record comes out in delivery order whatever order the answers arrive in."""
import io
import sys

import msgpack
import zmq

from emulator.devices import AlwaysOn, Battery, DeviceSpec
from emulator.holds import INF, Holds
from emulator.clock import DELIVER, FLOW_START, Deliver, Notice
from emulator.netconfig import CONDUCTOR, Link, NetworkConfig, network_message
from emulator.network import Network
from protocol import envelope

PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0", "c1"], "host1": ["c2"]}


class Wire:
    """Stands in for the ROUTER socket: keeps what the network sends."""

    def __init__(self):
        self.sent: list[tuple[str, dict]] = []

    def send_multipart(self, frames, copy=True):
        env = msgpack.unpackb(frames[1])
        parts = [msgpack.unpackb(p) for p in env["parts"]] if env["op"] == "batch" else [env]
        self.sent += [(frames[0].decode(), part) for part in parts]


def network(devices=None, link: Link | None = None) -> Network:
    links = {a: link or Link() for a in ("server", "c0", "c1", "c2")}
    cfg = NetworkConfig("inproc://unused", PEERS, links, devices=devices or {})
    net = Network(cfg)
    net.guard.log = io.StringIO()
    for peer, actors in PEERS.items():
        net.receive(peer.encode(), [zmq.Frame(envelope.pack("hello", peer=peer, actors=actors))])
    assert net.started
    net.queue.clear()  # the server's start: not part of these tests
    net._outbox.clear()
    return net


def deliver_at(net: Network, t: float, dst: str, n: int) -> None:
    env = {"src": "server", "dst": dst, "kind": "task", "round": 0, "t": 0.0, "body": {}}
    net.push(t, dst, n, 0, Deliver(env, []))


def run(net: Network, wire: Wire) -> None:
    while net.step(wire):
        pass
    net.batches.flush(wire)  # the frameless deliveries wait for the end of the network's loop


def done(net: Network, peer: str, actor: str, hold: int, busy_until=None, busy_s=None) -> None:
    net.receive(peer.encode(), [zmq.Frame(envelope.pack("done", actor=actor, hold=hold, busy_until=busy_until, busy_s=busy_s))])


def test_holds_answer_the_lower_bound_and_who_is_held():
    holds = Holds()
    assert holds.earliest() == INF
    holds.deliver(1, "a", 2.0)
    holds.deliver(2, "b", 2.0)
    assert holds.earliest() == 2.0 and holds.holding("a") and holds.unanswered == {1, 2}
    holds.answer(1)
    holds[1] = ("a", 7.0)  # a declared busy-until
    assert holds.unanswered == {2} and holds.earliest() == 2.0
    del holds[2]
    assert holds.earliest() == 7.0 and not holds.holding("b") and len(holds) == 1
    holds[1] = ("a", 3.0)
    assert holds.earliest() == 3.0  # a hold moved earlier is seen (its old entry is stale)
    holds[1] = ("b", 3.0)
    assert holds.holding("b") and not holds.holding("a")  # a hold that changes hands leaves the old actor free
    holds[1] = ("a", 3.0)
    del holds[1]
    assert holds.earliest() == INF and not holds.holding("a") and not holds


def test_deliveries_of_one_instant_go_out_before_any_answer():
    net, wire = network(), Wire()
    deliver_at(net, 1.0, "c0", 0)
    deliver_at(net, 1.0, "c2", 1)
    deliver_at(net, 2.0, "c1", 2)
    run(net, wire)
    assert [m["dst"] for _, m in wire.sent] == ["c0", "c2"]  # not c1: 2.0 is past the bound
    assert net.holds.unanswered == {0, 1}
    done(net, "host1", "c2", 1)
    run(net, wire)
    assert len(wire.sent) == 2  # c0 has not answered
    done(net, "host0", "c0", 0)
    run(net, wire)
    assert [m["dst"] for _, m in wire.sent] == ["c0", "c2", "c1"]


def test_a_second_delivery_to_a_held_actor_waits_and_so_does_all_behind_it():
    net, wire = network(), Wire()
    deliver_at(net, 1.0, "c0", 0)
    deliver_at(net, 1.0, "c0", 1)
    deliver_at(net, 1.0, "c2", 2)
    run(net, wire)
    assert [m["dst"] for _, m in wire.sent] == ["c0"]
    done(net, "host0", "c0", 0)
    run(net, wire)
    assert [m["dst"] for _, m in wire.sent] == ["c0", "c0", "c2"]


def test_a_transfer_start_at_the_bound_waits_for_every_answer():
    net, wire = network(), Wire()
    deliver_at(net, 1.0, "c0", 0)
    run(net, wire)
    net.receive(b"host0", [zmq.Frame(envelope.pack("send", src="c0", dst="server", kind="update", round=0, t=1.0, n=0,
                                                   body={}, payload=10, fp32=40)), zmq.Frame(b"x" * 10)])
    assert net.queue[0][1] == FLOW_START
    assert not net.step(wire)  # c0 may still send something that sorts before it
    done(net, "host0", "c0", 0)
    assert net.step(wire) and net.flows.flows


def test_answers_in_any_order_record_in_delivery_order():
    battery = lambda: Battery(1000.0, 500.0)  # noqa: E731
    devices = {a: DeviceSpec(i, "phone", "wifi", AlwaysOn(), battery(), train_w=2.0) for i, a in enumerate(("c0", "c1", "c2"))}
    for reverse in (False, True):
        net, wire = network(devices), Wire()
        for n, actor in enumerate(("c0", "c1", "c2")):
            deliver_at(net, 1.0, actor, n)
        run(net, wire)
        holds = {m["dst"]: m["hold"] for _, m in wire.sent}
        assert len(holds) == 3 and not net._outbox
        answers = [("host1", "c2"), ("host0", "c1"), ("host0", "c0")] if reverse else \
            [("host0", "c0"), ("host0", "c1"), ("host1", "c2")]
        for peer, actor in answers:
            done(net, peer, actor, holds[actor], busy_until=3.0, busy_s=2.0)
            if actor != answers[-1][1]:
                assert not net._outbox  # held back until every delivery of the instant is answered
        rows = [msgpack.unpackb(m)["body"]["devices"][0] for m in net._outbox]
        assert [(r["client"], r["event"], r["energy_j"]) for r in rows] == \
            [("c0", "train", 4.0), ("c1", "train", 4.0), ("c2", "train", 4.0)]
        assert net.holds.earliest() == 3.0 and not net.holds.unanswered


def test_a_notice_is_small_and_delivers_the_networks_own_message():
    """A device's `online` waits on the clock as a Notice (a population queues one per device at
    t = 0): two slots, no envelope until it is delivered, and a fresh envelope each time (a
    delivery writes its time into the one it sends)."""
    notice = Notice("c0042", "online")
    assert not hasattr(notice, "__dict__") and sys.getsizeof(notice) < 64
    assert notice.order == DELIVER and notice.portable() is notice
    assert notice.env == network_message("c0042", "online") and notice.env is not notice.env
