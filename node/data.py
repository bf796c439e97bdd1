"""Datasets and partitions. The public data sets load from a data root in torchvision's layouts,
fetched there on first use unless the scenario says `task.download: false` (node/download.py)."""
from __future__ import annotations

import gzip
import json
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .plugins import PluginError, is_import_path, resolve_callable

DATASETS = ("mnist", "fashion_mnist", "cifar10", "femnist", "shakespeare", "synthetic")
LEAF = ("femnist", "shakespeare")  # LEAF's JSON: the data come split by writer
# LEAF's Shakespeare vocabulary (leaf/models/utils/language_utils.py): 80 printable characters
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
ENV_DATA_ROOT = "EMULATOR_DATA"


class DataError(RuntimeError):
    """The dataset could not be loaded; the message says where it looked and what to do."""


@dataclass
class Dataset:
    x: torch.Tensor  # uint8 images (N, C, H, W), float features, or int64 tokens (N, L)
    y: torch.Tensor  # int64 labels
    classes: int
    users: np.ndarray | None = None  # the user (writer) of each sample, where the data come split by user

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def to(self, device) -> "Dataset":
        """The same samples on `device` (moved once per host, not per batch); self when already there."""
        if self.x.device == torch.device(device):
            return self
        return Dataset(self.x.to(device), self.y.to(device), self.classes, self.users)

    def batch(self, idx) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(idx, torch.Tensor) and idx.device != self.x.device:
            idx = idx.to(self.x.device)
        x = self.x[idx]
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
        return x, self.y[idx]


def default_data_root() -> Path:
    if os.environ.get(ENV_DATA_ROOT):
        return Path(os.environ[ENV_DATA_ROOT])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fl-emulator" / "data"


FOLDERS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}
IDX_FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format: 0, 0, dtype 0x08 = uint8, ndim, big-endian int32 sizes, data),
    plain or gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = np.frombuffer(raw, ">i4", count=ndim, offset=4).astype(int)
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: header says {tuple(dims)} but holds {data.size} bytes")
    return data.reshape(tuple(dims))


def _raw_files(name: str, root: Path) -> dict[bool, tuple[Path, Path]] | None:
    folder = root / FOLDERS[name] / "raw"
    found = {}
    for train, files in IDX_FILES.items():
        paths = []
        for file in files:
            plain, packed = folder / file, folder / f"{file}.gz"
            paths.append(plain if plain.exists() else packed if packed.exists() else None)
        if None in paths:
            return None
        found[train] = tuple(paths)
    return found


def _read_raw(files: dict[bool, tuple[Path, Path]]) -> tuple[Dataset, Dataset]:
    """Read torchvision's raw layout directly: the same tensors, without importing torchvision
    (which costs every process about 160 MB)."""
    out = []
    for train in (True, False):
        images, labels = (read_idx(p) for p in files[train])
        out.append(Dataset(torch.from_numpy(images.copy()).unsqueeze(1).contiguous(),
                           torch.from_numpy(labels.astype(np.int64)), 10))
    return out[0], out[1]


def fetch_if_missing(name: str, root: Path, download: bool | str) -> None:
    """`task.download`: auto (the default) and true fetch what a public data set lacks under the
    data root (node/download.py), false never (the reader then says what is missing); a failed
    download is one line naming the folder."""
    from .download import SOURCES, DownloadError, fetch

    source = SOURCES[name]
    if download is False or not source.missing(root):
        return
    folder = root / source.folder
    try:
        fetch(name, root)
    except DownloadError as exc:
        raise DataError(f"dataset {name!r} is not under {folder} and could not be downloaded ({exc}). Without internet "
                        f"access, put the files there or point task.data_root or ${ENV_DATA_ROOT} at a folder that "
                        "has them.") from None


def _idx_dataset(name: str, root: Path, download: bool | str) -> tuple[Dataset, Dataset]:
    files = _raw_files(name, root)
    if files is None:
        fetch_if_missing(name, root, download)
        files = _raw_files(name, root)
    if files is None:
        raise DataError(f"dataset {name!r} not found under {root / FOLDERS[name] / 'raw'}. Put the raw files there, point "
                        f"task.data_root or ${ENV_DATA_ROOT} at a folder that has them, or set task.download: auto (the "
                        "default) on a machine with internet access.")
    return _read_raw(files)


def read_cifar10(root: Path) -> tuple[Dataset, Dataset]:
    """CIFAR-10 in torchvision's `cifar-10-batches-py` layout: pickled batches data_batch_1..5 and
    test_batch, each {b"data": uint8 (N, 3072) as R, G, B planes of 32 x 32, b"labels": [N]}."""
    import pickle

    folder = root / "cifar-10-batches-py"
    names = {True: [f"data_batch_{i}" for i in range(1, 6)], False: ["test_batch"]}
    missing = [n for ns in names.values() for n in ns if not (folder / n).exists()]
    if missing:
        raise DataError(f"dataset 'cifar10' not found under {folder} (missing {', '.join(missing)}). Put torchvision's "
                        f"cifar-10-batches-py folder there, point task.data_root or ${ENV_DATA_ROOT} at its parent, or "
                        "set task.download: auto (the default) on a machine with internet access.")
    out = []
    for train in (True, False):
        xs, ys = [], []
        for name in names[train]:
            try:
                with open(folder / name, "rb") as f:
                    batch = pickle.load(f, encoding="bytes")  # noqa: S301  (the user's own data files)
                data, labels = np.asarray(batch[b"data"], dtype=np.uint8), np.asarray(batch[b"labels"], dtype=np.int64)
            except Exception as exc:  # pickle and a wrong structure raise many unrelated types
                raise DataError(f"{folder / name}: not a CIFAR-10 batch ({type(exc).__name__}: {exc})") from None
            if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
                raise DataError(f"{folder / name}: expected data (N, 3072) and N labels, got {data.shape} and {labels.shape}")
            xs.append(data.reshape(-1, 3, 32, 32))
            ys.append(labels)
        out.append(Dataset(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)), 10))
    return out[0], out[1]


def _leaf_folder(root: Path, name: str, split: str) -> Path:
    """LEAF writes data/NAME/data/{train,test}/*.json; a copy of just the two folders also works."""
    for folder in (root / name / "data" / split, root / name / split):
        if folder.is_dir() and any(folder.glob("*.json")):
            return folder
    raise DataError(f"dataset {name!r} not found: no JSON files in {root / name / 'data' / split} or {root / name / split}. "
                    f"Generate it with LEAF (data/{name}/preprocess.sh) and point task.data_root or ${ENV_DATA_ROOT} at the "
                    "folder that holds its data directory.")


def _leaf_samples(name: str, x: list, where: str) -> np.ndarray:
    if name == "femnist":  # 784 floats in [0, 1] per sample, a 28 x 28 image
        arr = np.asarray(x, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != 784:
            raise DataError(f"{where}: FEMNIST samples must be 784 floats each, got shape {arr.shape}")
        return arr.reshape(-1, 1, 28, 28)
    index = {c: i for i, c in enumerate(LEAF_LETTERS)}  # Shakespeare: 80 characters of text per sample
    try:
        return np.asarray([[index[c] for c in text] for text in x], dtype=np.int64)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{where}: Shakespeare samples must be strings of equal length over LEAF's 80 letters ({exc!r})") from None


def _leaf_labels(name: str, y: list, where: str) -> np.ndarray:
    if name == "femnist":
        return np.asarray(y, dtype=np.int64)
    try:
        return np.asarray([LEAF_LETTERS.index(c) for c in y], dtype=np.int64)
    except (ValueError, TypeError) as exc:
        raise DataError(f"{where}: Shakespeare labels must be single letters of LEAF's vocabulary ({exc!r})") from None


def read_leaf(root: Path, name: str) -> tuple[Dataset, Dataset]:
    """LEAF's JSON ({"users": [...], "user_data": {user: {"x": [...], "y": [...]}}}), train and test
    files alike. Users are numbered in order of their first appearance in the training files
    (sorted by file name); a test user absent from training gets the next numbers."""
    order: dict[str, int] = {}
    out = []
    for split in ("train", "test"):
        folder = _leaf_folder(root, name, split)
        xs, ys, us = [], [], []
        for path in sorted(folder.glob("*.json")):
            try:
                blob = json.loads(path.read_text())
                users, user_data = blob["users"], blob["user_data"]
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"{path}: not LEAF JSON with 'users' and 'user_data' ({type(exc).__name__}: {exc})") from None
            for user in users:
                record = user_data.get(user) if isinstance(user_data, dict) else None
                if not isinstance(record, dict) or "x" not in record or "y" not in record:
                    raise DataError(f"{path}: user {user!r} has no x and y in user_data")
                where = f"{path}: user {user!r}"
                x, y = _leaf_samples(name, record["x"], where), _leaf_labels(name, record["y"], where)
                if len(x) != len(y):
                    raise DataError(f"{where}: {len(x)} samples but {len(y)} labels")
                order.setdefault(user, len(order))
                xs.append(x)
                ys.append(y)
                us.append(np.full(len(y), order[user], dtype=np.int64))
        if not xs:
            raise DataError(f"{folder}: the JSON files list no users")
        x = np.concatenate(xs)
        out.append(Dataset(torch.from_numpy(x), torch.from_numpy(np.concatenate(ys)),
                           62 if name == "femnist" else len(LEAF_LETTERS), np.concatenate(us)))
    return out[0], out[1]


def leaf_split(train: Dataset, test: Dataset, clients: int) -> UserSplit:
    """The writers as LEAF splits them, writer j merged into client j mod N like the FedML split."""
    writers = int(train.users.max()) + 1
    if clients > writers:
        raise DataError(f"the data hold {writers} writers; cannot make {clients} clients")
    per_writer = lambda d: [np.flatnonzero(d.users == w) for w in range(writers)]  # noqa: E731
    # a test writer absent from training stays in the test set, in nobody's own test split
    return UserSplit(train, test, merge_users(per_writer(train), clients), merge_users(per_writer(test), clients))


def synthetic(samples: int, test_samples: int, shape: tuple[int, ...], classes: int, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded, learnable data: each class is a fixed random pattern plus noise."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.rand((classes, *shape), generator=gen)

    def draw(n: int) -> Dataset:
        y = torch.randint(0, classes, (n,), generator=gen)
        # centers[y] * 0.7 + noise * 0.3, in place (the same operations on the same values: the same bytes)
        x = centers[y].mul_(0.7).add_(torch.rand((n, *shape), generator=gen).mul_(0.3)).mul_(255).to(torch.uint8)
        return Dataset(x, y, classes)

    return draw(samples), draw(test_samples)


def load(name: str, root: str | Path | None, download: bool | str = "auto", options: dict | None = None,
         **synthetic_args) -> tuple[Dataset, Dataset]:
    """A data set by its name, or a user's loader named "package.module:loader"."""
    if name == "synthetic":
        return synthetic(**synthetic_args)
    if is_import_path(name):
        return load_user(name, Path(root) if root else default_data_root(), options or {})
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    folder = Path(root) if root else default_data_root()
    if name == "cifar10":
        fetch_if_missing(name, folder, download)
        return read_cifar10(folder)
    if name in LEAF:
        return read_leaf(folder, name)
    return _idx_dataset(name, folder, download)


def load_user(path: str, root: Path, options: dict) -> tuple[Dataset, Dataset]:
    """loader(root, **options) must return (train, test), each a torch.utils.data.Dataset of
    (input tensor, int label) pairs; they become tensors once, here. Inputs keep their dtype (uint8
    ones are scaled to [0, 1] per batch, as the built-in images are); labels come from `.targets`
    when the data set has it, else from its pairs."""
    try:
        loader = resolve_callable(path)
    except PluginError as exc:
        raise DataError(str(exc)) from None
    try:
        pair = loader(str(root), **options)
    except Exception as exc:  # the user's code: whatever it raises is reported in one line
        raise DataError(f"{path!r}: {path.partition(':')[2]}(root, **dataset_options) raised {type(exc).__name__}: {exc}") from None
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise DataError(f"{path!r} returned a {type(pair).__name__}, not a (train, test) pair of data sets")
    (x_train, y_train, k_train), (x_test, y_test, k_test) = (_tensors(ds, f"{path}: its {part} set")
                                                             for ds, part in zip(pair, ("training", "test")))
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(f"{path!r}: training inputs are {tuple(x_train.shape[1:])} but test inputs {tuple(x_test.shape[1:])}")
    classes = max(k_train, k_test, int(y_train.max()) + 1, int(y_test.max()) + 1)
    return Dataset(x_train, y_train, classes), Dataset(x_test, y_test, classes)


def _tensors(ds: Any, where: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A map-style data set as (inputs, int64 labels, the class count it declares or 0)."""
    if not hasattr(ds, "__getitem__") or not hasattr(ds, "__len__"):
        raise DataError(f"{where} is a {type(ds).__name__}, not a torch.utils.data.Dataset")
    n = len(ds)
    if n == 0:
        raise DataError(f"{where} is empty")
    inputs, labels = [], []
    for i in range(n):
        item = ds[i]
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], torch.Tensor):
            raise DataError(f"{where}: item {i} is {_describe(item)}, not an (input tensor, int label) pair")
        try:
            labels.append(operator.index(item[1].item() if isinstance(item[1], torch.Tensor) else item[1]))
        except (TypeError, ValueError, RuntimeError):
            raise DataError(f"{where}: item {i}'s label is {item[1]!r}, not an int") from None
        inputs.append(item[0])
    shapes = {tuple(x.shape) for x in inputs}
    if len(shapes) != 1:
        raise DataError(f"{where}: inputs of different shapes {sorted(shapes)[:3]}")
    targets = getattr(ds, "targets", None)
    y = torch.as_tensor(np.asarray(targets if targets is not None else labels), dtype=torch.int64).reshape(-1)
    if y.numel() != n or int(y.min()) < 0:
        raise DataError(f"{where}: .targets must hold one label >= 0 per sample ({n}), got {y.numel()} from {int(y.min())}")
    declared = getattr(ds, "classes", None)
    return torch.stack(inputs), y, len(declared) if isinstance(declared, (list, tuple)) else 0


def _describe(item: Any) -> str:
    if isinstance(item, (tuple, list)):
        return f"a {len(item)}-item {type(item).__name__} of {', '.join(type(v).__name__ for v in item[:3])}"
    return f"a {type(item).__name__}"


def partition_iid(n_samples: int, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(n_samples), clients)]


def partition_dirichlet(labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator, min_size: int = 1) -> list[np.ndarray]:
    """Per class, split its samples among clients with proportions ~ Dir(alpha); redraw until every
    client has at least min_size samples (bounded number of tries)."""
    classes = np.unique(labels)
    for _ in range(1000):
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * idx.size).astype(int)[:-1]
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].append(chunk)
        shards = [np.sort(np.concatenate(p)) for p in parts]
        if min(s.size for s in shards) >= min_size:
            return shards
    raise DataError(f"Dirichlet(alpha={alpha}) could not give each of {clients} clients {min_size} samples; raise alpha or lower clients")


def fedprox_users(labels: np.ndarray, users: int, seed: int, first: int = 5, sigma: float = 2.0) -> list[np.ndarray]:
    """FedProx's MNIST generator (litian96/FedProx data/mnist/generate_niid.py), which the FedML
    MNIST JSON and the core paper use: user u holds labels u mod K and (u+1) mod K. Each takes
    `first` samples of each of its labels first, in the data's order; then what is left of each
    label is shared among its 2 users/K holders by power law: props = lognormal(0, sigma,
    (K, users/K, 2)) normalised per label to its remaining count, user u taking
    floor(props[label, u // K, j]) for its j-th label (a draw that would run past the label's end
    is skipped, as in FedProx). The draw is numpy's legacy generator seeded with `seed`, the one
    FedProx's unseeded script used. Returns each user's indices into `labels`, in taking order."""
    classes = int(labels.max()) + 1
    if users % classes:
        raise DataError(f"the FedProx split needs users to be a multiple of the {classes} labels, got {users}")
    by_label = [np.flatnonzero(labels == c) for c in range(classes)]
    per_label = 2 * first * users // classes
    for c, pool in enumerate(by_label):
        if pool.size < per_label:
            raise DataError(f"label {c} has {pool.size} samples, fewer than the {per_label} its {2 * users // classes} users take first")
    taken = np.zeros(classes, dtype=np.int64)
    parts: list[list[np.ndarray]] = [[] for _ in range(users)]
    for u in range(users):
        for j in range(2):
            c = (u + j) % classes
            parts[u].append(by_label[c][taken[c]: taken[c] + first])
            taken[c] += first
    props = np.random.RandomState(seed).lognormal(0.0, sigma, (classes, users // classes, 2))
    remaining = np.array([pool.size - per_label for pool in by_label], dtype=np.float64)
    props = remaining[:, None, None] * props / props.sum(axis=(1, 2), keepdims=True)
    for u in range(users):
        for j in range(2):
            c = (u + j) % classes
            count = int(props[c, u // classes, j])
            if taken[c] + count < by_label[c].size:
                parts[u].append(by_label[c][taken[c]: taken[c] + count])
                taken[c] += count
    return [np.concatenate(p) for p in parts]


def split_users(users: list[np.ndarray], train_share: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each user's samples shuffled (seeded), the first int(train_share * n) for training and the
    rest for testing, as FedProx writes its train and test JSON."""
    rng = np.random.RandomState(seed)
    train, test = [], []
    for idx in users:
        shuffled = idx[rng.permutation(idx.size)]
        cut = int(train_share * idx.size)
        train.append(shuffled[:cut])
        test.append(shuffled[cut:])
    return train, test


def merge_users(users: list[np.ndarray], clients: int) -> list[np.ndarray]:
    """User j goes to client j mod N (FedML's round-robin merge); each client's indices sorted."""
    if clients > len(users):
        raise DataError(f"the by-user partition has {len(users)} users; cannot make {clients} clients (raise task.partition.users)")
    merged: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for u, idx in enumerate(users):
        merged[u % clients].append(idx)
    return [np.sort(np.concatenate(m)).astype(np.int64) for m in merged]


@dataclass
class UserSplit:
    """A dataset regrouped by user: the pool every index refers to, the test set (the union of the
    users' test parts, indexed by `test_shards`) and each client's training indices into the pool."""
    train: Dataset
    test: Dataset
    train_shards: list[np.ndarray]
    test_shards: list[np.ndarray]


def fedprox_split(train: Dataset, test: Dataset, clients: int, users: int, seed: int,
                  train_share: float = 0.9, sigma: float = 2.0) -> UserSplit:
    """FedProx's split of the whole data set: torchvision's training and test files joined (70,000
    MNIST images, as FedProx's `MNIST original`), cut into users by `fedprox_users`, each user's
    part split 90/10, users merged round-robin into clients."""
    pool = Dataset(torch.cat([train.x, test.x]), torch.cat([train.y, test.y]), train.classes)
    users_idx = fedprox_users(pool.y.numpy(), users, seed, sigma=sigma)
    user_train, user_test = split_users(users_idx, train_share, seed)
    train_shards = merge_users(user_train, clients)
    client_tests = merge_users(user_test, clients)
    held_out = np.sort(np.concatenate(user_test)).astype(np.int64)
    test_set = Dataset(pool.x[torch.from_numpy(held_out)], pool.y[torch.from_numpy(held_out)], pool.classes)
    test_shards = [np.searchsorted(held_out, t) for t in client_tests]
    return UserSplit(pool, test_set, train_shards, test_shards)


def by_user_labels(users: int, classes: int) -> list[tuple[int, int]]:
    """The two labels of each user: user u holds u mod K and (u mod K + 1 + (u div K) mod (K-1)) mod K.

    For users = 1000 and K = 10 every label is held by exactly 200 users, 100 as the first label
    and 100 as the second, and no user holds one label twice."""
    return [(u % classes, (u % classes + 1 + (u // classes) % (classes - 1)) % classes) for u in range(users)]


def partition_by_user(labels: np.ndarray, clients: int, users: int = 1000, seed: int = 0, size_sigma: float = 1.0) -> list[np.ndarray]:
    """The FedML MNIST split rebuilt from the training set (docs/algorithms.md 1.7): `users` users with
    two labels each, then user j merged into client j mod N.

    Each label's samples are shuffled (numpy seed `seed`) and cut among the users holding it into
    pieces of log-normal relative size (sigma `size_sigma`, at least 2 samples each), which gives
    LEAF-like unequal user sizes. Deterministic for a given training set, users and seed."""
    classes = int(labels.max()) + 1
    if clients > users:
        raise DataError(f"the by-user partition has {users} users; cannot make {clients} clients (raise task.partition.users)")
    rng = np.random.default_rng(seed)
    holders: list[list[int]] = [[] for _ in range(classes)]
    for u, pair in enumerate(by_user_labels(users, classes)):
        for c in pair:
            holders[c].append(u)
    parts: list[list[np.ndarray]] = [[] for _ in range(users)]
    for c in range(classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = len(holders[c])
        if idx.size < 2 * k:
            raise DataError(f"label {c} has {idx.size} samples, fewer than 2 for each of its {k} users")
        weights = rng.lognormal(0.0, size_sigma, k)
        sizes = 2 + np.floor(weights / weights.sum() * (idx.size - 2 * k)).astype(int)
        sizes[: idx.size - sizes.sum()] += 1  # hand out the rounding remainder
        for u, chunk in zip(holders[c], np.split(idx, np.cumsum(sizes)[:-1])):
            parts[u].append(chunk)
    merged: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for u in range(users):
        merged[u % clients].extend(parts[u])
    return [np.sort(np.concatenate(m)) for m in merged]


def partition_label_skew(labels: np.ndarray, clients: int, k: int, rng: np.random.Generator,
                         primary: float = 0.55, secondary: float = 0.20, rest: float = 0.03) -> list[np.ndarray]:
    """FIRMA's label skew (docs/algorithms.md 2.6): client i's primary classes are cyc[iK : iK+K] and its
    secondary ones cyc[iK+K : iK+2K+1] of the cycled class list. With B = max(20, floor(n/N)) it
    takes floor(primary B) samples from EACH primary class, floor(secondary B) from each secondary
    class and floor(rest B) from each other class, in client order, from one shuffled pool per
    class; a class that runs dry gives what it has left."""
    classes = int(labels.max()) + 1
    if k > classes:
        raise DataError(f"classes_per_client {k} is more than the data set's {classes} classes")
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(classes)]
    taken = [0] * classes
    budget = max(20, labels.size // clients)
    shards = []
    for i in range(clients):
        first = [(i * k + j) % classes for j in range(k)]
        second = [(i * k + k + j) % classes for j in range(k + 1)]
        parts = []
        for c in range(classes):
            share = primary if c in first else secondary if c in second else rest
            want = int(np.floor(share * budget))
            got = pools[c][taken[c]: taken[c] + want]
            taken[c] += len(got)
            parts.append(np.asarray(got, dtype=np.int64))
        shards.append(np.sort(np.concatenate(parts)))
    return shards


def partition_dirichlet_fedml(labels: np.ndarray, clients: int, alpha: float, min_size: int = 10, seed: int = 10) -> list[np.ndarray]:
    """FedML's LDA split (partition_method=hetero, docs/algorithms.md 1.7): numpy's legacy generator
    seeded with `seed`; per class, p ~ Dir(alpha 1_N), p_j set to 0 for clients that already hold
    n/N samples, renormalised, cut by cumsum; the whole draw repeated until every client has
    min_size samples; each client's indices shuffled."""
    rng = np.random.RandomState(seed)
    n, classes = labels.size, np.unique(labels)
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(clients)]
        for c in classes:
            idx = np.flatnonzero(labels == c)
            rng.shuffle(idx)
            p = rng.dirichlet(np.repeat(alpha, clients))
            p = np.array([pj * (len(part) < n / clients) for pj, part in zip(p, parts)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * idx.size).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx, cuts)):
                part.extend(chunk.tolist())
        if min(len(part) for part in parts) >= min_size:
            break
    else:
        raise DataError(f"FedML's Dirichlet(alpha={alpha}) could not give each of {clients} clients {min_size} samples")
    out = []
    for part in parts:
        idx = np.asarray(part, dtype=np.int64)
        rng.shuffle(idx)
        out.append(np.sort(idx))
    return out


def partition_dirichlet_floor(labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """FIRMA's Dirichlet split (docs/algorithms.md 2.6): per class, p ~ Dir(alpha 1_N), client j gets
    floor(p_j n_c) samples and the last client the remainder. No redraw."""
    classes = np.unique(labels)
    parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for c in classes:
        idx = rng.permutation(np.flatnonzero(labels == c))
        counts = np.floor(rng.dirichlet(np.full(clients, alpha)) * idx.size).astype(int)
        counts[-1] = idx.size - counts[:-1].sum()
        for j, chunk in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
            parts[j].append(chunk)
    return [np.sort(np.concatenate(p)) for p in parts]


def with_input_noise(data: Dataset, indices: np.ndarray, std: float, seed) -> tuple[Dataset, np.ndarray]:
    """A client's own samples with fixed additive Gaussian noise N(0, std^2) on its inputs (feature
    skew, NIID-Bench style), as a dataset of its own indexed 0..n-1; unchanged when std is 0.
    The noise is drawn once, so every epoch sees the same noisy samples."""
    if std <= 0:
        return data, indices
    x, y = data.batch(torch.from_numpy(indices))
    noise = np.random.default_rng(seed).normal(0.0, std, size=tuple(x.shape)).astype(np.float32)
    return Dataset(x + torch.from_numpy(noise).to(x.device), y, data.classes), np.arange(indices.size)
