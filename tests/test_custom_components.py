"""A user's own model, data loader, strategy and selection policy, named by import path
(examples/custom_components), and the one-line errors for paths that do not resolve to what their
key needs."""
import csv
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, needs_mnist, run_cli
from node.plugins import PluginError, resolve, resolve_class
from node.selection import SelectionContext, Selector
from node.strategies import ClientUpdate, Strategy

EXAMPLE = REPO / "examples" / "custom_components"
# small_mlp(hidden=32) on 28x28 inputs, by hand: 784*32 + 32 weights and biases in, 32*10 + 10 out
MLP_PARAMETERS = 784 * 32 + 32 + 32 * 10 + 10


@pytest.fixture
def example_importable(monkeypatch):
    """The example package, installed (CI: pip install -e examples/custom_components) or from its folder."""
    if importlib.util.find_spec("custom_components") is None:
        monkeypatch.syspath_prepend(str(EXAMPLE))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")])))


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@needs_mnist
def test_the_example_runs_its_own_model_data_strategy_and_selector(tmp_path, example_importable):
    out = tmp_path / "run"
    res = run_cli("run", str(EXAMPLE / "scenario.yaml"), "--out", str(out), "--plain")
    assert res.returncode == 0, res.stderr[-3000:]
    transfers = rows(out / "transfers.csv")
    assert {r["kind"] for r in transfers} == {"task", "update"} and len(transfers) == 2 * 2 * 4
    # fp32 both ways: a message's payload is exactly 4 bytes for each of the model's parameters
    assert {int(r["payload_bytes"]) for r in transfers} == {4 * MLP_PARAMETERS}
    # RoundRobin from position 2, four at a time, over c0000..c0007
    chosen = {}
    for r in rows(out / "clients.csv"):
        chosen.setdefault(int(r["round"]), []).append(r["client"])
    assert chosen == {0: ["c0002", "c0003", "c0004", "c0005"], 1: ["c0000", "c0001", "c0006", "c0007"]}
    assert all(r["outcome"] == "ok" for r in rows(out / "clients.csv"))
    accuracy = [float(r["accuracy"]) for r in rows(out / "rounds.csv")]
    assert len(accuracy) == 2 and accuracy[-1] > 0.2  # it learns (10 classes: chance is 0.1)


def test_trimmed_mean_drops_the_extremes_of_each_coordinate(example_importable):
    trimmed = resolve_class("custom_components.strategy:TrimmedMean", Strategy, "Strategy")({"trim": 0.25})
    values = [[0.0, 100.0], [1.0, 2.0], [3.0, 4.0], [-50.0, 6.0]]
    for i, v in enumerate(values):
        trimmed.on_update(ClientUpdate(f"c{i}", {"w": np.array(v, np.float32)}, {}, 1.0))
    out = trimmed.aggregate({"w": np.zeros(2, np.float32)})
    # per coordinate, sorted: (-50, 0, 1, 3) -> mean(0, 1); (2, 4, 6, 100) -> mean(4, 6)
    assert out["w"].tolist() == [0.5, 5.0] and out["w"].dtype == np.float32


def test_round_robin_keeps_its_place_in_a_checkpoint(example_importable):
    cls = resolve_class("custom_components.selection:RoundRobin", Selector, "Selector")
    pool = {f"c{i}": {} for i in range(5)}
    ctx = SelectionContext(0, np.random.default_rng(0))
    first = cls({"start": 1})
    assert first.select(pool, 2, ctx) == ["c1", "c2"]
    second = cls()
    second.restore(first.snapshot())
    assert second.select(pool, 2, ctx) == ["c3", "c4"] and second.select(pool, 2, ctx) == ["c0", "c1"]


def test_paths_that_do_not_resolve_say_why():
    with pytest.raises(PluginError, match="cannot import no_such_package"):
        resolve("no_such_package.mod:thing")
    with pytest.raises(PluginError, match="os has no attribute nothing_here"):
        resolve("os:nothing_here")
    with pytest.raises(PluginError, match="not an import path"):
        resolve("os:")
    with pytest.raises(PluginError, match="the class OrderedDict, not a subclass of Strategy"):
        resolve_class("collections:OrderedDict", Strategy, "Strategy")


BAD = '''
import torch
from torch.utils.data import TensorDataset

def not_a_module():
    return 42

def one_dataset(root):
    return TensorDataset(torch.zeros(4, 1, 2, 2), torch.zeros(4, dtype=torch.long))

def unlabelled(root):
    return [torch.zeros(3)] * 4, [torch.zeros(3)] * 4

def tiny(root):
    x = torch.rand(40, 1, 4, 4)
    return TensorDataset(x, torch.arange(40) % 3), TensorDataset(x[:8], torch.arange(8) % 3)

def wide():  # does not fit tiny's 16 inputs
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(99, 3))

def net():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
'''

SCENARIO = """name: bad
rounds: 1
task: {{dataset: {dataset}, model: {model}}}
population:
  clients: 4
  hosts: 1
  devices: [{{name: d, share: 1.0, ms_per_sample: 1.0}}]
  links: [{{name: l, share: 1.0, up_mbps: 10, down_mbps: 10}}]
selection: {{clients_per_round: 2, policy: {policy}}}
algorithm: {{name: {algorithm}}}
"""


def run_components(tmp_path, monkeypatch, timeout: float = 120, **fields):
    """A run of SCENARIO with bad_components importable; fields override its dataset, model, policy, algorithm."""
    (tmp_path / "bad_components.py").write_text(BAD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    values = {"dataset": "bad_components:tiny", "model": "mlp", "policy": "random", "algorithm": "fedavg", **fields}
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO.format(**values))
    return run_cli("run", str(scenario), "--out", str(tmp_path / "out"), timeout=timeout)


@pytest.mark.parametrize("key, fields", [
    ("task.model", {"model": "no_such_package.models:cnn"}),
    ("task.model", {"model": "bad_components:not_a_module"}),
    ("task.model", {"model": "torch.nn:Linear"}),  # Linear() without its arguments raises: said in one line
    ("task.dataset", {"dataset": "bad_components:one_dataset"}),
    ("task.dataset", {"dataset": "bad_components:unlabelled"}),
    ("task.dataset", {"dataset": "bad_components:missing"}),
    ("algorithm", {"algorithm": "bad_components:tiny"}),
    ("selection.policy", {"policy": "collections:OrderedDict"}),
])
def test_a_bad_component_is_one_line_naming_the_key_and_exit_2(tmp_path, monkeypatch, key, fields):
    res = run_components(tmp_path, monkeypatch, **fields)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert f": {key}" in lines[0] and "Traceback" not in res.stderr, lines[0]


def test_a_user_model_that_does_not_fit_the_data_is_named(tmp_path, monkeypatch):
    res = run_components(tmp_path, monkeypatch, model="bad_components:wide")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-2000:]
    assert "task.model: bad_components:wide does not fit the inputs" in res.stderr


def test_a_user_dataset_and_model_run_with_a_built_in_strategy(tmp_path, monkeypatch):
    """tiny: 40 samples of 1x4x4 in 3 classes; a user model on it, trained for real."""
    res = run_components(tmp_path, monkeypatch, timeout=180, model="bad_components:net", algorithm="fedavgm")
    assert res.returncode == 0, res.stderr[-3000:]
    payload = {int(r["payload_bytes"]) for r in rows(tmp_path / "out" / "transfers.csv")}
    assert len(payload) == 1 and payload.pop() > 0
