"""Too few eligible clients: the server waits (emulated) for check-ins up to selection.wait_s,
then runs with whoever is eligible or skips the round, and says so; a run in which no round ever
had a client ends as no_clients (exit code 3)."""
import json

import pytest

from conftest import read_csv, run_cli, write_scenario
from node.strategy import eligible, shortfall

BATTERY = """
name: eligibility
seed: 9
rounds: 3
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 600, test_samples: 20}
population:
  clients: 12
  hosts: 2
  devices: [{ms_per_sample: 1, battery_wh: 10, battery_start: BATTERY}]
  links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]
selection: {clients_per_round: 12, policy: resource_aware, min_battery: 0.5, checkin: true, checkin_wait_s: 2,
            min_clients: MIN, wait_s: 20}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""


def run(tmp_path, battery: str, min_clients: int):
    out = tmp_path / "run"
    text = BATTERY.replace("BATTERY", battery).replace("MIN", str(min_clients))
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out), timeout=180)
    summary = json.loads((out / "summary.json").read_text())
    return res, summary, read_csv(out / "rounds.csv")


def test_pure_eligibility_and_its_shortfall_by_threshold():
    pool = {"a": {"battery": 0.2}, "b": {"battery": 0.9, "cpu_load": 0.95}, "c": {"battery": 0.1, "charging": True},
            "d": {"up_mbps": 0.5}}
    params = dict(min_battery=0.5, max_cpu_load=0.9, min_up_mbps=1.0)
    assert eligible("resource_aware", pool, **params) == ["c"]
    assert eligible("random", pool, **params) == ["a", "b", "c", "d"]
    assert shortfall(pool, **params) == {"min_battery": 1, "max_cpu_load": 1, "min_up_mbps": 1}


def test_nobody_meets_the_battery_threshold_every_round_is_skipped_and_the_run_says_why(tmp_path):
    res, summary, rounds = run(tmp_path, "[0.1, 0.4]", 1)
    assert res.returncode == 3, res.stderr[-2000:]
    assert summary["status"] == "no_clients"
    assert "12 of 12 checked in; 12 fail selection.min_battery" in summary["reason"]
    assert "no_clients: no round had an eligible client" in res.stderr and "Traceback" not in res.stderr
    # each round waits 20 emulated seconds for check-ins after the 2 s check-in window, then is skipped
    assert [(float(r["t_start"]), float(r["t_end"]), int(r["selected"])) for r in rounds] == [(2, 22, 0), (22, 42, 0), (42, 62, 0)]
    notices = [i for i in summary["incidents"] if i["what"] == "no_eligible_clients"]
    assert [(n["round"], n["checked_in"], n["eligible"], n["failing"], n["action"]) for n in notices] == [
        (r, 12, 0, {"min_battery": 12}, "skipped") for r in range(3)]


def test_fewer_than_min_clients_waits_then_runs_with_whoever_is_eligible(tmp_path):
    res, summary, rounds = run(tmp_path, "[0.0, 1.0]", 12)
    assert res.returncode == 0, res.stderr[-2000:]
    assert summary["status"] == "completed"
    first = rounds[0]
    assert float(first["t_start"]) == pytest.approx(22.0)  # 2 s of check-ins, then 20 s waiting for more
    notices = [i for i in summary["incidents"] if i["what"] == "no_eligible_clients"]
    assert notices[0]["action"] == "ran with fewer" and notices[0]["min_clients"] == 12
    assert 0 < int(first["selected"]) == notices[0]["eligible"] < 12
    assert notices[0]["failing"] == {"min_battery": 12 - notices[0]["eligible"]}
