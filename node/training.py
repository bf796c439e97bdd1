"""Local training and evaluation: plain minibatch SGD, real work on the real model."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .data import Dataset


def train_sgd(model: nn.Module, data: Dataset, indices: np.ndarray, epochs: int, batch_size: int, lr: float,
              rng: np.random.Generator) -> float:
    """E epochs of minibatch SGD over the client's samples; returns the mean loss of the last epoch."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    last = 0.0
    for _ in range(epochs):
        order = rng.permutation(indices)
        total, count = 0.0, 0
        for start in range(0, order.size, batch_size):
            x, y = data.batch(torch.from_numpy(order[start:start + batch_size]))
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * y.numel()
            count += y.numel()
        last = total / max(count, 1)
    return last


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, max_samples: int | None = None, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean loss) on the first max_samples test samples."""
    model.eval()
    n = data.y.numel() if max_samples is None else min(max_samples, data.y.numel())
    correct, loss_sum = 0, 0.0
    for start in range(0, n, batch_size):
        x, y = data.batch(slice(start, min(n, start + batch_size)))
        out = model(x)
        loss_sum += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
    return correct / max(n, 1), loss_sum / max(n, 1)
