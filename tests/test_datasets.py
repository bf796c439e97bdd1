"""Data sets users bring (issue 13, item 8): CIFAR-10 in torchvision's pickled layout and LEAF's
JSON (FEMNIST, Shakespeare), each tested on small files in the exact format, written here, and
run for a round on real processes; missing data is one clear line naming the folder."""
import json
import pickle

import numpy as np
import pytest

from conftest import REPO, read_csv, run_cli, write_scenario
from emulator.scenario import ScenarioError, load_scenario
from emulator.world import build_world, load_task
from node.data import LEAF_LETTERS, DataError, load, partition_dirichlet_fedml


def write_cifar(root, per_batch=4, test=3):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    batches = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", test)]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": []}, f)
        batches[name] = (data, labels)
    return batches


def test_cifar10_reads_the_pickled_batches_as_channel_planes(tmp_path):
    batches = write_cifar(tmp_path)
    train, test = load("cifar10", tmp_path)
    assert tuple(train.x.shape) == (20, 3, 32, 32) and train.x.dtype.is_floating_point is False
    assert tuple(test.x.shape) == (3, 3, 32, 32) and train.classes == 10
    data, labels = batches["data_batch_2"]
    # the second batch starts at sample 4; its green plane starts at byte 1024 of the row
    assert int(train.x[4, 1, 0, 0]) == int(data[0, 1024]) and int(train.x[4, 2, 31, 31]) == int(data[0, 3071])
    assert train.y[4:8].tolist() == labels
    assert test.y.tolist() == batches["test_batch"][1]


def test_cifar10_missing_or_damaged_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"cifar-10-batches-py \(missing data_batch_1"):
        load("cifar10", tmp_path, download=False)
    with pytest.raises(DataError, match=r"dataset 'cifar10' is not under \S*cifar-10-batches-py and could not be downloaded "
                                        r"\(cifar-10-python.tar.gz: http://127.0.0.1:9/cifar10/cifar-10-python.tar.gz: "):
        load("cifar10", tmp_path)  # (tests/conftest.py points the mirrors at a closed port)
    assert not any(tmp_path.iterdir())  # nothing half-written
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="test_batch: not a CIFAR-10 batch"):
        load("cifar10", tmp_path)


def test_fedml_dirichlet_gives_every_client_its_minimum_and_caps_full_clients():
    labels = np.repeat(np.arange(10), 100)
    parts = partition_dirichlet_fedml(labels, 5, 0.5, min_size=10)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    assert min(p.size for p in parts) >= 10
    assert [p.tolist() for p in parts] == [p.tolist() for p in partition_dirichlet_fedml(labels, 5, 0.5, min_size=10)]


def leaf_blob(users, make):
    return {"users": users, "num_samples": [len(make(u)[1]) for u in users],
            "user_data": {u: {"x": make(u)[0], "y": make(u)[1]} for u in users}}


def write_femnist(root):
    for split, files in {"train": [["f0001", "f0002"], ["f0003"]], "test": [["f0001", "f0002", "f0003"]]}.items():
        folder = root / "femnist" / "data" / split
        folder.mkdir(parents=True)
        for i, users in enumerate(files):
            def make(u, split=split):
                k = int(u[-1]) + (3 if split == "train" else 0)
                return [[(j % 7) / 7.0] * 784 for j in range(k)], [(int(u[-1]) * 11 + j) % 62 for j in range(k)]
            (folder / f"all_data_{i}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(leaf_blob(users, make)))


def test_femnist_keeps_the_writers_in_order(tmp_path):
    write_femnist(tmp_path)
    train, test = load("femnist", tmp_path)
    assert tuple(train.x.shape) == (4 + 5 + 6, 1, 28, 28) and train.classes == 62
    assert train.users.tolist() == [0] * 4 + [1] * 5 + [2] * 6  # order of first appearance, files by name
    assert test.users.tolist() == [0] * 1 + [1] * 2 + [2] * 3
    assert train.y[:4].tolist() == [11, 12, 13, 14]


def write_shakespeare(root):
    for split in ("train", "test"):
        folder = root / "shakespeare" / split
        folder.mkdir(parents=True)
        text = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer the slings"
        def make(u, split=split):
            k = 6 if split == "train" else 2
            return [text[j:j + 80] for j in range(k)], [text[j + 80] for j in range(k)]
        (folder / "data.json").write_text(json.dumps(leaf_blob(["HAMLET", "OPHELIA"], make)))


def test_shakespeare_characters_become_leaf_vocabulary_indices(tmp_path):
    write_shakespeare(tmp_path)
    train, _ = load("shakespeare", tmp_path)
    assert tuple(train.x.shape) == (12, 80) and train.classes == 80
    assert train.x[0, :2].tolist() == [LEAF_LETTERS.index("T"), LEAF_LETTERS.index("o")]
    assert train.users.tolist() == [0] * 6 + [1] * 6


SCENARIO = """
rounds: 1
task: {{dataset: {dataset}, model: {model}, data_root: {root}, partition: {partition}}}
population: {{clients: 2, hosts: 1, devices: [{{gflops: 50}}], links: [{{up_mbps: 100, down_mbps: 100}}]}}
selection: {{clients_per_round: 2}}
algorithm: {{local_epochs: 1, batch_size: 4}}
eval: {{every: 1, split: {split}}}
"""


@pytest.mark.parametrize("dataset, model, partition, split, writer", [
    ("cifar10", "vgg7", "{kind: dirichlet, alpha: 0.5, rule: fedml, min_size: 2}", "global", write_cifar),
    ("femnist", "mnist_cnn", "{kind: natural}", "clients", write_femnist),
    ("shakespeare", "char_lstm", "{kind: natural}", "clients", write_shakespeare),
])
def test_each_data_set_runs_a_round_on_real_processes(tmp_path, dataset, model, partition, split, writer):
    writer(tmp_path / "data")
    text = SCENARIO.format(dataset=dataset, model=model, root=tmp_path / "data", partition=partition, split=split)
    out = tmp_path / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", text)), "--out", str(out), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_csv(out / "rounds.csv")
    assert len(rows) == 1 and int(rows[0]["completed"]) == 2 and rows[0]["accuracy"] != ""


@pytest.mark.parametrize("dataset, model, partition, expected, data_missing", [
    # run fetches (and fails: the mirrors point at a closed port), validate only looks
    ("cifar10", "vgg7", "{kind: iid}", "cifar-10-batches-py", True),
    ("femnist", "mnist_cnn", "{kind: natural}", "dataset 'femnist' not found: no JSON files in", True),
    ("femnist", "mnist_cnn", "{kind: iid}", "femnist comes split by writer; use kind: natural", False),
    ("mnist", "char_lstm", "{kind: iid}", "char_lstm is the model for shakespeare", False),
])
def test_missing_data_and_mismatched_keys_are_one_clear_line(tmp_path, dataset, model, partition, expected, data_missing):
    text = SCENARIO.format(dataset=dataset, model=model, root=tmp_path / "nothing", partition=partition, split="global")
    path = write_scenario(tmp_path / "s.yaml", text)
    res = run_cli("run", str(path), "--out", str(tmp_path / "out"), timeout=60)
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0] and str(path) in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()
    checked = run_cli("validate", str(path), timeout=60)
    if data_missing:  # a valid scenario whose data is elsewhere: a warning, the same message
        assert checked.returncode == 0 and expected in checked.stderr and "its data set is not here" in checked.stdout
    else:
        assert checked.returncode == 2 and expected in checked.stderr


def test_shipped_cifar10_scenarios_validate_without_the_data(tmp_path):
    """The command for one (its words), validate's own checks in this process for the others."""
    res = run_cli("validate", str(REPO / "scenarios" / "paper" / "cifar10_fp32.yaml"), "--set", f"task.data_root={tmp_path}",
                  timeout=60)
    assert res.returncode == 0 and "schema ok" in res.stdout, res.stderr
    assert "dataset 'cifar10' not found" in res.stderr
    for mode in ("int8", "cosine", "dynamic"):
        sc, _ = load_scenario(REPO / "scenarios" / "paper" / f"cifar10_{mode}.yaml", [f"task.data_root={tmp_path}"])
        with pytest.raises(ScenarioError, match="dataset 'cifar10' not found"):
            load_task(sc, fetch=False)


def test_cifar10_paper_scenarios_validate_against_the_test_files(tmp_path):
    write_cifar(tmp_path, per_batch=40, test=10)
    res = run_cli("validate", str(REPO / "scenarios" / "paper" / "cifar10_fp32.yaml"), "--set", f"task.data_root={tmp_path}",
                  "--set", "population.clients=10", timeout=60)
    assert res.returncode == 0 and "ok (10 clients" in res.stdout, res.stderr
    for mode in ("int8", "cosine", "dynamic"):  # validate's own checks, in this process
        sc, _ = load_scenario(REPO / "scenarios" / "paper" / f"cifar10_{mode}.yaml",
                              [f"task.data_root={tmp_path}", "population.clients=10"])
        build_world(sc, load_task(sc))


def test_synthetic_samples_are_their_class_pattern_and_noise_drawn_in_a_fixed_order():
    """The draws (patterns, labels, noise, from one seeded generator) and the arithmetic
    (pattern * 0.7 + noise * 0.3, scaled to bytes) written out: a faster way of computing them must
    give the same bytes, or every synthetic scenario's results move."""
    import torch  # noqa: PLC0415

    from node.data import synthetic  # noqa: PLC0415

    train, test = synthetic(500, 20, (1, 4, 4), 3, seed=5)
    gen = torch.Generator().manual_seed(5)
    centers = torch.rand((3, 1, 4, 4), generator=gen)
    for data, n in ((train, 500), (test, 20)):
        y = torch.randint(0, 3, (n,), generator=gen)
        x = (centers[y] * 0.7 + torch.rand((n, 1, 4, 4), generator=gen) * 0.3).mul_(255).to(torch.uint8)
        assert torch.equal(data.y, y) and torch.equal(data.x, x)
    assert len(set(train.y.tolist())) == 3 and train.x.float().std() > 10
