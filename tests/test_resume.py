"""Checkpoints and resume: a run whose conductor is SIGKILLed after a checkpoint, then resumed,
writes exactly the CSV files of a run that was never interrupted."""
import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import REPO, read_csv, run_cli, write_scenario

RESUMABLE = """
name: resumable
seed: 12
rounds: 12
task:
  dataset: synthetic
  model: mnist_cnn
  synthetic: {samples: 3000, test_samples: 100, shape: [1, 28, 28]}
population:
  clients: 8
  hosts: 2
  devices: [{ms_per_sample: 2, battery_wh: 2, battery_start: [0.3, 1.0]}]
  links: [{up_mbps: 20, down_mbps: 50, latency_ms: 30, loss: 0.01}]
  availability: {kind: markov, mean_on_s: 60, mean_off_s: 15}
selection: {clients_per_round: 4, checkin: true, checkin_wait_s: 1}
round: {timeout_s: 30}
algorithm: {local_epochs: 1, batch_size: 25, codec: {up: {name: topk, fraction: 0.1, error_feedback: true}}}
eval: {every: 1}
network: {transport: tcp}
run: {checkpoint_every: 1}
"""
CSVS = ("transfers", "clients", "devices")
# SCAFFOLD: the server's control variate and every client's own are checkpointed state too
SCAFFOLD = RESUMABLE.replace(
    "algorithm: {local_epochs: 1, batch_size: 25, codec: {up: {name: topk, fraction: 0.1, error_feedback: true}}}",
    "algorithm: {name: scaffold, local_epochs: 1, batch_size: 25, codec: {up: {name: fp32}, down: {name: fp32}}}").replace(
    "model: mnist_cnn", "model: mlp")  # fp32 both ways, twice the model: small enough to be in between rounds


# secure aggregation: its phases' table and totals resume too (a pinned cost table: both runs charge the same)
SECURE = RESUMABLE.replace(
    "algorithm: {local_epochs: 1, batch_size: 25, codec: {up: {name: topk, fraction: 0.1, error_feedback: true}}}",
    "algorithm: {local_epochs: 1, batch_size: 25, codec: {down: {name: int}}, secure_aggregation: {protocol: secagg, "
    "clip: 0.5, phase_timeout_s: 10, costs: {host_ms_per_sample: 1.0, keygen_s: 0.0001, agree_s: 0.0001, "
    "split_s: 0.000001, seal_s: 0.00001, word_s: 0.000000005, combine_s: 0.000001}}}").replace(
    "model: mnist_cnn", "model: mlp")


# realtime: the clock stands still while a checkpoint is written, and goes on from it on resume
REALTIME = RESUMABLE.replace("eval: {every: 1}", "eval: {every: 1}\nclock: {mode: realtime, speedup: 20}")


# the hierarchy: the cloud checkpoints after its rounds, the edges' state with it, edges.csv resumes too
HIERARCHY = RESUMABLE.replace(
    "algorithm: {local_epochs: 1, batch_size: 25, codec: {up: {name: topk, fraction: 0.1, error_feedback: true}}}",
    "topology: hierarchical\nhierarchy: {edges: 2, edge_rounds: 2}\n"
    "algorithm: {local_epochs: 1, batch_size: 25, codec: {up: {name: int}}}").replace(
    "selection: {clients_per_round: 4,", "selection: {clients_per_round: 2,").replace("model: mnist_cnn", "model: mlp")


# FedBuff: clients always train; it drains before each checkpoint (node/async_server.py)
FEDBUFF = RESUMABLE.replace("algorithm: {local_epochs: 1,", "algorithm: {name: fedbuff, options: {buffer_size: 2}, local_epochs: 1,")


# the FIRMA ring: its clients meet at a barrier after every round, where the run is checkpointed;
# FibFL++'s warm-up (2 rounds, through its own aggregator actor) is in the checkpointed part
RING = """
name: ring_resumable
seed: 7
rounds: 12
topology: ring
task:
  dataset: synthetic
  model: firma_mlp
  synthetic: {samples: 600, test_samples: 120, shape: [1, 28, 28], classes: 10}
population:
  clients: 6
  hosts: 2
  devices: [{ms_per_sample: 2, battery_wh: 2, battery_start: [0.3, 1.0]}]
  links: [{up_mbps: 8, down_mbps: 8, latency_ms: 10, loss: 0.01}]
algorithm:
  name: fibfl
  lr: 0.01
  batch_size: 20
  firma: {variant: fibfl++, epochs_head: 1, epochs_extractor: 1, warmup_aggregator: server}
eval: {every: 1}
network: {transport: tcp}
run: {checkpoint_every: 1}
"""


def checkpointed_rounds(out) -> int:
    try:
        return json.loads((out / "checkpoint" / "meta.json").read_text())["rounds"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def without_wall(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.mark.parametrize("scenario", [RESUMABLE, SCAFFOLD, SECURE, REALTIME, HIERARCHY, FEDBUFF, RING],
                         ids=["fedavg_topk_feedback", "scaffold", "secagg", "realtime", "hierarchy", "fedbuff", "ring"])
def test_a_killed_run_resumed_from_its_checkpoint_writes_what_an_uninterrupted_run_writes(tmp_path, scenario):
    path = write_scenario(tmp_path / "s.yaml", scenario)
    whole = tmp_path / "whole"
    res = run_cli("run", str(path), "--out", str(whole))
    assert res.returncode == 0, res.stderr[-2000:]
    assert not (whole / "checkpoint").exists()  # a completed run keeps no checkpoint

    broken = tmp_path / "broken"
    proc = subprocess.Popen([sys.executable, "-m", "emulator", "run", str(path), "--out", str(broken)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while checkpointed_rounds(broken) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint of round 3 came"
            time.sleep(0.01)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)  # the conductor dies; its children die with it
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    cut_at = checkpointed_rounds(broken)
    assert 3 <= cut_at < 12
    assert json.loads((broken / "summary.json").read_text())["status"] == "running"

    res = run_cli("resume", str(broken))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "round 12/12" in res.stdout and f"round {cut_at}/12" not in res.stdout  # only what was left ran again
    for name in CSVS + (("secure",) if scenario is SECURE else ()) + (("edges",) if scenario is HIERARCHY else ()):
        assert read_csv(broken / f"{name}.csv") == read_csv(whole / f"{name}.csv"), name
    assert without_wall(read_csv(broken / "rounds.csv")) == without_wall(read_csv(whole / "rounds.csv"))
    summary = json.loads((broken / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 12
    assert summary["resumed"][0]["from_round"] == cut_at
    assert summary["best_accuracy"] == json.loads((whole / "summary.json").read_text())["best_accuracy"]
    if scenario is REALTIME:  # the resumed part's lag, measured from the checkpoint's instant on
        assert summary["clock"]["mode"] == "realtime" and summary["clock"]["lag"]["events"] > 0

    again = run_cli("resume", str(broken))
    assert again.returncode == 2 and "the run completed; there is nothing to resume" in again.stderr


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    res = run_cli("resume", str(tmp_path))
    assert res.returncode == 2 and "not a run directory" in res.stderr and "Traceback" not in res.stderr
    out = tmp_path / "run"
    assert run_cli("run", str(write_scenario(tmp_path / "s.yaml", RESUMABLE.replace("run: {checkpoint_every: 1}\n", "")
                                             .replace("rounds: 12", "rounds: 1"))), "--out", str(out)).returncode == 0
    (out / "summary.json").write_text(json.dumps({"status": "failed"}))
    res = run_cli("resume", str(out))
    assert res.returncode == 2 and "no checkpoint to resume from (set run.checkpoint_every" in res.stderr


def test_no_checkpoint_while_clients_still_upload(tmp_path):
    # a 1 s deadline against uploads of several seconds: every round ends with transfers in flight
    text = RESUMABLE.replace("round: {timeout_s: 30}", "round: {timeout_s: 1}").replace("rounds: 12", "rounds: 3")
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    info = json.loads((out / "summary.json").read_text())["checkpoint"]
    assert info["skipped"] >= 1
    assert info["last_skip"]["why"] == "transfers in flight" or "working" in info["last_skip"]["why"]


def test_a_ring_takes_checkpoints_at_its_barriers(tmp_path):
    """The ring was refused checkpoints (no instant without a client working); its clients now
    meet at a barrier after every K-th round (the resume test above runs one)."""
    text = """
rounds: 2
topology: ring
task: {dataset: synthetic, model: firma_mlp}
population: {clients: 4, devices: [{ms_per_sample: 1}], links: [{up_mbps: 1, down_mbps: 1}]}
algorithm: {name: fibfl}
run: {checkpoint_every: 1}
"""
    path = write_scenario(tmp_path / "s.yaml", text)
    res = run_cli("validate", str(path))
    assert res.returncode == 0, res.stderr
    from emulator.scenario import load_scenario  # noqa: PLC0415
    from emulator.world import build_world  # noqa: PLC0415

    assert build_world(load_scenario(path)[0]).ring.checkpoint_every == 1
