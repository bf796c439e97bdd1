"""The schema's refusals come from declarations (emulator/rules.py): a section's rules over its own
fields, and what each part of a run (topology, algorithm, clock mode, model) declares it works with.
A strategy of one's own, named by import path, is refused exactly where its flags and Capabilities
say, with no line of the schema naming it."""
from pathlib import Path
from typing import Optional

import pytest
from pydantic import ValidationError

from emulator.rules import Fits, Needs, OneOf, OnlyWhen, Ordered, OwnOptions, scenario_refusals, strategy_fits
from emulator.scenario import ScenarioError, Strict, load_scenario
from node.strategies.base import Capabilities
from node.strategies.fedavg import FedAvg

SMOKE = Path(__file__).resolve().parent.parent / "scenarios" / "smoke.yaml"


class Section(Strict):
    a: Optional[int] = None
    b: Optional[int] = None
    mode: str = "x"
    low: int = 0
    high: int = 10
    component: str = "builtin"
    options: dict = {}
    rules = (OneOf("a", "b"), Needs("mode", ("b",), values=("y",)), OnlyWhen("a", "mode", ("x",)),
             Ordered("low", "high"), OwnOptions("options", "component", "for your own component, not {value}"))


@pytest.mark.parametrize("values, message", [
    ({}, "give exactly one of a and b"),
    ({"a": 1, "b": 2}, "give exactly one of a and b"),
    ({"a": 1, "mode": "y"}, "mode y needs b"),
    ({"b": 1, "a": None, "mode": "z"}, None),
    ({"a": 1, "mode": "z"}, "a: only for mode x, got mode z"),
    ({"a": 1, "low": 11}, "low (11) exceeds high (10)"),
    ({"a": 1, "options": {"k": 1}}, "options: for your own component, not builtin"),
    ({"a": 1, "options": {"k": 1}, "component": "pkg.mod:thing"}, None),
])
def test_a_sections_rules_refuse_in_one_line(values, message):
    if message is None:
        Section(**values)
        return
    with pytest.raises(ValidationError) as err:
        Section(**values)
    assert message in str(err.value)


class NoCheckpoints(FedAvg):
    """A strategy of one's own that declares what it cannot do."""

    capabilities = Capabilities(topologies=("star",), privacy=("none", "laplace"), checkpoints=False,
                                communication_only=False)


class Lingering(FedAvg):
    keeps_late = True


@pytest.mark.parametrize("sets, message", [
    (["run.checkpoint_every=1"], "run.checkpoint_every: test_rules:NoCheckpoints's state cannot be checkpointed"),
    (["algorithm.train=false"], "algorithm.train: test_rules:NoCheckpoints needs training"),
    (["topology=hierarchical", "hierarchy.edges=2"], "topology: test_rules:NoCheckpoints runs on star, not hierarchical"),
    (["algorithm.privacy.mechanism=dpsgd", "algorithm.privacy.clip=1", "algorithm.privacy.noise_multiplier=1"],
     "algorithm.privacy.mechanism: test_rules:NoCheckpoints works with none, laplace, not dpsgd"),
])
def test_a_strategy_of_ones_own_is_refused_where_it_declares(sets, message):
    with pytest.raises(ScenarioError) as err:
        load_scenario(SMOKE, ["algorithm.name=test_rules:NoCheckpoints", *sets])
    assert f"smoke.yaml: {message}" in str(err.value)
    load_scenario(SMOKE, ["algorithm.name=test_rules:NoCheckpoints"])  # and accepted otherwise


def test_a_strategy_that_keeps_late_updates_needs_a_deadline_and_no_closing_notices():
    with pytest.raises(ScenarioError, match="round.timeout_s: test_rules:Lingering keeps the updates"):
        load_scenario(SMOKE, ["algorithm.name=test_rules:Lingering"])
    with pytest.raises(ScenarioError, match="round.notify_closed: test_rules:Lingering uses updates that arrive after"):
        load_scenario(SMOKE, ["algorithm.name=test_rules:Lingering", "round.timeout_s=30", "round.notify_closed=true"])
    load_scenario(SMOKE, ["algorithm.name=test_rules:Lingering", "round.timeout_s=30"])


def test_every_part_is_asked_and_each_refusal_names_its_key():
    sc, _ = load_scenario(SMOKE)
    parts = sc.parts()
    assert [p.who for p in parts] == ["topology star", "fedavg", "clock.mode virtual", "task.model mnist_cnn",
                                      "selection.policy random", "algorithm.secure_aggregation"]
    strict = Fits(who="a test part", checkpoints="no checkpoints here", codec_time="no codec time here",
                  privacy=("gaussian",))
    sc.run.checkpoint_every = 1
    assert scenario_refusals(sc, [strict]) == [
        "algorithm.privacy.mechanism: a test part works with gaussian, not none",
        "run.checkpoint_every: no checkpoints here"]
    assert strategy_fits("fedbuff", sc).checkpoints is None  # it drains for them (node/async_server.py)


@pytest.mark.parametrize("privacy", [
    ["algorithm.privacy.mechanism=dpsgd", "algorithm.privacy.clip=1", "algorithm.privacy.noise_multiplier=1"],
    ["algorithm.privacy.mechanism=laplace", "algorithm.privacy.epsilon=10", "algorithm.privacy.clip=1"],
])
def test_oort_selects_on_unnoised_private_statistics_so_it_runs_without_dp_only(privacy):
    """Issue 43, item 1: Oort's utility is the clients' exact loss statistics; beside a DP mechanism
    it would leak what the mechanism protects. Refused in one line; without DP it runs."""
    with pytest.raises(ScenarioError) as err:
        load_scenario(SMOKE, ["selection.policy=oort", *privacy])
    assert "algorithm.privacy.mechanism: selection.policy oort works with none" in str(err.value)
    assert "exact training-loss statistics" in str(err.value) and len(str(err.value).splitlines()) == 1
    load_scenario(SMOKE, ["selection.policy=oort"])
