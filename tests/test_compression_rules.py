"""Compression where it is valid (issue 13, items 2 and 3): sparsifiers only on updates, error
feedback wired into the client actor, and the bf16 and threshold codecs."""
import numpy as np
import pytest

from conftest import write_scenario
from emulator.scenario import ScenarioError, load_scenario
from node.actor import Message
from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
from node.data import synthetic
from node.models import state_to_numpy
from protocol.codecs import decode_state, encode_state, make_codec

STAR = """
rounds: 1
task: {dataset: synthetic, model: mlp}
population: {clients: 3, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}
"""
RING = """
rounds: 1
topology: ring
task: {dataset: synthetic, model: firma_mlp}
population: {clients: 3, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}
"""


def load(tmp_path, text, codec):
    return load_scenario(write_scenario(tmp_path / "s.yaml", text + f"algorithm: {{{codec}}}\n"))


@pytest.mark.parametrize("text, codec, message", [
    (STAR, "codec: {down: {name: topk, fraction: 0.01}}",
     "algorithm.codec.down: topk encodes updates (deltas), but the download carries the model's weights"),
    (STAR, "codec: {down: {name: randomk}}", "algorithm.codec.down: randomk encodes updates"),
    (RING, "name: fibfl, codec: {up: {name: topk}}", "algorithm.codec.up: topk encodes updates (deltas), but ring gossip"),
    (STAR, "codec: {down: {name: fp32, error_feedback: true}}", "algorithm.codec.down.error_feedback"),
    (RING, "name: fibfl, codec: {up: {name: fp16, error_feedback: true}}", "algorithm.codec.up.error_feedback"),
])
def test_sparsifiers_on_weights_and_misplaced_error_feedback_are_refused(tmp_path, text, codec, message):
    with pytest.raises(ScenarioError) as err:
        load(tmp_path, text, codec)
    assert message in str(err.value) and str(tmp_path / "s.yaml") in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_sparsifiers_on_star_uploads_are_accepted(tmp_path):
    sc, _ = load(tmp_path, STAR, "codec: {up: {name: topk, fraction: 0.01, error_feedback: true}, down: {name: bf16}}")
    assert sc.algorithm.codec.up.error_feedback and sc.algorithm.codec.up.build().describe() == "topk(fraction=0.01,value_bits=32)"
    sc, _ = load(tmp_path, STAR, "codec: {up: {name: threshold, magnitude: 0.001}}")
    assert sc.algorithm.codec.up.build().name == "threshold"


# ---- the client keeps the residual ------------------------------------------------------------
def make_client(error_feedback: bool):
    train, test = synthetic(60, 10, (1, 4, 4), 3, seed=0)
    task = TaskSpec("mlp", train, test, seed=0)
    cfg = ClientConfig(make_codec({"name": "topk", "fraction": 0.05}), seed=0, error_feedback=error_feedback)
    return ClientActor(ClientProfile("c0", 0, np.arange(60), 1.0), Trainer(task), cfg)


def run_task(client, state, rnd, t=0.0):
    encoded = encode_state(state, make_codec("fp32"), np.random.default_rng(0))
    body = {"epochs": 1, "batch_size": 20, "lr": 0.5, "bits": None, "n_max": 60}
    reaction = client.react(Message("server", "c0", "task", rnd, t, body, encoded.frames, {}))
    deliver = reaction.work()
    sends = deliver().sends
    return decode_state(sends[0].frames)


def test_error_feedback_adds_what_top_k_dropped_to_the_next_update():
    with_ef, without = make_client(True), make_client(False)
    state = state_to_numpy(with_ef.trainer.model)
    first, basis = run_task(with_ef, state, 0)
    assert basis == "delta"
    plain_first, _ = run_task(without, state, 0)
    for name in first:  # round 0: no residual yet, the same top-k of the same update
        assert np.array_equal(first[name], plain_first[name])
    residual = {k: v.copy() for k, v in with_ef.feedback.residual.items()}
    assert sum(float(np.abs(r).sum()) for r in residual.values()) > 0
    second, _ = run_task(with_ef, state, 1)
    plain_second, _ = run_task(without, state, 1)
    # the same local update (same seed, same start) plus the residual, top-k'd again
    name = max(residual, key=lambda k: residual[k].size)
    update = plain_second[name]  # nonzero where the plain top-k kept entries
    assert not np.array_equal(second[name], update)
    kept = second[name] != 0
    assert np.count_nonzero(kept) == np.count_nonzero(update)  # same k
    # every entry the EF client sent equals (its update + residual) there; what it kept out stays in the residual
    assert np.allclose(second[name] + with_ef.feedback.residual[name], local_update(state, 1)[name] + residual[name], atol=1e-5)


def local_update(state, rnd):
    """The raw local update of round `rnd` from `state`, without compression."""
    fresh = make_client(False)
    fresh.cfg = ClientConfig(make_codec("fp32"), seed=0)
    got, _ = run_task(fresh, state, rnd)
    return {k: got[k] - state[k] for k in got}


def test_residual_is_lost_when_the_device_goes_offline():
    client = make_client(True)
    state = state_to_numpy(client.trainer.model)
    run_task(client, state, 0)
    assert client.feedback.residual
    client.react(Message("net", "c0", "online", -1, 5.0, {}, (), {}))
    assert client.feedback.residual == {}


# ---- codecs -------------------------------------------------------------------------------------
def test_bf16_rounds_to_nearest_even_and_keeps_the_float32_range():
    codec = make_codec("bf16")
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 3e38, np.inf, np.nan, 1e-40], np.float32)
    enc = codec.encode(x, None)
    assert enc.payload_bytes == 2 * x.size
    out = codec.decode(enc.meta, memoryview(enc.data), x.shape)
    assert out[0] == 1.0 and out[1] == 1.0 and out[2] == 1 + 2**-6 and out[3] == -2.5  # ties go to the even mantissa
    assert np.isfinite(out[4]) and out[4] == pytest.approx(3e38, rel=2**-8)
    assert out[5] == np.inf and np.isnan(out[6])
    assert np.frombuffer(enc.data, "<u2")[0] == 0x3F80


def test_threshold_sends_what_exceeds_the_magnitude_in_top_k_layout():
    x = np.array([0.5, -0.01, 0.2, -0.3, 0.0, 0.05], np.float32)
    codec = make_codec({"name": "threshold", "magnitude": 0.1})
    enc = codec.encode(x, np.random.default_rng(0))
    assert enc.meta["k"] == 3
    assert enc.payload_bytes == (3 * 3 + 7) // 8 + 3 * 4  # three 3-bit indices, three fp32 values
    assert codec.decode(enc.meta, memoryview(enc.data), x.shape).tolist() == pytest.approx([0.5, 0, 0.2, -0.3, 0, 0])
    tiny = make_codec({"name": "threshold", "magnitude": 9.0}).encode(x, np.random.default_rng(0))
    assert tiny.meta["k"] == 1  # nothing above: the largest alone
    with pytest.raises(Exception, match="magnitude"):
        make_codec({"name": "threshold", "magnitude": -1})


# ---- mixed precision: a codec per layer -------------------------------------------------------
MIXED = """
rounds: 1
task: {dataset: synthetic, model: mlp, synthetic: {samples: 200, test_samples: 20}}
population: {clients: 2, hosts: 1, devices: [{ms_per_sample: 1}], links: [{up_mbps: 10, down_mbps: 10}]}
selection: {clients_per_round: 2}
algorithm:
  codec:
    down: {name: int, bits: 8, layers: {"net.1.weight": {name: int, bits: 16}}}
    up: {name: int, bits: 4, layers: {"net.3.*": {name: fp32}, "net.*": {name: fp16}}}
eval: {every: 0}
"""


def test_each_layer_travels_with_its_own_codec(tmp_path):
    from conftest import read_csv, run_cli

    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "m.yaml", MIXED)), "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    # the MLP: net.1 is 784 x 64 + 64, net.3 is 64 x 10 + 10
    down = 784 * 64 * 2 + 64 * 1 + 640 * 1 + 10 * 1  # the first weight at 16 bits, the rest at 8
    up = 784 * 64 * 2 + 64 * 2 + (640 + 10) * 4  # net.3 in fp32 (first match), the rest of net.* in fp16
    clients = read_csv(out / "clients.csv")
    assert [int(c["payload_bytes_down"]) for c in clients] == [down, down]
    assert [int(c["payload_bytes_up"]) for c in clients] == [up, up]


@pytest.mark.parametrize("codec, message", [
    ("codec: {down: {name: fp32, layers: {'net.1.*': {name: topk}}}}", "algorithm.codec.down: layers['net.1.*'] topk encodes updates"),
    ("codec: {up: {name: fp32, layers: {'net.1.*': {name: int, bits: 40}}}}", "layers['net.1.*']: codec 'int'"),
])
def test_bad_layer_codecs_are_one_clear_line(tmp_path, codec, message):
    with pytest.raises(ScenarioError) as err:
        load(tmp_path, STAR, codec)
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1


HIERARCHY = STAR.replace("rounds: 1", "rounds: 1\ntopology: hierarchical\nhierarchy: {edges: 2, codec: %s}")
SPARSIFIERS = ("{name: topk, fraction: 0.1}", "{name: randomk, fraction: 0.1}", "{name: threshold, magnitude: 0.001}")


@pytest.mark.parametrize("codec", SPARSIFIERS)
@pytest.mark.parametrize("path", ["algorithm.codec.down", "ring gossip", "hierarchy.codec"])
def test_every_path_that_carries_weights_refuses_every_sparsifier(tmp_path, codec, path):
    """Issue 43, item 4: a sparsifier keeps a few entries of what it is given; given weights (a download,
    ring gossip, the edges' and the cloud's models) it zeroes most of the model. Each path refuses
    each sparsifier in one line naming the key; the star's upload (an update) takes them all."""
    text, extra, key = {
        "algorithm.codec.down": (STAR, f"codec: {{down: {codec}}}", "algorithm.codec.down"),
        "ring gossip": (RING, f"name: fibfl, codec: {{up: {codec}}}", "algorithm.codec.up"),
        "hierarchy.codec": (HIERARCHY % codec, "name: fedavg", "hierarchy.codec"),
    }[path]
    with pytest.raises(ScenarioError) as err:
        load(tmp_path, text, extra)
    assert f"{key}: " in str(err.value) and "encodes updates (deltas)" in str(err.value)
    assert len(str(err.value).splitlines()) == 1
    load(tmp_path, STAR, f"codec: {{up: {codec}}}")  # an upload is an update: accepted


@pytest.mark.parametrize("codec, refused", [
    ("{name: randomk, fraction: 0.1}", True), ("{name: topk, fraction: 0.1}", False),
    ("{name: threshold, magnitude: 0.001}", False), ("{name: int, bits: 8}", False),
])
def test_error_feedback_only_with_contractive_codecs(tmp_path, codec, refused):
    """Rescaled random-k is not contractive: with error feedback its residual grows without bound."""
    spec = codec[:-1] + ", error_feedback: true}"
    if refused:
        with pytest.raises(ScenarioError, match=r"algorithm\.codec\.up\.error_feedback: randomk is not contractive"):
            load(tmp_path, STAR, f"codec: {{up: {spec}}}")
    else:
        assert load(tmp_path, STAR, f"codec: {{up: {spec}}}")[0].algorithm.codec.up.error_feedback


def test_random_k_with_error_feedback_does_diverge_where_top_k_does_not():
    """Why the refusal: a constant update through error feedback, 50 rounds. Top-k's residual stays
    bounded (it is contractive); rescaled random-k's grows by orders of magnitude."""
    from protocol.codecs.feedback import ErrorFeedback

    update = {"w": np.linspace(-1.0, 1.0, 1000).astype(np.float32)}
    residual_norms = {}
    for name in ("topk", "randomk"):
        feedback, codec, rng = ErrorFeedback(), make_codec({"name": name, "fraction": 0.05}), np.random.default_rng(0)
        for _ in range(50):
            _, feedback.residual = feedback.compress(update, codec, rng)
        residual_norms[name] = float(np.linalg.norm(feedback.residual["w"]))
    assert residual_norms["topk"] < 50 * np.linalg.norm(update["w"])  # bounded: at most the updates summed
    assert residual_norms["randomk"] > 1e3 * residual_norms["topk"]
