"""Realtime clock mode: the same scenario gives the same emulated times and bytes as virtual
mode, takes about emulated time / speedup of wall time, and reports its lag."""
import json

from conftest import read_csv, run_cli, write_scenario

SCENARIO = """
name: realtime
seed: 3
rounds: 2
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 200, test_samples: 50}
population:
  clients: 2
  hosts: 1
  devices: [{ms_per_sample: 300}]
  links:
    - {name: slow, share: 0.5, up_mbps: 1, down_mbps: 2, latency_ms: 50}
    - {name: fast, share: 0.5, up_mbps: 4, down_mbps: 8, latency_ms: 20}
selection: {clients_per_round: 2}
algorithm: {local_epochs: 1, batch_size: 20, lr: 0.1}
eval: {every: 0}
"""
SPEEDUP = 10



def run(tmp_path, name, *sets):
    out = tmp_path / name
    args = [a for s in sets for a in ("--set", s)]
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO)), *args, "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads((out / "summary.json").read_text())


def test_realtime_matches_virtual_and_runs_at_the_speedup(tmp_path):
    virtual_dir, virtual = run(tmp_path, "virtual")
    real_dir, real = run(tmp_path, "real", "clock.mode=realtime", f"clock.speedup={SPEEDUP}")
    keep = ("round", "src", "dst", "payload_bytes", "wire_bytes", "link_bytes", "t_start", "t_end", "outcome")
    strip = lambda rows: sorted(tuple(r[k] for k in keep) for r in rows)  # noqa: E731
    assert strip(read_csv(real_dir / "transfers.csv")) == strip(read_csv(virtual_dir / "transfers.csv"))
    for a, b in zip(read_csv(real_dir / "rounds.csv"), read_csv(virtual_dir / "rounds.csv")):
        assert (a["t_end"], a["payload_bytes_up"], a["wire_bytes_down"]) == (b["t_end"], b["payload_bytes_up"], b["wire_bytes_down"])

    emulated = real["emulated_time_s"]
    assert emulated > 60  # 2 rounds of 100 samples x 300 ms plus the transfers
    clocked = real["wall_time_s"] - real["startup_s"]
    assert emulated / SPEEDUP <= clocked <= emulated / SPEEDUP * 1.5 + 1.0
    # virtual does not wait (6 s of pacing leave room for a loaded machine's slower real work)
    assert virtual["wall_time_s"] - virtual["startup_s"] < emulated / SPEEDUP

    clock = real["clock"]
    assert clock["mode"] == "realtime" and clock["speedup"] == SPEEDUP
    assert clock["lag"]["events"] > 0
    assert 0 <= clock["lag"]["mean_s"] <= clock["lag"]["p99_s"] <= clock["lag"]["max_s"]
    assert clock["faithful"] == (clock["lag"]["max_s"] <= clock["lag_bound_s"])
    assert "lag" not in virtual["clock"]


def test_realtime_flags_an_unfaithful_run(tmp_path):
    """At a speedup the machine cannot keep up with (training takes longer than its modelled time
    divided by k), the lag exceeds a tiny bound and the run is flagged."""
    _, real = run(tmp_path, "fast", "clock.mode=realtime", "clock.speedup=100000", "clock.lag_bound_s=0.001",
                  "population.devices[0].ms_per_sample=0.01")
    assert real["status"] == "completed"
    assert real["clock"]["faithful"] is False
    assert real["clock"]["lag"]["max_s"] > 0.001
