"""The serverless FIRMA ring on real processes: who talks to whom, how often, with what, and
how long it takes, checked against the ring order and hand-done link arithmetic; plus the ring
client's blend checked in-process, and a host killed mid-run."""
import json
import signal
from collections import Counter

import msgpack
import numpy as np
import pytest

from conftest import (children_by_name, link_bytes, read_csv, run_cli, start_run, wait_for_rounds,
                      write_scenario)
from node import firma
from node.actor import Message
from node.client import ClientProfile, TaskSpec
from node.data import synthetic
from node.models import state_to_numpy
from node.actor import Reaction
from node.models import state_spec
from node.ring import Evaluator, RingClientActor, RingConfig, WarmupAggregator
from protocol.codecs import decode_state, encode_state, make_codec

EXTRACTOR = 784 * 256 + 256 + 2 * 256 + 256 * 256 + 256 + 2 * 256 + 256 * 128 + 128  # 300,672 parameters
HEAD = 128 * 10 + 10
UP_BPS = 8e6
LATENCY_S = 0.010
MS_PER_SAMPLE = 2.0
SAMPLES = 100  # per client: 600 synthetic samples, iid over 6
# A head-only epoch costs the frozen extractor's forward pass and the head's backward pass, against
# the whole network forward and backward: FLOPs 2 M + 4 (128 x 10) over 6 M, M the multiply-accumulates.
MACS = 784 * 256 + 256 * 256 + 256 * 128 + 128 * 10
HEAD_EPOCH = (2 * MACS + 4 * 128 * 10) / (6 * MACS)

RING = f"""
name: ring
seed: 5
rounds: {{rounds}}
topology: ring
task:
  dataset: synthetic
  model: firma_mlp
  synthetic: {{{{samples: 600, test_samples: 120, shape: [1, 28, 28], classes: 10}}}}
population:
  clients: 6
  hosts: 2
  devices: [{{{{ms_per_sample: {MS_PER_SAMPLE}}}}}]
  links: [{{{{up_mbps: 8, down_mbps: 8, latency_ms: 10}}}}]
algorithm:
  name: fibfl
  lr: 0.01
  batch_size: 20
  firma: {{{{variant: {{variant}}, epochs_head: 1, epochs_extractor: 1, warmup_aggregator: {{warmup}}}}}}
eval: {{{{every: 1}}}}
network: {{{{transport: {{transport}}}}}}
"""


def run_ring(tmp, variant: str = "fibfl++", rounds: int = 3, timeout_s: float | None = None, cut: str | None = None,
             transport: str = "fluid", warmup: str = "peer", server_link: str | None = None):
    """Run the 6-client ring; optionally with a pass timeout and with `cut`'s link down from 0.1 s.
    FibFL++'s warm-up goes through the elected peer unless `warmup` is server (then over `server_link`).
    The link arithmetic done by hand in these tests is the fluid model's unless a test says otherwise."""
    text = RING.format(rounds=rounds, variant=variant, transport=transport, warmup=warmup)
    if timeout_s is not None:
        text = text.replace("epochs_extractor: 1,", f"epochs_extractor: 1, pass_timeout_s: {timeout_s},")
    if server_link is not None:
        text += f"server: {{link: {server_link}}}\n"
    if cut is not None:
        text += f"faults: [{{kind: link_down, actor: {cut}, at_s: 0.1}}]\n"
    out = tmp / "run"
    res = run_cli("run", str(write_scenario(tmp / "ring.yaml", text)), "--out", str(out), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory):
    return run_ring(tmp_path_factory.mktemp("ring"))


def test_ring_summary_and_rounds(ring_run):
    summary = json.loads((ring_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    ring = summary["ring"]
    assert ring["variant"] == "fibfl++" and ring["passes"] == 3 and ring["warmup_rounds"] == 1
    assert sorted(ring["order"]) == [f"c{i:04d}" for i in range(6)]
    assert ring["warmup_aggregator"] == ring["order"][0]
    rows = read_csv(ring_run / "rounds.csv")
    assert [int(r["round"]) for r in rows] == [0, 1, 2]
    assert all(int(r["completed"]) == 6 and r["accuracy"] != "" for r in rows)
    assert all(int(r["payload_bytes_up"]) == 0 == int(r["payload_bytes_down"]) for r in rows)  # nobody is a server
    # gamma: warm-up has none; R = 3, W = 1, R_eff = 1: 0.4 then 0.05
    assert rows[0]["gamma"] == "" and float(rows[1]["gamma"]) == pytest.approx(0.4) and float(rows[2]["gamma"]) == pytest.approx(0.05)


def test_gossip_goes_only_to_ring_neighbours_2KN_times_per_round(ring_run):
    order = json.loads((ring_run / "summary.json").read_text())["ring"]["order"]
    n, k = 6, 3
    edges = {(order[p], order[(p + d) % n]) for p in range(n) for d in (-1, 1)}
    transfers = read_csv(ring_run / "transfers.csv")
    for rnd in (1, 2):
        mine = [t for t in transfers if int(t["round"]) == rnd]
        assert len(mine) == 2 * k * n == 36
        assert {t["kind"] for t in mine} == {"gossip"} and all(t["outcome"] == "ok" for t in mine)
        pairs = Counter((t["src"], t["dst"]) for t in mine)
        assert set(pairs) == edges and set(pairs.values()) == {k}  # every directed ring edge once per pass
    rows = read_csv(ring_run / "rounds.csv")
    assert int(rows[1]["payload_bytes_peer"]) == 36 * 4 * EXTRACTOR


def test_the_head_never_travels_after_warmup(ring_run):
    transfers = read_csv(ring_run / "transfers.csv")
    gossip = [t for t in transfers if t["kind"] == "gossip"]
    assert gossip and all(int(t["payload_bytes"]) == 4 * EXTRACTOR for t in gossip)  # extractor only, fp32
    warm = [t for t in transfers if int(t["round"]) == 0]
    assert all(int(t["payload_bytes"]) == 4 * (EXTRACTOR + HEAD) for t in warm)  # warm-up: the full model


@pytest.fixture(scope="module")
def ring_run_tcp(tmp_path_factory):
    return run_ring(tmp_path_factory.mktemp("ring-tcp"), transport="tcp")


def test_under_tcp_the_warmup_windows_never_bind_and_one_connection_is_one_stream(ring_run_tcp):
    """The tcp twin of the warm-up arithmetic. RTT = 2 x (10 + 10) ms + one segment at 8 Mbit/s =
    41.5 ms. Every warm-up flow shares a link five ways (1.6 Mbit/s), where a first round of 10
    segments lasts 75.7 ms, longer than the RTT: the window covers the path from the start and slow
    start costs nothing. What differs from the fluid model: the aggregator's pass-1 gossip to its two
    neighbours goes on the connections that still carry their warm-up models, so it waits behind
    them (one byte stream per connection) and takes no share: all five models get 1.6 Mbit/s to the end."""
    seg_bits = 1514 * 8
    rtt = 4 * LATENCY_S + seg_bits / UP_BPS
    assert 10 * seg_bits / (UP_BPS / 5) > rtt
    order = json.loads((ring_run_tcp / "summary.json").read_text())["ring"]["order"]
    agg = order[0]
    transfers = read_csv(ring_run_tcp / "transfers.csv")
    warm = [t for t in transfers if int(t["round"]) == 0]
    ups = [t for t in warm if t["kind"] == "warmup_update"]
    downs = {t["dst"]: t for t in warm if t["kind"] == "warmup_model"}
    train_s = MS_PER_SAMPLE * SAMPLES / 1000
    for t in ups:
        expected = train_s + 8 * link_bytes(int(t["wire_bytes"])) / (UP_BPS / 5) + 2 * LATENCY_S
        assert float(t["t_end"]) == pytest.approx(expected, rel=1e-9)
    t0 = max(float(t["t_end"]) for t in ups)
    for t in downs.values():
        assert float(t["t_start"]) == pytest.approx(t0, rel=1e-12)
        expected = t0 + 8 * int(t["link_bytes"]) / (UP_BPS / 5) + 2 * LATENCY_S
        assert float(t["t_end"]) == pytest.approx(expected, rel=1e-9)
    gossip = [t for t in transfers if t["kind"] == "gossip" and t["src"] == agg and int(t["round"]) == 1]
    first = {}
    for t in sorted(gossip, key=lambda t: float(t["t_start"])):
        first.setdefault(t["dst"], t)
    assert len(first) == 2
    for dst, t in first.items():
        assert float(t["t_start"]) == pytest.approx(t0 + (1 + HEAD_EPOCH) * train_s)  # sent when its round-1 training ended
        # it leaves only after the warm-up model ahead of it on the same connection has left
        assert float(t["t_end"]) > float(downs[dst]["t_end"]) + 8 * link_bytes(int(t["wire_bytes"])) / UP_BPS


def test_warmup_fedavg_through_the_elected_peer_matches_link_arithmetic(ring_run):
    order = json.loads((ring_run / "summary.json").read_text())["ring"]["order"]
    agg = order[0]
    warm = [t for t in read_csv(ring_run / "transfers.csv") if int(t["round"]) == 0]
    ups = [t for t in warm if t["kind"] == "warmup_update"]
    downs = [t for t in warm if t["kind"] == "warmup_model"]
    assert len(ups) == 5 and all(t["dst"] == agg for t in ups)
    assert len(downs) == 5 and all(t["src"] == agg for t in downs) and {t["dst"] for t in downs} == set(order[1:])
    # Everyone trains one epoch (0.2 s), then five equal uploads share the aggregator's 8 Mbit/s
    # downlink (1.6 Mbit/s each) and arrive after both access latencies.
    train_s = MS_PER_SAMPLE * SAMPLES / 1000
    for t in ups:
        assert float(t["t_start"]) == pytest.approx(train_s, rel=1e-12)
        expected = train_s + 8 * link_bytes(int(t["wire_bytes"])) / (UP_BPS / 5) + 2 * LATENCY_S
        assert int(t["link_bytes"]) == link_bytes(int(t["wire_bytes"]))
        assert float(t["t_end"]) == pytest.approx(expected, rel=1e-9)
    # The average goes out the moment the last upload is in: five flows share the aggregator's uplink
    # at 1.6 Mbit/s. The aggregator starts round 1 at once; 0.4 s later (two epochs) its two pass-1
    # gossip flows join them on its uplink, and all seven get 8/7 Mbit/s from then on.
    t0 = max(float(t["t_end"]) for t in ups)
    main_train_s = (1 + HEAD_EPOCH) * train_s
    for t in downs:
        assert float(t["t_start"]) == pytest.approx(t0, rel=1e-12)
        left_bits = 8 * int(t["link_bytes"]) - main_train_s * UP_BPS / 5
        expected = t0 + main_train_s + left_bits / (UP_BPS / 7) + 2 * LATENCY_S
        assert float(t["t_end"]) == pytest.approx(expected, rel=1e-9)
    first_gossip = [t for t in read_csv(ring_run / "transfers.csv") if t["kind"] == "gossip" and t["src"] == agg
                    and int(t["round"]) == 1]
    assert len(first_gossip) == 2 * 3 and min(float(t["t_start"]) for t in first_gossip) == pytest.approx(t0 + main_train_s)
    rows = read_csv(ring_run / "rounds.csv")
    assert float(rows[0]["t_end"]) == pytest.approx(max(float(t["t_end"]) for t in downs), rel=1e-12)


SERVER_MBPS, SERVER_LATENCY_S = 24.0, 0.005


@pytest.fixture(scope="module")
def ring_run_server(tmp_path_factory):
    return run_ring(tmp_path_factory.mktemp("ring_server"), warmup="server",
                    server_link=f"{{up_mbps: {SERVER_MBPS:g}, down_mbps: {SERVER_MBPS:g}, latency_ms: 5}}")


def test_warmup_fedavg_through_its_own_aggregator_matches_link_arithmetic(ring_run_server):
    summary = json.loads((ring_run_server / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["ring"]["warmup_aggregator"] == "server"
    order = summary["ring"]["order"]
    transfers = read_csv(ring_run_server / "transfers.csv")
    warm = [t for t in transfers if int(t["round"]) == 0]
    ups = [t for t in warm if t["kind"] == "warmup_update"]
    downs = [t for t in warm if t["kind"] == "warmup_model"]
    # every client, the first on the ring too, sends its model to the aggregator and takes the average back
    assert sorted(t["src"] for t in ups) == sorted(order) and {t["dst"] for t in ups} == {"server"}
    assert sorted(t["dst"] for t in downs) == sorted(order) and {t["src"] for t in downs} == {"server"}
    assert {t["kind"] for t in transfers if "server" in (t["src"], t["dst"])} == {"warmup_update", "warmup_model"}
    # One epoch (0.2 s), then six uploads share the server's 24 Mbit/s downlink (4 Mbit/s each, under
    # each client's own 8) and arrive after the client's and the server's latency.
    train_s = MS_PER_SAMPLE * SAMPLES / 1000
    share = SERVER_MBPS * 1e6 / 6
    for t in ups:
        assert float(t["t_start"]) == pytest.approx(train_s, rel=1e-12)
        assert int(t["link_bytes"]) == link_bytes(int(t["wire_bytes"]))
        expected = train_s + 8 * int(t["link_bytes"]) / share + LATENCY_S + SERVER_LATENCY_S
        assert float(t["t_end"]) == pytest.approx(expected, rel=1e-9)
    # The average leaves when the last model is in; six downloads share the server's 24 Mbit/s uplink.
    t0 = max(float(t["t_end"]) for t in ups)
    for t in downs:
        assert float(t["t_start"]) == pytest.approx(t0, rel=1e-12)
        expected = t0 + 8 * int(t["link_bytes"]) / share + SERVER_LATENCY_S + LATENCY_S
        assert float(t["t_end"]) == pytest.approx(expected, rel=1e-9)
    # Everyone starts round 1 as the average arrives: the first gossip leaves one main-round training later.
    t1 = max(float(t["t_end"]) for t in downs)
    first_gossip = min(float(t["t_start"]) for t in transfers if t["kind"] == "gossip")
    assert first_gossip == pytest.approx(t1 + (1 + HEAD_EPOCH) * train_s, rel=1e-9)
    rows = read_csv(ring_run_server / "rounds.csv")
    assert float(rows[0]["t_end"]) == pytest.approx(t1, rel=1e-12)
    assert [int(r["completed"]) for r in rows] == [6, 6, 6] and rows[-1]["accuracy"] != ""


def test_the_warmup_aggregator_averages_by_samples_what_came_in_time(tmp_path):
    """In-process: the aggregator waits for every live client, takes a lost one out, averages by
    samples, sends to the live ones after the aggregation time, and ignores a late model."""
    train, test = synthetic(80, 20, (1, 28, 28), 10, seed=0)
    task = TaskSpec("firma_mlp", train, test, 0)
    cfg = RingConfig("fibfl++", 6, ["c0", "c1", "c2"], 0, 1, 1, batch_size=20, pass_timeout_s=5.0, warmup_via="server")
    agg = WarmupAggregator(cfg, task, aggregate_s=0.25)
    assert cfg.aggregator == agg.name == "server"
    codec = make_codec("fp32")
    spec_model = task.build()
    states = {n: {k: np.full_like(v, i + 1.0) for k, v in state_to_numpy(spec_model).items()}
              for i, n in enumerate(cfg.order)}

    def update(src, t, samples, rnd=0):
        enc = encode_state(states[src], codec, np.random.default_rng(0))
        return agg.react(Message(src, "server", "warmup_update", rnd, t, {"samples": samples}, enc.frames))

    first = update("c0", 1.0, 10.0)
    assert first.sends == [] and first.timers == [(6.0, "warmup:0")]  # the pass timeout, from the first model
    assert update("c1", 2.0, 30.0).timers == []  # c2 is still to come
    lost = agg.react(Message("network", "server", "peer_down", 0, 3.0, {"actors": ["c2"]}))
    assert lost.timers == [(3.25, "send:0")] and lost.sends == []  # formed now, leaves after aggregate_s
    sent = agg.react(Message("network", "server", "tick", 0, 3.25, {"tag": "send:0"}))
    (send,) = sent.sends
    assert send.kind == "warmup_model" and send.dst == ["c0", "c1"]
    average, _ = decode_state(send.frames, state_spec(spec_model))
    assert all(np.allclose(v, (1.0 * 10 + 2.0 * 30) / 40) for v in average.values())
    assert update("c2", 4.0, 50.0) == Reaction()  # round 0 is done: too late
    assert agg.react(Message("network", "server", "tick", 0, 6.0, {"tag": "warmup:0"})) == Reaction()


def test_a_ring_client_sends_its_warmup_model_to_the_aggregator_and_goes_on_without_it_if_lost():
    train, test = synthetic(80, 20, (1, 28, 28), 10, seed=0)
    task = TaskSpec("firma_mlp", train, test, 0)
    cfg = RingConfig("fibfl++", 6, ["c0", "c1", "c2"], 0, 1, 1, batch_size=20, warmup_via="server")
    actor = RingClientActor(ClientProfile("c0", 0, np.arange(20), 1.0, np.arange(10)), task, cfg, Evaluator(task))
    started = actor.react(Message("network", "c0", "start", 0, 0.0, {}))
    sent = started.work()()
    assert [(s.dst, s.kind) for s in sent.sends] == [("server", "warmup_update")] and actor.phase == "warmup_wait"
    gone = actor.react(Message("network", "c0", "peer_down", 0, 1.0, {"actors": ["server"]}))
    report = gone.reports[0]() if callable(gone.reports[0]) else gone.reports[0]
    assert report["round"] == 0 and report["warmup"] and report["t_end"] == 1.0  # round 0 ends with the own model
    assert actor.round == 1 and gone.work is not None  # and round 1's training begins


def test_same_seed_same_ring_run(ring_run, tmp_path):
    out = run_ring(tmp_path)
    assert read_csv(out / "transfers.csv") == read_csv(ring_run / "transfers.csv")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert strip(read_csv(out / "rounds.csv")) == strip(read_csv(ring_run / "rounds.csv"))  # accuracies included
    assert read_csv(out / "clients.csv") == read_csv(ring_run / "clients.csv")


# ---- the ring client's reactions, in-process ---------------------------------------------------------
def _actor(variant: str, name: str = "c1", order=("c0", "c1", "c2", "c3")):
    train, test = synthetic(80, 20, (1, 28, 28), 10, seed=0)
    task = TaskSpec("firma_mlp", train, test, 0)
    cfg = RingConfig(variant, 4, list(order), 0, 1, 1, batch_size=20)
    profile = ClientProfile(name, order.index(name), np.arange(20), 1.0, np.arange(10))
    return RingClientActor(profile, task, cfg, Evaluator(task)), cfg


def _gossip(src: str, dst: str, state: dict, acc: float, rnd: int = 0, k: int = 1) -> Message:
    enc = encode_state(state, make_codec("fp32"), np.random.default_rng(0))
    return Message(src, dst, "gossip", rnd, 1.0, {"pass": k, "acc": acc}, enc.frames)


def _train(actor):
    reaction = actor.react(Message("network", actor.name, "start", -1, 0.0, {}))
    return reaction.work()()


def test_gossip_payload_names_only_extractor_tensors():
    actor, _ = _actor("fibfl+")
    sent = _train(actor).sends
    assert len(sent) == 1 and sent[0].kind == "gossip" and sent[0].dst == ["c0", "c2"]
    header = msgpack.unpackb(bytes(memoryview(sent[0].frames[0])))
    names = [t["name"] for t in header["tensors"]]
    assert names and all(nm.startswith("extractor.") for nm in names)
    assert sent[0].payload_bytes == 4 * EXTRACTOR


@pytest.mark.parametrize("variant,acc_left,acc_right", [("fibfl", 0.1, 0.1), ("fibfl+", 0.9, 0.2), ("fibfl+", 0.8, 0.4)])
def test_a_pass_blends_the_neighbours_as_the_formula_says(variant, acc_left, acc_right):
    actor, cfg = _actor(variant)
    _train(actor)
    own = {k: v.detach().numpy().copy() for k, v in actor.model.state_dict().items()}
    rng = np.random.default_rng(3)
    left = {k: rng.normal(size=own[k].shape).astype(np.float32) for k in actor.shared_keys}
    right = {k: rng.normal(size=own[k].shape).astype(np.float32) for k in actor.shared_keys}
    assert actor.react(_gossip("c0", "c1", left, acc_left)).reports == []  # one neighbour: wait for the other
    reaction = actor.react(_gossip("c2", "c1", right, acc_right))
    weights = firma.neighbour_weights(acc_left, acc_right, gated=variant != "fibfl", tau=0.35)
    expected = firma.blend({k: own[k] for k in actor.shared_keys}, left, right, weights, 0.5)
    now = {k: v.detach().numpy() for k, v in actor.model.state_dict().items()}
    for k in actor.shared_keys:
        assert np.allclose(now[k], expected[k], atol=1e-6)
    for k in ("head.weight", "head.bias"):
        assert np.array_equal(now[k], own[k])  # the head is private: no neighbour touches it
    assert reaction.reports and reaction.work is not None  # round reported, next round's training started


def test_gossip_that_arrives_during_training_waits_in_the_inbox():
    actor, _ = _actor("fibfl+")
    state = {k: v.detach().numpy().copy() for k, v in actor.model.state_dict().items() if not k.startswith("head.")}
    assert actor.react(_gossip("c0", "c1", state, 0.9)).sends == []  # both neighbours were faster
    assert actor.react(_gossip("c2", "c1", state, 0.9)).sends == []
    assert actor.round == -1  # nothing blended before its own training
    trained = _train(actor)  # its pass-1 message goes out, and the waiting ones complete the pass at once
    assert [s.kind for s in trained.sends] == ["gossip"]
    assert len(trained.reports) == 1 and trained.work is not None and actor.round == 1
    assert actor.inbox == {}


# ---- a host dies mid-run ---------------------------------------------------------------------------
def test_sigkill_a_ring_host_the_survivors_finish(tmp_path):
    text = RING.format(rounds=40, variant="fibfl+", transport="tcp", warmup="peer")
    path = write_scenario(tmp_path / "ring.yaml", text)
    out = tmp_path / "run"
    proc = start_run(path, out)
    try:
        wait_for_rounds(out, 2, proc)
        children_by_name(proc.pid)["flemu-host1"].send_signal(signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 40
    assert any("host1" in i["what"] for i in summary["incidents"])
    rows = read_csv(out / "rounds.csv")
    assert int(rows[-1]["completed"]) == 3  # host1's three clients are gone; the other three kept gossiping
    dead = {r["client"] for r in read_csv(out / "population.csv") if r["host"] == "1"}
    last = [t for t in read_csv(out / "transfers.csv") if int(t["round"]) == 39]
    assert last and not ({t["src"] for t in last} | {t["dst"] for t in last}) & dead


def test_a_silent_neighbour_is_waited_for_only_pass_timeout_s(tmp_path):
    out = run_ring(tmp_path, "fibfl+", timeout_s=5.0, cut="c0003")
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    transfers = read_csv(out / "transfers.csv")
    assert all(t["outcome"] == "link_down" for t in transfers if "c0003" in (t["src"], t["dst"]))
    assert all(t["outcome"] == "ok" for t in transfers if "c0003" not in (t["src"], t["dst"]))
    rows = read_csv(out / "rounds.csv")
    assert len(rows) == 3
    # A message takes about 2.6 s here (two flows share each 8 Mbit/s uplink), well inside the 5 s.
    # Round 0 of the identity ring: c0002 and c0004 wait 5 s for c0003's message and blend with their
    # other neighbour; c0003 hears nobody. Nobody else waits.
    assert int(rows[0]["timeouts"]) == 3
    assert max(float(t["t_end"]) - float(t["t_start"]) for t in transfers if t["outcome"] == "ok") < 3.0
    neighbour = [t for t in transfers if t["src"] == "c0002" and t["dst"] == "c0001"]
    starts = sorted(float(t["t_start"]) for t in neighbour)
    train_s = (1 + HEAD_EPOCH) * MS_PER_SAMPLE * SAMPLES / 1000
    assert len(starts) == 3 and starts[0] == pytest.approx(train_s)
    assert starts[1] - starts[0] == pytest.approx(5.0 + train_s, rel=1e-9)  # the timeout, then the next round's training


def test_warmup_aggregator_averages_without_a_silent_peer_and_the_others_take_it(tmp_path):
    out = run_ring(tmp_path, "fibfl++", timeout_s=5.0, cut="c0005")
    assert json.loads((out / "summary.json").read_text())["ring"]["warmup_aggregator"] == "c0000"  # 2-opt keeps position 0
    warm = [t for t in read_csv(out / "transfers.csv") if int(t["round"]) == 0]
    models = [t for t in warm if t["kind"] == "warmup_model"]
    # c0000 trained for 0.2 s, waited 5 s for c0005, then sent the average of the other five to everyone
    assert {t["dst"]: t["outcome"] for t in models} == {**{f"c000{i}": "ok" for i in range(1, 5)}, "c0005": "link_down"}
    assert all(float(t["t_start"]) == pytest.approx(0.2 + 5.0) for t in models)
    # Only the aggregator and the cut-off client gave up waiting. The other four took the average,
    # although it arrived 6.4 s after it left (five flows share c0000's uplink), after 11.6 s in all.
    assert int(read_csv(out / "rounds.csv")[0]["timeouts"]) == 2
    assert all(float(t["t_end"]) > 0.2 + 2 * 5.0 for t in models if t["outcome"] == "ok")


def test_clients_start_from_their_own_models_unless_init_is_shared():
    a, _ = _actor("fibfl", "c1")
    b, _ = _actor("fibfl", "c2")
    wa, wb = state_to_numpy(a.model), state_to_numpy(b.model)
    assert not np.array_equal(wa["extractor.1.weight"], wb["extractor.1.weight"])  # FIRMA's default: independent
    again, _ = _actor("fibfl", "c1")
    assert np.array_equal(wa["extractor.1.weight"], state_to_numpy(again.model)["extractor.1.weight"])  # seeded
    train, test = synthetic(80, 20, (1, 28, 28), 10, seed=0)
    task = TaskSpec("firma_mlp", train, test, 0)
    cfg = RingConfig("fibfl", 4, ["c0", "c1", "c2", "c3"], 0, 1, 1, batch_size=20, init="shared")
    shared = [RingClientActor(ClientProfile(n, i, np.arange(20), 1.0, np.arange(10)), task, cfg, Evaluator(task))
              for i, n in ((1, "c1"), (2, "c2"))]
    assert np.array_equal(*(state_to_numpy(s.model)["extractor.1.weight"] for s in shared))
