"""Corrupted messages on real processes: the network truncates every message one actor sends
(a `truncate` fault). The receivers must reject them with a named reason, count them, and keep
running; the run still finishes with every round recorded."""
import csv
import json

import pytest

from conftest import run_cli, write_scenario

BASE = """
name: corrupt
seed: 5
rounds: 3
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 300, test_samples: 50}
population:
  clients: 3
  hosts: 1
  devices: [{ms_per_sample: 1}]
  links: [{up_mbps: 20, down_mbps: 20, latency_ms: 5}]
selection: {clients_per_round: 3}
round: {timeout_s: 30}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""


def run(tmp_path, faults: str):
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", BASE + faults)), "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(out / "rounds.csv") as f:
        rounds = list(csv.DictReader(f))
    return res, rounds, json.loads((out / "summary.json").read_text())


def test_server_rejects_truncated_updates_and_keeps_going(tmp_path):
    res, rounds, summary = run(tmp_path, "faults: [{kind: truncate, actor: c0001}]\n")
    assert summary["status"] == "completed"
    assert len(rounds) == 3
    for row in rounds:
        assert (row["completed"], row["failed"], row["rejected"]) == ("2", "1", "1")
        # the bad update did not hold the round up until the deadline
        assert float(row["duration_s"]) < 30
    assert "rejected update from c0001" in res.stderr
    assert "Traceback" not in res.stderr


def test_clients_reject_a_truncated_task_and_the_deadline_closes_the_round(tmp_path):
    res, rounds, summary = run(tmp_path, "faults: [{kind: truncate, actor: server, duration_s: 1}]\n")
    assert summary["status"] == "completed"
    first, *rest = rounds
    assert (first["completed"], first["failed"]) == ("0", "3")
    assert float(first["duration_s"]) == pytest.approx(30.0)
    for row in rest:  # the fault is over: later rounds are clean
        assert (row["completed"], row["failed"]) == ("3", "0")
    rejections = [i for i in summary["incidents"] if i["what"] == "rejected"]
    assert sorted(i["actor"] for i in rejections) == ["c0000", "c0001", "c0002"]
    assert all("bytes" in i["error"] or "length" in i["error"] for i in rejections), rejections
    assert "Traceback" not in res.stderr


def test_fault_naming_an_unknown_actor_is_a_clear_error(tmp_path):
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", BASE + "faults: [{kind: truncate, actor: c9}]\n")),
                  "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "faults[0].actor: no actor named 'c9'" in res.stderr
    assert "Traceback" not in res.stderr
