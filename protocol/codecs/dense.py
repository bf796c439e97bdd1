"""Dense codecs: fp32, fp16, and symmetric integer quantization at any bit-length (Eq. 1.2-1.4)."""
from __future__ import annotations

import math
import sys

import numpy as np

from ..bitpack import code_dtype, pack_lanes, packed_size, unpack_lanes
from ..native import compiled
from .base import Codec, CodecError, EncodedTensor, all_finite, expect_length, meta_int, register, require

_kernels = compiled("protocol._kernels")  # the numpy path below gives the same bytes without it

# max|x| + machine epsilon, exactly as the paper's quantizer, so an all-zero slice gets a finite scale.
ALPHA_EPSILON = 2.220446049250313e-16
MIN_BITS, MAX_BITS = 2, 32


@register
class Fp32(Codec):
    name = "fp32"

    def encode(self, x, rng):
        data = np.ascontiguousarray(x, dtype="<f4").reshape(-1)
        return EncodedTensor({}, data.view(np.uint8), data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = math.prod(shape)
        expect_length(data, 4 * n, "fp32 values")
        return np.frombuffer(data, "<f4").reshape(shape)


@register
class Fp16(Codec):
    name = "fp16"

    def encode(self, x, rng):
        torch = sys.modules.get("torch")  # where a process already has it: its F16C conversion, 10x numpy's
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if torch is not None and x.size:
            data = torch.from_numpy(x).to(torch.float16).numpy()
        else:
            data = x.astype("<f2")
        return EncodedTensor({}, data.view(np.uint8), data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = math.prod(shape)
        expect_length(data, 2 * n, "fp16 values")
        halves = np.frombuffer(data, "<f2")
        torch = sys.modules.get("torch")
        if torch is not None and n:
            return torch.from_numpy(halves.copy()).to(torch.float32).numpy().reshape(shape)
        return halves.astype(np.float32).reshape(shape)


@register
class Bf16(Codec):
    """bfloat16: float32's sign, exponent and top 7 mantissa bits, rounded to nearest even. The
    range of float32 at 2 bytes, so large updates do not overflow as in fp16."""

    name = "bf16"

    def encode(self, x, rng):
        x = np.ascontiguousarray(x, dtype="<f4").reshape(-1)
        if _kernels is not None and x.size:
            data = np.empty(x.size, "<u2")
            _kernels.bf16_encode(x, data)
            return EncodedTensor({}, data.view(np.uint8), data.nbytes)
        return self.encode_numpy(x)

    @staticmethod
    def encode_numpy(x: np.ndarray) -> EncodedTensor:
        bits = np.ascontiguousarray(x, dtype="<f4").reshape(-1).view("<u4")
        nan = np.isnan(bits.view("<f4"))
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16  # uint32 arithmetic: wraps nothing below inf
        rounded[nan] = 0x7FC0  # a quiet NaN stays a NaN, never rounds into infinity
        data = rounded.astype("<u2")
        return EncodedTensor({}, data.view(np.uint8), data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = math.prod(shape)
        expect_length(data, 2 * n, "bf16 values")
        return (np.frombuffer(data, "<u2").astype("<u4") << 16).view("<f4").reshape(shape)


def slices_of(x: np.ndarray, per_filter: bool) -> np.ndarray:
    """One row per quantization slice: per output filter for 4-D conv weights, else the whole tensor."""
    if per_filter and x.ndim >= 4:
        return x.reshape(x.shape[0], -1)
    return x.reshape(1, -1)


# From this bit-length on, s is kept in float64 and stochastic rounding takes the product exactly
# in float32 pairs (_codes_pair). Below it, y = x*s + qmax + u in float32 rounds y + u to half an
# ulp of codes up to 2^b, which biases the rounding up: +0.0008 of a step at b = 15 and +0.0014 at
# b = 16 measured over 2^25 values, against +0.0002 at 14 and +0.0001 at 12 (tests/test_codecs.py
# holds the pair path's mean error within noise). The compiled kernel has the same constant.
PAIR_FROM_BITS = 14


def _work_dtype(bits: int) -> type:
    """The precision of s = qmax/alpha, and of nearest rounding's arithmetic: float32 y = x*s loses
    up to half a step beyond ~20 bits, and biases stochastic rounding from about 14 bits on, so
    b >= PAIR_FROM_BITS keeps s in float64 (stochastic rounding there takes the product exactly in
    float32 pairs: _codes_pair)."""
    return np.float64 if bits >= PAIR_FROM_BITS else np.float32


def _scaling(x: np.ndarray, bits: int, per_filter: bool, compiled: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slices, s = qmax/alpha per slice in the working precision, the float32 scales sent)."""
    qmax = (1 << (bits - 1)) - 1
    rows = np.ascontiguousarray(slices_of(np.asarray(x, dtype=np.float32), per_filter))
    if rows.size and _kernels is not None and compiled:  # one integer pass over the bits; the same values
        s, scales = np.empty(rows.shape[0], _work_dtype(bits)), np.empty(rows.shape[0], np.float32)
        if not _kernels.scaling(rows, bits, s, scales):
            raise ValueError("tensor contains non-finite values; refusing to quantize")
        return rows, s, scales
    if rows.size:  # max |x| without a full-size temporary: the larger of max and -min
        alpha = np.maximum(rows.max(axis=1), -rows.min(axis=1)).astype(np.float64) + ALPHA_EPSILON
    else:
        alpha = np.ones(rows.shape[0])
    if not all_finite(alpha):
        raise ValueError("tensor contains non-finite values; refusing to quantize")
    return rows, (qmax / alpha).astype(_work_dtype(bits)), (alpha / qmax).astype(np.float32)


def dither_key(rng: np.random.Generator) -> int:
    """One draw per tensor keys its stochastic-rounding dither (the dither itself is a hash)."""
    return int(rng.integers(0, 2**32, dtype=np.uint64))


def dither(n: int, key: int) -> np.ndarray:
    """The uniform [0, 1) fraction added before truncation: value t gets the top 24 bits of
    lowbias32(t + key) over 2^24. A counter-based hash instead of a generator's stream costs a
    few integer passes instead of one float draw per value (3x cheaper here), and the compiled
    kernel computes the very same numbers in its single pass."""
    h = np.arange(n, dtype=np.uint32)
    h += np.uint32(key)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x7FEB352D)
    h ^= h >> np.uint32(15)
    h *= np.uint32(0x846CA68B)
    h ^= h >> np.uint32(16)
    h >>= np.uint32(8)
    u = h.astype(np.float32)
    u *= np.float32(2.0 ** -24)
    return u


def quantize(x: np.ndarray, bits: int, stochastic: bool, per_filter: bool, rng: np.random.Generator):
    """Symmetric uniform quantization with z = 0. Returns (codes in [0, 2*qmax], scale per slice).

    code = q + qmax with q in [-qmax, qmax], qmax = 2^(b-1) - 1; x_hat = q * scale."""
    rows, s, scales = _scaling(x, bits, per_filter)
    return _codes(rows, s, bits, dither_key(rng) if stochastic else None), scales


def _codes(rows: np.ndarray, s: np.ndarray, bits: int, key: int | None) -> np.ndarray:
    qmax = (1 << (bits - 1)) - 1
    if key is not None and bits >= PAIR_FROM_BITS:
        return _codes_pair(rows, s, bits, key)
    # Shifting by qmax first makes every value non-negative, so the integer cast truncates exactly
    # like floor; that saves a full pass over the tensor.
    y = np.multiply(rows, s[:, None], dtype=_work_dtype(bits))
    y += qmax
    if key is not None:
        y += dither(y.size, key).reshape(y.shape)
    else:
        np.rint(y, out=y)
    np.clip(y, 0, 2 * qmax, out=y)
    return y.astype(code_dtype(bits)).reshape(-1)


def _codes_pair(rows: np.ndarray, s: np.ndarray, bits: int, key: int) -> np.ndarray:
    """Stochastic rounding for b >= PAIR_FROM_BITS in float32 with the product taken exactly, as the
    kernel's quantize_pair: s = s_hi + s_lo; x*s_hi = p + e exactly (the float64 product of two
    float32 values is exact, and so is its difference from p); r = rint(p); the code is
    r + floor(((p - r) + e) + x*s_lo + u) + qmax, the two integers added exactly. Only the fraction
    is rounded, to 2^-23 of a step for b <= 25, where float64's x*s + qmax + u was rounded to
    2^(b-52); it runs in float32 vectors twice as wide."""
    qmax = (1 << (bits - 1)) - 1
    hi = s.astype(np.float32)
    lo = (s - hi.astype(np.float64)).astype(np.float32)
    lim = (1.5 * qmax / s).astype(np.float32)[:, None]  # every code past it is saturated; nothing overflows
    rows = np.where(rows < lim, rows, lim)
    rows = np.where(rows > -lim, rows, -lim)
    p = rows * hi[:, None]
    e = (rows.astype(np.float64) * hi.astype(np.float64)[:, None] - p).astype(np.float32)
    r = np.rint(p)
    f = p - r
    f += e
    f += rows * lo[:, None]
    f += dither(f.size, key).reshape(f.shape)
    q = r.astype(np.int64) + np.floor(f).astype(np.int64)
    np.clip(q, -qmax, qmax, out=q)
    q += qmax
    return q.astype(code_dtype(bits)).reshape(-1)


def quantize_packed(x: np.ndarray, bits: int, stochastic: bool, per_filter: bool, rng: np.random.Generator,
                    compiled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """pack(quantize(...)): the packed codes and the scales, in one pass where the kernel is built."""
    rows, s, scales = _scaling(x, bits, per_filter, compiled)
    key = dither_key(rng) if stochastic else None
    if _kernels is None or not compiled or rows.size == 0:
        return pack_lanes(_codes(rows, s, bits, key), bits), scales
    out = np.empty(packed_size(rows.size, bits), np.uint8)
    _kernels.quantize_pack(rows, s, bits, key is not None, key or 0, out)
    return out, scales


def dequantize(codes: np.ndarray, scales: np.ndarray, bits: int, shape: tuple[int, ...]) -> np.ndarray:
    qmax = (1 << (bits - 1)) - 1
    if bits > 24:
        return _dequantize_split(codes, scales, qmax).reshape(shape)
    work = _work_dtype(bits)  # codes below 2^24: float32 or float64, the same values
    values = codes.astype(work).reshape(scales.size, -1)
    values -= qmax
    values *= scales.astype(work)[:, None]
    return values.astype(np.float32, copy=False).reshape(shape)


def _dequantize_split(codes: np.ndarray, scales: np.ndarray, qmax: int) -> np.ndarray:
    """b > 24, as the kernel's dequant_split: d = code - qmax splits exactly into d_hi (its bits above
    the low 8, a float32 as it is) and d_lo (the low 8 bits); p = d_hi*s rounded, e its exact error,
    and the value p + round(d_lo*s + e): float32 arithmetic on a code float32 cannot hold, equal to
    the exact product's float32 rounding but where that product lies within a hair of a halfway point."""
    d = (codes.astype(np.int64) - qmax).astype(np.int32).reshape(scales.size, -1)
    hi = (d & ~0xFF).astype(np.float32)
    lo = (d & 0xFF).astype(np.float32)
    s32 = scales.astype(np.float32)[:, None]
    s64 = s32.astype(np.float64)
    p = hi * s32
    e = (hi.astype(np.float64) * s64 - p).astype(np.float32)  # exact: float64 holds the 48-bit product
    return p + (lo.astype(np.float64) * s64 + e).astype(np.float32)  # d_lo*s + e exact in float64, rounded once


def unpack_dequantize(data, scales: np.ndarray, bits: int, shape: tuple[int, ...], compiled: bool = True) -> np.ndarray:
    """dequantize(unpack(...)), in one pass where the kernel is built."""
    n = math.prod(shape)
    if _kernels is None or not compiled or n == 0:
        return dequantize(unpack_lanes(data, n, bits), scales, bits, shape)
    out = np.empty(shape, np.float32)
    _kernels.unpack_dequantize(data, bits, np.ascontiguousarray(scales, dtype=np.float32), out)
    return out


@register
class IntQuant(Codec):
    """int-b quantization, bit-packed to ceil(n*b/8) bytes; one float32 scale per slice in the header."""

    name = "int"

    def __init__(self, bits: int = 8, rounding: str = "stochastic", granularity: str = "per_filter"):
        if not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
            raise ValueError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {bits!r}")
        if rounding not in ("stochastic", "nearest"):
            raise ValueError(f"rounding must be 'stochastic' or 'nearest', got {rounding!r}")
        if granularity not in ("per_filter", "per_tensor"):
            raise ValueError(f"granularity must be 'per_filter' or 'per_tensor', got {granularity!r}")
        self.bits, self.rounding, self.granularity = bits, rounding, granularity

    def params(self):
        return {"bits": self.bits, "rounding": self.rounding, "granularity": self.granularity}

    def with_bits(self, bits: int) -> "IntQuant":
        return IntQuant(bits, self.rounding, self.granularity)

    def encode(self, x, rng):
        data, scales = quantize_packed(x, self.bits, self.rounding == "stochastic", self.granularity == "per_filter", rng)
        return EncodedTensor({"bits": self.bits, "scales": scales.astype("<f4").tobytes()}, data, data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        bits = meta_int(meta, "bits", MIN_BITS, MAX_BITS)
        n = math.prod(shape)
        scales_raw = meta.get("scales")
        require(isinstance(scales_raw, bytes) and len(scales_raw) % 4 == 0, "header field 'scales' missing or malformed")
        scales = np.frombuffer(scales_raw, "<f4")
        slices = shape[0] if len(shape) >= 4 and scales.size == shape[0] and shape[0] != 1 else 1
        if scales.size != slices or n % slices != 0:
            raise CodecError(f"{scales.size} scales do not fit a tensor of shape {shape}")
        require(all_finite(scales), "non-finite quantization scale")
        expect_length(data, packed_size(n, bits), f"int{bits} values")
        return unpack_dequantize(data, scales, bits, shape)
