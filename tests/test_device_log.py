"""devices.csv as a summary (run.device_log: summary, the default) against the full event log: the
summary's rows are the log's events counted and added up per device and round, exactly."""
from collections import defaultdict

import pytest

from emulator.device_log import DeviceSummary
from conftest import read_csv, run_cli, write_scenario
from test_resume import RESUMABLE


ZERO = {"train": 0, "send": 0, "receive": 0, "offline": 0, "online": 0, "ran_dry": 0, "link_down": 0, "link_up": 0}


def test_a_summary_row_counts_and_adds_up_its_devices_events():
    log = DeviceSummary()
    assert log.add({"t": 1.0, "client": "c1", "event": "send", "battery": 0.9, "energy_j": 0.5}) == []
    assert log.add({"t": 1.5, "client": "c0", "event": "offline", "battery": None, "energy_j": None}) == []
    assert log.round_ended(0, 2.0) == []  # an event at 2.0 may still come: it would be round 0's
    assert log.add({"t": 2.0, "client": "c1", "event": "train", "battery": 0.8, "energy_j": 2.0}) == []
    rows = log.add({"t": 2.5, "client": "c1", "event": "battery", "battery": 0.0, "energy_j": None})  # ran dry, after
    assert rows == [
        {"round": 0, "client": "c0", "events": 1, "t_first": 1.5, "t_last": 1.5, "energy_j": 0.0, "battery": None,
         **ZERO, "offline": 1},
        {"round": 0, "client": "c1", "events": 2, "t_first": 1.0, "t_last": 2.0, "energy_j": 2.5, "battery": 0.8,
         **ZERO, "send": 1, "train": 1},
    ]
    assert log.close() == [{"round": 1, "client": "c1", "events": 1, "t_first": 2.5, "t_last": 2.5, "energy_j": 0.0,
                            "battery": 0.0, **ZERO, "ran_dry": 1}]  # after the last round: one past it


def test_events_go_to_the_round_of_their_time_whenever_the_report_comes():
    """The same events and reports in two arrival orders give the same rows."""
    events = [{"t": t, "client": c, "event": "send", "battery": None, "energy_j": 1.0}
              for t, c in ((0.5, "a"), (1.0, "b"), (1.0, "a"), (3.0, "b"), (4.5, "a"))]
    rows = {}
    for order in ("reports first", "events first"):
        log, out = DeviceSummary(), []
        if order == "reports first":
            out += log.round_ended(0, 1.0) + log.round_ended(1, 4.0)
        for e in events:
            out += log.add(e)
        if order == "events first":
            out += log.round_ended(0, 1.0) + log.round_ended(1, 4.0)
        rows[order] = out + log.close()
    assert rows["reports first"] == rows["events first"]
    assert [(r["round"], r["client"], r["events"]) for r in rows["events first"]] == [
        (0, "a", 2), (0, "b", 1), (1, "b", 1), (2, "a", 1)]


def test_the_summary_is_the_full_log_added_up_and_nothing_else_changes(tmp_path):
    path = write_scenario(tmp_path / "s.yaml", RESUMABLE.replace("rounds: 12", "rounds: 4"))
    runs = {}
    for mode in ("summary", "full"):
        res = run_cli("run", str(path), "--set", f"run.device_log={mode}", "--out", str(tmp_path / mode), timeout=240)
        assert res.returncode == 0, res.stderr[-2000:]
        runs[mode] = tmp_path / mode
    for name in ("transfers", "clients"):
        assert read_csv(runs["summary"] / f"{name}.csv") == read_csv(runs["full"] / f"{name}.csv"), name
    full, summary = read_csv(runs["full"] / "devices.csv"), read_csv(runs["summary"] / "devices.csv")
    assert 0 < len(summary) < len(full)
    assert sum(int(r["events"]) for r in summary) == len(full)
    counts, energy, last = defaultdict(lambda: defaultdict(int)), defaultdict(float), {}
    for e in full:
        counts[e["client"]]["ran_dry" if e["event"] == "battery" else e["event"]] += 1
        energy[e["client"]] += float(e["energy_j"] or 0)
        if e["battery"]:
            last[e["client"]] = e["battery"]
    mine, my_energy, my_last = defaultdict(lambda: defaultdict(int)), defaultdict(float), {}
    for r in summary:
        for event in ("train", "send", "receive", "offline", "online", "ran_dry", "link_down", "link_up"):
            if int(r[event]):
                mine[r["client"]][event] += int(r[event])
        my_energy[r["client"]] += float(r["energy_j"])
        if r["battery"]:
            my_last[r["client"]] = r["battery"]
    assert mine == counts and my_last == last
    assert my_energy == pytest.approx(energy, rel=1e-12)
    rounds = [int(r["round"]) for r in summary]
    assert rounds == sorted(rounds) and set(rounds) <= set(range(5))  # each row a round's, the last after round 3
