"""trace.json (issue 45, item 4): a run as Chrome Trace Event JSON for Perfetto UI, with a track per
client whose slices last exactly what clients.csv says, a slice per round as rounds.csv says, and the
payload bytes in flight."""
import json

import pytest

from conftest import read_csv, run_cli, write_scenario

SCENARIO = """
name: traced
rounds: 2
task: {dataset: synthetic, model: mlp, synthetic: {samples: 120, test_samples: 40, shape: [1, 28, 28], classes: 10}}
population: {clients: 5, hosts: 1, devices: [{ms_per_sample: 1, battery_wh: 0.01, battery_start: [0.5, 0.9], train_w: 3, j_per_mb_up: 1}],
             links: [{up_mbps: 10, down_mbps: 20, latency_ms: 10}]}
selection: {clients_per_round: 3}
server: {aggregate_ms: 40}
algorithm: {local_epochs: 1, batch_size: 10, lr: 0.05}
"""


def test_a_runs_trace_is_its_records_as_a_timeline(tmp_path):
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO)), "--trace", "--set", "run.device_log=full",
                  "--out", str(out), timeout=120)
    assert res.returncode == 0, res.stderr
    trace = json.loads((out / "trace.json").read_text())
    events = trace["traceEvents"]
    tracks = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 2}
    clients = read_csv(out / "clients.csv")
    assert set(tracks) == {c["client"] for c in clients}  # a track per client that took part
    slices = {(e["tid"], e["name"], e["args"]["round"]): e for e in events if e["ph"] == "X" and e["pid"] == 2}
    for c in clients:
        for phase in ("download", "compute", "upload"):
            start, end = float(c[f"{phase}_start"]), float(c[f"{phase}_end"])
            s = slices[(tracks[c["client"]], phase, int(c["round"]))]
            assert s["ts"] == pytest.approx(start * 1e6) and s["dur"] == pytest.approx((end - start) * 1e6)
    rounds = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == 0]
    aggregation = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == 1]
    assert [(a["ts"] + a["dur"], a["dur"]) for a in aggregation] == [
        pytest.approx((float(r["t_end"]) * 1e6, 40e3)) for r in read_csv(out / "rounds.csv")]
    assert [(r["ts"], r["ts"] + r["dur"]) for r in rounds] == [
        pytest.approx((float(r["t_start"]) * 1e6, float(r["t_end"]) * 1e6)) for r in read_csv(out / "rounds.csv")]
    in_flight = [e["args"]["bytes"] for e in events if e["ph"] == "C" and e["pid"] == 1]
    assert max(in_flight) > 0 and in_flight[-1] == 0  # every transfer that began ended
    # a battery counter per client, its level at each of its device events, as devices.csv says
    devices = [d for d in read_csv(out / "devices.csv") if d["battery"]]
    batteries = [e for e in events if e["ph"] == "C" and e["pid"] == 3]
    assert len(batteries) == len(devices) > 0
    for e, d in zip(batteries, devices):
        assert e["name"] == f"battery {d['client']}" and e["args"]["level"] == pytest.approx(float(d["battery"]))
        assert e["ts"] == pytest.approx(float(d["t"]) * 1e6)
    assert len({e["name"] for e in batteries}) == len({d["client"] for d in devices}) >= 3 and min(e["args"]["level"] for e in batteries) < 0.9


def test_the_trace_command_refuses_what_is_not_a_run(tmp_path):
    res = run_cli("trace", str(tmp_path), timeout=60)
    assert res.returncode == 2 and "not a run directory" in res.stderr and len(res.stderr.strip().splitlines()) == 1
