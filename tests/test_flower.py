"""Flower apps under the emulator (the flower extra): records on the wire, finding an app, and the
example app run with 10 clients for 3 rounds, whose Flower FedAvg aggregate must be the weighted
average of what the clients sent, whose transfers carry exactly the model's bytes, and where a
client that goes offline mid-round is simply absent from the replies."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, needs_mnist, read_csv, link_bytes, run_cli, write_scenario
from test_integration_exact import tcp_transfer_time

flwr = pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict  # noqa: E402

from emulator.scenario import ScenarioError, load_scenario  # noqa: E402
from node.channel import Channel  # noqa: E402
from node.flower.app import FlowerAppError, read_app  # noqa: E402
from node.flower.records import RecordError, decode_content, encode_content  # noqa: E402
from protocol.codecs import make_codec  # noqa: E402

EXAMPLE = REPO / "examples" / "flower_quickstart"
NET_PARAMS = 8 * 25 + 8 + 16 * 8 * 25 + 16 + 256 * 64 + 64 + 64 * 10 + 10  # the example's CNN: 20,522


def _content() -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"w": Array(np.linspace(-1, 1, 600, dtype=np.float32).reshape(20, 30)),
                                              "steps": Array(np.array([7, 9], dtype=np.int64))}),
                       "config": ConfigRecord({"lr": 0.05, "name": "x", "on": True, "ks": [1, 2]}),
                       "metrics": MetricRecord({"num-examples": 12, "loss": 0.5})})


def test_records_cross_the_wire_with_exact_payload_bytes():
    wire = encode_content(_content(), Channel(make_codec("fp32")), np.random.default_rng(0))
    assert (wire.payload_bytes, wire.fp32_bytes) == (600 * 4 + 2 * 8, 600 * 4 + 2 * 8)
    back = decode_content(wire.body, [bytes(memoryview(f)) for f in wire.frames])
    np.testing.assert_array_equal(back["arrays"]["w"].numpy(), _content()["arrays"]["w"].numpy())
    np.testing.assert_array_equal(back["arrays"]["steps"].numpy(), [7, 9])
    assert dict(back["config"]) == {"lr": 0.05, "name": "x", "on": True, "ks": [1, 2]}
    assert dict(back["metrics"]) == {"num-examples": 12, "loss": 0.5}


def test_the_run_codec_applies_to_flower_arrays():
    channel = Channel(make_codec({"name": "int", "bits": 8}))
    wire = encode_content(_content(), channel, np.random.default_rng(0))
    assert wire.payload_bytes < 600 + 64 + 16  # 8 bits a value (plus its scale), the int64 array raw
    assert wire.fp32_bytes == 600 * 4 + 16 and channel.stats.messages == 0
    wire.commit()
    assert channel.stats.messages == 1 and channel.stats.payload_bytes == wire.payload_bytes
    back = decode_content(wire.body, [bytes(memoryview(f)) for f in wire.frames])
    assert np.abs(back["arrays"]["w"].numpy() - _content()["arrays"]["w"].numpy()).max() < 2 / 255 + 1e-6


def test_a_body_that_does_not_decode_is_named():
    with pytest.raises(RecordError, match="frames left over"):
        decode_content({"arrays": [], "configs": {}, "metrics": {}}, [b"x"])
    with pytest.raises(RecordError, match="without"):
        decode_content({"configs": {}}, [])


def test_an_app_is_found_as_flwr_run_finds_it(tmp_path):
    ref = read_app(str(EXAMPLE), None, None, {"num-server-rounds": 7})
    assert (ref.server, ref.client) == ("flower_quickstart.server_app:app", "flower_quickstart.client_app:app")
    assert ref.run_config["num-server-rounds"] == 7 and ref.run_config["lr"] == 0.05
    with pytest.raises(FlowerAppError, match=r"\['nope'\] are not keys of the app's"):
        read_app(str(EXAMPLE), None, None, {"nope": 1})
    (tmp_path / "pyproject.toml").write_text("[tool.flwr.app.components]\nserverapp = 'a:b'\n")
    with pytest.raises(FlowerAppError, match="must name serverapp and clientapp"):
        read_app(str(tmp_path), None, None, {})
    with pytest.raises(FlowerAppError, match="neither a directory"):
        read_app(str(tmp_path / "missing"), None, None, {})


BASE = """
name: fl
seed: 4
rounds: 3
task: {{dataset: mnist, model: mlp, partition: {{kind: iid}}}}
population:
  clients: 10
  hosts: 2
  devices: [{{name: d, share: 1.0, ms_per_sample: 2.0}}]
  links:
    - {{name: fast, share: 0.5, up_mbps: 20, down_mbps: 50, latency_ms: 10}}
    - {{name: slow, share: 0.5, up_mbps: 5, down_mbps: 10, latency_ms: 40}}
{extra}server: {{link: {{up_mbps: null, down_mbps: null, latency_ms: 0}}}}
algorithm:
  name: flower
  local_epochs: 1
  flower:
    app: {app}
    server_app: {server_app}
    run_config: {{num-server-rounds: 3, fraction-train: 1.0, fraction-evaluate: 0.5, min-nodes: 4, max-examples: 100}}
    timeout_s: 30
"""


def test_scenario_errors_name_the_key(tmp_path):
    for extra, message in (("topology: ring\n", "runs algorithm.name fibfl"),
                           ("run: {checkpoint_every: 1}\n", "run.checkpoint_every: a Flower app's state")):
        path = write_scenario(tmp_path / "s.yaml", extra + BASE.format(extra="", app=EXAMPLE, server_app="null"))
        with pytest.raises(ScenarioError, match=message):
            load_scenario(path)
    path = write_scenario(tmp_path / "s.yaml", BASE.format(extra="", app=EXAMPLE, server_app="null").replace(
        f"    app: {EXAMPLE}\n", ""))
    with pytest.raises(ScenarioError, match="algorithm: flower.app: name the Flower app"):
        load_scenario(path)


T_OFF = 0.5  # c0003 goes offline while it trains in round 1


@needs_mnist
def test_the_example_app_runs_with_flower_fedavg_exact_bytes_and_an_absent_client(tmp_path):
    trace = {str(i): {"active": [0], "inactive": [T_OFF] if i == 3 else [], "finish_time": 1e6} for i in range(10)}
    (tmp_path / "behaviour.json").write_text(json.dumps(trace))
    text = BASE.format(extra="  availability: {kind: trace, trace: behaviour.json}\n", app=EXAMPLE,
                       server_app="tests.flower_probe:app")
    path = write_scenario(tmp_path / "s.yaml", text)
    probe = tmp_path / "round1.npz"
    env = {**os.environ, "FLOWER_PROBE_OUT": str(probe)}
    res = subprocess.run([sys.executable, "-m", "emulator", "run", str(path), "--out", str(tmp_path / "out"), "--quiet"],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3

    # Flower's FedAvg aggregate of round 1 is the num-examples weighted average of the replies
    saved = np.load(probe)
    assert sorted(saved["nodes"].tolist()) == [1000 + i for i in range(10) if i != 3]  # c0003 is absent
    weights = saved["examples"].astype(np.float64)
    names = sorted({k.split("/", 1)[1] for k in saved.files if k.startswith("aggregate/")})
    assert len(names) == 8
    for name in names:
        replies = np.stack([saved[f"reply{k}/{name}"].astype(np.float64) for k in range(len(weights))])
        expected = np.tensordot(weights / weights.sum(), replies, axes=1)
        np.testing.assert_allclose(saved[f"aggregate/{name}"], expected, rtol=1e-5, atol=1e-7)

    # exact bytes: every model is the CNN's fp32 arrays; an evaluation reply carries metrics only
    transfers = read_csv(out / "transfers.csv")
    for tr in transfers:
        payload, wire = int(tr["payload_bytes"]), int(tr["wire_bytes"])
        if tr["outcome"] != "ok":
            continue
        is_eval_reply = tr["kind"] == "update" and payload == 0
        assert payload == (0 if is_eval_reply else NET_PARAMS * 4), tr
        assert 0 < wire - payload < 2048, tr  # envelope, Flower's metadata and records, codec header
        assert int(tr["link_bytes"]) == link_bytes(wire)
    tasks = [t for t in transfers if t["kind"] == "task" and t["round"] == "0"]
    assert len([t for t in tasks if t["dst"] != "c0003"]) >= 9 + 4  # every client trains, then half evaluate
    # and exact times: each client's first download is TCP slow start on its own link by hand
    link_of = {r["client"]: r["link"] for r in read_csv(out / "population.csv")}
    first = {}
    for t in tasks:
        first.setdefault(t["dst"], t)
    assert len(first) == 10
    for client, t in first.items():
        rate, one_way = (50e6, 0.010) if link_of[client] == "fast" else (10e6, 0.040)
        expected = tcp_transfer_time(int(t["link_bytes"]) * 8, rate, one_way)
        assert float(t["t_end"]) - float(t["t_start"]) == pytest.approx(expected, abs=1e-9), client

    rows = read_csv(out / "rounds.csv")
    assert [(r["selected"], r["completed"], r["failed"]) for r in rows][0] == ("10", "9", "1")
    assert all(r["accuracy"] and r["train_loss"] for r in rows)
    first = {r["client"]: r["outcome"] for r in read_csv(out / "clients.csv") if r["round"] == "0"}
    assert first["c0003"] == "dropped_offline" and list(first.values()).count("ok") == 9
    # the deadline (FedAvg's 3600 s, capped by algorithm.flower.timeout_s at 30 emulated s) closed round 1
    assert float(rows[0]["t_end"]) == pytest.approx(30.0, abs=1.0)


@needs_mnist
def test_the_shipped_flower_scenario_validates():
    res = run_cli("validate", "scenarios/flower_edge.yaml", timeout=120)
    assert res.returncode == 0 and "ok (20 clients, 5 rounds)" in res.stdout, res.stderr


@needs_mnist
def test_a_server_app_that_raises_fails_the_run_with_its_traceback(tmp_path):
    path = write_scenario(tmp_path / "s.yaml", BASE.format(extra="", app=EXAMPLE, server_app="tests.flower_probe:broken"))
    res = run_cli("run", str(path), "--out", str(tmp_path / "out"), "--quiet", timeout=300)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "the server actor raised an exception: RuntimeError: the app's own bug" in res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert any("RuntimeError: the app's own bug" in str(i.get("error")) for i in summary["incidents"])


@needs_mnist
def test_with_check_in_the_grid_offers_only_clients_that_checked_in(tmp_path):
    trace = {str(i): {"active": [1e5] if i == 3 else [0], "inactive": [], "finish_time": 1e6} for i in range(10)}
    (tmp_path / "behaviour.json").write_text(json.dumps(trace))
    text = BASE.format(extra="  availability: {kind: trace, trace: behaviour.json}\n", app=EXAMPLE, server_app="null")
    text = text.replace("rounds: 3", "rounds: 2").replace("num-server-rounds: 3", "num-server-rounds: 2")
    path = write_scenario(tmp_path / "s.yaml", text + "selection: {checkin: true, clients_per_round: 10}\n")
    res = run_cli("run", str(path), "--out", str(tmp_path / "out"), "--quiet", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    transfers = read_csv(tmp_path / "out" / "transfers.csv")
    checkins = {t["src"] for t in transfers if t["kind"] == "checkin"}
    assert checkins == {f"c{i:04d}" for i in range(10) if i != 3}
    tasks = [t for t in transfers if t["kind"] == "task"]
    assert tasks and all(t["dst"] != "c0003" for t in tasks)  # offline from the start: never a node of the Grid
    rows = read_csv(tmp_path / "out" / "rounds.csv")
    # FedAvg found no node at t = 0 (no check-in had arrived), so it polled with time.sleep(1), which
    # runs in emulated seconds, until min-nodes (4) had checked in; by round 2 all 9 had
    assert [(r["selected"], r["completed"]) for r in rows] == [("4", "4"), ("9", "9")]
    start = float(rows[0]["t_start"])
    assert start >= 1.0 and start == int(start)


def test_an_app_waiting_for_nodes_that_never_come_ends_within_its_cap(tmp_path):
    """Flower's strategies poll for min_available_nodes for ever: asked for 50 of 10 clients, the app
    sends nothing, and the run ends after algorithm.flower.wait_for_nodes_s of emulated polling with
    status no_clients (exit 3) and a reason that says why, instead of polling for ever."""
    text = BASE.format(extra="", app=EXAMPLE, server_app="null").replace("min-nodes: 4", "min-nodes: 50")
    text = text.replace("    timeout_s: 30\n", "    timeout_s: 30\n    wait_for_nodes_s: 45\n")
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out), "--quiet", timeout=120)
    assert res.returncode == 3, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "no_clients" and summary["rounds_completed"] == 0
    assert "waited 45 emulated s for nodes and sent nothing (it sees 10 of 10 clients" in summary["reason"]
    assert "algorithm.flower.wait_for_nodes_s" in res.stderr


@pytest.mark.parametrize("name, settings, client_app, codec, bar", [
    ("fedprox", "strategy: fedprox", None, None, 0.35),
    ("fedadam", "strategy: fedadam", None, None, 0.25),
    ("int8", "strategy: fedavg", None, "{name: int, bits: 8}", 0.35),
    ("dp-fixed", "strategy: dp-fixed", "flower_quickstart.client_app:app_dp", None, None),
])
def test_flowers_own_strategies_and_its_dp_mod_run_and_learn(tmp_path, name, settings, client_app, codec, bar):
    """What is tested of Flower beyond FedAvg (docs/guide/flower.md lists exactly this): its FedProx
    (the example's client adds the proximal term it is sent) and FedAdam, FedAvg with the run's int8
    codec both ways, each above a stated final accuracy after 3 rounds of 240 examples a client
    (chance is 0.1); and DifferentialPrivacyClientSideFixedClipping with Flower's fixedclipping_mod
    on the train messages, which must complete with every round evaluated (its noise, z = 0.1 at a
    clip of 10, keeps it near chance in 3 rounds)."""
    text = BASE.format(extra="", app=EXAMPLE, server_app="null").replace("max-examples: 100}", f"max-examples: 300, {settings}}}")
    if client_app:
        text = text.replace("    server_app: null\n", f"    server_app: null\n    client_app: {client_app}\n")
    if codec:
        text = text.replace("  local_epochs: 1\n  flower:", f"  local_epochs: 1\n  codec: {{down: {codec}, up: {codec}}}\n  flower:")
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out), "--quiet", timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_csv(out / "rounds.csv")
    assert len(rows) == 3 and all(int(r["completed"]) == 10 for r in rows)
    assert all(r["accuracy"] for r in rows)  # evaluated every round (the DP mod lets evaluation through)
    if bar is not None:
        assert float(rows[-1]["accuracy"]) >= bar
    if codec:
        assert int(rows[0]["payload_bytes_up"]) < int(rows[0]["fp32_bytes_up"]) / 3  # int8 really went up
