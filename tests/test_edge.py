"""The heterogeneous edge on real processes: shared links, devices going offline, links going
down, battery-aware selection, over-selection, all with exact expected times where the link
arithmetic allows, and determinism of the whole thing."""
import json

import pytest

from conftest import link_bytes, read_csv, run_cli, write_scenario
from emulator.scenario import load_scenario
from emulator.world import build_world



def run(tmp_path, text, name="run", *sets):
    out = tmp_path / name
    args = [a for s in sets for a in ("--set", s)]
    res = run_cli("run", str(write_scenario(tmp_path / f"{name}.yaml", text)), *args, "--out", str(out), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


# ---- max-min sharing of the server's 10 Mbit/s ingress --------------------------------------------
SHARED = """
name: shared
seed: 1
rounds: 1
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 300, test_samples: 20, shape: [1, 64, 64]}
population:
  clients: 3
  hosts: 1
  devices:
    - {name: fast, share: 0.6667, ms_per_sample: 10}
    - {name: slow, share: 0.3333, ms_per_sample: 14}
  links: [{up_mbps: 1000, down_mbps: 1000}]
server: {link: {up_mbps: null, down_mbps: 10}}
selection: {clients_per_round: 3}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""


def test_uploads_share_the_server_link_max_min_fairly(tmp_path):
    out = run(tmp_path, SHARED)
    device = {r["client"]: r["device"] for r in read_csv(out / "population.csv")}
    ups = {r["src"]: r for r in read_csv(out / "transfers.csv") if r["kind"] == "update"}
    downs = {r["dst"]: r for r in read_csv(out / "transfers.csv") if r["kind"] == "task"}
    assert len(ups) == 3 and sorted(device.values()) == ["fast", "fast", "slow"]
    assert len({r["wire_bytes"] for r in ups.values()}) == 1  # equal uploads, so the arithmetic below holds
    bits = 8 * link_bytes(int(next(iter(ups.values()))["wire_bytes"]))
    assert bits > 8e6  # about 1 MB each
    t_down = 8 * link_bytes(int(next(iter(downs.values()))["wire_bytes"])) / 1e9
    fast = [c for c in ups if device[c] == "fast"]
    slow = next(c for c in ups if device[c] == "slow")
    t0 = t_down + 100 * 10 / 1000  # both fast clients start uploading together
    t3 = t_down + 100 * 14 / 1000  # the slow one joins 0.4 s later
    for c in fast:
        assert float(ups[c]["t_start"]) == pytest.approx(t0, abs=1e-9)
    assert float(ups[slow]["t_start"]) == pytest.approx(t3, abs=1e-9)
    # 5 Mbit/s each until t3; then 10/3 Mbit/s each until the first two finish; then 10 Mbit/s.
    left = bits - 5e6 * (t3 - t0)
    t_pair = t3 + left / (10e6 / 3)
    t_last = t_pair + (bits - (10e6 / 3) * (t_pair - t3)) / 10e6
    for c in fast:
        assert float(ups[c]["t_end"]) == pytest.approx(t_pair, rel=1e-9)
    assert float(ups[slow]["t_end"]) == pytest.approx(t_last, rel=1e-9)
    # the same two uploads alone would have taken bits / 5 Mbit/s: the third really slowed them
    assert t_pair > t0 + bits / 5e6


# ---- a device going offline mid-upload, and a link going down ------------------------------------
OFFLINE = """
name: offline
seed: 2
rounds: 1
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 200, test_samples: 20, shape: [1, 64, 64]}
population:
  clients: 2
  hosts: 1
  devices:
    - {name: quick, share: 0.5, ms_per_sample: 1}
    - {name: steady, share: 0.5, ms_per_sample: 10}
  links: [{up_mbps: 10, down_mbps: 1000}]
server: {link: {up_mbps: null, down_mbps: null}}
selection: {clients_per_round: 2}
round: {timeout_s: 5}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""
T_OFF = 1.3


@pytest.mark.parametrize("how", ["fedscale_trace", "link_down_fault"])
def test_going_offline_mid_upload_aborts_it_and_the_deadline_closes_the_round(tmp_path, how):
    sc, _ = load_scenario(write_scenario(tmp_path / "probe.yaml", OFFLINE))
    steady = next(c.profile.name for c in build_world(sc).clients if c.device == "steady")
    if how == "fedscale_trace":
        trace = {str(i): {"active": [0], "inactive": [T_OFF] if f"c{i:04d}" == steady else [], "finish_time": 1e6}
                 for i in range(2)}
        (tmp_path / "behaviour.json").write_text(json.dumps(trace))
        extra = "  availability: {kind: trace, trace: behaviour.json}\n"
        text = OFFLINE.replace("  links: [{up_mbps: 10, down_mbps: 1000}]\n", "  links: [{up_mbps: 10, down_mbps: 1000}]\n" + extra)
        expected, outcome = "offline", "dropped_offline"
    else:
        text = OFFLINE + f"faults: [{{kind: link_down, actor: {steady}, at_s: {T_OFF}}}]\n"
        expected, outcome = "link_down", "dropped_link_down"
    out = run(tmp_path, text)
    upload = next(r for r in read_csv(out / "transfers.csv") if r["kind"] == "update" and r["src"] == steady)
    assert upload["outcome"] == expected
    assert float(upload["t_end"]) == pytest.approx(T_OFF)
    sent = (T_OFF - float(upload["t_start"])) * 10e6 / 8
    assert int(upload["wasted_bytes"]) == pytest.approx(sent, abs=1)
    assert 0 < int(upload["wasted_bytes"]) < int(upload["link_bytes"])
    (row,) = read_csv(out / "rounds.csv")
    assert (row["completed"], row["failed"]) == ("1", "1")
    assert float(row["t_end"]) == pytest.approx(5.0)  # closed by its deadline
    assert int(row["wasted_bytes"]) == int(upload["wasted_bytes"])
    outcomes = {r["client"]: r["outcome"] for r in read_csv(out / "clients.csv")}
    assert outcomes[steady] == outcome and list(outcomes.values()).count("ok") == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["client_outcomes"] == {"ok": 1, outcome: 1}


# ---- battery-aware selection -------------------------------------------------------------------------
BATTERY = """
name: battery
seed: 9
rounds: 1
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 600, test_samples: 20}
population:
  clients: 12
  hosts: 2
  devices: [{ms_per_sample: 1, battery_wh: 10, battery_start: [0.0, 1.0]}]
  links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]
selection: {clients_per_round: 12, policy: resource_aware, min_battery: 0.5, checkin: true, checkin_wait_s: 2}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""


def test_battery_threshold_selects_exactly_the_clients_at_or_above_it(tmp_path):
    out = run(tmp_path, BATTERY)
    sc, _ = load_scenario(tmp_path / "run.yaml")
    world = build_world(sc)
    level = {c.profile.name: c.spec.battery.fraction for c in world.clients}
    expected = sorted(n for n, f in level.items() if f >= 0.5)
    assert 0 < len(expected) < 12
    rows = read_csv(out / "clients.csv")
    assert sorted(r["client"] for r in rows) == expected
    for r in rows:
        assert float(r["battery"]) == pytest.approx(level[r["client"]])  # no drain configured: the check-in is exact
        assert float(r["checkin_t"]) < 2.0
    checkins = [t for t in read_csv(out / "transfers.csv") if t["kind"] == "checkin"]
    assert len(checkins) == 12 and all(int(t["wire_bytes"]) > 0 for t in checkins)


# ---- over-selection keeps the first K ------------------------------------------------------------------
OVER = """
name: over
seed: 4
rounds: 2
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 400, test_samples: 20}
population:
  clients: 4
  hosts: 2
  devices:
    - {name: d1, share: 0.25, ms_per_sample: 1}
    - {name: d2, share: 0.25, ms_per_sample: 3}
    - {name: d3, share: 0.25, ms_per_sample: 9}
    - {name: d4, share: 0.25, ms_per_sample: 27}
  links: [{up_mbps: 20, down_mbps: 20, latency_ms: 10}]
selection: {clients_per_round: 2, over_selection: 2.0}
round: {policy: first_k}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""


def test_over_selection_keeps_the_first_k_arrivals(tmp_path):
    out = run(tmp_path, OVER)
    device = {r["client"]: r["device"] for r in read_csv(out / "population.csv")}
    rows = [r for r in read_csv(out / "clients.csv") if r["round"] == "0"]
    assert len(rows) == 4  # 2 x over-selection 2.0
    ok = sorted(r["client"] for r in rows if r["outcome"] == "ok")
    assert sorted(device[c] for c in ok) == ["d1", "d2"]  # the two fastest devices answer first
    (r0, _) = read_csv(out / "rounds.csv")
    assert (r0["selected"], r0["completed"], r0["failed"]) == ("4", "2", "2")
    first_two = sorted(float(r["upload_end"]) for r in rows if r["outcome"] == "ok")
    assert float(r0["t_end"]) == pytest.approx(first_two[-1])  # closed at the second arrival
    assert sorted(r["outcome"] for r in rows if r["outcome"] != "ok") == ["late", "late"]


# ---- determinism of everything at once -------------------------------------------------------------------
EVERYTHING = """
name: everything
seed: 3
rounds: 3
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 1200, test_samples: 100}
population:
  clients: 24
  hosts: 2
  devices:
    - {profile: phone_mid, share: 0.5}
    - {profile: phone_low, share: 0.5, battery_start: [0.0, 0.02]}
  links:
    - {profile: wifi, share: 0.5}
    - {profile: lte, share: 0.5, loss: 0.05}
  availability: {kind: markov, mean_on_s: 20, mean_off_s: 10}
  shared_links: [{name: tower, up_mbps: 10, down_mbps: 40, links: [lte]}]
server: {link: {up_mbps: 100, down_mbps: 100, latency_ms: 2}}
selection: {clients_per_round: 6, policy: fastest, over_selection: 1.5, checkin: true, checkin_wait_s: 1}
round: {policy: first_k, timeout_s: 15}
algorithm: {local_epochs: 1, batch_size: 25}
eval: {every: 1}
"""


def test_the_whole_edge_is_deterministic(tmp_path):
    a = run(tmp_path, EVERYTHING, "a", "run.device_log=full")  # every device event, to compare
    b = run(tmp_path, EVERYTHING, "b", "run.device_log=full")
    end = json.loads((a / "summary.json").read_text())["emulated_time_s"]
    # What still happens after the last round closed (work in flight when the run stops) may or
    # may not be recorded; everything up to then must be identical.
    upto = lambda rows, key: [r for r in rows if float(r[key]) <= end]  # noqa: E731
    drop_id = lambda rows: sorted(str({k: v for k, v in r.items() if k != "id"}) for r in rows)  # noqa: E731
    assert read_csv(a / "clients.csv") == read_csv(b / "clients.csv")
    assert upto(read_csv(a / "devices.csv"), "t") == upto(read_csv(b / "devices.csv"), "t")
    assert drop_id(upto(read_csv(a / "transfers.csv"), "t_end")) == drop_id(upto(read_csv(b / "transfers.csv"), "t_end"))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert strip(read_csv(a / "rounds.csv")) == strip(read_csv(b / "rounds.csv"))
    outcomes = json.loads((a / "summary.json").read_text())["client_outcomes"]
    assert outcomes.get("ok", 0) > 0 and set(outcomes) - {"ok"}  # something went wrong for somebody
    events = {r["event"] for r in read_csv(a / "devices.csv")}
    assert {"offline", "online", "train", "send"} <= events
    assert any(int(r["link_bytes"]) > link_bytes(int(r["wire_bytes"])) for r in read_csv(a / "transfers.csv"))  # resent segments


def test_report_prints_the_summary_and_writes_the_plots(tmp_path):
    out = run(tmp_path, EVERYTHING.replace("rounds: 3", "rounds: 2"), "rep")
    assert (out / "plots" / "accuracy.png").exists()  # written at the end of `run`
    res = run_cli("report", str(out), "--round", "1")
    assert res.returncode == 0, res.stderr
    assert "client outcomes" in res.stdout and "emulated time" in res.stdout
    names = {p.name for p in (out / "plots").iterdir()}
    assert {"accuracy.png", "round_time.png", "gantt_round_1.png"} <= names
    assert all((out / "plots" / n).stat().st_size > 5000 for n in names)
    bad = run_cli("report", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and "not a run directory" in bad.stderr


LATE_DURING_AGGREGATION = """
name: resume
seed: 6
rounds: 2
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 300, test_samples: 20}
population:
  clients: 3
  hosts: 1
  devices:
    - {name: d1, share: 0.34, ms_per_sample: 1}
    - {name: d2, share: 0.33, ms_per_sample: 10}
    - {name: d3, share: 0.33, ms_per_sample: 20}
  links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]
server: {aggregate_ms: 5000}
selection: {clients_per_round: 1, over_selection: 3, checkin: true, checkin_wait_s: 1}
round: {policy: first_k}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 0}
"""


def test_the_next_round_sees_everything_that_arrived_during_aggregation(tmp_path):
    """Round 0 closes at the first update; aggregation takes 5 emulated seconds, during which the
    two late updates arrive and re-register their clients. Round 1 starts at close + 5 s and must
    see them, whatever the wall-clock speed of the aggregation."""
    out = run(tmp_path, LATE_DURING_AGGREGATION)
    r0, r1 = read_csv(out / "rounds.csv")
    late = [u for u in read_csv(out / "transfers.csv") if u["kind"] == "update" and u["round"] == "0"]
    assert len(late) == 3 and all(float(u["t_end"]) < float(r1["t_start"]) for u in late)
    assert float(r1["t_start"]) == pytest.approx(float(r0["t_end"]))
    assert r1["selected"] == "3"
