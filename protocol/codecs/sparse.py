"""Sparsifying codecs for model updates: top-k and random-k (docs/algorithms.md part 4)."""
from __future__ import annotations

import math

import numpy as np

from ..bitpack import pack, packed_size, unpack
from .base import Codec, EncodedTensor, all_finite, expect_length, meta_int, register, require
from .dense import dequantize, quantize

MAX_INDEX_BITS = 40


def index_bits(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def keep_count(n: int, fraction: float) -> int:
    return min(n, max(1, math.ceil(fraction * n))) if n else 0


def _check_fraction(fraction) -> None:
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")


def _encode_values(values: np.ndarray, value_bits: int, rng) -> tuple[bytes | np.ndarray, dict]:
    if value_bits == 32:
        return values.astype("<f4").view(np.uint8), {}
    codes, scales = quantize(values, value_bits, True, False, rng)
    return pack(codes, value_bits), {"scales": scales.astype("<f4").tobytes()}


def _decode_values(meta: dict, data: memoryview, k: int, value_bits: int) -> np.ndarray:
    if value_bits == 32:
        expect_length(data, 4 * k, "fp32 values")
        return np.frombuffer(data, "<f4")
    scales_raw = meta.get("scales")
    require(isinstance(scales_raw, bytes) and len(scales_raw) == 4, "header field 'scales' missing or malformed")
    scales = np.frombuffer(scales_raw, "<f4")
    require(all_finite(scales), "non-finite quantization scale")
    expect_length(data, packed_size(k, value_bits), f"int{value_bits} values")
    return dequantize(unpack(data, k, value_bits), scales, value_bits, (k,))


@register
class TopK(Codec):
    """Keep the k = ceil(fraction*n) largest-magnitude entries: sorted indices bit-packed at
    ceil(log2 n) bits, then values in fp32 (value_bits=32) or stochastic int-b."""

    name = "topk"
    encodes_delta = True

    def __init__(self, fraction: float = 0.01, value_bits: int = 32):
        _check_fraction(fraction)
        if value_bits != 32 and not (isinstance(value_bits, int) and 2 <= value_bits <= 31):
            raise ValueError(f"value_bits must be 32 (fp32) or an integer in [2, 31], got {value_bits!r}")
        self.fraction, self.value_bits = fraction, value_bits

    def params(self):
        return {"fraction": self.fraction, "value_bits": self.value_bits}

    def keep(self, flat: np.ndarray) -> np.ndarray:
        """Sorted indices of the entries that travel."""
        n = flat.size
        k = keep_count(n, self.fraction)
        return np.sort(np.argpartition(-np.abs(flat), k - 1)[:k]) if k < n else np.arange(n)

    def encode(self, x, rng):
        flat = np.asarray(x, np.float32).reshape(-1)
        n = flat.size
        idx = self.keep(flat)
        k = idx.size
        ibits = index_bits(n)
        idx_bytes = pack(idx.astype(np.uint64 if ibits > 32 else np.uint32), ibits) if ibits <= 32 else None
        require(idx_bytes is not None, "tensor too large for top-k index packing")
        values, meta = _encode_values(flat[idx], self.value_bits, rng)
        data = np.concatenate([idx_bytes, np.asarray(values).view(np.uint8)])
        meta.update(k=k, value_bits=self.value_bits)
        return EncodedTensor(meta, data, data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = math.prod(shape)
        k = meta_int(meta, "k", 0, n)
        value_bits = meta_int(meta, "value_bits", 2, 32)
        ibits = index_bits(n)
        require(ibits <= 32, "tensor too large for top-k index packing")
        split = packed_size(k, ibits)
        require(len(data) >= split, f"top-k: frame has {len(data)} bytes, indices alone need {split}")
        idx = unpack(data[:split], k, ibits).astype(np.int64)
        require(bool(np.all(idx < n)), "top-k index out of range")
        values = _decode_values(meta, data[split:], k, value_bits)
        out = np.zeros(n, np.float32)
        out[idx] = values
        return out.reshape(shape)


@register
class Threshold(TopK):
    """Keep the entries with |x| >= magnitude (at least one: the largest, so the receiver always gets
    a scale); on the wire exactly like top-k (same header fields, same decoder)."""

    name = "threshold"

    def __init__(self, magnitude: float = 1e-3, value_bits: int = 32):
        if not isinstance(magnitude, (int, float)) or not magnitude >= 0:
            raise ValueError(f"magnitude must be a number >= 0, got {magnitude!r}")
        super().__init__(1.0, value_bits)
        self.magnitude = float(magnitude)

    def params(self):
        return {"magnitude": self.magnitude, "value_bits": self.value_bits}

    def keep(self, flat: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(np.abs(flat) >= self.magnitude)
        if idx.size == 0 and flat.size:
            idx = np.array([int(np.argmax(np.abs(flat)))])
        return idx


@register
class RandomK(Codec):
    """Keep a seeded random subset of k = ceil(fraction*n) entries, scaled by n/k so the
    decoded tensor is an unbiased estimate. Only the values and the seed travel. Not contractive
    (the kept entries are scaled by n/k): with error feedback the residual grows without bound
    (to 6e9 in 50 rounds of a constant update), so the schema refuses that pairing."""

    name = "randomk"
    encodes_delta = True
    contractive = False

    def __init__(self, fraction: float = 0.01):
        _check_fraction(fraction)
        self.fraction = fraction

    def params(self):
        return {"fraction": self.fraction}

    @staticmethod
    def indices(seed: int, n: int, k: int) -> np.ndarray:
        return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))

    def encode(self, x, rng):
        flat = np.asarray(x, np.float32).reshape(-1)
        n = flat.size
        k = keep_count(n, self.fraction)
        seed = int(rng.integers(0, 2**63))
        values = (flat[self.indices(seed, n, k)] * (n / k if k else 0.0)).astype("<f4")
        return EncodedTensor({"k": k, "seed": seed}, values.view(np.uint8), values.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = math.prod(shape)
        k = meta_int(meta, "k", 0, n)
        seed = meta_int(meta, "seed", 0, 2**63 - 1)
        expect_length(data, 4 * k, "random-k values")
        out = np.zeros(n, np.float32)
        out[cls.indices(seed, n, k)] = np.frombuffer(data, "<f4")
        return out.reshape(shape)
