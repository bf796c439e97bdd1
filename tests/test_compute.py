"""The device compute model (issue 13, item 6): a per-batch cost, background load followed period
by period through a task, and training energy for the full-speed seconds only."""
import pytest

from conftest import read_csv, run_cli, write_scenario
from node.compute import LoadModel, full_speed_seconds, loaded_duration
from node.models import build_model, training_flops


def test_full_speed_seconds_per_sample_and_per_batch():
    # 100 samples in batches of 32 = 4 steps; 2 epochs of (100 x 10 ms + 4 x 5 ms)
    assert full_speed_seconds(10.0, 100, 2, 32, 5.0) == pytest.approx(2.04)
    assert full_speed_seconds(10.0, 100, 2) == pytest.approx(2.0)
    assert full_speed_seconds(10.0, 0, 2, 32, 5.0) == 0.0


def test_loaded_duration_follows_the_load_period_by_period():
    load = LoadModel(seed=3, device=7, period_s=10.0, mean=0.5)
    l0, l1, l2 = load.at(5.0), load.at(15.0), load.at(25.0)
    assert len({l0, l1, l2}) == 3  # three different periods
    # 9 s of work from t = 5: (1 - l0) x 5 s done by t = 10, then (1 - l1) x 10 by t = 20, the rest in period 3
    done_by_20 = (1 - l0) * 5 + (1 - l1) * 10
    assert done_by_20 < 9.0 < done_by_20 + (1 - l2) * 10
    expected = 20.0 + (9.0 - done_by_20) / (1 - l2) - 5.0  # a duration from t = 5
    assert loaded_duration(9.0, 5.0, load) == pytest.approx(expected)
    # one period only: the plain stretch
    assert loaded_duration(1.0, 5.0, load) == pytest.approx(1.0 / (1 - l0))
    assert loaded_duration(0.0, 5.0, load) == 0.0
    assert loaded_duration(2.0, 0.0, None, constant=0.0) == 2.0
    assert LoadModel.from_status({"load": load.as_status()}) == load and LoadModel.from_status({}) is None


def test_head_only_epochs_cost_the_frozen_extractors_forward_pass():
    model = build_model("firma_mlp", (1, 28, 28), 10)
    full, head = training_flops(model, (1, 28, 28)), training_flops(model, (1, 28, 28), trained="head.")
    macs = 784 * 256 + 256 * 256 + 256 * 128 + 128 * 10
    assert full == 6 * macs
    assert head == 2 * macs + 4 * 128 * 10  # forward everywhere, backward only through the head
    assert head / full == pytest.approx(0.335, abs=0.002)


SCENARIO = """
seed: 5
rounds: 2
task: {dataset: synthetic, model: mlp, synthetic: {samples: 200, test_samples: 20}}
population:
  clients: 1
  hosts: 1
  devices: [{ms_per_sample: 20, ms_per_batch: 30, train_w: 2.0, battery_wh: 10, load_mean: 0.5, load_period_s: 1.5}]
  links: [{up_mbps: 100, down_mbps: 100}]
selection: {clients_per_round: 1}
algorithm: {local_epochs: 2, batch_size: 64}
eval: {every: 0}
"""


def test_a_task_under_load_takes_its_loaded_time_and_full_speed_energy(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO)), "--set", "run.device_log=full", "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    busy = full_speed_seconds(20.0, 200, 2, 64, 30.0)  # (4 + 0.12) x 2 = 8.24 s: spans several 1.5 s load periods
    assert busy == pytest.approx(8.24)
    load = LoadModel(5, 0, 1.5, 0.5)
    clients = read_csv(out / "clients.csv")
    assert len(clients) == 2
    for c in clients:
        start, end = float(c["compute_start"]), float(c["compute_end"])
        assert end - start == pytest.approx(loaded_duration(busy, start, load), rel=1e-9)
        assert end - start > busy / (1 - load.at(start)) * 0.5  # not simply the load at the start, stretched
    trains = [d for d in read_csv(out / "devices.csv") if d["event"] == "train"]
    assert len(trains) == 2 and all(float(d["energy_j"]) == pytest.approx(2.0 * busy) for d in trains)


def test_a_capped_session_trains_on_a_fresh_subset_and_is_weighted_by_it():
    import numpy as np

    from node.actor import Message
    from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
    from node.data import synthetic
    from node.models import state_to_numpy
    from protocol.codecs import encode_state, make_codec

    train, test = synthetic(60, 10, (1, 4, 4), 3, seed=0)
    task = TaskSpec("mlp", train, test, seed=0)
    client = ClientActor(ClientProfile("c0", 0, np.arange(60), 10.0), Trainer(task),
                         ClientConfig(make_codec("fp32"), seed=0, max_samples=16, shuffle="once"))
    sessions = [client._session(r)[0] for r in range(3)]
    assert all(s.size == 16 and set(s) <= set(range(60)) for s in sessions)
    assert not np.array_equal(sessions[0], sessions[1])  # a fresh subset each round
    assert np.array_equal(sessions[0], client._session(0)[0])  # seeded
    order = client._session(0)[1]
    assert sorted(order.tolist()) == sessions[0].tolist()  # the fixed batch order, restricted to the session
    encoded = encode_state(state_to_numpy(client.trainer.model), make_codec("fp32"), np.random.default_rng(0))
    body = {"epochs": 2, "batch_size": 8, "lr": 0.1, "bits": None, "n_max": 60}
    reaction = client.react(Message("server", "c0", "task", 0, 0.0, body, encoded.frames, {}))
    assert reaction.work_s == pytest.approx(10.0 * 16 * 2 / 1000)  # 16 samples, not 60
    sent = reaction.work()().sends[0]
    assert sent.body["samples"] == 16


# ---- codec work charged to the client (algorithm.charge_codec_time) ----------------------------------
def test_codec_seconds_scale_the_hosts_measurement_by_the_devices_speed():
    from node.codec_cost import CodecTime

    table = CodecTime(host_ms_per_sample=2.0, decode_s={0: 0.005}, encode_s={8: 0.01, 16: 0.02}, noise_s=0.003)
    # a device that trains 3x slower than the host (6 ms against 2 ms a sample) codes 3x slower
    assert table.seconds(None, 16, 6.0) == pytest.approx((0.005 + 0.003 + 0.02) * 3)
    assert table.seconds(None, 8, 1.0) == pytest.approx((0.005 + 0.003 + 0.01) / 2)
    # a bit-length the table lacks takes the nearest one measured (the lower on a tie)
    assert table.seconds(None, 15, 2.0) == pytest.approx(0.028) and table.seconds(None, 12, 2.0) == pytest.approx(0.018)


def test_calibration_measures_every_bit_length_the_run_can_use():
    import torch

    from node.codec_cost import calibrate
    from node.privacy import add_noise
    from protocol.codecs import make_codec

    model = build_model("mlp", (1, 8, 8), 10)
    inputs, labels = torch.rand(32, 1, 8, 8), torch.randint(0, 10, (32,))
    table = calibrate(model, inputs, labels, make_codec("fp32"), make_codec({"name": "int", "bits": 8}), [None], range(4, 9),
                      lambda state, rng: add_noise(state, "laplace", 1.0, rng), reps=1)
    assert set(table.decode_s) == {0} and set(table.encode_s) == {4, 5, 6, 7, 8}
    assert all(v > 0 for v in [*table.decode_s.values(), *table.encode_s.values(), table.noise_s, table.host_ms_per_sample])
    assert calibrate(model, inputs, labels, make_codec("fp32"), make_codec("fp16"), [None], [None], reps=1).noise_s == 0.0


PINNED = {"host_ms_per_sample": 4.0, "decode_s": {0: 0.25}, "encode_s": {8: 0.5}, "noise_s": 0.25}


def test_a_charged_task_takes_its_codec_seconds_on_real_processes_and_the_run_pins_its_table(tmp_path):
    """One client at 20 ms a sample, 5x the pinned host's 4 ms: 1 s of codec work becomes 5 s."""
    import json

    import yaml

    base = SCENARIO.replace("load_mean: 0.5, load_period_s: 1.5", "load_mean: 0.0") \
        .replace("algorithm: {local_epochs: 2, batch_size: 64}",
                 "algorithm: {local_epochs: 2, batch_size: 64, codec: {up: {name: int, bits: 8}}, "
                 "privacy: {mechanism: laplace, epsilon: 100, clip: 10}, charge_codec_time: true, codec_time: %s}"
                 % json.dumps(PINNED))
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", base)), "--set", "run.device_log=full", "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    busy = full_speed_seconds(20.0, 200, 2, 64, 30.0)
    codec_s = (0.25 + 0.25 + 0.5) * 20.0 / 4.0
    clients = read_csv(out / "clients.csv")
    assert len(clients) == 2
    for c in clients:
        assert float(c["compute_end"]) - float(c["compute_start"]) == pytest.approx(busy + codec_s, rel=1e-9)
    trains = [d for d in read_csv(out / "devices.csv") if d["event"] == "train"]
    assert all(float(d["energy_j"]) == pytest.approx(2.0 * (busy + codec_s)) for d in trains)  # the CPU codes at full power
    summary = json.loads((out / "summary.json").read_text())
    assert summary["codec_time"] == {**PINNED, "decode_s": {"0": 0.25}, "encode_s": {"8": 0.5}}
    # measured, not pinned: the run directory's scenario.yaml pins what was measured, and reruns to the same times
    measured = base.replace(", codec_time: %s}" % json.dumps(PINNED), "}")
    first = tmp_path / "measured"
    res = run_cli("run", str(write_scenario(tmp_path / "m.yaml", measured)), "--out", str(first), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    pinned = yaml.safe_load((first / "scenario.yaml").read_text())["algorithm"]["codec_time"]
    assert set(pinned["encode_s"]) == {8} and pinned["host_ms_per_sample"] > 0
    again = tmp_path / "again"
    res = run_cli("run", str(first / "scenario.yaml"), "--out", str(again), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert read_csv(again / "clients.csv") == read_csv(first / "clients.csv")
    took = [float(c["compute_end"]) - float(c["compute_start"]) for c in read_csv(first / "clients.csv")]
    assert all(t > busy for t in took)


def test_codec_time_without_charging_it_is_refused(tmp_path):
    import json

    text = SCENARIO.replace("algorithm: {local_epochs: 2, batch_size: 64}",
                            "algorithm: {local_epochs: 2, batch_size: 64, codec_time: %s}" % json.dumps(PINNED))
    res = run_cli("validate", str(write_scenario(tmp_path / "s.yaml", text)))
    assert res.returncode == 2 and "codec_time" in res.stderr and "charge_codec_time" in res.stderr
    assert "Traceback" not in res.stderr


# ---- the mechanism's compute cost (issue 43, item 6) -------------------------------------------------
def test_dp_sgd_sessions_take_their_compute_factor_longer(tmp_path):
    """DP-SGD's per-sample gradients cost several times plain SGD's (5.6x for the CNN on this
    project's CPU): the session's modelled time is charged that factor, settable, and said in
    summary.json; the other mechanisms' is 1."""
    import numpy as np

    from emulator.scenario import DPSGD_COMPUTE_FACTOR, load_scenario
    from emulator.summary import Summary
    from emulator.world import build_world
    from node.actor import Message
    from node.client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
    from node.data import synthetic
    from node.models import state_to_numpy
    from node.stages import Privacy
    from protocol.codecs import encode_state, make_codec

    def session_s(privacy: Privacy) -> float:
        train, test = synthetic(60, 10, (1, 4, 4), 3, seed=0)
        client = ClientActor(ClientProfile("c0", 0, np.arange(60), 10.0), Trainer(TaskSpec("mlp", train, test, seed=0)),
                             ClientConfig(make_codec("fp32"), seed=0, privacy=privacy))
        encoded = encode_state(state_to_numpy(client.trainer.model), make_codec("fp32"), np.random.default_rng(0))
        body = {"epochs": 2, "batch_size": 8, "lr": 0.1, "bits": None, "n_max": 60}
        return client.react(Message("server", "c0", "task", 0, 0.0, body, encoded.frames, {})).work_s

    plain = session_s(Privacy())
    assert plain == pytest.approx(10.0 * 60 * 2 / 1000)
    assert session_s(Privacy("dpsgd", clip=1.0, noise_multiplier=1.0, compute_factor=5.6)) == pytest.approx(5.6 * plain)

    dpsgd = ["algorithm.privacy.mechanism=dpsgd", "algorithm.privacy.clip=1", "algorithm.privacy.noise_multiplier=1"]
    smoke = write_scenario(tmp_path / "s.yaml", SCENARIO)
    for sets, factor in ((dpsgd, DPSGD_COMPUTE_FACTOR), ([*dpsgd, "algorithm.privacy.compute_factor=2.5"], 2.5), ([], 1.0)):
        sc, _ = load_scenario(smoke, sets)
        world = build_world(sc)
        assert world.client.privacy.compute_factor == factor
        summary = Summary.start("s")
        summary.describe_run(sc, world.client.privacy, None, {})
        assert summary["privacy"]["compute_factor"] == factor
