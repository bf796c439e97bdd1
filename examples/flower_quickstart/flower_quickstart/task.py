"""The model, the data and the training loop of the quickstart app."""
from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms


class Net(nn.Module):
    """A small CNN for 28x28 digits (21,840 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5)
        self.conv2 = nn.Conv2d(8, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


_CACHE: dict = {}


def _mnist(root: str, train: bool):
    key = (root, train)
    if key not in _CACHE:
        _CACHE[key] = datasets.MNIST(root, train=train, download=False, transform=transforms.ToTensor())
    return _CACHE[key]


def load_data(partition_id: int, num_partitions: int, batch_size: int, max_examples: int, data_root: str = ""):
    """This partition's share of MNIST (an IID split of the training set, seeded), as a train and
    a test loader (its 20 % held out)."""
    root = data_root or os.environ.get("EMULATOR_DATA") or "./data"
    full = _mnist(root, True)
    order = np.random.default_rng(42).permutation(len(full))
    part = np.array_split(order, num_partitions)[partition_id][:max_examples]
    cut = int(len(part) * 0.8)
    train = DataLoader(Subset(full, part[:cut].tolist()), batch_size=batch_size, shuffle=True)
    test = DataLoader(Subset(full, part[cut:].tolist()), batch_size=batch_size)
    return train, test


def train(net: Net, loader: DataLoader, epochs: int, lr: float, proximal_mu: float = 0.0) -> float:
    """SGD with momentum; with proximal_mu (FedProx), plus (mu/2)||w - w_global||^2 to the loss."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    anchor = [p.detach().clone() for p in net.parameters()] if proximal_mu > 0 else None
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            if anchor is not None:
                loss = loss + proximal_mu / 2 * sum(((p - a) ** 2).sum() for p, a in zip(net.parameters(), anchor))
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            batches += 1
    return total / max(1, batches)


def test(net: Net, loader: DataLoader) -> tuple[float, float]:
    net.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = net(x)
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            n += len(y)
    return loss / max(1, n), correct / max(1, n)
