"""Local training and evaluation: plain minibatch SGD, real work on the real model, with the
core paper's gradient clipping and Lipschitz estimate when local DP is on."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .data import Dataset
from .privacy import LipschitzEstimate, clip_parts


@dataclass(frozen=True)
class DpSgd:
    """DP-SGD (Abadi et al. 2016): each sample's gradient clipped to L2 norm `clip`, Gaussian noise
    of std noise_multiplier * clip added to their sum, divided by the batch size."""
    noise_multiplier: float
    clip: float
    sampling: str = "poisson"  # poisson: each sample in each step with probability B/n; shuffle: fixed batches
    # Poisson steps per epoch when a capped session (algorithm.max_samples_per_round) draws its batches
    # from all n of the client's samples: ceil(cap/B), the cap's work; None: ceil(n/B)
    steps: int | None = None


@dataclass(frozen=True)
class LocalTraining:
    epochs: int
    batch_size: int
    lr: float
    clip: float | None = None  # gradient-norm threshold xi (Eq. 1.8); None: no clipping
    clip_norm: float = 1.0  # 1: L1 (Laplace), 2: L2 (Gaussian)
    estimate_lipschitz: bool = False  # Eq. 1.9
    shuffle: str = "every_epoch"  # or "once": batches built once per client and replayed (the paper's MNIST loader)
    prox_mu: float = 0.0  # FedProx: add (mu/2) ||w - w_global||^2 to the local loss
    dpsgd: DpSgd | None = None  # per-sample clipping and noise at every step (node/cohort.py runs it)


@dataclass
class TrainingResult:
    loss: float  # mean loss of the last epoch
    lipschitz: float = 0.0
    samples_seen: int = 0  # samples of one epoch
    loss_rms: float = 0.0  # root mean square of the per-sample losses of the last epoch (Oort's utility)


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def on_device(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch where the model is: a no-op for data the host already moved there (the shared sets),
    one copy for data built elsewhere (a client's noisy or aligned copy)."""
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def steps_per_epoch(samples: int, batch_size: int) -> int:
    return max(1, -(-int(samples) // batch_size))


def epoch_steps(samples: int, cfg: LocalTraining) -> int:
    """Steps in one epoch over `samples` samples: ceil(n/B), or a capped DP-SGD session's own count."""
    if cfg.dpsgd is not None and cfg.dpsgd.steps is not None:
        return cfg.dpsgd.steps
    return steps_per_epoch(samples, cfg.batch_size)


def poisson_rate(samples: int, batch_size: int) -> float:
    """DP-SGD's Poisson sampling: the probability that a sample is in a step's batch (what the
    accountant is told, so it must be what the batches were drawn with)."""
    return min(1.0, batch_size / max(1, int(samples)))


def batches(indices: np.ndarray, cfg: LocalTraining, rng: np.random.Generator, fixed: np.ndarray | None):
    """One epoch's batches. Under DP-SGD with Poisson sampling, steps_per_epoch batches in which
    each sample is independently with probability B/n (their sizes vary; one may be empty)."""
    if cfg.dpsgd is not None and cfg.dpsgd.sampling == "poisson":
        rate = poisson_rate(indices.size, cfg.batch_size)
        return [indices[rng.random(indices.size) < rate] for _ in range(epoch_steps(indices.size, cfg))]
    order = fixed if fixed is not None else rng.permutation(indices)
    return [order[s:s + cfg.batch_size] for s in range(0, order.size, cfg.batch_size)]


def train_local(model: nn.Module, data: Dataset, indices: np.ndarray, cfg: LocalTraining,
                rng: np.random.Generator, fixed_order: np.ndarray | None = None,
                correction: dict[str, np.ndarray] | None = None) -> TrainingResult:
    """E epochs of minibatch SGD over the client's samples.

    With shuffle "once" the caller passes `fixed_order`, the same for every epoch (and round), so
    batch position k holds the same samples in every epoch, which Eq. 1.9 compares. A correction
    (parameter name -> array, a strategy's: SCAFFOLD's c - c_i) is added to every step's gradient."""
    if cfg.dpsgd is not None:
        raise ValueError("DP-SGD needs per-sample gradients: it trains through node.cohort.train_cohort")
    model.train()
    device = device_of(model)
    params = [p for p in model.parameters() if p.requires_grad]
    loss_fn = nn.CrossEntropyLoss()
    estimate = LipschitzEstimate(cfg.lr) if cfg.estimate_lipschitz else None
    fixed = fixed_order if cfg.shuffle == "once" else None
    anchor = [p.detach().clone() for p in params] if cfg.prox_mu > 0 else None
    offsets = gradient_offsets(model, correction)
    last = last_rms = 0.0
    for _ in range(cfg.epochs):
        total, squares, count = 0.0, 0.0, 0
        for position, idx in enumerate(batches(indices, cfg, rng, fixed)):
            x, y = on_device(data.batch(torch.from_numpy(idx)), device)
            for p in params:
                p.grad = None
            out = model(x)
            loss = loss_fn(out, y)
            with torch.no_grad():
                squares += float((nn.functional.cross_entropy(out, y, reduction="none") ** 2).sum())
            objective = loss if anchor is None else loss + proximal_term(params, anchor, cfg.prox_mu)
            objective.backward()
            for p, offset in offsets:
                p.grad.add_(offset)
            grads = [p.grad for p in params if p.grad is not None]  # this step's own tensors
            if cfg.clip is not None:
                clip_parts(grads, cfg.clip, cfg.clip_norm)
            if estimate is not None:  # keeps them: the next step's backward pass makes new ones
                estimate.observe(position, grads)
            sgd_step(params, cfg.lr)
            total += float(loss.detach()) * y.numel()
            count += y.numel()
        last, last_rms = total / max(count, 1), (squares / max(count, 1)) ** 0.5
    return TrainingResult(last, estimate.value if estimate else 0.0, int(indices.size), last_rms)


def gradient_offsets(model: nn.Module, correction: dict[str, np.ndarray] | None) -> list[tuple[nn.Parameter, torch.Tensor]]:
    """(parameter, the tensor added to its gradient) for each corrected trainable parameter."""
    if not correction:
        return []
    return [(p, torch.as_tensor(np.asarray(correction[name]), dtype=p.dtype).to(p.device))
            for name, p in model.named_parameters() if p.requires_grad and name in correction]


@torch.no_grad()
def sgd_step(params: list[torch.nn.Parameter], lr: float) -> None:
    """w <- w - lr * grad: what torch.optim.SGD does without momentum or weight decay, the same
    op per tensor. Written out because constructing any torch.optim optimizer imports
    torch._dynamo (and Triton), about 150 MiB in every host process."""
    for p in params:
        if p.grad is not None:
            p.add_(p.grad, alpha=-lr)


def proximal_term(params, anchor, mu: float) -> torch.Tensor:
    """FedProx's (mu/2) ||w - w_t||^2 over the trainable parameters (Li et al., MLSys 2020)."""
    return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, max_samples: int | None = None, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean loss) on the first max_samples test samples."""
    model.eval()
    n = data.y.numel() if max_samples is None else min(max_samples, data.y.numel())
    correct, loss_sum = 0, 0.0
    for start in range(0, n, batch_size):
        x, y = on_device(data.batch(slice(start, min(n, start + batch_size))), device_of(model))
        out = model(x)
        loss_sum += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
    return correct / max(n, 1), loss_sum / max(n, 1)


def train_part(model: nn.Module, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, data: Dataset,
               indices: np.ndarray, epochs: int, batch_size: int, rng: np.random.Generator) -> float:
    """Epochs of cross-entropy that update only `params` with the caller's (persistent) optimizer;
    every other parameter is frozen meanwhile (docs/algorithms.md 2.2). Returns the last epoch's mean loss."""
    model.train()
    device = device_of(model)
    trainable = {id(p) for p in params}
    frozen = [p for p in model.parameters() if id(p) not in trainable and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    loss_fn = nn.CrossEntropyLoss()
    last = 0.0
    try:
        for _ in range(epochs):
            total, count = 0.0, 0
            order = rng.permutation(indices)
            for s in range(0, order.size, batch_size):
                x, y = on_device(data.batch(torch.from_numpy(order[s:s + batch_size])), device)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * y.numel()
                count += y.numel()
            last = total / max(count, 1)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return last


@torch.no_grad()
def accuracy_on(model: nn.Module, data: Dataset, indices: np.ndarray, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean loss) of the model on the given samples."""
    model.eval()
    correct, loss_sum = 0, 0.0
    for s in range(0, indices.size, batch_size):
        x, y = on_device(data.batch(torch.from_numpy(indices[s:s + batch_size])), device_of(model))
        out = model(x)
        loss_sum += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
    return correct / max(indices.size, 1), loss_sum / max(indices.size, 1)
