"""round.notify_closed: when a round closes, the server tells the selected clients it has not heard
from; they upload nothing. Real processes: two fast and two slow clients, over-selection 2 and
first_k 2, so each round closes with the fast clients' updates while the slow ones still train."""
import pytest

from conftest import read_csv, run_cli, write_scenario
from emulator.scenario import ScenarioError, load_scenario

SCENARIO = """
name: notify
seed: 4
rounds: 3
task: {{dataset: synthetic, model: mlp, synthetic: {{samples: 400, test_samples: 40, shape: [1, 28, 28], classes: 10}}}}
population:
  clients: 4
  hosts: 2
  devices: [{{name: fast, share: 0.5, ms_per_sample: 1}}, {{name: slow, share: 0.5, ms_per_sample: 5}}]
  links: [{{up_mbps: 10, down_mbps: 20, latency_ms: 10}}]
selection: {{clients_per_round: 2, over_selection: 2.0}}
round: {{policy: first_k, notify_closed: {notify}}}
algorithm: {{local_epochs: 1, batch_size: 10, lr: 0.05}}
eval: {{every: 0}}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for notify in ("true", "false"):
        tmp = tmp_path_factory.mktemp(f"notify-{notify}")
        res = run_cli("run", str(write_scenario(tmp / "s.yaml", SCENARIO.format(notify=notify))), "--out", str(tmp / "run"),
                      "--quiet", timeout=180)
        assert res.returncode == 0, res.stderr[-3000:]
        out[notify] = {name: read_csv(tmp / "run" / f"{name}.csv") for name in ("transfers", "clients", "rounds", "population")}
    return out


def _slow(run) -> set[str]:
    return {r["client"] for r in run["population"] if r["device"] == "slow"}


def test_the_clients_still_training_hear_that_the_round_closed_and_upload_nothing(runs):
    run = runs["true"]
    slow = _slow(run)
    assert len(slow) == 2
    for rnd in run["rounds"][:-1]:  # (the run ends as the last round closes: its notices are moot)
        index, t_end = int(rnd["round"]), float(rnd["t_end"])
        told = [r for r in run["transfers"] if r["kind"] == "closed" and int(r["round"]) == index]
        assert sorted(r["dst"] for r in told) == sorted(slow), index
        assert all(r["src"] == "server" and r["outcome"] == "ok" and int(r["payload_bytes"]) == 0 for r in told)
        # sent as the round closed (its aggregation comes after)
        assert all(float(r["t_start"]) <= t_end for r in told)
        assert not [r for r in run["transfers"] if r["kind"] == "update" and int(r["round"]) == index and r["src"] in slow]
        outcomes = {r["client"]: r["outcome"] for r in run["clients"] if int(r["round"]) == index}
        assert all(outcomes[c] == "ok" for c in set(outcomes) - slow) and all(outcomes[c] != "ok" for c in slow)


def test_without_notices_the_slow_clients_upload_updates_that_are_discarded(runs):
    told, untold = runs["true"], runs["false"]
    slow = _slow(untold)
    assert not [r for r in untold["transfers"] if r["kind"] == "closed"]
    end0 = float(untold["rounds"][0]["t_end"])
    late = [r for r in untold["transfers"] if r["kind"] == "update" and int(r["round"]) == 0 and r["src"] in slow]
    assert len(late) == 2 and all(float(r["t_start"]) > end0 for r in late)
    # round 0 closes on the fast clients' updates either way; the notices only save the uplink
    assert told["rounds"][0]["t_end"] == untold["rounds"][0]["t_end"]
    up = {name: sum(int(r["wire_bytes"]) for r in run["transfers"] if r["kind"] == "update") for name, run in runs.items()}
    assert up["true"] < up["false"]


@pytest.mark.parametrize("extra, words", [
    ("topology: ring\nalgorithm: {name: fibfl}\n", "topology is ring"),
    ("algorithm: {name: fedbuff, options: {buffer_size: 2}}\nround: {notify_closed: true, timeout_s: 30}\n", "fedbuff uses updates"),
])
def test_notify_closed_is_refused_where_no_server_closes_rounds(tmp_path, extra, words):
    text = """
name: bad
rounds: 2
task: {dataset: synthetic, model: mlp, synthetic: {samples: 120, test_samples: 40, shape: [1, 28, 28], classes: 10}}
population: {clients: 3, hosts: 1, devices: [{ms_per_sample: 1}], links: [{up_mbps: 10, down_mbps: 10, latency_ms: 10}]}
""" + extra
    if "round:" not in extra:
        text += "round: {notify_closed: true}\n"
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_scenario(tmp_path / "s.yaml", text))
    assert "round.notify_closed" in str(info.value) and words in str(info.value)
