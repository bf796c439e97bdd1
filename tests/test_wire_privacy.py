"""Only what a real deployment sends crosses the emulated wire (issue 43, item 1).

A DP client's update goes through the real host runtime's encoder and the real network process:
the bytes the server is handed carry the model's frames, the sample count and the bit-length, and
no byte of the session's diagnostics (loss, lambda, noise scale, epsilon, norms). Those reach the
run's records beside the message (the transfer's record), and count in none of its bytes."""
import io
import itertools
import queue
from collections import defaultdict
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest
import zmq

from emulator.netconfig import CONDUCTOR, Link, NetworkConfig
from emulator.network import Network
from node.actor import Message
from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
from node.data import synthetic
from node.models import state_to_numpy
from node.runtime import Runtime
from node.stages import Privacy
from node.strategies.base import SessionPlan
from node.strategies.fedalign import FedAlign
from protocol import envelope
from protocol.codecs import encode_state, make_codec

PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0"]}
BODY = {"samples", "bits"}  # all an update's body may hold (and the frames: the model)


class Wire:
    """A socket that keeps what is sent through it, frame by frame, as bytes."""

    def __init__(self):
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames, copy=True):
        self.sent.append([bytes(memoryview(f.buffer if hasattr(f, "buffer") else f)) for f in frames])

    def send(self, frame, *args, **kwargs):
        self.sent.append([bytes(frame)])


def a_client(privacy: Privacy, schedule_dynamic: bool = False) -> ClientActor:
    train, test = synthetic(60, 10, (1, 4, 4), 3, seed=0)
    cfg = ClientConfig(make_codec("fp32"), seed=0, privacy=privacy)
    return ClientActor(ClientProfile("c0", 0, np.arange(60), 10.0), Trainer(TaskSpec("mlp", train, test, seed=0)), cfg)


def the_update(client: ClientActor, plan: SessionPlan | None = None):
    encoded = encode_state(state_to_numpy(client.trainer.model), make_codec("fp32"), np.random.default_rng(0))
    task = Message("server", "c0", "task", 0, 0.0, {"epochs": 1, "batch_size": 8, "lr": 0.1, "bits": None, "n_max": 60},
                   encoded.frames, {})
    reaction = client.train_task(task, task, plan) if plan else client.react(task)
    return reaction.work()()


def over_the_wire(reaction) -> tuple[list[bytes], dict, list[dict]]:
    """The update as the host's runtime sends it and the network hands it to the server: (the
    deliver message's frames, its envelope, the network's records for the conductor)."""
    host_side = Wire()
    Runtime._emit(SimpleNamespace(counters=defaultdict(itertools.count), _reports=queue.SimpleQueue()),
                  host_side, "c0", reaction, 1.0)
    [sent] = host_side.sent
    net = Network(NetworkConfig("inproc://unused", PEERS, {a: Link() for a in ("server", "c0")}))
    net.guard.log = io.StringIO()
    for peer, actors in PEERS.items():
        net.receive(peer.encode(), [zmq.Frame(envelope.pack("hello", peer=peer, actors=actors))])
    net.queue.clear()
    net.receive(b"host0", [zmq.Frame(f) for f in sent])
    server_side = Wire()
    delivered = []
    while net.step(server_side) and not delivered:
        delivered = [frames for frames in server_side.sent if frames[0] == b"server"]
    [frames] = delivered
    records = [msgpack.unpackb(f[-1]) for f in server_side.sent if f[0] == CONDUCTOR.encode()]
    records += [msgpack.unpackb(f) for f in net._outbox]
    return frames[1:], envelope.unpack(frames[1]), records


def floats_in(values: dict) -> list[bytes]:
    """Each diagnostic float as msgpack writes it: what to look for in the bytes."""
    return [msgpack.packb(float(v)) for v in values.values() if isinstance(v, float) and v not in (0.0, 1.0)]


LAPLACE = Privacy("laplace", epsilon=50.0, clip=1.0)
GAUSSIAN = Privacy("gaussian", epsilon=50.0, delta=1e-5, clip=1.0)
DPSGD = Privacy("dpsgd", clip=1.0, noise_multiplier=1.0)


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSSIAN, DPSGD], ids=["laplace", "gaussian", "dpsgd"])
def test_a_dp_clients_update_carries_the_model_its_samples_and_its_bits_and_nothing_else(privacy):
    client = a_client(privacy)
    reaction = the_update(client)
    [send] = reaction.sends
    notes = send.notes
    assert {"loss", "loss_rms", "nu"} <= set(notes)  # the diagnostics exist, beside the message
    assert {"sensitivity", "noise_scale"} <= set(notes) if privacy.mechanism != "dpsgd" else {"dp_epsilon"} <= set(notes)
    frames, env, records = over_the_wire(reaction)
    assert env["op"] == "deliver" and env["kind"] == "update"
    assert set(env["body"]) == BODY, env["body"]
    raw = b"".join(frames)
    secrets = floats_in(notes)
    assert len(secrets) >= 3
    assert not [s for s in secrets if s in raw], "a diagnostic crossed the wire"
    # the transfer's record keeps them for the run's files, and its bytes are the delivered message's
    [update] = [r for rec in records for r in rec.get("body", {}).get("transfers", []) if r["kind"] == "update"]
    assert update["notes"] == pytest.approx(notes)
    payload = sum(len(f) for f in frames[1:])
    unicast = envelope.pack("send", src="c0", dst="server", kind="update", round=0, t=1.0, n=0, body=env["body"],
                            payload=send.payload_bytes, fp32=send.fp32_bytes)
    assert update["wire_bytes"] == len(unicast) + payload


def test_fedalign_uploads_its_noised_pseudo_gradient_without_its_norm():
    client = a_client(Privacy())
    strategy = FedAlign({"clip": 1.0, "epsilon": 5.0})
    client.cfg.strategy = strategy
    plan = SessionPlan(indices=np.arange(40), weight=60, upload=strategy._private_upload)
    reaction = the_update(client, plan)
    [send] = reaction.sends
    assert {"update_norm", "noise_scale", "loss"} <= set(send.notes)
    frames, env, _ = over_the_wire(reaction)
    assert set(env["body"]) == BODY and env["body"]["samples"] == 60
    raw = b"".join(frames)
    assert not [s for s in floats_in(send.notes) if s in raw]


def test_oorts_utility_is_the_one_statistic_a_selection_policy_can_ask_for():
    client = a_client(Privacy())
    client.cfg.update_statistics = ("loss_rms",)
    [send] = the_update(client).sends
    assert set(send.body) == BODY | {"loss_rms"} and send.body["loss_rms"] == send.notes["loss_rms"] > 0
