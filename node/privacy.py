"""Local differential privacy of the core paper (docs/algorithms.md 1.5) as pure functions:
gradient clipping (Eq. 1.8), the local Lipschitz estimate (Eq. 1.9), the sensitivity (Eq. 1.10)
and the output-perturbation noise on the weights (Eq. 1.11)."""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from protocol.native import compiled

from .accounting import analytic_gaussian_sigma

_dpkernels = compiled("node._dpkernels")  # without it: torch's passes, summed in double too

MECHANISMS = ("none", "laplace", "gaussian")
NOISE_FACTORS = ("code", "paper")
CLIP_EPSILON = 1e-6  # torch.nn.utils.clip_grad_norm_ adds it to the norm


def vector_norm(t: torch.Tensor, norm: float) -> torch.Tensor:
    """torch.linalg.vector_norm, with the L1 norm as abs().sum(): on the CPU, vector_norm(t, 1) of
    the CNN's 1.66 M-entry gradient sums with a relative error of 1.6e-4 and takes 1.6 ms, against
    9e-8 and 0.4 ms for sum's pairwise reduction. As a tensor, for clip_gradients' per-parameter
    L2 norms; every L1 norm of a gradient (both clips' and the Lipschitz estimate's) is l1_norm's."""
    return t.abs().sum() if norm == 1 else torch.linalg.vector_norm(t, norm)


def _compiled(t: torch.Tensor) -> bool:
    return _dpkernels is not None and t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()


Parts = Sequence[torch.Tensor]  # one vector cut into tensors: a step's gradient, one tensor per parameter


def _parts(t: torch.Tensor | Parts) -> list[torch.Tensor]:
    return [t.detach()] if isinstance(t, torch.Tensor) else [p.detach() for p in t]


def l1_norm(t: torch.Tensor | Parts) -> float:
    """sum |t| in double precision, over one tensor or over the parts of one vector (a gradient as
    its parameters' tensors). On the CPU one pass of node/_dpkernels.c over the values, each entry
    summed into the accumulator its place in the whole vector gives it, so the result does not
    depend on how the vector is cut (abs().sum() writes a temporary as large as the model first:
    0.6-1.2 ms against 0.2-0.5 for the CNN's gradient); elsewhere, or without the compiled module,
    torch's reductions in float64, which agree with it to about 1e-15."""
    parts = _parts(t)
    if all(_compiled(p) for p in parts):
        return _dpkernels.l1_norm([p.numpy() for p in parts])
    return sum(float(p.abs().sum(dtype=torch.float64)) for p in parts)


def clip_gradients(params: Iterable[torch.nn.Parameter], threshold: float, norm: float) -> float:
    """Eq. 1.8 on the parameters' gradients: see clip_parts."""
    return clip_parts([p.grad for p in params if p.grad is not None], threshold, norm)


def clip_parts(grads: Parts, threshold: float, norm: float) -> float:
    """Eq. 1.8: g <- g * min(1, xi / (||g|| + 1e-6)), the norm taken over all the parts together,
    in place. norm = 1 for the Laplace mechanism (L1, in double precision: float32 sums drift by
    1e-7 and more), 2 for the Gaussian one. Returns the norm before clipping."""
    if not grads:
        return 0.0
    if norm == 1:
        total = l1_norm(grads)
    else:
        total = float(vector_norm(torch.stack([vector_norm(g, norm) for g in grads]), norm))
    factor = threshold / (total + CLIP_EPSILON)
    if factor < 1.0:
        for g in grads:
            g.mul_(factor)
    return total


class LipschitzEstimate:
    """Eq. 1.9: lambda = max over batches k and epochs e >= 2 of
    ||g_k^(e) - g_k^(e-1)||_1 / ||w_k^(e) - w_k^(e-1)||_1, with w the pre-step weights and g the
    clipped gradient of batch position k.

    The authors' code stores E x batches x 2 full copies. Here only one gradient per batch
    position (the previous epoch's) is kept, plus one running sum: with plain SGD the weights at
    position k of epoch e differ from those at position k of epoch e-1 by exactly -lr times the
    sum of the batches-per-epoch gradients applied in between, which the running sum holds. Memory
    is (batches + 1) parameter vectors whatever E is."""

    def __init__(self, lr: float):
        self.lr = lr
        self.previous: dict[int, list[torch.Tensor]] = {}
        self.window: list[torch.Tensor] | None = None
        self.value = 0.0

    def observe(self, position: int, grad: torch.Tensor | Parts) -> None:
        """grad: the clipped gradient about to be applied at batch `position` of the current epoch,
        one tensor or the parameters' gradient tensors, cut the same way at every call. Its tensors
        are kept, not copied (a step's fresh gradients: no copy of the model is made), until the
        next epoch's observation at this position, so nothing else may write to them meanwhile."""
        grad = _parts(grad)
        prev = self.previous.get(position)
        if self.window is None:
            self.window = [torch.zeros_like(g) for g in grad]
        if prev is not None:
            # the previous gradient is dropped below: torch's passes write the difference into it
            if all(_compiled(t) for t in (*grad, *prev, *self.window)):
                window_l1, diff_l1 = _dpkernels.lipschitz_update([g.numpy() for g in grad], [p.numpy() for p in prev],
                                                                 [w.numpy() for w in self.window])
            else:
                window_l1 = l1_norm(self.window)
                for g, p, w in zip(grad, prev, self.window):
                    w += torch.sub(g, p, out=p)
                diff_l1 = l1_norm(prev)
            step_l1 = self.lr * window_l1
            if step_l1 > 0:
                self.value = max(self.value, diff_l1 / step_l1)
        else:
            for w, g in zip(self.window, grad):
                w += g
        self.previous[position] = grad


def sensitivity(samples: int, lipschitz: float, lr: float, epochs: int, clip: float) -> float:
    """Eq. 1.10, exactly as the authors' code writes it (including the jump at E = E_0)."""
    n = samples
    if lipschitz > 1e-10:
        e0 = math.log(1 + n) / math.log(1 + lipschitz * lr)
        if epochs < e0:
            return (2 * clip / (lipschitz * n)) * ((1 + lipschitz * lr) ** epochs - 1)
        return 2 * clip + 2 * lr * clip * (epochs - e0)
    return 2 * clip * lr * epochs / n


def worst_case_sensitivity(samples: int, batch_size: int, lr: float, epochs: int, clip: float) -> float:
    """A bound on how far one record can move a session's weights when each step's batch-mean
    gradient is clipped to `clip` (in the norm the noise is calibrated in): 2 lr clip per step, over
    every step of the session. Not only the steps that contain the record: once the two trajectories
    differ, every later step's gradient may differ too, and each is still within the clip ball."""
    steps = epochs * max(1, -(-int(samples) // batch_size))
    return 2.0 * lr * clip * steps


def noise_factor(kind: str, rounds: int, epochs: int, per_round: int, clients: int) -> float:
    """c_T of Eq. 1.11: 'code' = (T/E)(P/N) as in the authors' code (the default), 'paper' = T/P."""
    if kind == "code":
        return (rounds / epochs) * (per_round / clients)
    if kind == "paper":
        return rounds / per_round
    raise ValueError(f"noise factor must be one of {NOISE_FACTORS}, got {kind!r}")


def noise_scale(mechanism: str, sens: float, factor: float, epsilon: float, delta: float = 0.0) -> float:
    """Laplace: beta = sens * c_T / eps (Eq. 1.11). Gaussian: the analytic Gaussian mechanism's sigma
    for (eps / c_T, delta) at L2 sensitivity sens; the classic sens * c_T * sqrt(2 ln(1.25/delta)) / eps
    is not DP for eps / c_T > 1."""
    if mechanism == "laplace":
        return sens * factor / epsilon
    if mechanism == "gaussian":
        return analytic_gaussian_sigma(epsilon / factor, delta, sens) if sens > 0 else 0.0
    return 0.0


def add_noise(state: Mapping[str, np.ndarray], mechanism: str, scale: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Output perturbation: i.i.d. noise on every element of every floating-point state entry.

    Integer buffers (BatchNorm's num_batches_tracked) are counters, not weights, and are left
    alone; the authors' code adds noise to them and truncates it away, to the same effect."""
    out = {}
    for name, value in state.items():
        value = np.asarray(value)
        if mechanism == "none" or scale <= 0 or not np.issubdtype(value.dtype, np.floating):
            out[name] = value
            continue
        if mechanism == "laplace":
            if _dpkernels is not None and value.dtype == np.float32 and value.flags.c_contiguous:
                out[name] = np.empty_like(value)  # standard_laplace's draws, signed, scaled and summed in one pass
                _dpkernels.laplace_from_bits(laplace_words(value.size, rng), float(np.float32(scale)), value, out[name])
                continue
            draw = standard_laplace(value.shape, rng)
        else:
            draw = rng.standard_normal(value.shape, dtype=np.float32)
        draw *= np.float32(scale)
        draw += value  # in place: for float32 weights the sum value + draw was, without its two copies
        out[name] = draw.astype(value.dtype, copy=False)
    return out


def laplace_words(n: int, rng: np.random.Generator) -> np.ndarray:
    """The generator's raw words for n Laplace draws: 32 bits each, two to a 64-bit word."""
    return rng.bit_generator.random_raw(-(-n // 2)).view("<u4")


# float32 constants of laplace_from_words, bit for bit those of node/_dpkernels.c
_LN2_HI, _LN2_LO = np.float32(float.fromhex("0x1.62e4p-1")), np.float32(float.fromhex("0x1.7f7d1cp-20"))
_ATANH_SERIES = [np.float32(float.fromhex(h)) for h in ("0x1.c71c72p-4", "0x1.24924ap-3", "0x1.99999ap-3", "0x1.555556p-2")]


def laplace_from_words(words: np.ndarray, n: int) -> np.ndarray:
    """n Laplace(0, 1) draws in float32 from 32-bit words: the top bit is the sign, the other 31 a
    uniform u = (k + 0.5) 2^-31 in (0, 1], the magnitude -log(u), a standard exponential. The log
    is float32 arithmetic of its own (node/_dpkernels.c takes the same operations in the same
    order, so the fused path gives these bits): with u = m 2^e, m in [sqrt(1/2), sqrt(2)),
    log m = 2 atanh(s), s = (m - 1)/(m + 1), by five terms of its series (the sixth is below
    float32's precision), and e ln 2 in two parts. Two numpy calls did it before (float32
    exponentials and a sign byte per 8): 10 ms for the CNN's 1.66 M weights against the
    generator's 2.3 ms of raw words here."""
    w = np.asarray(words, dtype="<u4")[:n]
    u = (w & np.uint32(0x7FFFFFFF)).astype(np.int32).astype(np.float32)
    u += np.float32(0.5)
    u *= np.float32(2.0 ** -31)
    b = u.view(np.uint32)
    e = (b >> np.uint32(23)).astype(np.int32) - np.int32(127)
    mb = (b & np.uint32(0x007FFFFF)) | np.uint32(0x3F800000)
    high = mb > np.uint32(0x3FB504F3)  # m > sqrt(2): take m / 2
    mb[high] -= np.uint32(0x00800000)
    e += high
    m = mb.view(np.float32)
    s = (m - np.float32(1.0)) / (m + np.float32(1.0))
    z = s * s
    p = np.full_like(z, _ATANH_SERIES[0])
    for c in _ATANH_SERIES[1:] + [np.float32(1.0)]:
        p *= z
        p += c
    logm = (s + s) * p
    fe = e.astype(np.float32)
    mag = fe * _LN2_LO + logm
    mag = fe * _LN2_HI + mag
    sign = (w & np.uint32(0x80000000)) ^ np.uint32(0x80000000)  # -log u, with the word's top bit as its sign
    return (mag.view(np.uint32) ^ sign).view(np.float32)


def standard_laplace(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Laplace(0, 1) in float32 (laplace_from_words on the generator's raw words)."""
    n = int(np.prod(shape))
    return laplace_from_words(laplace_words(n, rng), n).reshape(shape)
