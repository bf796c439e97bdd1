"""Cohort training (node/cohort.py): clients of one host trained together give, per client, what
one-by-one training gives (float tolerance: the vectorised kernels sum in another order), a
client's numbers do not depend on who trains beside it, a client that drops out or fails does
not hold up the rest, and a whole run with cohorts has the same emulated times and bytes."""
import json
import math

import numpy as np
import pytest

from conftest import REPO, read_csv, run_cli, write_scenario
from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
from node.actor import Message
from node.cohort import CohortTrainer, TrainRequest, resolve_cohort, train_cohort
from node.data import synthetic
from node.models import build_model, state_to_numpy
from node.schedule import BitSchedule
from node.stages import Privacy
from node.training import LocalTraining, train_local
from node.models import load_numpy_state
from protocol.codecs import decode_state, encode_state, make_codec

# Tolerances (absolute, on weights after the whole local schedule): dense layers differ by float32
# rounding only; convolutions under vmap run as one grouped convolution whose sums go in another order.
WEIGHT_TOL = {"mlp": 1e-5, "mnist_cnn": 2e-3}
LOSS_RTOL = 1e-4
# Eq. 1.9's estimate divides a difference of gradients by a difference of weights, both small, so
# the summation order's rounding is amplified: on an AMD EPYC host the CNN's differed by 1.3e-3.
LIPSCHITZ_RTOL = {"mlp": 1e-3, "mnist_cnn": 5e-3}

DATA = synthetic(480, 10, (1, 28, 28), 10, seed=0)
SHARDS = [np.arange(0, 47), np.arange(60, 107), np.arange(120, 168), np.arange(200, 246)]  # 3 steps of 16, ragged last batch


def requests(model, cfg, shards=SHARDS, clients=None):
    start = state_to_numpy(model)
    clients = range(len(shards)) if clients is None else clients
    return [TrainRequest(start, DATA[0], shards[c], cfg, np.random.default_rng([7, c])) for c in clients]


def one_by_one(model, reqs):
    out = []
    for r in reqs:
        load_numpy_state(model, r.state)
        result = train_local(model, r.data, r.indices, r.cfg, r.rng, r.fixed_order)
        out.append((state_to_numpy(model), result))
    return out


@pytest.mark.parametrize("name", ["mlp", "mnist_cnn"])
@pytest.mark.parametrize("clip_norm", [1.0, 2.0])
def test_cohort_equals_one_by_one_with_clipping_lipschitz_and_prox(name, clip_norm):
    model = build_model(name, (1, 28, 28), 10, seed=1)
    cfg = LocalTraining(2, 16, 0.05, clip=0.5, clip_norm=clip_norm, estimate_lipschitz=True, prox_mu=0.1)
    together = train_cohort(model, requests(model, cfg))
    alone = one_by_one(model, requests(model, cfg))
    clipped_somewhere = False
    for (w_c, r_c), (w_1, r_1) in zip(together, alone):
        assert set(w_c) == set(w_1)
        for k in w_1:
            assert np.abs(w_c[k] - w_1[k]).max() <= WEIGHT_TOL[name], k
        assert r_c.loss == pytest.approx(r_1.loss, rel=LOSS_RTOL)
        assert r_c.loss_rms == pytest.approx(r_1.loss_rms, rel=LOSS_RTOL)
        assert r_c.lipschitz == pytest.approx(r_1.lipschitz, rel=LIPSCHITZ_RTOL[name]) and r_1.lipschitz > 0
        assert r_c.samples_seen == r_1.samples_seen
        clipped_somewhere |= r_1.lipschitz > 0
    assert clipped_somewhere
    # the clients really differ (different data): the comparison is per client, not of copies
    assert not np.allclose(together[0][0][k], together[1][0][k])


def test_shuffle_once_replays_each_clients_fixed_order():
    model = build_model("mlp", (1, 28, 28), 10, seed=1)
    cfg = LocalTraining(3, 16, 0.1, shuffle="once")
    reqs = requests(model, cfg)
    for r, seed in zip(reqs, range(4)):
        r.fixed_order = np.random.default_rng(seed).permutation(r.indices)
    again = requests(model, cfg)
    for r, seed in zip(again, range(4)):
        r.fixed_order = np.random.default_rng(seed).permutation(r.indices)
    for (w_c, _), (w_1, _) in zip(train_cohort(model, reqs), one_by_one(model, again)):
        assert all(np.abs(w_c[k] - w_1[k]).max() <= 1e-5 for k in w_1)


@pytest.mark.parametrize("name", ["mlp", "mnist_cnn"])
def test_a_clients_numbers_do_not_depend_on_its_cohort(name):
    """Who is queued beside a client depends on wall-clock timing; its result must not."""
    model = build_model(name, (1, 28, 28), 10, seed=2)
    cfg = LocalTraining(1, 16, 0.05, clip=1.0, clip_norm=2.0, estimate_lipschitz=True)
    trainer = CohortTrainer(model, max_size=8)
    shards = SHARDS + [np.arange(300, 346), np.arange(400, 447)]
    results = {}
    for members in ([0, 1, 2, 3], [3, 2, 1, 0], [0, 4], [0, 1, 2, 3, 4, 5], [0]):
        got = trainer._train_group(requests(model, cfg, shards, members))
        results[tuple(members)] = dict(zip(members, got))
    reference = results[(0, 1, 2, 3)][0]
    for members, got in results.items():
        state, result = got[0]
        assert all(np.array_equal(state[k], reference[0][k]) for k in state), members
        assert (result.loss, result.lipschitz, result.loss_rms) == (reference[1].loss, reference[1].lipschitz, reference[1].loss_rms)


def test_groups_by_steps_per_epoch_and_schedule():
    model = build_model("mlp", (1, 28, 28), 10, seed=0)
    cfg = LocalTraining(1, 16, 0.05)
    other = LocalTraining(1, 16, 0.01)
    reqs = requests(model, cfg) + [TrainRequest(state_to_numpy(model), DATA[0], np.arange(0, 100), cfg, np.random.default_rng(9)),
                                   TrainRequest(state_to_numpy(model), DATA[0], np.arange(0, 47), other, np.random.default_rng(9))]
    assert len({r.key for r in reqs}) == 3  # 3 steps at lr 0.05, 7 steps, and lr 0.01
    with pytest.raises(ValueError, match="one local schedule"):
        train_cohort(model, reqs[3:])
    got = CohortTrainer(model, 8)._train_group(reqs)
    alone = one_by_one(model, [TrainRequest(r.state, r.data, r.indices, r.cfg, np.random.default_rng(9)) for r in reqs[4:]])
    for (w_c, _), (w_1, _) in zip(got[4:], alone):
        assert all(np.abs(w_c[k] - w_1[k]).max() <= 1e-5 for k in w_1)


# ---- through the client actor: DP noise, per-client bits, drop-outs ----------------------------
def make_clients(cohort, count=4):
    train, test = DATA
    task = TaskSpec("mlp", train, test, seed=0)
    trainer = Trainer(task, cohort)
    cfg = ClientConfig(make_codec({"name": "int", "bits": 8}), seed=11, schedule=BitSchedule("dynamic", 10, 4, 16),
                       privacy=Privacy("laplace", epsilon=20.0, clip=2.0, factor=1.0))
    shards = [np.arange(60 * c, 60 * c + 30 + 8 * c) for c in range(count)]  # unequal sizes: several cohorts
    return [ClientActor(ClientProfile(f"c{c}", c, shards[c], 1.0), trainer, cfg) for c in range(count)], trainer


def task_message(client, state):
    encoded = encode_state(state, make_codec("fp32"), np.random.default_rng(0))
    body = {"epochs": 2, "batch_size": 8, "lr": 0.1, "n_max": 60}
    return Message("server", client.name, "task", 3, 10.0, body, encoded.frames, {})


def outcomes(clients, trainer, state, grouped, offline=()):
    reactions = [c.react(task_message(c, state)) for c in clients]
    assert all(r.cohort for r in reactions)
    for name in offline:  # the device went off and on while the task waited
        next(c for c in clients if c.name == name).react(Message("net", name, "online", -1, 11.0, {}, (), {}))
    works = [r.work for r in reactions]
    done = trainer.cohorts.run_group(works) if grouped else [w() for w in works]
    sent = {}
    for client, deliver in zip(clients, done):
        if callable(deliver):
            for send in deliver().sends:
                sent[client.name] = ({**send.body, **send.notes}, decode_state(send.frames)[0])
    return sent


def test_cohort_clients_send_what_one_by_one_clients_send():
    clients, trainer = make_clients(8)
    state = state_to_numpy(trainer.model)
    together = outcomes(clients, trainer, state, grouped=True)
    solo, solo_trainer = make_clients("off")
    assert solo_trainer.cohorts.max_size == 1 and trainer.cohorts.max_size == 8
    alone = outcomes(solo, solo_trainer, state, grouped=False)
    assert sorted(together) == sorted(alone) == ["c0", "c1", "c2", "c3"]
    bits = set()
    for name in alone:
        (info_c, w_c), (info_1, w_1) = together[name], alone[name]
        assert info_c["bits"] == info_1["bits"]  # per-client bits (importance-driven schedule)
        bits.add(info_1["bits"])
        assert info_c["lipschitz"] == pytest.approx(info_1["lipschitz"], rel=1e-3)
        assert info_c["noise_scale"] == pytest.approx(info_1["noise_scale"], rel=1e-3)
        assert info_c["loss"] == pytest.approx(info_1["loss"], rel=LOSS_RTOL)
        # same Laplace draws on nearly the same weights, then 8-bit quantization: equal up to
        # one quantization step where a weight sits on a rounding boundary
        for k in w_1:
            step = 2 * np.abs(w_1[k]).max() / (2 ** info_1["bits"] - 1)
            assert np.abs(w_c[k] - w_1[k]).max() <= step + 1e-4, k
            assert np.mean(np.abs(w_c[k] - w_1[k]) < step / 2) > 0.95  # nearly all on the same level
    assert len(bits) > 1


def test_a_client_that_drops_out_does_not_hold_up_its_cohort():
    clients, trainer = make_clients(8)
    state = state_to_numpy(trainer.model)
    full = outcomes(clients, trainer, state, grouped=True)
    clients, trainer = make_clients(8)
    partial = outcomes(clients, trainer, state, grouped=True, offline=["c1"])
    assert sorted(partial) == ["c0", "c2", "c3"]
    for name in partial:
        assert all(np.array_equal(partial[name][1][k], full[name][1][k]) for k in full[name][1])


def test_a_failing_client_fails_alone():
    model = build_model("mlp", (1, 28, 28), 10, seed=0)
    trainer = CohortTrainer(model, 4)
    cfg = LocalTraining(1, 16, 0.05)
    reqs = requests(model, cfg)

    def boom():
        raise RuntimeError("bad data")

    def guarded(fn):
        def run():
            try:
                return fn()
            except RuntimeError as exc:
                return exc
        return run

    works = [guarded(lambda r=r: trainer.train(r)) for r in reqs[:3]] + [guarded(boom)]
    got = trainer.run_group(works)
    assert isinstance(got[3], RuntimeError)
    assert all(isinstance(g, tuple) and set(g[0]) == set(state_to_numpy(model)) for g in got[:3])


@pytest.mark.parametrize("setting, model, device, expected", [
    ("off", "mlp", "cpu", 1), (5, "mlp", "cpu", 5), ("auto", "mlp", "cpu", 1), ("auto", "mnist_cnn", "cpu", 1),
    ("auto", "mnist_cnn", "cuda:0", 32), (8, "mnist_cnn", "cpu", 8), ("auto", "vgg7", "cuda", 1), (4, "vgg7", "cpu", 1),
    ("auto", "char_lstm", "cuda", 1),
])
def test_cohort_setting_resolves_per_model_and_device(setting, model, device, expected):
    shape = {"vgg7": (3, 32, 32), "char_lstm": (80,)}.get(model, (1, 28, 28))
    assert resolve_cohort(setting, build_model(model, shape, 10), device) == expected


# ---- a whole run --------------------------------------------------------------------------------
SCENARIO = """
name: cohort_dropout
seed: 5
rounds: 3
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 800, test_samples: 200}
population:
  clients: 8
  hosts: 1
  devices: [{ms_per_sample: 20}]
  links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]
  availability: {kind: markov, mean_on_s: 6, mean_off_s: 2}
selection: {clients_per_round: 8}
round: {timeout_s: 20}
algorithm: {local_epochs: 2, batch_size: 16, cohort: COHORT, privacy: {mechanism: laplace, epsilon: 50, clip: 5}}
eval: {every: 1}
"""


def run(tmp_path, cohort):
    out = tmp_path / f"run_{cohort}"
    path = write_scenario(tmp_path / f"s_{cohort}.yaml", SCENARIO.replace("COHORT", str(cohort)))
    res = run_cli("run", str(path), "--out", str(out), "--plain", timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    return read_csv(out / "clients.csv"), read_csv(out / "rounds.csv"), json.loads((out / "summary.json").read_text())


def test_a_run_with_cohorts_has_the_same_times_bytes_and_drop_outs(tmp_path):
    off_clients, off_rounds, off_summary = run(tmp_path, "off")
    on_clients, on_rounds, on_summary = run(tmp_path, 8)
    assert "cohorts" not in off_summary
    assert on_summary["cohorts"]["host0"]["largest"] > 1
    assert on_summary["training_devices"]["host0"]["cohort"] == 8
    float_columns = {"loss", "lipschitz", "sensitivity", "noise_scale", "update_norm"}
    # a client that went offline after its cohort had started training, and one that finished
    assert any(r["outcome"] == "dropped_offline" and r["compute_end"] for r in on_clients)
    assert any(r["outcome"] == "ok" for r in on_clients)
    for off, on in zip(off_clients, on_clients, strict=True):
        # Whether a task sent to a device at the very instant it goes offline logs a download start,
        # and so whether the client counts as dropped or as never updating, depends on which
        # reaches the network first, in runs without cohorts too (about one run pair in six
        # differs so, before and after stop 28's clock changes; not yet explained). Such a row is
        # held to its round and client only: it never got its model.
        raced = not off["download_end"] and {off["outcome"], on["outcome"]} <= {"dropped_offline", "no_update"}
        for key in off:
            if raced and key not in ("round", "client"):
                continue
            if key in float_columns and off[key]:
                assert math.isclose(float(on[key]), float(off[key]), rel_tol=1e-3), (key, off, on)
            else:
                assert on[key] == off[key], key
    for off, on in zip(off_rounds, on_rounds, strict=True):
        for key in ("t_end", "completed", "payload_bytes_up", "wire_bytes_up", "wire_bytes_down"):
            assert on[key] == off[key]
        if off.get("accuracy"):
            assert abs(float(on["accuracy"]) - float(off["accuracy"])) <= 0.02
