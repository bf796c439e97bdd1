"""FedBuff: the staleness weights and the buffered step by hand, then real processes with
hand-built client times: the server steps at exactly the K-th arrival, with the staleness a
hand-drawn timeline gives."""
import math

import numpy as np
import pytest

from conftest import read_csv, run_cli, write_scenario
from node.strategies import ClientUpdate, strategy_class
from node.strategies.fedbuff import staleness_weight


def test_staleness_weights_by_hand():
    assert staleness_weight(0) == 1.0
    assert staleness_weight(3) == pytest.approx(0.5)  # 1/sqrt(1+3)
    assert staleness_weight(8, exponent=1.0) == pytest.approx(1 / 9)
    assert staleness_weight(7, "constant") == 1.0
    assert staleness_weight(4, "hinge", a=10, b=4) == 1.0
    assert staleness_weight(6, "hinge", a=10, b=4) == pytest.approx(1 / 21)
    with pytest.raises(ValueError):
        staleness_weight(-1)


def update(name, delta, staleness, samples=1.0):
    return ClientUpdate(name, {}, {"w": np.array(delta, dtype=np.float32)}, samples, {}, staleness)


def test_buffer_steps_at_k_and_weights_a_stale_update():
    fedbuff = strategy_class("fedbuff")({"buffer_size": 2, "server_lr": 0.5})
    w = {"w": np.array([1.0, 1.0], dtype=np.float32)}
    fedbuff.on_update(update("a", [2.0, 0.0], 0))
    assert not fedbuff.ready()
    fedbuff.on_update(update("b", [0.0, 4.0], 3))  # weight 1/2
    assert fedbuff.ready()
    out = fedbuff.aggregate(w)
    # w + 0.5 * (1 * [2, 0] + 0.5 * [0, 4]) / 2
    np.testing.assert_allclose(out["w"], [1.5, 1.5])
    assert out["w"].dtype == np.float32
    assert not fedbuff.ready() and fedbuff.aggregate(w)["w"].tolist() == [1.0, 1.0]  # the buffer is forgotten


def test_sample_weighting_and_max_staleness():
    fedbuff = strategy_class("fedbuff")({"buffer_size": 2, "weighting": "samples", "max_staleness": 2})
    assert fedbuff.accepts(2) and not fedbuff.accepts(3)
    fedbuff.on_update(update("a", [3.0], 0, samples=30))
    fedbuff.on_update(update("b", [8.0], 1, samples=10))  # 1/sqrt(2)
    out = fedbuff.aggregate({"w": np.zeros(1, dtype=np.float32)})
    assert out["w"][0] == pytest.approx((30 * 3.0 + 10 * 8.0 / math.sqrt(2)) / 40, rel=1e-6)


# Three clients on identical, fast links; their compute alone spaces the arrivals: 1 s, 2.4 s
# and 6.5 s per task (100 samples each). With all three always training and K = 2, the timeline
# by hand (F, M, S: arrival times; staleness = steps taken while the client trained):
#   F@1 s0, F@2 s0 -> step 0 | M@2.4 s1, F@3 s0 -> step 1 | F@4 s0, M@4.8 s1 -> step 2
#   F@5 s1, F@6 s0 -> step 3 | S@6.5 s4, F@7 s0 -> step 4 (the last)
SCENARIO = """
name: fedbuff
seed: 1
rounds: 5
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 300, test_samples: 50, shape: [1, 28, 28], classes: 10}
population:
  clients: 3
  hosts: 3
  devices:
    - {name: F, share: 0.34, ms_per_sample: 10}
    - {name: M, share: 0.33, ms_per_sample: 24}
    - {name: S, share: 0.33, ms_per_sample: 65}
  links: [{name: lan, up_mbps: 1000, down_mbps: 1000, latency_ms: 0}]
selection: {clients_per_round: 3}
algorithm:
  name: fedbuff
  local_epochs: 1
  batch_size: 20
  options: {buffer_size: 2%s}
eval: {every: 0}
network: {transport: fluid}
"""
EXPECTED = {  # step -> (hand time, [(device, staleness) aggregated])
    0: (2.0, [("F", 0), ("F", 0)]),
    1: (3.0, [("M", 1), ("F", 0)]),
    2: (4.8, [("F", 0), ("M", 1)]),
    3: (6.0, [("F", 1), ("F", 0)]),
    4: (7.0, [("S", 4), ("F", 0)]),
}


def run(tmp_path, options=""):
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO % options)), "--out", str(out), "--quiet", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    device = {r["client"]: r["device"] for r in read_csv(out / "population.csv")}
    return out, device


def steps(out, device):
    rows = read_csv(out / "clients.csv")
    by_step = {}
    for r in rows:
        by_step.setdefault(int(r["round"]), []).append(r)
    return by_step


def test_server_steps_at_every_kth_arrival_with_hand_staleness(tmp_path):
    out, device = run(tmp_path)
    rounds = read_csv(out / "rounds.csv")
    assert [int(r["round"]) for r in rounds] == [0, 1, 2, 3, 4]
    by_step = steps(out, device)
    for r in rounds:
        step = int(r["round"])
        hand_t, hand = EXPECTED[step]
        ok = [c for c in by_step[step] if c["outcome"] == "ok"]
        got = sorted(((device[c["client"]], int(c["staleness"])) for c in ok), key=lambda x: float(
            next(c["upload_end"] for c in ok if device[c["client"]] == x[0] and int(c["staleness"]) == x[1])))
        assert got == hand, (step, got)
        # exactly at the K-th arrival: the latest upload of the step ends at the step's end
        assert float(r["t_end"]) == max(float(c["upload_end"]) for c in ok)
        # each arrival is its dispatch plus two ~1.6 ms transfers plus the device's compute
        assert float(r["t_end"]) == pytest.approx(hand_t, abs=0.05)
        assert int(r["completed"]) == 2
        assert float(r["staleness_max"]) == max(s for _, s in hand)
    # every dispatch of a step's rows was made with the model of an earlier or the same step
    for c in read_csv(out / "clients.csv"):
        assert float(c["selected_t"]) <= float(c["download_start"]) < float(c["upload_end"])


def test_max_staleness_discards_the_straggler(tmp_path):
    out, device = run(tmp_path, ", max_staleness: 3")
    by_step = steps(out, device)
    straggler = [c for c in by_step[4] if device[c["client"]] == "S"]
    assert [(c["outcome"], c["staleness"]) for c in straggler] == [("stale", "4")]
    ok = sorted((device[c["client"]], int(c["staleness"])) for c in by_step[4] if c["outcome"] == "ok")
    assert ok == [("F", 0), ("M", 1)]  # M's third task (dispatched at 4.8 with version 3) closes step 4 at 7.2
    last = read_csv(out / "rounds.csv")[-1]
    assert float(last["t_end"]) == pytest.approx(7.2, abs=0.05)


# ---- semi-asynchronous FedAvg: a deadline round that keeps late updates ---------------------------
def test_semiasync_weights_a_late_update_by_samples_and_staleness():
    semi = strategy_class("semiasync")({"exponent": 1.0, "max_staleness": 2})
    g = {"w": np.zeros(1, dtype=np.float32)}
    semi.on_update(ClientUpdate("a", {"w": np.array([2.0], dtype=np.float32)}, {}, 10.0, {}, 0))
    semi.on_update(ClientUpdate("b", {"w": np.array([8.0], dtype=np.float32)}, {}, 10.0, {}, 1))  # weight 10 / 2
    assert semi.aggregate(g)["w"][0] == pytest.approx((10 * 2 + 5 * 8) / 15)
    assert semi.accepts(2) and not semi.accepts(3)


def test_semiasync_late_updates_join_a_later_round(tmp_path):
    text = (SCENARIO % "").replace("  name: fedbuff\n", "  name: semiasync\n").replace("  options: {buffer_size: 2}\n", "")
    text += "round: {timeout_s: 3.0}\n"
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out), "--quiet", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    device = {r["client"]: r["device"] for r in read_csv(out / "population.csv")}
    rows = read_csv(out / "clients.csv")
    joined = [r for r in rows if r["outcome"] == "ok_stale"]
    assert joined and all(device[r["client"]] == "S" for r in joined)  # only the 6.5 s client misses a 3 s deadline
    for r in joined:  # it was cut off (late) in the round it trained for, `staleness` rounds earlier
        origin = int(r["round"]) - int(r["staleness"])
        assert int(r["staleness"]) >= 1
        assert any(o["client"] == r["client"] and int(o["round"]) == origin and o["outcome"] == "late" for o in rows)
    assert {r["outcome"] for r in rows if device[r["client"]] != "S"} == {"ok"}
