"""Horizons (issue 43, item 5): a short run can be a prefix of a long study. The cosine schedule's T
and c_T's T are `quantization.horizon` and `privacy.horizon` (default: rounds), and summary.json says
both, with c_T and the epsilon each release spends."""
import pytest

from conftest import write_scenario
from emulator.scenario import load_scenario
from emulator.summary import Summary
from emulator.world import build_world
from node.schedule import cosine_bits

SCENARIO = """
name: short
rounds: 30
task: {dataset: synthetic, model: mlp, synthetic: {samples: 200, test_samples: 50, shape: [1, 28, 28], classes: 10}}
population: {clients: 50, hosts: 1, devices: [{ms_per_sample: 1}], links: [{up_mbps: 10, down_mbps: 10}]}
selection: {clients_per_round: 5}
algorithm:
  local_epochs: 5
  codec: {down: {name: int}, up: {name: int}}
  quantization: {schedule: cosine, b_min: 8, b_max: 32%s}
  privacy: {mechanism: laplace, epsilon: 10000, clip: 100%s}
"""


def world_of(tmp_path, horizon: str):
    sc, _ = load_scenario(write_scenario(tmp_path / "s.yaml", SCENARIO % (horizon, horizon)))
    return sc, build_world(sc)


def test_a_short_run_is_a_prefix_of_its_horizon(tmp_path):
    sc, world = world_of(tmp_path, ", horizon: 1000")
    # c_T = (T/E)(P/N) with T the horizon: (1000/5)(5/50) = 20, not the (30/5)(5/50) = 0.6 of 30 rounds
    assert world.client.privacy.factor == pytest.approx(20.0)
    schedule = world.server.schedule
    assert schedule.rounds == 1000
    assert [schedule.server_bits(t, 8) for t in range(30)] == [cosine_bits(t, 1000, 8, 32) for t in range(30)]
    summary = Summary.start("short")
    summary.describe_run(sc, world.client.privacy, None, {})
    assert summary["privacy"]["horizon"] == 1000 and summary["quantization"]["horizon"] == 1000
    assert summary["privacy"]["epsilon_per_release"] == pytest.approx(10000 / 20)


def test_without_a_horizon_the_run_is_the_whole_study(tmp_path):
    sc, world = world_of(tmp_path, "")
    assert world.client.privacy.factor == pytest.approx((30 / 5) * (5 / 50))
    assert world.server.schedule.rounds == 30 and world.server.schedule.server_bits(29, 8) == cosine_bits(29, 30, 8, 32)
    summary = Summary.start("short")
    summary.describe_run(sc, world.client.privacy, None, {})
    assert summary["privacy"]["horizon"] == 30 and summary["quantization"] == {"schedule": "cosine", "horizon": 30}
