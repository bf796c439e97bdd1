"""Frameless envelopes cross in batches (protocol/batch.py): over real ZeroMQ sockets, in order, a
message with payload frames never overtaking what was queued before it; the network handles each
part of a peer's batch as if it had come alone, and refuses what it would refuse alone."""
import math
import random

import msgpack
import pytest
import zmq

from conftest import greeted_network
from emulator.clock import Tick
from emulator.netconfig import CONDUCTOR, Link, NetworkConfig
from emulator.network import Network
from protocol import batch, envelope

PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0", "c1"], "host1": ["c2"]}


@pytest.fixture
def pair(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(f"ipc://{tmp_path}/b")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"host0")
    dealer.connect(f"ipc://{tmp_path}/b")
    dealer.send(b"hi")
    assert router.recv_multipart() == [b"host0", b"hi"]
    yield router, dealer
    ctx.destroy(linger=0)


def received(sock: zmq.Socket, strip_identity: bool) -> list[list[bytes]]:
    messages = []
    while sock.poll(200):
        frames = sock.recv_multipart()
        messages.append(frames[1:] if strip_identity else frames)
    return messages


def timer(tag: str) -> bytes:
    return envelope.pack("timer", actor="c0", at=1.0, tag=tag)


def test_a_dealers_frameless_sends_go_as_one_batch_and_a_payload_waits_its_turn(pair):
    router, dealer = pair
    out = batch.BatchingDealer(dealer)
    out.send(timer("a"))
    out.send(timer("b"))
    out.send_multipart([envelope.pack("send", src="c0", dst="server", kind="update", round=0, t=0.0, n=0, body={},
                                      payload=3, fp32=12), b"xyz"])
    out.send(timer("c"))
    out.flush()
    messages = received(router, strip_identity=True)
    assert len(messages) == 3  # the batch, the update with its payload, the last timer alone
    first = envelope.unpack(messages[0][0])
    assert first["op"] == "batch" and [envelope.unpack(p)["tag"] for p in first["parts"]] == ["a", "b"]
    assert envelope.unpack(messages[1][0])["op"] == "send" and messages[1][1] == b"xyz"
    assert envelope.unpack(messages[2][0])["tag"] == "c"


def test_a_batch_never_grows_past_its_limits(pair):
    router, dealer = pair
    out = batch.BatchingDealer(dealer)
    for k in range(batch.MAX_PARTS * 2 + 7):
        out.send(timer(str(k)))
    out.flush()
    sizes = [len(envelope.unpack(m[0])["parts"]) for m in received(router, strip_identity=True)]
    assert sizes == [batch.MAX_PARTS, batch.MAX_PARTS, 7]
    big = timer("x" * 100_000)
    for _ in range(5):
        out.send(big)
    out.flush()
    messages = received(router, strip_identity=True)
    assert all(len(m[0]) <= batch.MAX_BYTES + len(big) + 64 for m in messages) and len(messages) == 2
    assert sum(len(envelope.unpack(m[0])["parts"]) for m in messages) == 5


def test_the_routers_batches_reach_each_peer_in_order_and_name_the_holds_of_a_gone_one(pair):
    router, dealer = pair
    lost = []
    batches = batch.RouterBatches(lost.extend)
    for k in range(3):
        batches.add(router, "host0", timer(str(k)), k)
    batches.add(router, "host7", timer("nobody"), 10)  # no such peer: ROUTER_MANDATORY refuses
    batches.add(router, "host7", timer("nobody"), None)
    batches.flush(router)
    [[message]] = received(dealer, strip_identity=False)
    assert [envelope.unpack(p)["tag"] for p in envelope.unpack(message)["parts"]] == ["0", "1", "2"]
    assert lost == [10, None] and not batches.queued


def network() -> Network:
    return greeted_network(NetworkConfig("inproc://unused", PEERS, {a: Link() for a in ("server", "c0", "c1", "c2")}))


def test_the_network_handles_each_part_of_a_batch_and_refuses_what_it_would_refuse_alone():
    net = network()
    before = net.guard.counts()["total"]
    parts = [timer("first"),
             envelope.pack("timer", actor="c2", at=2.0, tag="not host0's actor"),
             batch.pack_batch([timer("nested")]),
             b"\x93garbage",
             envelope.pack("stop"),  # only the conductor stops the network
             timer("last")]
    net.receive(b"host0", [zmq.Frame(batch.pack_batch(parts))])
    ticks = [e[5].tag for e in net.queue if isinstance(e[5], Tick)]
    assert ticks == ["first", "last"]
    assert net.guard.counts()["total"] - before == 4 and not net.stopping
    net.receive(b"host0", [zmq.Frame(batch.pack_batch([timer("with frames")])), zmq.Frame(b"x")])
    assert net.guard.counts()["total"] - before == 5 and len(net.queue) == 2
    with pytest.raises(envelope.ProtocolError, match="packed envelopes"):
        envelope.unpack(msgpack.packb({"v": 1, "op": "batch", "parts": [1, 2]}))


def test_a_checkpoint_sends_the_queued_deliveries_before_it_asks_for_snapshots(tmp_path):
    net = network()
    net.cfg.checkpoint_dir = str(tmp_path / "ckpt")
    sent = []

    class Wire:
        def send_multipart(self, frames, copy=True):
            sent.append((frames[0], envelope.unpack(frames[1])["op"]))

    net.batches.add(Wire(), "host0", envelope.pack("deliver", src="c1", dst="c0", kind="checkin", round=-1, t=0.0,
                                                  hold=0, body={}, device=None, shared=0, quiet=True), None)
    net.checkpoints.begin(Wire(), 0)
    assert sent[0] == (b"host0", "deliver") and {op for _, op in sent[1:]} == {"snapshot"}


def reference_unpack(frame: bytes) -> dict:
    """The field checks as envelope.unpack made them before they were precompiled: the oracle."""
    env = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    schema = envelope.SCHEMA[env["op"]]
    extra = set(env) - set(schema) - {"v", "op"}
    if extra:
        raise envelope.ProtocolError(f"{env['op']}: unexpected fields {sorted(extra)}")
    for field, kind in schema.items():
        if isinstance(kind, envelope.Defaulted):
            if field not in env:
                env[field] = kind.default
                continue
            kind = kind.kind
        elif field not in env:
            raise envelope.ProtocolError(f"{env['op']}: field {field!r} missing")
        value = env[field]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise envelope.ProtocolError(f"{env['op']}: field {field!r} has the wrong type ({type(value).__name__})")
        if isinstance(value, (int, float)):
            envelope._check_number(env["op"], field, value)
    envelope._check_contents(env["op"], env)
    return env


def test_the_precompiled_field_checks_accept_and_refuse_exactly_what_the_plain_ones_did():
    rng = random.Random(3)
    values = [0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 0.0, -0.0, -1e-300, 1.5, 1e19, -1e19, math.inf,
              -math.inf, math.nan, True, False, None, "c0", "", b"x", [], ["a"], [1], {}, {"a": 1}]
    good = {"send": dict(src="c0", dst="server", kind="update", round=0, t=0.0, n=0, body={}, payload=0, fp32=0),
            "deliver": dict(src="a", dst="c2", kind="task", round=0, t=0.0, hold=1, body={}, device=None, shared=0),
            "done": dict(actor="c0", hold=3, busy_until=None, busy_s=None),
            "timer": dict(actor="c0", at=1.0, tag="x"), "hello": dict(peer="h", actors=["c0"]),
            "welcome": dict(peer="h", index=0, scenario={}, fingerprint="f", network_port=1, silence_s=1.0)}
    outcomes = set()
    for _ in range(3000):
        op = rng.choice(sorted(good))
        fields = dict(good[op])
        for _ in range(rng.randint(0, 2)):
            field = rng.choice([*fields, "extra", "more", "quiet", "notes", "restore"])
            if rng.random() < 0.15:
                fields.pop(field, None)
            else:
                fields[field] = rng.choice(values)
        frame = msgpack.packb({"v": 1, "op": op, **fields}, use_bin_type=True)
        results = []
        for check in (envelope.unpack, reference_unpack):
            try:
                results.append(("ok", check(frame)))
            except envelope.ProtocolError as exc:
                results.append(("refused", str(exc)))
        assert results[0] == results[1], (op, fields, results)
        outcomes.add(results[0][0])
    assert outcomes == {"ok", "refused"}
