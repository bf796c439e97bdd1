"""Speculative training (run.speculate): the network previews the server's tasks to the clients'
hosts as their downloads begin; a host whose worker would idle trains them then, and the
delivery's work takes the result. It must save wall time only: every result of a run is the
same with it and without it."""
import io
import json
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from conftest import read_csv, run_cli, write_scenario
from emulator.netconfig import CONDUCTOR, Link, NetworkConfig
from emulator.network import Network
from node.actor import Message, Reaction
from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
from node.data import synthetic
from node.models import state_to_numpy
from node.stages import Privacy
from node.runtime import Runtime
from node.schedule import BitSchedule
from node.speculation import SpeculativeResults
from node.strategies.fedavg import FedAvg
from protocol import envelope
from protocol.codecs import encode_state, make_codec


# ---- the envelope -------------------------------------------------------------------------------
def test_early_and_preview_fields_default_when_left_out_and_previews_are_checked():
    send = envelope.unpack(envelope.pack("send", src="s", dst="c", kind="task", round=0, t=0.0, n=0, body={},
                                         payload=0, fp32=0))
    assert send["early"] is False
    deliver = envelope.unpack(envelope.pack("deliver", src="s", dst="c", kind="task", round=0, t=0.0, hold=1, body={},
                                            device=None, shared=0))
    assert deliver["preview"] == 0
    good = dict(src="s", dst=["c0", "c1"], kind="task", round=2, body={}, preview=5, eta=[1.0, 2])
    assert envelope.unpack(envelope.pack("preview", **good))["eta"] == [1.0, 2]
    for bad, why in [({"eta": [1.0]}, "one finite time per dst"), ({"eta": [1.0, float("nan")]}, "one finite time"),
                     ({"preview": -1}, "negative"), ({"dst": ["c0", 3]}, "actor names")]:
        with pytest.raises(envelope.ProtocolError, match=why):
            envelope.unpack(envelope.pack("preview", **{**good, **bad}))
    with pytest.raises(envelope.ProtocolError, match="wrong type"):
        envelope.unpack(envelope.pack("send", src="s", dst="c", kind="task", round=0, t=0.0, n=0, body={},
                                      payload=0, fp32=0, early=1))


# ---- the network ---------------------------------------------------------------------------------
PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0", "c1"], "host1": ["c2"]}
LINKS = {"server": Link(up_bps=8e6, down_bps=8e6, latency_s=0.001), "c0": Link(down_bps=1e6, latency_s=0.01),
         "c1": Link(down_bps=4e6, latency_s=0.02), "c2": Link(down_bps=2e6, latency_s=0.03)}


class Wire:
    def __init__(self):
        self.sent: list[tuple[str, dict, list[bytes]]] = []

    def send_multipart(self, frames, *flags, **options):
        self.sent.append((bytes(frames[0]).decode(), msgpack.unpackb(bytes(frames[1])), [bytes(f) for f in frames[2:]]))


def network(previews: bool = True) -> Network:
    net = Network(NetworkConfig("inproc://unused", PEERS, LINKS, previews=previews))
    net.guard.log = io.StringIO()
    for peer, actors in PEERS.items():
        net.receive(peer.encode(), [zmq.Frame(envelope.pack("hello", peer=peer, actors=actors))])
    net.queue.clear()
    return net


def send(net: Network, dst, payload: bytes, n: int, early: bool) -> None:
    header = envelope.pack("send", src="server", dst=dst, kind="task", round=n, t=net.now, n=n, body={"lr": 0.1},
                           payload=len(payload), fp32=len(payload), early=early)
    net.receive(b"server", [zmq.Frame(header), zmq.Frame(payload)])


def run_out(net: Network) -> list[tuple[str, dict, list[bytes]]]:
    """Everything the network sends to its peers until its queue is empty, deliveries answered at once."""
    wire, seen = Wire(), []
    net._flush_peers(wire)
    while True:
        stepped = net.step(wire)
        for peer, env, frames in wire.sent:
            if env["op"] == "deliver":
                net.receive(peer.encode(), [zmq.Frame(envelope.pack("done", actor=env["dst"], hold=env["hold"],
                                                                    busy_until=None, busy_s=None))])
        seen += wire.sent
        wire.sent.clear()
        if not stepped:
            return seen


def test_an_early_send_is_previewed_once_per_host_before_any_delivery_and_its_deliveries_name_it():
    net = network()
    send(net, ["c0", "c1", "c2"], b"model-0", 0, early=True)
    seen = run_out(net)
    previews = [(peer, env, frames) for peer, env, frames in seen if env["op"] == "preview"]
    assert sorted(peer for peer, _, _ in previews) == ["host0", "host1"]
    first_delivery = min(i for i, (_, env, _) in enumerate(seen) if env["op"] == "deliver")
    assert max(i for i, (_, env, _) in enumerate(seen) if env["op"] == "preview") < first_delivery
    by_peer = {peer: (env, frames) for peer, env, frames in previews}
    env0, frames0 = by_peer["host0"]
    assert env0["dst"] == ["c0", "c1"] and frames0 == [b"model-0"] and env0["body"] == {"lr": 0.1}
    # eta: alone on its links, the payload at the slower of the server's uplink and the receiver's downlink
    bits = len(b"model-0") * 8
    assert env0["eta"] == pytest.approx([0.011 + bits / 1e6, 0.021 + bits / 4e6])
    assert by_peer["host1"][0]["eta"] == pytest.approx([0.031 + bits / 2e6])
    key = env0["preview"]
    assert key > 0 and by_peer["host1"][0]["preview"] == key
    deliveries = [env for _, env, _ in seen if env["op"] == "deliver"]
    assert sorted(env["dst"] for env in deliveries) == ["c0", "c1", "c2"]
    assert {env["preview"] for env in deliveries} == {key}
    # the next early send has its own id; a send that is not early is never previewed
    send(net, "c2", b"model-1", 1, early=True)
    send(net, "c1", b"update", 2, early=False)
    later = run_out(net)
    assert [(p, env["dst"]) for p, env, _ in later if env["op"] == "preview"] == [("host1", ["c2"])]
    assert {env["dst"]: env["preview"] for _, env, _ in later if env["op"] == "deliver"} == {"c2": key + 1, "c1": 0}


def test_previews_switched_off_leave_only_the_deliveries():
    net = network(previews=False)
    send(net, ["c0", "c2"], b"model-0", 0, early=True)
    seen = run_out(net)
    assert [env["op"] for _, env, _ in seen] == ["deliver", "deliver"]
    assert all(env["preview"] == 0 for _, env, _ in seen)


# ---- the runtime ---------------------------------------------------------------------------------
class Sock:
    def __init__(self):
        self.sent = []

    def send(self, data, *flags, **options):
        self.sent.append(envelope.unpack(data))


class Prepares:
    """An actor that records what it is asked to prepare, answering `answers` in turn (then True)."""

    def __init__(self, name, log, answers=()):
        self.name, self.log, self.answers = name, log, list(answers)

    def react(self, msg):
        self.log.append(("react", self.name, msg.preview))
        return Reaction()

    def speculate(self, msg):
        assert msg.frames[0] == bytearray(b"payload") and msg.device is None
        answer = self.answers.pop(0) if self.answers else True
        self.log.append(("speculate", self.name, msg.preview, answer))
        return answer


def preview_env(dsts, etas, key):
    return {"src": "server", "dst": dsts, "kind": "task", "round": 0, "body": {}, "preview": key, "eta": etas}


def start_worker(rt):
    th = threading.Thread(target=rt._worker, args=(lambda: None,), daemon=True)
    th.start()
    return th


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def stop(rt, th):
    with rt._jobs_cv:
        rt._stopping = True
        rt._jobs_cv.notify_all()
    th.join(5)


def test_an_idle_worker_prepares_the_earliest_arrival_first_and_skips_what_was_delivered():
    log = []
    rt = Runtime("host0", "inproc://unused", [Prepares(n, log) for n in ("a", "b", "c", "d")])
    rt._preview(preview_env(["a", "b", "c", "d"], [3.0, 1.0, 2.0, 0.5], 7), [b"payload"])
    # d's task arrived before the worker got to it: its delivery's own work computes it
    rt._deliver(Sock(), {"src": "server", "dst": "d", "kind": "task", "round": 0, "t": 0.6, "hold": 1, "body": {},
                         "device": None, "shared": 0, "preview": 7}, [b"payload"])
    th = start_worker(rt)
    wait_for(lambda: rt.speculated == 3)
    stop(rt, th)
    assert log == [("react", "d", 7), ("speculate", "b", 7, True), ("speculate", "c", 7, True), ("speculate", "a", 7, True)]
    assert not rt._previews and not rt._previewed


def test_a_worker_told_not_now_waits_for_the_next_job_and_real_work_always_comes_first():
    log = []
    rt = Runtime("host0", "inproc://unused", [Prepares("a", log, answers=[False]), Prepares("b", log)])
    rt._preview(preview_env(["a", "b"], [1.0, 2.0], 3), [b"payload"])
    th = start_worker(rt)
    wait_for(lambda: len(log) == 1)
    time.sleep(0.1)
    assert log == [("speculate", "a", 3, False)]  # no room: b waits too (its result would need room as well)
    ran = threading.Event()

    def work():
        log.append(("work",))
        ran.set()
        return Reaction()

    rt._start_work(Sock(), "b", 1, Reaction(work=work, work_s=1.0), 0.0)
    wait_for(lambda: rt.speculated == 2)
    stop(rt, th)
    assert log == [("speculate", "a", 3, False), ("work",), ("speculate", "a", 3, True), ("speculate", "b", 3, True)]


def test_a_host_training_in_groups_takes_no_previews():
    log = []
    rt = Runtime("host0", "inproc://unused", [Prepares("a", log)], run_group=lambda works: [w() for w in works], group_size=4)
    rt._preview(preview_env(["a"], [1.0], 3), [b"payload"])
    assert not rt._previews


# ---- the client: a task trained ahead gives the same update, bit for bit --------------------------
DATA = synthetic(400, 50, (1, 6, 6), 4, seed=3)


def make_clients(count=3, strategy=None):
    train, test = DATA
    trainer = Trainer(TaskSpec("mlp", train, test, seed=0))
    cfg = ClientConfig(make_codec({"name": "int", "bits": 8}), seed=11, schedule=BitSchedule("dynamic", 10, 4, 16),
                       privacy=Privacy("laplace", epsilon=20.0, clip=2.0, factor=1.0), max_samples=40,
                       **({"strategy": strategy} if strategy else {}))
    shards = [np.arange(100 * c, 100 * c + 50 + 10 * c) for c in range(count)]
    return [ClientActor(ClientProfile(f"c{c}", c, shards[c], 1.0), trainer, cfg) for c in range(count)], trainer


def task(client, state, preview, round_=2):
    encoded = encode_state(state, make_codec("fp32"), np.random.default_rng(0))
    body = {"epochs": 2, "batch_size": 8, "lr": 0.1, "n_max": 70}
    return Message("server", client.name, "task", round_, 10.0, body, [bytes(f) for f in encoded.frames],
                   {"battery": 1.0}, preview)


def update_of(client, msg):
    """What the client sends for a delivered task: the update's body and its frames as bytes."""
    deliver = client.react(msg).work()
    (sent,) = deliver().sends
    return sent.body, [bytes(memoryview(f)) for f in sent.frames]


def test_an_update_trained_ahead_is_bit_for_bit_the_one_trained_on_delivery():
    ahead, trainer = make_clients()
    plain, _ = make_clients()
    state = state_to_numpy(trainer.model)
    # ahead: every client's task trained before delivery, in another order than they arrive
    for c in reversed(ahead):
        assert c.speculate(task(c, state, preview=9)) is True
    assert len(trainer.speculated) == 3
    got = [update_of(c, task(c, state, preview=9)) for c in ahead]
    assert trainer.speculated.stats() == {"used": 3, "dropped": 0} and len(trainer.speculated) == 0
    want = [update_of(c, task(c, state, preview=0)) for c in plain]
    assert got == want
    assert len({tuple(frames) for _, frames in got}) == 3  # three clients, three different updates


def test_a_result_is_used_only_by_the_delivery_of_its_own_preview():
    (client,), trainer = make_clients(1)
    (plain,), _ = make_clients(1)
    state = state_to_numpy(trainer.model)
    client.speculate(task(client, state, preview=4))
    other = {k: v + np.float32(0.01) for k, v in state.items()}
    # another message (a different preview id) from another start: trained anew, not served the prepared result
    assert update_of(client, task(client, other, preview=5)) == update_of(plain, task(plain, other, preview=0))
    assert trainer.speculated.stats()["used"] == 0 and len(trainer.speculated) == 1


def test_nothing_is_trained_ahead_for_a_closed_round_or_an_impure_strategy():
    (client,), trainer = make_clients(1)
    state = state_to_numpy(trainer.model)
    client.react(Message("server", "c0", "closed", 2, 5.0, {}, (), {}))
    assert client.speculate(task(client, state, preview=1)) is True and len(trainer.speculated) == 0

    class Remembers(FedAvg):
        local_update_is_pure = False

    (client,), trainer = make_clients(1, strategy=Remembers())
    assert client.speculate(task(client, state, preview=1)) is True and len(trainer.speculated) == 0


def test_the_store_drops_older_rounds_for_room_and_says_no_when_full_of_the_newest():
    store = SpeculativeResults(capacity=2)
    store.put("a", 1, "A")
    store.put("b", 1, "B")
    assert not store.has_room(1)
    assert store.has_room(2) and len(store) == 0 and store.stats() == {"used": 0, "dropped": 2}
    store.put("c", 2, "C")
    store.put("d", 3, "D")
    assert store.take("c") == "C" and store.take("c") is None
    assert store.stats() == {"used": 1, "dropped": 2}
    with pytest.raises(ValueError, match="at least one"):
        SpeculativeResults(0)


# ---- whole runs --------------------------------------------------------------------------------
RUN = """
name: spec
seed: 4
rounds: 4
task: {{dataset: synthetic, model: mlp, synthetic: {{samples: 1200, test_samples: 100}}}}
population:
  clients: 12
  hosts: 2
  devices:
    - {{name: fast, share: 0.5, ms_per_sample: 2}}
    - {{name: slow, share: 0.5, ms_per_sample: 9}}
  links:
    - {{name: a, share: 0.5, up_mbps: 3, down_mbps: 9, latency_ms: 30}}
    - {{name: b, share: 0.5, up_mbps: 7, down_mbps: 2, latency_ms: 80}}
server: {{link: {{up_mbps: 10, down_mbps: 10, latency_ms: 2}}}}
selection: {{clients_per_round: 6, over_selection: 1.4}}
round: {{policy: first_k, timeout_s: 30, notify_closed: true}}
algorithm:
  local_epochs: 2
  batch_size: 8
  codec: {{down: {{name: int}}, up: {{name: int}}}}
  quantization: {{schedule: dynamic, b_min: 8, b_max: 16}}
  privacy: {{mechanism: laplace, epsilon: 50, clip: 10}}
eval: {{every: 2}}
run: {{speculate: {speculate}}}
"""


def test_a_run_is_the_same_with_and_without_speculation(tmp_path):
    outs = {}
    for speculate in ("true", "false"):
        out = tmp_path / speculate
        res = run_cli("run", str(write_scenario(tmp_path / f"{speculate}.yaml", RUN.format(speculate=speculate))),
                      "--out", str(out), "--plain")
        assert res.returncode == 0, res.stderr[-3000:]
        outs[speculate] = out
    for name in ("transfers.csv", "clients.csv"):
        assert read_csv(outs["true"] / name) == read_csv(outs["false"] / name), name
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert strip(read_csv(outs["true"] / "rounds.csv")) == strip(read_csv(outs["false"] / "rounds.csv"))
    with_it = json.loads((outs["true"] / "summary.json").read_text())
    without = json.loads((outs["false"] / "summary.json").read_text())
    assert with_it["speculation"]["trained_ahead"] > 0 and with_it["speculation"]["used"] > 0, with_it["speculation"]
    assert "speculation" not in without


class Estimates(Prepares):
    """Prepares, with its own estimate of when its work would be ready."""

    def __init__(self, name, log, ready):
        super().__init__(name, log)
        self.ready = ready

    def speculation_ready(self, msg, eta):
        return eta + self.ready


def test_a_worker_prepares_the_earliest_ready_first_and_only_the_share_it_was_given():
    """Ordered by eta plus each actor's own estimate (a: 1 + 5, b: 2 + 0, c: 3 + 1, d: 0.5 + 9);
    with share 0.5 the two whose work would be ready last (a, d) are not trained ahead."""
    log = []
    actors = [Estimates(n, log, r) for n, r in (("a", 5.0), ("b", 0.0), ("c", 1.0), ("d", 9.0))]
    rt = Runtime("host0", "inproc://unused", actors, speculate_share=0.5)
    rt._preview(preview_env(["a", "b", "c", "d"], [1.0, 2.0, 3.0, 0.5], 9), [b"payload"])
    assert rt._previewed == {("b", 9), ("c", 9)}
    th = start_worker(rt)
    wait_for(lambda: rt.speculated == 2)
    stop(rt, th)
    assert log == [("speculate", "b", 9, True), ("speculate", "c", 9, True)]
    rt = Runtime("host0", "inproc://unused", [Estimates(n, [], 0.0) for n in "abc"], speculate_share=0.5)
    rt._preview(preview_env(["a", "b", "c"], [3.0, 1.0, 2.0], 1), [b"payload"])
    assert rt._previewed == {("b", 1), ("c", 1)}  # a share rounds up: 2 of 3


def test_the_share_trained_ahead_follows_the_over_selection_of_first_k_rounds():
    from emulator.scenario import load_scenario
    from emulator.world import _speculate_share

    flagship, _ = load_scenario("scenarios/edge_1000.yaml")
    assert _speculate_share(flagship) == pytest.approx(1 / 1.3)
    deadline_only, _ = load_scenario("scenarios/edge_1000.yaml", ["round.policy=all"])
    assert _speculate_share(deadline_only) == 1.0
    no_over, _ = load_scenario("scenarios/edge_1000.yaml", ["selection.over_selection=1.0"])
    assert _speculate_share(no_over) == 1.0
