"""A client's update as the vector secure aggregation sums: its float tensors' change, in the
state's order, times its weight; then the arrays its strategy sends beside the model (SCAFFOLD's
control-variate changes), unweighted; then the weight itself times c in one last slot; all in the
cohort's fixed-point encoding (protocol/secagg/fixedpoint.py). The server decodes the exact sum
once: the sum of the weighted changes over the sum of the weights is FedAvg's weighted mean change,
and the arrays' sums are what the strategy adds up.

Integer tensors (a batch norm's step count) are not summed: the global model's are kept."""
from __future__ import annotations

import numpy as np

from protocol.secagg import fixedpoint

Spec = dict[str, tuple[tuple[int, ...], str]]


def float_names(spec: Spec) -> list[str]:
    return [name for name, (_, dtype) in spec.items() if dtype.startswith("f")]


def _size(spec: Spec, names: list[str]) -> int:
    return sum(int(np.prod(spec[name][0])) for name in names)


def length(spec: Spec, extras: Spec | None = None) -> int:
    """L: the values of one client's vector (the float parameters, the extra arrays, the weight slot)."""
    return _size(spec, float_names(spec)) + _size(extras or {}, sorted(extras or {})) + 1


def client_vector(new: dict[str, np.ndarray], old: dict[str, np.ndarray], spec: Spec, weight: float,
                  clip: float, extras: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """[weight (new - old) over the float tensors, the extra arrays (sorted by name), weight c],
    float64. `weight` in (0, 1]."""
    parts = [np.asarray(new[k], dtype=np.float64).reshape(-1) - np.asarray(old[k], dtype=np.float64).reshape(-1)
             for k in float_names(spec)]
    flat = np.concatenate(parts) * weight if parts else np.zeros(0)
    more = [np.asarray(extras[k], dtype=np.float64).reshape(-1) for k in sorted(extras or {})]
    return np.concatenate([flat, *more, [weight * clip]])


def encode(vector: np.ndarray, clip: float, bits: int, rng: np.random.Generator) -> np.ndarray:
    """The vector in fixed point, stochastically rounded with the client's own seeded dither."""
    return fixedpoint.encode(vector, clip, bits, rng.random(vector.size))


def decode_mean(total: np.ndarray, clip: float, bits: int, clients: int, spec: Spec, global_state: dict[str, np.ndarray],
                extras: Spec | None = None) -> tuple[dict[str, np.ndarray], float, dict[str, np.ndarray]]:
    """From the exact integer sum of `clients` encoded vectors: the global model moved by the
    weighted mean change, the sum of the weights (0 where it rounds to nothing), and the sums of
    the extra arrays."""
    # float64 throughout: the integer sum reaches 2^m, where float32 would drop its low bits
    values = np.asarray(total, dtype=np.float64) * fixedpoint.step(clip, bits) - clients * clip
    weight = float(values[-1]) / clip
    out = dict(global_state)
    offset = 0
    for k in float_names(spec):
        size = int(np.prod(spec[k][0]))
        if weight > 0:
            change = values[offset:offset + size].reshape(spec[k][0]) / weight
            out[k] = (np.asarray(global_state[k], dtype=np.float64) + change).astype(global_state[k].dtype)
        offset += size
    sums = {}
    for k in sorted(extras or {}):
        size = int(np.prod(extras[k][0]))
        sums[k] = values[offset:offset + size].reshape(extras[k][0])
        offset += size
    return out, max(weight, 0.0), sums
