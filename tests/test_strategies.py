"""Strategies as plug-ins: the registry, each strategy's own options, FedAvg/FedProx/FedAvgM by
hand, and the guide's example strategy (docs/guide/strategies.md) running in real processes."""
import numpy as np
import pytest

from conftest import read_csv, run_cli, write_scenario
from emulator.scenario import ScenarioError, load_scenario
from emulator.world import build_world
from node.strategies import REGISTRY, ClientUpdate, Strategy, StrategyError, register, strategy_class
from node.training import LocalTraining


def upd(state, weight):
    return ClientUpdate("c", {"w": np.array(state, dtype=np.float32)}, {}, weight)


def test_registry_names_every_builtin_and_refuses_duplicates():
    assert {"fedavg", "fedprox", "fedavgm", "fedalign", "fedbuff"} <= set(REGISTRY)
    with pytest.raises(StrategyError, match="no strategy named 'nope'"):
        strategy_class("nope")
    with pytest.raises(StrategyError, match="registered twice"):
        register("fedavg")(type("Again", (Strategy,), {}))


def test_fedavg_weighted_mean_and_server_lr_by_hand():
    g = {"w": np.array([0.0, 0.0], dtype=np.float32)}
    fedavg = strategy_class("fedavg")({"server_lr": 0.5})
    fedavg.on_update(upd([1.0, 2.0], 1))
    fedavg.on_update(upd([4.0, 5.0], 2))
    np.testing.assert_allclose(fedavg.aggregate(g)["w"], [1.5, 2.0])  # 0.5 * [3, 4]
    assert fedavg.aggregate(g)["w"].tolist() == [0.0, 0.0]  # nothing since: the model stays


def test_fedavgm_momentum_by_hand():
    g = {"w": np.array([1.0], dtype=np.float32)}
    m = strategy_class("fedavgm")({"momentum": 0.5})
    m.on_update(upd([3.0], 1))
    g = m.aggregate(g)  # v = 2, w = 3
    assert g["w"].tolist() == [3.0]
    m.on_update(upd([3.0], 1))
    g = m.aggregate(g)  # v = 0.5 * 2 + 0 = 1, w = 4
    assert g["w"].tolist() == [4.0]
    assert m.snapshot()["velocity"]["w"].tolist() == [1.0]
    assert m.aggregate(g)["w"].tolist() == [4.0]  # a round nobody answered moves nothing


def test_fedprox_is_fedavg_with_a_proximal_client():
    prox = strategy_class("fedprox")({"mu": 0.3})
    seen = []
    prox.local_update({}, LocalTraining(1, 8, 0.1), lambda state, config: seen.append(config.prox_mu) or (state, None))
    assert seen == [0.3]
    plain = []
    strategy_class("fedavg")().local_update({}, LocalTraining(1, 8, 0.1), lambda s, c: plain.append(c.prox_mu) or (s, None))
    assert plain == [0.0]


BASE = """
name: s
rounds: 2
task: {dataset: synthetic, model: mlp, synthetic: {samples: 120, test_samples: 40, shape: [1, 28, 28], classes: 10}}
population: {clients: 3, hosts: 1, devices: [{ms_per_sample: 1}], links: [{up_mbps: 10, down_mbps: 10, latency_ms: 10}]}
algorithm: {local_epochs: 1, batch_size: 10, lr: 0.05, %s}
"""


@pytest.mark.parametrize("algorithm, error", [
    ("name: fedsgd", "algorithm: name: no strategy named 'fedsgd'"),
    ("name: fedavgm, options: {momentum: 1.5}", "options.momentum: "),
    ("name: fedprox, options: {mu: 0.1, nu: 2}", "options.nu: "),
    ("name: fedalign, options: {rho: 0.5}", "fedalign's options are algorithm.fedalign"),
    ("name: fedbuff, options: {buffer_size: 0}", "options.buffer_size: "),
])
def test_each_strategy_validates_its_own_options(tmp_path, algorithm, error):
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_scenario(tmp_path / "s.yaml", BASE % algorithm))
    assert error in str(info.value)
    assert "Traceback" not in str(info.value)


@pytest.mark.parametrize("extra, key", [
    ("round: {policy: first_k}", "round.policy"),
    ("selection: {clients_per_round: 2, over_selection: 1.5}", "selection.over_selection"),
])
def test_asynchronous_strategies_refuse_synchronous_keys(tmp_path, extra, key):
    with pytest.raises(ScenarioError, match=key):
        load_scenario(write_scenario(tmp_path / "s.yaml", BASE % "name: fedbuff" + extra + "\n"))


def test_fedbuff_takes_checkpoints_by_draining(tmp_path):
    """run.checkpoint_every is no longer refused beside FedBuff: its server drains before each
    checkpoint (node/async_server.py; tests/test_resume.py resumes one)."""
    sc, _ = load_scenario(write_scenario(tmp_path / "s.yaml", BASE % "name: fedbuff" + "run: {checkpoint_every: 1}\n"))
    assert sc.run.checkpoint_every == 1 and sc.algorithm.name == "fedbuff"


def test_options_reach_the_built_strategy_with_defaults(tmp_path):
    sc, resolved = load_scenario(write_scenario(tmp_path / "s.yaml", BASE % "name: fedavgm, options: {momentum: 0.7}"))
    assert resolved["algorithm"]["options"] == {"server_lr": 1.0, "momentum": 0.7}
    world = build_world(sc)
    assert world.server.strategy.name == "fedavgm" and world.server.strategy.options.momentum == 0.7
    assert world.client.strategy.name == "fedavgm"


def test_fedavgm_runs_end_to_end_and_differs_from_fedavg(tmp_path):
    finals = {}
    for name in ("fedavg", "fedavgm"):
        out = tmp_path / name
        scenario = write_scenario(tmp_path / f"{name}.yaml", BASE % f"name: {name}")
        res = run_cli("run", str(scenario), "--out", str(out), "--quiet", timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        rows = read_csv(out / "rounds.csv")
        assert len(rows) == 2 and all(int(r["completed"]) == 3 for r in rows)
        finals[name] = [r["test_loss"] for r in rows]
    assert finals["fedavg"][0] == finals["fedavgm"][0]  # round 1: zero velocity plus one step is FedAvg's step
    assert finals["fedavg"][1] != finals["fedavgm"][1]  # round 2: the momentum carries on


def test_readme_example_is_the_shipped_strategy():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    source = (root / "node" / "strategies" / "fedavgm.py").read_text()
    assert "```python\n" + source + "```" in (root / "docs" / "guide" / "strategies.md").read_text()


def test_a_strategy_that_raises_fails_the_run_at_once_with_the_error(tmp_path):
    """A user's strategy crashes in the server process: the run ends as failed within seconds,
    saying why, instead of waiting out run.stall_timeout_s. (In-process conductor: the forked
    server inherits this test's registration.)"""
    import time
    from emulator.conductor import run_scenario
    from emulator.progress import QuietView
    from node.strategies.fedavg import FedAvg

    if "exploding_for_test" not in REGISTRY:
        @register("exploding_for_test")
        class Exploding(FedAvg):
            def aggregate(self, global_state):
                raise RuntimeError("boom in aggregate")

    sc, resolved = load_scenario(write_scenario(tmp_path / "s.yaml", BASE % "name: exploding_for_test"))
    t0 = time.monotonic()
    summary = run_scenario(sc, resolved, tmp_path / "run", QuietView(sc.rounds))
    assert summary["status"] == "failed"
    assert "server actor raised an exception: RuntimeError: boom in aggregate" in summary["reason"]
    assert time.monotonic() - t0 < 60  # the stall timeout is 600 s
    assert any("boom" in str(i.get("error")) for i in summary["incidents"])


def test_weighted_average_is_the_float64_weighted_mean_to_the_last_bit(monkeypatch):
    from node.strategy import WeightedAverage
    monkeypatch.setattr(WeightedAverage, "CHUNK", 8)  # "w" spans 4 chunks, the last one short
    rng = np.random.default_rng(3)
    states = [{"w": rng.standard_normal((7, 5)).astype(np.float32), "b": rng.integers(0, 9, 4),
               "s": np.float32(rng.standard_normal())} for _ in range(4)]
    weights = [12.0, 30.0, 7.0, 1.5]
    avg = WeightedAverage()
    for state, weight in zip(states, weights):
        avg.add(state, weight)
    for name in ("w", "b", "s"):
        expected = sum(np.asarray(s[name], dtype=np.float64) * w for s, w in zip(states, weights))
        assert np.array_equal(avg.sums[name], expected)
    result = avg.result(states[0])
    for name in ("w", "s"):
        assert result[name].dtype == np.float32
        assert np.array_equal(result[name], (avg.sums[name] / sum(weights)).astype(np.float32))
    assert result["s"].shape == () and result["w"].shape == (7, 5)


def test_a_clients_delta_is_computed_when_read_and_equals_the_difference():
    from node.strategies.base import Difference
    new = {"w": np.array([3.0, 5.0], dtype=np.float32), "b": np.array([1.0], dtype=np.float32)}
    old = {"w": np.array([1.0, 1.5], dtype=np.float32), "b": np.array([4.0], dtype=np.float32)}
    delta = Difference(new, old)
    assert not delta._done and len(delta) == 2 and set(delta) == {"w", "b"}
    assert np.array_equal(delta["w"], [2.0, 3.5]) and list(delta._done) == ["w"]
    assert {k: v.tolist() for k, v in delta.items()} == {"w": [2.0, 3.5], "b": [-3.0]}
    assert delta["w"] is delta["w"]  # computed once
