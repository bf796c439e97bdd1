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
    assert [len(envelope.unpack(m[0]).get("parts", [m])) for m in messages] == [2, 2, 1]  # a third would pass MAX_BYTES
    assert all(len(m[0]) <= batch.MAX_BYTES + 64 for m in messages)
    # an envelope near the limit after queued ones: it goes alone, so nothing crosses over the limit
    huge = timer("y" * (envelope.MAX_ENVELOPE_BYTES - 100))
    out.send(timer("small"))
    out.send(huge)
    out.send(timer("after"))
    out.flush()
    sizes = [len(m[0]) for m in received(router, strip_identity=True)]
    assert len(sizes) == 3 and max(sizes) <= envelope.MAX_ENVELOPE_BYTES and sizes[1] == len(huge)


def test_the_routers_batches_stay_within_their_bytes_too(pair):
    router, dealer = pair
    batches = batch.RouterBatches(lambda tags: None)
    huge = timer("y" * (envelope.MAX_ENVELOPE_BYTES - 100))
    for header in (timer("a"), huge, timer("b"), timer("c")):
        batches.add(router, "host0", header, None)
    batches.flush(router)
    got = [m[0] for m in received(dealer, strip_identity=False)]
    assert [len(m) for m in got[:2]] == [len(timer("a")), len(huge)] and len(got) == 3
    assert [envelope.unpack(p)["tag"] for p in envelope.unpack(got[2])["parts"]] == ["b", "c"]


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
        envelope.unpack(msgpack.packb({"v": envelope.VERSION, "op": "batch", "parts": [1, 2]}))


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
        frame = msgpack.packb({"v": envelope.VERSION, "op": op, **fields}, use_bin_type=True)
        results = []
        for check in (envelope.unpack, reference_unpack):
            try:
                results.append(("ok", check(frame)))
            except envelope.ProtocolError as exc:
                results.append(("refused", str(exc)))
        assert results[0] == results[1], (op, fields, results)
        outcomes.add(results[0][0])
    assert outcomes == {"ok", "refused"}


class CheckingIn:
    """On `online`, checks in with the server: a frameless send, then the runtime's `done`."""

    def __init__(self, name: str):
        self.name = name

    def react(self, msg):
        from node.actor import Reaction, Send  # noqa: PLC0415

        return Reaction(sends=[Send("server", "checkin", -1, {"battery": 0.5})])


def test_a_hosts_runtime_answers_a_batch_of_deliveries_with_one_batch_in_delivery_order(tmp_path):
    import threading  # noqa: PLC0415

    from node.runtime import Runtime  # noqa: PLC0415

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp_path}/n")
    runtime = Runtime("host0", f"ipc://{tmp_path}/n", [CheckingIn(f"c{k}") for k in range(3)])
    thread = threading.Thread(target=runtime.run, daemon=True)
    thread.start()
    try:
        assert router.poll(10_000), "the runtime never said hello"
        peer, hello = router.recv_multipart()
        assert envelope.unpack(hello)["op"] == "hello"
        online = [envelope.pack("deliver", src="network", dst=f"c{k}", kind="online", round=-1, t=0.5, hold=10 + k,
                                body={}, device=None, shared=0) for k in (2, 0, 1)]
        router.send_multipart([peer, batch.pack_batch(online)])
        assert router.poll(10_000), "no answer"
        _, answer = router.recv_multipart()
        env = envelope.unpack(answer)
        assert env["op"] == "batch"
        parts = [envelope.unpack(p) for p in env["parts"]]
        assert [(p["op"], p.get("src") or p.get("actor")) for p in parts] == [
            ("send", "c2"), ("done", "c2"), ("send", "c0"), ("done", "c0"), ("send", "c1"), ("done", "c1")]
        assert [p["hold"] for p in parts if p["op"] == "done"] == [12, 10, 11]
        assert all(p["t"] == 0.5 and p["kind"] == "checkin" for p in parts if p["op"] == "send")
    finally:
        router.send_multipart([peer, envelope.pack("stop")])
        thread.join(10)
        ctx.destroy(linger=0)
    assert not thread.is_alive()


def test_an_answer_that_starts_work_leaves_before_the_work_is_handed_over():
    """The network's clock waits for it; queued, it waited behind the worker thread's hold of the GIL."""
    from node.actor import Reaction  # noqa: PLC0415
    from node.runtime import Runtime  # noqa: PLC0415

    class Wire:
        def __init__(self):
            self.sent = []

        def send(self, frame, flags=0):
            self.sent.append(envelope.unpack(frame))

    wire = Wire()
    sock = batch.BatchingDealer(wire)
    runtime = Runtime("host0", "inproc://unused", [])
    seen_at_submit = []
    runtime.work.submit = lambda *args: seen_at_submit.append([m["op"] for m in wire.sent])
    sock.send(timer("before"))
    runtime._start_work(sock, "c0", 7, Reaction(work=lambda: Reaction(), work_s=2.0), 1.0)
    assert seen_at_submit == [["batch"]]  # the timer queued before it and the done, sent together
    done = [p for m in wire.sent if m["op"] == "batch" for p in map(envelope.unpack, m["parts"])]
    assert [p["op"] for p in done] == ["timer", "done"] and done[1]["busy_until"] == 3.0 and not sock.queued


def test_a_hosts_runtime_refuses_a_nested_batch_and_a_batch_with_frames_and_goes_on(caplog):
    from node.runtime import Runtime  # noqa: PLC0415

    runtime = Runtime("host0", "inproc://unused", [])
    sock = batch.BatchingDealer(None)  # nothing may be sent: both are refused before any delivery
    assert runtime._on_message(sock, batch.pack_batch([batch.pack_batch([timer("x")])]), [])
    assert runtime._on_message(sock, batch.pack_batch([timer("x")]), [b"frame"])
    assert runtime.refused == 2  # the nested batch (what it holds is never read), the batch with frames
    assert "a batch inside a batch" in caplog.text
