"""Secure aggregation in real runs (issue 44, items 1 and 4): the server, the network process and
the hosts as processes, every phase a message through the emulated links. The masked run reaches
the accuracy of the same run with the shared encoding and no masks exactly; the run writes each
phase's bytes and times (secure.csv) and the overhead (summary.json); a run replays to the same
bytes and times from its pinned scenario.yaml; the schema refuses what cannot work, in one line."""
import json
import shutil
import subprocess

import pytest
import yaml

from conftest import read_csv, run_cli, write_scenario
from emulator.htmlreport import collect
from emulator.scenario import ScenarioError, load_scenario

STAR = """
name: secure
seed: 4
rounds: 2
task: {dataset: synthetic, model: mlp, synthetic: {samples: 600, test_samples: 200, shape: [1, 8, 8]}}
population:
  clients: 8
  devices: [{ms_per_sample: 2.0}]
  links: [{up_mbps: 5, down_mbps: 20, latency_ms: 30}]
selection: {clients_per_round: 6}
algorithm:
  lr: 0.2
"""


def run(tmp_path, name: str, extra: str, scenario: str = STAR):
    out = tmp_path / name
    res = run_cli("run", str(write_scenario(tmp_path / f"{name}.yaml", scenario + extra)), "--out", str(out), "--quiet",
                  timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_a_masked_run_equals_the_plain_sum_and_writes_what_it_cost(tmp_path):
    masked = run(tmp_path, "secagg", "  secure_aggregation: {protocol: secagg, clip: 0.5}\n")
    plain = run(tmp_path, "plain", "  secure_aggregation: {protocol: plain, clip: 0.5}\n")
    acc = [(r["accuracy"], r["test_loss"]) for r in read_csv(masked / "rounds.csv")]
    assert acc == [(r["accuracy"], r["test_loss"]) for r in read_csv(plain / "rounds.csv")] and float(acc[-1][0]) > 0.5
    phases = read_csv(masked / "secure.csv")
    assert [p["phase"] for p in phases] == ["keys", "shares", "input", "unmask"] * 2
    assert all(p["entered"] == p["answered"] == "6" for p in phases)
    # a phase's bytes are its messages': 100-byte key records up, 6 rosters of 6 records down, ...
    keys = phases[0]
    assert int(keys["payload_bytes_up"]) == 6 * 100 and int(keys["payload_bytes_down"]) == 0
    assert int(phases[1]["payload_bytes_down"]) == 6 * 6 * 100 and int(phases[1]["payload_bytes_up"]) == 6 * 5 * 160
    transfers = read_csv(masked / "transfers.csv")
    words = [t for t in transfers if t["kind"] == "sa_masked"]
    length = 64 * 64 + 64 + 64 * 10 + 10 + 1  # the mlp's parameters (64 hidden) and the weight slot
    assert len(words) == 12 and all(int(t["payload_bytes"]) == -(-length * 19 // 8) for t in words)  # 16 + ceil(log2 6) bits
    plain_words = [t for t in read_csv(plain / "transfers.csv") if t["kind"] == "sa_masked"]
    assert all(int(t["payload_bytes"]) == -(-length * 16 // 8) for t in plain_words)
    summary = json.loads((masked / "summary.json").read_text())["secure_aggregation"]
    assert summary["rounds"] == 2 and summary["failed_rounds"] == 0 and summary["word_bits"] == 19
    assert 0 < summary["overhead_share_of_bytes"] < 1 and summary["overhead_s"] > 0
    clients = read_csv(masked / "clients.csv")
    assert all(c["outcome"] == "ok" and c["upload_end"] and c["samples"] for c in clients)
    assert "costs" in yaml.safe_load((masked / "scenario.yaml").read_text())["algorithm"]["secure_aggregation"]
    # report.html shows the phases
    data = collect(masked)
    assert len(data["secure"]["phases"]) == 8 and data["secure"]["summary"]["word_bits"] == 19
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is not None:  # (.ci/run installs it; tests/test_htmlreport.py skips without it too)
        dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                              (masked / "report.html").as_uri()], capture_output=True, text=True, timeout=120).stdout
        drawn = dom[dom.index('<table id="secure">'):]
        assert drawn[:drawn.index("</table>")].count('<tr class="row">') == 8


def test_a_run_replays_to_the_same_bytes_and_times_from_its_pinned_scenario(tmp_path):
    first = run(tmp_path, "first", "  secure_aggregation: {protocol: secaggplus, degree: 2, clip: 0.5}\n")
    pinned = (first / "scenario.yaml").read_text()
    again = tmp_path / "again"
    res = run_cli("run", str(write_scenario(tmp_path / "again.yaml", pinned)), "--out", str(again), "--quiet", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (first / "transfers.csv").read_text() == (again / "transfers.csv").read_text()
    assert (first / "secure.csv").read_text() == (again / "secure.csv").read_text()


def test_a_corrupt_client_is_excluded_with_an_incident(tmp_path):
    out = run(tmp_path, "corrupt", "  secure_aggregation: {protocol: secagg, clip: 0.5, corrupt_clients: [c0002, c0005]}\n"
                                   "selection: {clients_per_round: 8}\n")
    summary = json.loads((out / "summary.json").read_text())
    named = sorted(i["client"] for i in summary["incidents"] if "do not authenticate" in i["what"])
    assert named == ["c0002", "c0002", "c0005", "c0005"]  # in each of the 2 rounds
    rounds = read_csv(out / "rounds.csv")
    assert [(r["completed"], r["rejected"]) for r in rounds] == [("6", "2"), ("6", "2")]


@pytest.mark.parametrize("extra, message", [
    ("algorithm: {name: fedbuff, secure_aggregation: {protocol: secagg}}",
     "algorithm.secure_aggregation.protocol: fedbuff needs each client's update at the server"),
    ("algorithm: {name: dpfedavg, secure_aggregation: {protocol: secagg}}",
     "algorithm.secure_aggregation.protocol: dpfedavg with noise server clips each update at the server"),
    ("algorithm: {name: dpfedavg, options: {noise: client}, secure_aggregation: {protocol: secagg}}",
     "algorithm.secure_aggregation.weighting: dpfedavg counts each client once"),
    ("algorithm: {secure_aggregation: {protocol: secagg, bits: 24}}\nselection: {clients_per_round: 300}",
     "algorithm.secure_aggregation.bits: 24 bits and a cohort of 300 need 33-bit words"),
    ("algorithm: {secure_aggregation: {protocol: secagg, corrupt_clients: [c9]}}",
     "algorithm.secure_aggregation.corrupt_clients: no client 'c9'"),
    ("algorithm: {secure_aggregation: {protocol: secagg, degree: 4}}",
     "algorithm.secure_aggregation: degree: an even k for protocol secaggplus"),
    ("algorithm: {secure_aggregation: {protocol: secagg}}\npopulation: {clients: 400, devices: [{ms_per_sample: 2.0}], "
     "links: [{up_mbps: 5, down_mbps: 20}], availability: {kind: markov, mean_on_s: 600, mean_off_s: 60}}",
     "round.timeout_s: devices go offline here, and secure aggregation waits for the masked inputs"),
    ("algorithm: {secure_aggregation: {protocol: secagg}, codec: {up: {name: fp16, error_feedback: true}}}",
     "algorithm.codec.up.error_feedback: secure aggregation sends each update in the cohort's fixed-point encoding"),
    ("algorithm: {name: semiasync, secure_aggregation: {protocol: secagg}}\nround: {timeout_s: 30}",
     "algorithm.secure_aggregation.protocol: semiasync needs each client's update at the server"),
])
def test_what_cannot_work_is_one_line_naming_the_key(tmp_path, extra, message):
    text = STAR.replace("algorithm:\n  lr: 0.2\n", "").replace("selection: {clients_per_round: 6}\n", "") \
        .replace("clients: 8", "clients: 400")
    file = write_scenario(tmp_path / "s.yaml", text + extra + "\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(file)
    [line] = str(err.value).splitlines()
    assert message in line and str(file) in line


def test_the_private_flagship_runs_two_rounds_within_its_budget(tmp_path):
    """scenarios/edge_1000_private.yaml: 1000 devices, SecAgg+ and client-noised DP-FedAvg, 2 rounds."""
    out = tmp_path / "private"
    res = run_cli("run", "scenarios/edge_1000_private.yaml", "--set", "rounds=2", "--out", str(out), "--quiet",
                  timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    spent = summary["privacy_spent"]["user_level"]
    assert spent["releases"] == 2 and spent["guarantee"] == "proven" and 0 < spent["epsilon"] < 8
    assert spent["delta"] == 1e-4
    secure = summary["secure_aggregation"]
    assert secure["protocol"] == "secaggplus" and secure["failed_rounds"] == 0 and secure["degree_last"] < 99
    phases = read_csv(out / "secure.csv")
    assert [p["phase"] for p in phases] == ["keys", "shares", "input", "unmask"] * 2
    assert all(int(p["answered"]) >= int(secure["threshold_last"]) for p in phases)


HIERARCHY = STAR.replace("selection: {clients_per_round: 6}\n", """selection: {fraction: 1.0}
topology: hierarchical
hierarchy: {edges: 2, edge_rounds: 2}
""")


def test_a_hierarchy_runs_secure_aggregation_at_its_edges(tmp_path):
    masked = run(tmp_path, "hsecagg", "  secure_aggregation: {protocol: secagg, clip: 0.5}\n", HIERARCHY)
    plain = run(tmp_path, "hplain", "  secure_aggregation: {protocol: plain, clip: 0.5}\n", HIERARCHY)
    acc = [r["accuracy"] for r in read_csv(masked / "rounds.csv")]
    assert acc == [r["accuracy"] for r in read_csv(plain / "rounds.csv")] and acc[-1]
    phases = read_csv(masked / "secure.csv")
    # 2 cloud rounds x 2 edge rounds x 2 edges, 4 phases each, every edge with its 4 clients
    assert len(phases) == 32 and {p["aggregator"] for p in phases} == {"edge0", "edge1"}
    assert all(p["entered"] == "4" for p in phases)
    cloud = [t for t in read_csv(masked / "transfers.csv") if "server" in (t["src"], t["dst"])]
    assert cloud and not any(t["kind"].startswith("sa_") for t in cloud)  # the cloud takes the edges' models as they are
