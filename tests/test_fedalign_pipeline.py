"""FedAlign on real processes: the statistics round trip is real messages with exact bytes and
the right order in emulated time, and the update is clipped and noised as configured."""
import json

import pytest

from conftest import read_csv, run_cli, write_scenario
from node.accounting import analytic_gaussian_sigma
from node.fedalign import update_noise_scale

INPUTS = 3 * 8 * 8
MLP = INPUTS * 64 + 64 + 64 * 10 + 10

SCENARIO = """
name: fedalign_test
seed: 4
rounds: 2
task:
  dataset: synthetic
  model: mlp
  partition: {kind: dirichlet, alpha: 1.0, min_size: 20}
  synthetic: {samples: 400, test_samples: 100, shape: [3, 8, 8], classes: 10}
population:
  clients: 4
  hosts: 2
  devices: [{ms_per_sample: 1}]
  links: [{up_mbps: 10, down_mbps: 20, latency_ms: 5}]
server:
  link: {latency_ms: 1}
selection: {clients_per_round: 3}
algorithm:
  name: fedalign
  local_epochs: 1
  batch_size: 16
  lr: 0.05
  fedalign: {sample_fraction: 0.75, granularity: GRANULARITY, stat_epsilon: 5.0, clip: 2.0, epsilon: 1000.0}
eval: {every: 1, split: clients}
"""


def run(tmp_path, granularity):
    out = tmp_path / granularity
    path = write_scenario(tmp_path / f"{granularity}.yaml", SCENARIO.replace("GRANULARITY", granularity))
    res = run_cli("run", str(path), "--out", str(out), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("granularity,values", [("channel", 3), ("dimension", INPUTS)])
def test_statistics_round_trip_is_real_messages_in_order(tmp_path, granularity, values):
    out = run(tmp_path, granularity)
    transfers = read_csv(out / "transfers.csv")
    for rnd in (0, 1):
        mine = [t for t in transfers if int(t["round"]) == rnd]
        by_kind = {k: [t for t in mine if t["kind"] == k] for k in ("task", "stats", "moments", "update")}
        assert [len(by_kind[k]) for k in ("task", "stats", "moments", "update")] == [3, 3, 3, 3]
        # two moments (moments: 2) of `values` float32 numbers each way: E[x], E[x^2] up, mean and variance down
        assert {int(t["payload_bytes"]) for t in by_kind["stats"] + by_kind["moments"]} == {4 * values * 2}
        assert {t["dst"] for t in by_kind["stats"]} == {"server"} and {t["src"] for t in by_kind["moments"]} == {"server"}
        assert {int(t["payload_bytes"]) for t in by_kind["update"]} == {4 * MLP}
        last_stats = max(float(t["t_end"]) for t in by_kind["stats"])
        assert {float(t["t_start"]) for t in by_kind["moments"]} == {last_stats}  # sent when the last one is in
        for client in {t["src"] for t in by_kind["stats"]}:
            task = next(t for t in by_kind["task"] if t["dst"] == client)
            stats = next(t for t in by_kind["stats"] if t["src"] == client)
            moments = next(t for t in by_kind["moments"] if t["dst"] == client)
            update = next(t for t in by_kind["update"] if t["src"] == client)
            assert float(task["t_end"]) == float(stats["t_start"])  # statistics first, before any training
            assert float(moments["t_end"]) < float(update["t_start"])  # training only on aligned data
    rows = read_csv(out / "rounds.csv")
    assert all(int(r["completed"]) == 3 for r in rows)
    # statistics bytes count in the round: 3 x (task + moments) down, 3 x (stats + update) up
    assert int(rows[0]["payload_bytes_up"]) == 3 * (4 * MLP + 8 * values)
    assert int(rows[0]["payload_bytes_down"]) == 3 * (4 * MLP + 8 * values)


def test_update_is_clipped_and_noised(tmp_path):
    out = run(tmp_path, "channel")
    clients = read_csv(out / "clients.csv")
    sigma = update_noise_scale(2.0, 1000.0, 1e-5)
    assert len(clients) == 6 and all(c["outcome"] == "ok" for c in clients)
    assert all(float(c["noise_scale"]) == pytest.approx(sigma) for c in clients)
    assert all(float(c["update_norm"]) > 0 for c in clients)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["best_accuracy"] is not None
    # the ledger: per participation one statistics release (5, 1e-5) and one update release (1000, 1e-5)
    spent = summary["privacy_spent"]
    rho_update = 4.0**2 / (2 * sigma**2)  # sensitivity 2C = 4
    rho_stats = 1 / (2 * analytic_gaussian_sigma(5.0, 1e-5, 1.0) ** 2)  # sigma scales with the sensitivity
    for name, ledger in spent["per_client"].items():
        times = sum(c["client"] == name for c in clients)
        assert ledger["releases"] == 2 * times
        assert ledger["basic"]["epsilon"] == pytest.approx(times * 1005.0)
        assert ledger["basic"]["delta"] == pytest.approx(times * 2e-5)
        assert ledger["zcdp"]["rho"] == pytest.approx(times * (rho_update + rho_stats))
    assert spent["clients"] == len({c["client"] for c in clients})


def test_damaged_statistics_are_rejected_and_the_round_goes_on_without_that_client(tmp_path):
    text = SCENARIO.replace("GRANULARITY", "channel").replace("clients_per_round: 3", "clients_per_round: 4") + \
        "faults: [{kind: truncate, actor: c0001, at_s: 0}]\n"
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rejected statistics from c0001" in res.stderr and "Traceback" not in res.stderr
    rows = read_csv(out / "rounds.csv")
    assert [(int(r["completed"]), int(r["rejected"])) for r in rows] == [(3, 1), (3, 1)]  # no deadline needed
    transfers = read_csv(out / "transfers.csv")
    assert not [t for t in transfers if t["dst"] == "c0001" and t["kind"] == "moments"]
    clients = read_csv(out / "clients.csv")
    assert {c["outcome"] for c in clients if c["client"] == "c0001"} == {"rejected"}
