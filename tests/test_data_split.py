"""FedProx's MNIST generator (issue 13, item 1): hand-checkable properties on synthetic labels, the
paper's two-digits-per-client property on real MNIST, and the world wiring it as by_user's default."""
import numpy as np
import pytest

from conftest import needs_mnist, write_scenario
from node.data import DataError, fedprox_users, merge_users, split_users

LABELS = np.repeat(np.arange(10), 1500)  # 1,500 of each digit, in label order like MNIST's own files


def test_each_user_holds_its_two_digits_and_takes_five_of_each_first():
    users = fedprox_users(LABELS, 100, seed=0)
    by_label = [np.flatnonzero(LABELS == c) for c in range(10)]
    for u, idx in enumerate(users):
        assert set(np.unique(LABELS[idx])) == {u % 10, (u + 1) % 10}
        assert np.count_nonzero(LABELS[idx] == u % 10) >= 5 and np.count_nonzero(LABELS[idx] == (u + 1) % 10) >= 5
    # user 0 takes digit 0's first five, then digit 1's first five; user 9 the second five of digits 9
    # and 0 (user 8 took digit 9's first five as its second digit)
    assert users[0][:10].tolist() == by_label[0][:5].tolist() + by_label[1][:5].tolist()
    assert users[9][:10].tolist() == by_label[9][5:10].tolist() + by_label[0][5:10].tolist()
    everything = np.concatenate(users)
    assert np.unique(everything).size == everything.size  # nobody shares a sample


def test_power_law_shares_all_but_the_floor_remainders():
    users = fedprox_users(LABELS, 100, seed=0)
    # 20 holders per digit take 100 first; the other 1,400 go by floor(props): each holder loses < 1
    counts = np.bincount(LABELS[np.concatenate(users)], minlength=10)
    assert np.all(counts <= 1500) and np.all(counts > 1500 - 20)
    sizes = np.array([u.size for u in users])
    assert sizes.max() > 5 * np.median(sizes)  # lognormal(0, 2): a few users hold most of a digit
    again = fedprox_users(LABELS, 100, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(users, again))
    assert [u.size for u in fedprox_users(LABELS, 100, seed=1)] != sizes.tolist()


def test_props_are_numpy_legacy_lognormal_normalised_per_digit():
    """One user's count by hand: props[digit, u // 10, j] of RandomState(seed).lognormal(0, 2, (10, 10, 2))."""
    props = np.random.RandomState(7).lognormal(0.0, 2.0, (10, 10, 2))
    props = 1400 * props / props.sum(axis=(1, 2), keepdims=True)
    users = fedprox_users(LABELS, 100, seed=7)
    u = 42  # digits 2 (j = 0) and 3 (j = 1), props row u // 10 = 4
    assert np.count_nonzero(LABELS[users[u]] == 2) == 5 + int(props[2, 4, 0])
    assert np.count_nonzero(LABELS[users[u]] == 3) == 5 + int(props[3, 4, 1])


def test_split_users_ninety_ten_and_merge_round_robin():
    users = [np.arange(10 * i, 10 * i + n) for i, n in enumerate([10, 3, 21, 1])]
    train, test = split_users(users, 0.9, seed=0)
    assert [t.size for t in train] == [9, 2, 18, 0]
    assert [t.size for t in test] == [1, 1, 3, 1]
    for u, tr, te in zip(users, train, test):
        assert sorted(np.concatenate([tr, te]).tolist()) == u.tolist()
    merged = merge_users(users, 2)
    assert merged[0].tolist() == sorted(users[0].tolist() + users[2].tolist())
    with pytest.raises(DataError, match="cannot make 5 clients"):
        merge_users(users, 5)


def test_too_few_samples_and_odd_user_counts_are_clear_errors():
    with pytest.raises(DataError, match="multiple of the 10 labels"):
        fedprox_users(LABELS, 105, seed=0)
    with pytest.raises(DataError, match="label 0 has 30 samples, fewer than the 40"):
        fedprox_users(np.repeat(np.arange(10), 30), 40, seed=0)


@needs_mnist
@pytest.mark.parametrize("clients", [50, 100])
def test_mnist_clients_keep_exactly_two_digits_as_in_the_paper(clients):
    from node.data import fedprox_split, load

    train, test = load("mnist", None)
    split = fedprox_split(train, test, clients, 1000, seed=0)
    assert split.train.y.numel() == 70_000
    for j, shard in enumerate(split.train_shards):
        assert set(np.unique(split.train.y.numpy()[shard])) == {j % 10, (j + 1) % 10}
    used = sum(s.size for s in split.train_shards) + split.test.y.numel()
    assert 70_000 - 2_000 < used <= 70_000
    assert split.test.y.numel() == sum(s.size for s in split.test_shards)
    assert 0.09 < split.test.y.numel() / used < 0.12  # each user's last 10 % (int() floors the training part)


@needs_mnist
def test_by_user_defaults_to_fedprox_in_the_world(tmp_path):
    from emulator.scenario import load_scenario
    from emulator.world import build_world

    text = """
rounds: 1
task: {dataset: mnist, model: mlp, partition: {kind: by_user, users: 1000}}
population: {clients: 50, hosts: 1, devices: [{ms_per_sample: 1}], links: [{up_mbps: 10, down_mbps: 10}]}
selection: {clients_per_round: 5}
eval: {split: clients}
"""
    sc, _ = load_scenario(write_scenario(tmp_path / "s.yaml", text))
    world = build_world(sc)
    assert world.task.train.y.numel() == 70_000  # FedProx draws from all 70,000 images
    labels = world.task.train.y.numpy()
    assert all(set(np.unique(labels[c.profile.indices])) == {i % 10, (i + 1) % 10} for i, c in enumerate(world.clients))
    test_labels = world.task.test.y.numpy()
    assert all(set(np.unique(test_labels[c.profile.test_indices])) <= {i % 10, (i + 1) % 10} for i, c in enumerate(world.clients))
    assert world.server.eval_shards is not None
    sc2, _ = load_scenario(write_scenario(tmp_path / "p.yaml", text.replace("users: 1000}", "users: 1000, generator: pairs}")))
    assert build_world(sc2).task.train.y.numel() == 60_000
