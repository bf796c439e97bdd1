"""Whole runs as real processes: determinism, learning, validation errors."""
import csv
import importlib.util
import json

import psutil
import pytest

from conftest import REPO, needs_fashion_mnist, needs_mnist, run_cli, write_scenario
from emulator.scenario import ScenarioError, load_scenario
from emulator.world import build_world, load_task

SYNTH = """
name: det
seed: {seed}
rounds: 3
task:
  dataset: synthetic
  model: mlp
  partition: {{kind: dirichlet, alpha: 0.5}}
  synthetic: {{samples: 600, test_samples: 100}}
population:
  clients: 6
  hosts: 2
  devices:
    - {{name: fast, share: 0.5, ms_per_sample: 2}}
    - {{name: slow, share: 0.5, ms_per_sample: 9}}
  links:
    - {{name: a, share: 0.5, up_mbps: 3, down_mbps: 9, latency_ms: 30}}
    - {{name: b, share: 0.5, up_mbps: 7, down_mbps: 15, latency_ms: 12}}
server:
  link: {{up_mbps: 10, down_mbps: 10, latency_ms: 2}}
selection: {{clients_per_round: 4}}
algorithm: {{local_epochs: 1, batch_size: 16}}
eval: {{every: 1}}
"""

# The model too: two clients of one host train one after the other on a shared model while the
# first one's update may still be on its way out, which once corrupted updates.
TIME_AND_BYTES = ["round", "t_start", "t_end", "selected", "completed", "payload_bytes_down", "payload_bytes_up",
                  "wire_bytes_down", "wire_bytes_up", "train_loss", "accuracy", "test_loss"]


def run_synth(tmp_path, name, seed):
    out = tmp_path / name
    res = run_cli("run", str(write_scenario(tmp_path / f"{name}.yaml", SYNTH.format(seed=seed))), "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    with open(out / "rounds.csv") as f:
        rounds = [{k: r[k] for k in TIME_AND_BYTES} for r in csv.DictReader(f)]
    with open(out / "transfers.csv") as f:
        selected = [sorted((t["round"], t["dst"]) for t in csv.DictReader(f) if t["kind"] == "task")]
    return rounds, selected


def test_same_seed_same_times_and_bytes_other_seed_other_selection(tmp_path):
    a_rounds, a_sel = run_synth(tmp_path, "a", 5)
    b_rounds, b_sel = run_synth(tmp_path, "b", 5)
    c_rounds, c_sel = run_synth(tmp_path, "c", 6)
    assert len(a_rounds) == 3
    assert a_rounds == b_rounds
    assert a_sel == b_sel
    assert a_sel != c_sel


@needs_mnist
def test_smoke_learns_mnist(tmp_path):
    """The shipped smoke scenario: MNIST IID, 3 rounds, must reach 85% test accuracy. Each client
    trains on 2,000 of its 6,000 samples a round (86.8 % here, in 31 s of wall time against 65-72 s
    for all of them), to keep the suite within its time. The time limit only catches a hang: a CI run
    was once killed at 240 s in round 3, for a cause not found (see run_cli for what a timeout now tells)."""
    out = tmp_path / "smoke"
    res = run_cli("run", str(REPO / "scenarios" / "smoke.yaml"), "--set", "algorithm.max_samples_per_round=2000",
                  "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["best_accuracy"] >= 0.85
    assert "round 3/3" in res.stdout


BASE = {
    "rounds": "rounds: 1",
    "task": "task: {dataset: synthetic, model: mlp}",
    "population": "population: {clients: 2, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}",
    "selection": "selection: {clients_per_round: 1}",
}


def scenario_text(**replace):
    parts = {**BASE, **replace}
    return "\n".join(v for v in parts.values() if v) + "\n"


@pytest.mark.parametrize("text, expected", [
    (scenario_text(extra="colour: blue"), "colour: unknown key"),
    (scenario_text(rounds="rounds: three"), "rounds: input should be a valid integer"),
    (scenario_text(population="population: {clients: 2, devices: [{ms_per_sample: 1}], "
                              "links: [{share: 1.5, up_mbps: 1, down_mbps: 1}]}"),
     "population.links[0].share: must be <= 1, got 1.5"),
    (scenario_text(task="task: {model: mlp}"), "task.dataset: required key is missing"),
    (scenario_text(population="population: {clients: 2, devices: [{ms_per_sample: 1}], "
                              "links: [{up_mbps: -5, down_mbps: 1}]}"),
     "population.links[0].up_mbps: must be > 0, got -5"),
    (scenario_text(task="task: {dataset: mnist, data_root: /nonexistent/data}"), "task.dataset: dataset 'mnist' is not under"),
    (scenario_text(extra="algorithm: {codec: {up: {name: int, bits: 40}}}"), "algorithm.codec.up"),
    (scenario_text(extra="topology: ring"), "topology ring runs algorithm.name fibfl, got 'fedavg'"),
    (scenario_text(population="population: {clients: 2, devices: [{ms_per_sample: 1, gflops: 10}], "
                              "links: [{up_mbps: 1, down_mbps: 1}]}"),
     "population.devices[0]: give exactly one of ms_per_sample and gflops"),
    (scenario_text(task="task: {dataset: synthetic, model: firma_mlp}", selection="",
                   population="population: {clients: 4, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}",
                   extra="algorithm: {name: fibfl}"), "algorithm.name fibfl runs on topology: ring"),
    (scenario_text(selection="", extra="topology: ring\nalgorithm: {name: fibfl}"),
     "topology ring needs at least 3 clients"),
    (scenario_text(task="task: {dataset: synthetic, model: firma_mlp}",
                   population="population: {clients: 4, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}",
                   extra="topology: ring\nalgorithm: {name: fibfl}"), "selection: a ring has no server to select"),
    (scenario_text(selection="", population="population: {clients: 4, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}",
                   extra="topology: ring\nalgorithm: {name: fibfl}"), "task.model must be firma_mlp"),
    (scenario_text(extra="algorithm: {name: fedalign, privacy: {mechanism: laplace, epsilon: 1, clip: 1}}"),
     "FedAlign has its own"),
    (scenario_text(extra="algorithm: {name: fedalign, fedalign: {epsilon: 1}}"), "epsilon needs clip"),
    (scenario_text(selection="", task="task: {dataset: synthetic, model: firma_mlp}",
                   population="population: {clients: 4, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}], "
                              "availability: {kind: markov}}",
                   extra="topology: ring\nalgorithm: {name: fibfl}"), "set algorithm.firma.pass_timeout_s"),
    (scenario_text(extra="network: {transport: reno}"), "network.transport"),
    (scenario_text(extra="network: {tcp: {beta: 1.5}}"), "network.tcp.beta"),
    (scenario_text(extra="network: {mss: 0}"), "mss must be > 0"),
    (scenario_text(population="population: {clients: 2, devices: [{ms_per_sample: 1}], "
                              "links: [{up_mbps: 1, down_mbps: 1, queue_ms: -3}]}"), "population.links[0].queue_ms"),
])
def test_malformed_scenarios_give_one_clear_error(tmp_path, text, expected):
    path = write_scenario(tmp_path / "bad.yaml", text)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    res = run_cli("run", str(path), "--out", str(tmp_path / "out"), timeout=60)
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, res.stderr
    assert expected in errors[0]
    assert str(path) in errors[0]
    assert "Traceback" not in res.stderr
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    assert not (tmp_path / "out").exists()


def test_validate_command_accepts_good_and_sets(tmp_path):
    path = write_scenario(tmp_path / "good.yaml", scenario_text())
    res = run_cli("validate", str(path), "--set", "population.clients=3", timeout=60)
    assert res.returncode == 0, res.stderr
    assert "3 clients" in res.stdout
    res = run_cli("validate", str(path), "--set", "population.clients=0", timeout=60)
    assert res.returncode == 2 and "population.clients: must be >= 1, got 0" in res.stderr


@needs_mnist
def test_every_shipped_scenario_validates():
    shipped = sorted(REPO.glob("scenarios/*.yaml")) + sorted(REPO.glob("scenarios/paper/*.yaml"))
    shipped = [p for p in shipped if p.name != "profiles.yaml"]  # CIFAR-10 ones: schema only where its data is missing
    if importlib.util.find_spec("flwr") is None:  # the flower extra: tests/test_flower.py validates it where installed
        shipped = [p for p in shipped if p.name != "flower_edge.yaml"]
    assert len(shipped) >= 8
    # what `validate` does (tests above run the command itself), in this process: a fresh
    # interpreter per scenario cost more than the checks
    for path in shipped:
        sc, _ = load_scenario(path)
        try:
            task = load_task(sc)
        except ScenarioError:  # its data set is not here (CIFAR-10): the schema is what can be checked
            continue
        build_world(sc, task)


@needs_fashion_mnist
@pytest.mark.parametrize("scenario,rounds", [("ring_fibfl.yaml", 2), ("ring_fibfl_edge.yaml", 3), ("fedalign.yaml", 2)])
def test_shipped_ring_and_fedalign_scenarios_run(tmp_path, scenario, rounds):
    out = tmp_path / "run"
    # FibFL++'s first round averages the clients' independently initialised models (FIRMA's code),
    # which takes more than 3 rounds to recover from; this short run starts them from one model
    extra = ["--set", "algorithm.firma.init=shared"] if scenario == "ring_fibfl_edge.yaml" else []
    res = run_cli("run", str(REPO / "scenarios" / scenario), "--set", f"rounds={rounds}", *extra, "--out", str(out), timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == rounds
    assert summary["best_accuracy"] > 0.3  # ten classes: well above chance after a round or two
    if summary["topology"] == "ring":
        # FibFL++'s warm-up FedAvg is the only traffic to and from a server: its aggregator's
        assert summary["ring"]["warmup_aggregator"] == "server"
        assert summary["payload_bytes_peer"] > 0 and summary["payload_bytes_up"] > 0 and summary["payload_bytes_down"] > 0
        assert "peer-to-peer" in res.stdout
    else:
        assert summary["payload_bytes_peer"] == 0 and summary["payload_bytes_up"] > 0


@needs_mnist
def test_edge_1000_shortened(tmp_path):
    """The flagship, two rounds: 1000 clients check in, 130 are asked, the first 100 count. Local
    training is shortened (what is asserted is selection, first-k, codecs and DP, not learning)."""
    out = tmp_path / "edge"
    res = run_cli("run", str(REPO / "scenarios" / "edge_1000.yaml"), "--set", "rounds=2", "--set", "eval.every=0",
                  "--set", "algorithm.local_epochs=1", "--set", "algorithm.max_samples_per_round=20",
                  "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 2
    with open(out / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    for r in rounds:
        assert int(r["selected"]) == 130 and int(r["completed"]) == 100
    assert [int(r["bits_down"]) for r in rounds] == [32, 20]  # cosine over 2 rounds
    with open(out / "clients.csv") as f:
        clients = list(csv.DictReader(f))
    assert len(clients) == 260
    # resource-aware: at least 20 % battery at check-in, unless charging or mains powered
    assert all(c["battery"] == "" or c["charging"] == "True" or float(c["battery"]) >= 0.2 for c in clients)
    assert {c["outcome"] for c in clients} >= {"ok", "late"}
    assert summary["privacy"]["mechanism"] == "laplace" and summary["mean_noise_scale"] > 0
    # round.notify_closed: round 0's stragglers were told as it closed, and none of them began an
    # upload after hearing it (one already under way goes on, and is discarded)
    with open(out / "transfers.csv") as f:
        transfers = list(csv.DictReader(f))
    told = {t["dst"]: float(t["t_end"]) for t in transfers if t["kind"] == "closed" and t["round"] == "0"}
    counted = {c["client"] for c in clients if c["round"] == "0" and c["outcome"] == "ok"}
    assert told and not set(told) & counted
    assert not [t for t in transfers if t["kind"] == "update" and t["round"] == "0" and t["src"] in told
                and float(t["t_start"]) >= told[t["src"]]]


def test_population_scenario_shortened(tmp_path):
    """scenarios/population_100k.yaml at 2,000 clients: every device that is on at t = 0 checks in,
    P of the 1.3 P asked count, and the network reports the events it handled."""
    out = tmp_path / "pop"
    res = run_cli("run", str(REPO / "scenarios" / "population_100k.yaml"), "--set", "population.clients=2000",
                  "--set", "selection.clients_per_round=50", "--set", "task.synthetic.samples=4000", "--set", "rounds=3",
                  "--set", "run.device_log=full", "--out", str(out), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    with open(out / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    assert [(int(r["selected"]), int(r["completed"])) for r in rounds] == [(65, 50)] * 3
    settled = summary["emulated_time_s"] - 2.0  # a check-in begun later may end after the run stopped
    with open(out / "devices.csv") as f:
        came_back = sum(1 for d in csv.DictReader(f) if d["event"] == "online" and float(d["t"]) <= settled)
    with open(out / "transfers.csv") as f:
        checkins = [t for t in csv.DictReader(f) if t["kind"] == "checkin" and float(t["t_start"]) <= settled]
    with open(out / "population.csv") as f:
        population = len(list(csv.DictReader(f)))
    # Markov availability starts a device on with probability 1800 / 2400: about 1,500 of 2,000 at t = 0
    at_start = sum(1 for t in checkins if float(t["t_start"]) == 0.0)
    assert population == 2000 and 1400 < at_start < 1600
    assert len(checkins) == at_start + came_back  # and every device that came back checked in again
    network = summary["network"]
    assert network["events"] > 4 * at_start and network["events_per_s"] > 0
    # where the network's loop waited: for hosts to answer deliveries, for actors' work, ...
    waited = network["waited_s"]
    assert set(waited) <= {"start", "answers", "work", "messages", "realtime"} and "realtime" not in waited
    assert waited.get("answers", 0) > 0 and sum(waited.values()) <= network["clock_s"] + 1.0
