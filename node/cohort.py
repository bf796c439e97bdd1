"""Cohort training: several clients of one host, with the same model and the same local
schedule, trained together. Each client keeps its own weights (stacked along a leading cohort
dimension), its own minibatches, clipping, Lipschitz estimate and loss; one vectorised step
(`torch.func.vmap` over `functional_call`) advances all of them. Per client it is the math of
`train_local`, step for step; only the floating-point evaluation order differs.

Clients are grouped by their number of steps per epoch, so no client idles through steps of
another; a shorter last batch is padded to the batch size and masked (the padding weighs nothing).

The gate below lets the unmodified client code drive it: each client of a group runs its work
in a thread of its own, and its call to train waits there until every client of the group has
either asked to train or finished; then the whole group trains at once."""
from __future__ import annotations

import copy
import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from .data import Dataset
from .models import load_numpy_state, state_to_numpy
from .privacy import CLIP_EPSILON, LipschitzEstimate
from .training import LocalTraining, TrainingResult, batches, device_of, epoch_steps, steps_per_epoch, train_local


@dataclass
class TrainRequest:
    """One client's call to train: the arguments of `train_local` and the state to start from."""
    state: dict[str, np.ndarray]
    data: Dataset
    indices: np.ndarray
    cfg: LocalTraining
    rng: np.random.Generator
    fixed_order: np.ndarray | None = None
    correction: dict[str, np.ndarray] | None = None  # added to each step's gradient (a strategy's, as SCAFFOLD's)

    @property
    def steps_per_epoch(self) -> int:
        return epoch_steps(self.indices.size, self.cfg)

    @property
    def key(self) -> tuple:
        """Requests with equal keys can train as one cohort."""
        return self.cfg, self.steps_per_epoch, self.correction is not None


def cohort_capable(model: nn.Module) -> bool:
    """A model can train in cohorts when its whole state is trainable parameters (no running
    statistics to update per client, as BatchNorm has) and its layers have vmap rules."""
    if any(True for _ in model.buffers()) or not getattr(type(model), "COHORT", True):
        return False
    return all(p.requires_grad for p in model.parameters())


def resolve_cohort(setting: str | int, model: nn.Module, device: str) -> int:
    """The largest cohort a host trains at once (1: one by one).

    auto: 32 on a GPU, where one small client's step leaves the device idle; off on a CPU, where
    tools/bench_training.py measures cohorts slower than one client at a time (a vmapped
    convolution with per-client weights runs as a grouped convolution, and each client's dense
    weights still cross the memory bus once per step). A number forces cohorts of that size."""
    if not cohort_capable(model) or setting == "off":
        return 1
    if setting == "auto":
        return 32 if str(device).startswith("cuda") else 1
    return max(1, int(setting))


def train_cohort(model: nn.Module, requests: Sequence[TrainRequest]) -> list[tuple[dict[str, np.ndarray], TrainingResult]]:
    """Local SGD for every request at once; all must share one key (same LocalTraining, same steps
    per epoch). `model` supplies the architecture and the device; its own weights are not used."""
    cfg = requests[0].cfg
    if any(r.key != requests[0].key for r in requests):
        raise ValueError("a cohort needs one local schedule and one number of steps per epoch")
    device = device_of(model)
    names = list(model.state_dict().keys())
    count = len(requests)
    params = {n: torch.stack([torch.as_tensor(np.asarray(r.state[n])) for r in requests]).to(device, torch.float32)
              for n in names}
    anchor = {n: p.clone() for n, p in params.items()} if cfg.prox_mu > 0 else None
    estimates = [LipschitzEstimate(cfg.lr) for _ in requests] if cfg.estimate_lipschitz else None
    offsets = _stacked_corrections(requests, params, device)

    if cfg.dpsgd is not None:
        # each client's noise comes from a torch generator seeded by one draw from its own rng
        generators = [torch.Generator(device=device).manual_seed(int(r.rng.integers(2**62))) for r in requests]
        gradient = _dpsgd_gradient(model, cfg, anchor, generators)
    else:
        gradient = _batch_gradient(model, cfg, anchor)
    fixed = [r.fixed_order if cfg.shuffle == "once" else None for r in requests]
    model.train()
    last = np.zeros(count)
    last_rms = np.zeros(count)
    for _ in range(cfg.epochs):
        plans = [batches(r.indices, cfg, r.rng, f) for r, f in zip(requests, fixed)]  # each client's draws, in its order
        total = np.zeros(count)
        squares = np.zeros(count)
        seen = np.zeros(count)
        for position in range(requests[0].steps_per_epoch):
            picks = [plan[position] for plan in plans]
            width = cfg.batch_size * steps_per_epoch(max(p.size for p in picks), cfg.batch_size)  # Poisson batches may be larger
            x, y, weight, sizes = _stack_batch([r.data for r in requests], picks, [r.indices[0] for r in requests], width, device)
            grads, loss, per_sample = gradient(params, x, y, weight, sizes)
            for n, offset in offsets.items():
                grads[n] = grads[n] + offset
            if cfg.clip is not None or estimates is not None:
                _clip_and_estimate(grads, cfg, estimates, position)
            with torch.no_grad():
                for n in names:
                    params[n].add_(grads[n], alpha=-cfg.lr)
            masked = (per_sample * (weight > 0)).double()
            total += loss.double().cpu().numpy() * sizes
            squares += (masked ** 2).sum(1).cpu().numpy()
            seen += sizes
        last = total / np.maximum(seen, 1)
        last_rms = np.sqrt(squares / np.maximum(seen, 1))
    out = []
    for c, r in enumerate(requests):
        state = {n: params[n][c].detach().cpu().numpy().copy() for n in names}
        out.append((state, TrainingResult(float(last[c]), estimates[c].value if estimates else 0.0, int(r.indices.size),
                                          float(last_rms[c]))))
    return out


def _stacked_corrections(requests: Sequence[TrainRequest], params: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """Each client's gradient correction, stacked like its parameters (zeros where it has none)."""
    if all(r.correction is None for r in requests):
        return {}
    names = {n for r in requests if r.correction for n in r.correction if n in params}
    return {n: torch.stack([torch.as_tensor(np.asarray(r.correction[n]), dtype=torch.float32) if r.correction and n in r.correction
                            else torch.zeros(params[n].shape[1:]) for r in requests]).to(device) for n in sorted(names)}


def _batch_gradient(model: nn.Module, cfg: LocalTraining, anchor: dict[str, torch.Tensor] | None):
    """Per client: the gradient of its mean batch loss (plus FedProx's term), its mean loss and
    its per-sample losses."""
    def objective(p, a, x, y, weight):
        per_sample = nn.functional.cross_entropy(functional_call(model, p, (x,)), y, reduction="none")
        loss = (per_sample * weight).sum()
        total = loss if a is None else loss + 0.5 * cfg.prox_mu * sum(((p[n] - a[n]) ** 2).sum() for n in p)
        return total, (loss.detach(), per_sample.detach())

    step = vmap(grad_and_value(objective, has_aux=True), in_dims=(0, 0 if anchor is not None else None, 0, 0, 0))

    def gradient(params, x, y, weight, sizes):
        grads, (_, (loss, per_sample)) = step(params, anchor, x, y, weight)
        return grads, loss, per_sample

    return gradient


def _dpsgd_gradient(model: nn.Module, cfg: LocalTraining, anchor: dict[str, torch.Tensor] | None,
                    generators: list[torch.Generator]):
    """Per client, DP-SGD's noisy gradient (Abadi et al. 2016, Algorithm 1): per-sample gradients
    (vmap over the samples inside vmap over the clients), each clipped to L2 norm C over all
    parameters, summed, N(0, (sigma C)^2) noise added per coordinate, divided by the batch size B
    (the expected batch size under Poisson sampling, as Opacus does). FedProx's term, which does
    not depend on the data, is added unclipped."""
    dp = cfg.dpsgd

    def sample_loss(p, x1, y1):
        return nn.functional.cross_entropy(functional_call(model, p, (x1.unsqueeze(0),)), y1.unsqueeze(0))

    per_sample_grads = vmap(vmap(grad_and_value(sample_loss), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
    std = dp.noise_multiplier * dp.clip

    def gradient(params, x, y, weight, sizes):
        grads, losses = per_sample_grads(params, x, y)
        count, width = losses.shape
        valid = (weight > 0).to(losses.dtype)
        norms = torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g.reshape(count, width, -1), 2, dim=2) for g in grads.values()], dim=2), 2, dim=2)
        factor = (dp.clip / (norms + CLIP_EPSILON)).clamp(max=1.0) * valid
        out = {}
        for n, g in grads.items():
            rows = []
            for c in range(count):
                k = int(sizes[c])  # a client's own samples only, whatever the padding: sums of its own shape
                summed = torch.einsum("i,i...->...", factor[c, :k], g[c, :k])
                noise = torch.normal(0.0, std, size=summed.shape, generator=generators[c], device=summed.device)
                rows.append((summed + noise) / cfg.batch_size)
            out[n] = torch.stack(rows)
            if anchor is not None:
                out[n] = out[n] + cfg.prox_mu * (params[n] - anchor[n])
        loss = (losses * valid).sum(1) / torch.as_tensor(np.maximum(sizes, 1), dtype=losses.dtype, device=losses.device)
        return out, loss.detach(), losses.detach()

    return gradient


def _stack_batch(datas: Sequence[Dataset], picks: Sequence[np.ndarray], fallback: Sequence[int], width: int,
                 device: torch.device):
    """Inputs [C, W, ...], labels [C, W], weights [C, W] (1/size for real samples, 0 for padding)
    and the real sizes. A short batch is padded with copies of its first sample (of the client's
    first sample if it is empty), always to the full batch size: a client's sums must have the
    same shape whoever trains beside it."""
    xs, ys = [], []
    weight = torch.zeros(len(picks), width, device=device)
    for c, (data, pick) in enumerate(zip(datas, picks)):
        pad = pick[0] if pick.size else fallback[c]
        idx = pick if pick.size == width else np.concatenate([pick, np.full(width - pick.size, pad)]).astype(np.int64)
        x, y = data.batch(torch.from_numpy(idx))
        xs.append(x.to(device, non_blocking=True))
        ys.append(y.to(device, non_blocking=True))
        if pick.size:
            weight[c, :pick.size] = 1.0 / pick.size
    sizes = np.array([p.size for p in picks], dtype=np.float64)
    return torch.stack(xs), torch.stack(ys), weight, sizes


def _clip_and_estimate(grads: dict[str, torch.Tensor], cfg: LocalTraining, estimates: list[LipschitzEstimate] | None,
                       position: int) -> None:
    """Eq. 1.8 per client (one norm over all of its parameters), then Eq. 1.9's observation of the
    clipped flat gradient, as train_local does."""
    count = next(iter(grads.values())).shape[0]
    flat = torch.cat([g.reshape(count, -1) for g in grads.values()], dim=1)
    if cfg.clip is not None:
        norms = torch.linalg.vector_norm(flat.double(), cfg.clip_norm, dim=1)
        factor = cfg.clip / (norms + CLIP_EPSILON)
        scale = torch.where(factor < 1.0, factor, torch.ones_like(factor)).to(flat.dtype)
        flat.mul_(scale[:, None])
        for g in grads.values():
            g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))
    if estimates is not None:
        for c, estimate in enumerate(estimates):
            estimate.observe(position, flat[c].clone())


def _at_least_two(requests: list[TrainRequest]) -> list[TrainRequest]:
    """A lone request gets a twin (its own copy of the generator; its result is dropped). Who is
    queued beside a client depends on wall-clock timing, so its numbers must not depend on the
    cohort's size: with two or more clients they do not (the vectorised kernels treat each client
    alike; tests/test_cohort.py checks it), but a cohort of one takes other kernels."""
    if len(requests) != 1:
        return requests
    twin = dataclasses.replace(requests[0], rng=copy.deepcopy(requests[0].rng))
    return [requests[0], twin]


class CohortGate:
    """Where the clients of one group meet to train: `train` blocks until every participant still
    working has asked to train or has left; the last one to arrive trains the whole group."""

    def __init__(self, participants: int, train_group: Callable[[list[TrainRequest]], list[Any]]):
        self._cv = threading.Condition()
        self._active = participants
        self._waiting: list[tuple[object, TrainRequest]] = []
        self._results: dict[object, Any] = {}
        self._train_group = train_group

    def train(self, request: TrainRequest):
        ticket = object()
        with self._cv:
            self._waiting.append((ticket, request))
            self._run_if_all_arrived()
            while ticket not in self._results:
                self._cv.wait()
            result = self._results.pop(ticket)
        if isinstance(result, BaseException):
            raise result
        return result

    def leave(self) -> None:
        with self._cv:
            self._active -= 1
            self._run_if_all_arrived()

    def _run_if_all_arrived(self) -> None:
        if not self._waiting or len(self._waiting) < self._active:
            return
        group, self._waiting = self._waiting, []
        try:
            results = self._train_group([request for _, request in group])
        except BaseException as exc:  # every participant learns why
            results = [exc] * len(group)
        for (ticket, _), result in zip(group, results):
            self._results[ticket] = result
        self._cv.notify_all()


class CohortTrainer:
    """A host's training: one by one on its model, or, inside `run_group`, in cohorts."""

    def __init__(self, model: nn.Module, max_size: int):
        self.model = model
        self.max_size = max_size
        self._local = threading.local()

    def train(self, request: TrainRequest) -> tuple[dict[str, np.ndarray], TrainingResult]:
        gate = getattr(self._local, "gate", None)
        if gate is not None:
            return gate.train(request)
        return self._train_group([request])[0]

    def _train_group(self, requests: list[TrainRequest]) -> list[tuple[dict[str, np.ndarray], TrainingResult]]:
        results: list[Any] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(r.key, []).append(i)
        for members in groups.values():
            if self.max_size > 1:
                trained = train_cohort(self.model, _at_least_two([requests[i] for i in members]))[:len(members)]
            else:
                trained = [self._one(requests[i]) for i in members]
            for i, result in zip(members, trained):
                results[i] = result
        return results

    def _one(self, r: TrainRequest) -> tuple[dict[str, np.ndarray], TrainingResult]:
        if r.cfg.dpsgd is not None:  # per-sample gradients: the vectorised path, a cohort of one
            return train_cohort(self.model, [r])[0]
        load_numpy_state(self.model, r.state)
        result = train_local(self.model, r.data, r.indices, r.cfg, r.rng, r.fixed_order, r.correction)
        return state_to_numpy(self.model), result

    def run_group(self, works: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run works (that may call `train`) each in its own thread, training together; returns
        their outcomes in order. A work must not raise (the runtime wraps them)."""
        gate = CohortGate(len(works), self._train_group)
        outcomes: list[Any] = [None] * len(works)

        def participant(i: int) -> None:
            self._local.gate = gate
            try:
                outcomes[i] = works[i]()
            finally:
                self._local.gate = None
                gate.leave()

        threads = [threading.Thread(target=participant, args=(i,), daemon=True) for i in range(len(works))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return outcomes
