"""A device that goes off aborts its own transfers, in the order they started, found through the
network's index of transfers by actor rather than a pass over every flow in flight."""
import msgpack
import zmq

from protocol import envelope
from emulator.clock import FlowStart
from emulator.netconfig import Link
from test_clock_holds import Wire, network


def send(net, peer, src, dst, n, t=0.0, size=50_000):
    net.receive(peer.encode(), [zmq.Frame(envelope.pack("send", src=src, dst=dst, kind="update", round=0, t=t, n=n,
                                                        body={}, payload=size, fp32=4 * size)), zmq.Frame(b"x" * size)])


def go_offline(net, actor):
    """What the device timeline's change does when a device goes off (emulator/clock.py's DeviceChange)."""
    net.timeline._go_offline(actor, "offline")
    net.transfers.abort_flows_of(actor, "offline")


def test_going_off_aborts_only_its_own_transfers_in_start_order():
    net, wire = network(link=Link(1e6, 1e6, 0.01)), Wire()
    send(net, "host0", "c0", "server", 0)
    send(net, "host1", "c2", "server", 0)
    send(net, "server", "server", "c0", 0)
    send(net, "host0", "c1", "server", 0)
    while net.queue and isinstance(net.queue[0][5], FlowStart):  # start the four, finish none
        net.step(wire)
    assert len(net.flows.flows) == 4
    assert {a: len(f) for a, f in net.transfers.flows_of.items()} == {"c0": 2, "c1": 1, "c2": 1, "server": 4}
    net._outbox.clear()
    go_offline(net, "c0")
    rows = [r for m in net._outbox for r in msgpack.unpackb(m)["body"].get("transfers", [])]
    assert sorted((r["src"], r["dst"], r["outcome"]) for r in rows) == [("c0", "server", "offline"), ("server", "c0", "offline")]
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows) and len(rows) == 2
    assert {net.transfers.in_flight[f].src for f in net.flows.flows} == {"c1", "c2"}
    assert "c0" not in net.transfers.flows_of and {a: len(f) for a, f in net.transfers.flows_of.items()} == {"c1": 1, "c2": 1, "server": 2}
    go_offline(net, "c2")  # and the index empties as its transfers go
    assert set(net.transfers.flows_of) == {"c1", "server"}
