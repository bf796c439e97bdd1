"""The fixed-point encoding a cohort shares for secure aggregation: integers only sum to the sum of
the updates if every client encodes with the same scale, so the server announces a clipping range
[-c, c] and a bit-length b with the task, each client maps its values onto 0 .. 2^b - 1 with
stochastic rounding (unbiased), and the sums live in Z_{2^m}, m = b + ceil(log2 n), which n clients'
values cannot overflow. The server decodes the exact integer sum once."""
from __future__ import annotations

import math

import numpy as np


def sum_bits(bits: int, clients: int) -> int:
    """m: the word size in which `clients` values of `bits` bits add up without wrapping."""
    return bits + max(0, math.ceil(math.log2(max(1, clients))))


def step(clip: float, bits: int) -> float:
    """The value of one integer step: the range 2c over 2^b - 1 steps."""
    return 2.0 * clip / ((1 << bits) - 1)


def encode(x: np.ndarray, clip: float, bits: int, dither: np.ndarray) -> np.ndarray:
    """Values clipped to [-c, c], as integers in [0, 2^b - 1]: floor((x + c)/step + u), u the dither
    (uniform in [0, 1), one per value), so each integer's expectation is (x + c)/step exactly."""
    if not 1 <= bits <= 30:
        raise ValueError(f"fixed-point values of 1 to 30 bits, got {bits}")
    scaled = (np.clip(np.asarray(x, dtype=np.float64), -clip, clip) + clip) / step(clip, bits)
    q = np.floor(scaled + np.asarray(dither, dtype=np.float64))
    return np.clip(q, 0, (1 << bits) - 1).astype(np.uint32)


def decode_sum(total: np.ndarray, clip: float, bits: int, clients: int) -> np.ndarray:
    """The sum of `clients` encoded vectors (exact integers) back to the sum of their values."""
    return (np.asarray(total, dtype=np.float64) * step(clip, bits) - clients * clip).astype(np.float32)
