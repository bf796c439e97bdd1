"""Quiet kinds (node/actor.py quiet_kinds): an actor that declares a message kind quiet reacts to it
without moving the clock, so the network does not wait for its answer. A population's check-ins
reach the server one after another; each was a round trip between two processes."""
import io

import msgpack
import pytest
import zmq

from conftest import read_csv, write_scenario
from emulator.clock import Deliver
from emulator.netconfig import CONDUCTOR, Link, NetworkConfig
from emulator.network import Network
from node.actor import Reaction, Send, moves_clock
from protocol import envelope

PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0", "c1"]}


class Wire:
    def __init__(self):
        self.sent: list[tuple[str, dict]] = []

    def send_multipart(self, frames, copy=True):
        env = msgpack.unpackb(frames[1])
        parts = [msgpack.unpackb(p) for p in env["parts"]] if env["op"] == "batch" else [env]
        self.sent += [(frames[0].decode(), part) for part in parts]


def network(quiet: dict | None) -> Network:
    cfg = NetworkConfig("inproc://unused", PEERS, {a: Link() for a in ("server", "c0", "c1")})
    net = Network(cfg)
    net.guard.log = io.StringIO()
    for peer, actors in PEERS.items():
        parts = envelope.hello_parts(peer, actors, quiet if peer == "server" else None)
        for part in parts:
            net.receive(peer.encode(), [zmq.Frame(part)])
    net.queue.clear()
    return net


def deliver_at(net: Network, t: float, src: str, dst: str, kind: str, n: int) -> None:
    env = {"src": src, "dst": dst, "kind": kind, "round": -1, "t": 0.0, "body": {}}
    net.push(t, dst, n, 0, Deliver(env, []))


def run(net: Network, wire: Wire) -> None:
    while net.step(wire):
        pass
    net.batches.flush(wire)  # the frameless deliveries wait for the end of the network's loop


def test_the_clock_goes_past_a_quiet_delivery_without_an_answer():
    net, wire = network({"checkin": ["server"]}), Wire()
    deliver_at(net, 1.0, "c0", "server", "checkin", 0)
    deliver_at(net, 2.0, "c1", "server", "checkin", 1)
    deliver_at(net, 3.0, "server", "c0", "task", 2)
    run(net, wire)
    kinds = [(peer, env["kind"], env["t"]) for peer, env in wire.sent]
    assert kinds == [("server", "checkin", 1.0), ("server", "checkin", 2.0), ("host0", "task", 3.0)]
    assert [env.get("quiet", False) for _, env in wire.sent] == [True, True, False]
    assert len(net.holds) == 1  # only the task holds the clock


def test_a_kind_not_declared_quiet_still_holds_the_clock():
    net, wire = network({"checkin": ["server"]}), Wire()
    deliver_at(net, 1.0, "c0", "server", "update", 0)
    deliver_at(net, 2.0, "server", "c0", "task", 1)
    run(net, wire)
    assert [env["kind"] for _, env in wire.sent] == ["update"]  # the task waits for the server's answer
    assert net.now == 1.0 and len(net.holds) == 1


def test_without_the_declaration_every_check_in_waits_for_its_answer():
    net, wire = network(None), Wire()
    deliver_at(net, 1.0, "c0", "server", "checkin", 0)
    deliver_at(net, 2.0, "c1", "server", "checkin", 1)
    run(net, wire)
    assert [env["kind"] for _, env in wire.sent] == ["checkin"]
    (hold,) = list(net.holds)
    net.receive(b"server", [zmq.Frame(envelope.pack("done", actor="server", hold=hold, busy_until=None, busy_s=None))])
    run(net, wire)
    assert [env["t"] for _, env in wire.sent] == [1.0, 2.0]


def test_a_peer_declares_quiet_kinds_only_for_its_own_actors():
    cfg = NetworkConfig("inproc://unused", PEERS, {})
    net = Network(cfg)
    net.guard.log = io.StringIO()
    net.receive(b"host0", [zmq.Frame(envelope.pack("hello", peer="host0", actors=["c0", "c1"],
                                                   quiet={"checkin": ["server"]}))])
    assert "host0" not in net.peer_actors and "server" not in net.quiet
    assert "declares quiet kinds for 'server'" in net.guard.log.getvalue()


def test_quiet_kinds_go_in_the_last_part_of_a_hello_and_name_known_kinds():
    parts = [envelope.unpack(p) for p in envelope.hello_parts("h", [f"c{i}" for i in range(45_000)], {"checkin": ["c1"]})]
    assert [p["quiet"] for p in parts] == [{}, {}, {"checkin": ["c1"]}]
    with pytest.raises(envelope.ProtocolError, match="quiet must map message kinds"):
        envelope.unpack(envelope.pack("hello", peer="h", actors=["c1"], quiet={"gossipy": ["c1"]}))


def test_what_in_a_reaction_moves_the_clock():
    assert moves_clock(Reaction(reports=[{"type": "x"}])) == []
    assert moves_clock(Reaction(sends=[Send("c0", "task", 0)], timers=[(1.0, "t")], halt=True)) == [
        "a send", "a timer", "a halt"]


SCENARIO = """
name: quiet
seed: 5
rounds: 3
task: {dataset: synthetic, model: mlp, synthetic: {samples: 2000, test_samples: 50}}
population:
  clients: 60
  devices: [{ms_per_sample: 1, battery_wh: 10, battery_start: [0.3, 0.9]}]
  links:
    - {share: 0.5, up_mbps: 20, down_mbps: 50, latency_ms: 10, jitter_ms: 3, loss: 0.002}
    - {share: 0.5, up_mbps: 5, down_mbps: 20, latency_ms: 40}
  availability: {kind: markov, mean_on_s: 20, mean_off_s: 10}
server: {link: {up_mbps: 60, down_mbps: 40, latency_ms: 1}}
selection: {clients_per_round: 15, policy: resource_aware, min_battery: 0.2, checkin: true, checkin_wait_s: 1}
round: {policy: first_k, timeout_s: 30}
algorithm: {train: false}
eval: {every: 0}
"""


def _run(tmp_path, name: str) -> dict:
    from emulator.conductor import run_scenario
    from emulator.progress import QuietView
    from emulator.scenario import load_scenario

    sc, resolved = load_scenario(write_scenario(tmp_path / f"{name}.yaml", SCENARIO))
    return run_scenario(sc, resolved, tmp_path / name, QuietView(sc.rounds))


def test_a_run_is_the_same_whether_the_server_declares_check_ins_quiet(tmp_path, monkeypatch):
    """Real processes (the forked server inherits the patched class): devices that come and go,
    check-ins over lossy jittery links, rounds that select among them: every row the same."""
    from node.server import ServerActor

    assert ServerActor.quiet_kinds == {"checkin"}
    assert _run(tmp_path, "quiet")["status"] == "completed"
    monkeypatch.setattr(ServerActor, "quiet_kinds", frozenset())
    assert _run(tmp_path, "waiting")["status"] == "completed"
    checkins = [r for r in read_csv(tmp_path / "quiet" / "transfers.csv") if r["kind"] == "checkin"]
    assert len(checkins) > 60  # devices came back on and checked in again
    for name in ("transfers.csv", "clients.csv", "devices.csv", "population.csv"):
        assert read_csv(tmp_path / "quiet" / name) == read_csv(tmp_path / "waiting" / name), name
    drop = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert drop(read_csv(tmp_path / "quiet" / "rounds.csv")) == drop(read_csv(tmp_path / "waiting" / "rounds.csv"))


def test_an_actor_that_breaks_its_declaration_fails_the_run_saying_so(tmp_path, monkeypatch):
    from node.server import ServerActor

    monkeypatch.setattr(ServerActor, "quiet_kinds", frozenset({"checkin", "tick"}))  # a round's start sends tasks
    summary = _run(tmp_path, "broken")
    assert summary["status"] == "failed"
    assert "server declares 'tick' quiet but reacted to it with a send" in summary["reason"]
