"""Dense codecs: fp32, fp16, and symmetric integer quantization at any bit-length (Eq. 1.2-1.4)."""
from __future__ import annotations

import numpy as np

from ..bitpack import code_dtype, pack, packed_size, unpack
from .base import Codec, EncodedTensor, expect_length, meta_int, register, require

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
        n = int(np.prod(shape))
        expect_length(data, 4 * n, "fp32 values")
        return np.frombuffer(data, "<f4").reshape(shape)


@register
class Fp16(Codec):
    name = "fp16"

    def encode(self, x, rng):
        data = np.asarray(x, dtype="<f2").reshape(-1)
        return EncodedTensor({}, data.view(np.uint8), data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = int(np.prod(shape))
        expect_length(data, 2 * n, "fp16 values")
        return np.frombuffer(data, "<f2").astype(np.float32).reshape(shape)


@register
class Bf16(Codec):
    """bfloat16: float32's sign, exponent and top 7 mantissa bits, rounded to nearest even. The
    range of float32 at 2 bytes, so large updates do not overflow as in fp16."""

    name = "bf16"

    def encode(self, x, rng):
        bits = np.ascontiguousarray(x, dtype="<f4").reshape(-1).view("<u4")
        nan = np.isnan(bits.view("<f4"))
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16  # uint32 arithmetic: wraps nothing below inf
        rounded[nan] = 0x7FC0  # a quiet NaN stays a NaN, never rounds into infinity
        data = rounded.astype("<u2")
        return EncodedTensor({}, data.view(np.uint8), data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = int(np.prod(shape))
        expect_length(data, 2 * n, "bf16 values")
        return (np.frombuffer(data, "<u2").astype("<u4") << 16).view("<f4").reshape(shape)


def slices_of(x: np.ndarray, per_filter: bool) -> np.ndarray:
    """One row per quantization slice: per output filter for 4-D conv weights, else the whole tensor."""
    if per_filter and x.ndim >= 4:
        return x.reshape(x.shape[0], -1)
    return x.reshape(1, -1)


def _work_dtype(bits: int) -> type:
    """Arithmetic precision for b-bit quantization; encoder and decoder must agree on it."""
    return np.float64 if bits > 16 else np.float32  # float32 y = x*s loses up to half a step beyond ~20 bits


def quantize(x: np.ndarray, bits: int, stochastic: bool, per_filter: bool, rng: np.random.Generator):
    """Symmetric uniform quantization with z = 0. Returns (codes in [0, 2*qmax], scale per slice).

    code = q + qmax with q in [-qmax, qmax], qmax = 2^(b-1) - 1; x_hat = q * scale."""
    qmax = (1 << (bits - 1)) - 1
    work = _work_dtype(bits)
    rows = slices_of(np.asarray(x, dtype=np.float32), per_filter)
    alpha = np.abs(rows).max(axis=1).astype(np.float64) + ALPHA_EPSILON if rows.size else np.ones(rows.shape[0])
    if not np.all(np.isfinite(alpha)):
        raise ValueError("tensor contains non-finite values; refusing to quantize")
    s = (qmax / alpha).astype(work)[:, None]
    # Shifting by qmax first makes every value non-negative, so the integer cast truncates exactly
    # like floor; that saves a full pass over the tensor (this function is the codec's hot path).
    y = np.multiply(rows, s, dtype=work)
    y += qmax
    if stochastic:
        y += rng.random(y.shape, dtype=np.float32)  # 24 random bits are ample for the fraction
    else:
        np.rint(y, out=y)
    np.clip(y, 0, 2 * qmax, out=y)
    return y.astype(code_dtype(bits)).reshape(-1), (alpha / qmax).astype(np.float32)


def dequantize(codes: np.ndarray, scales: np.ndarray, bits: int, shape: tuple[int, ...]) -> np.ndarray:
    qmax = (1 << (bits - 1)) - 1
    work = _work_dtype(bits)
    values = codes.astype(work).reshape(scales.size, -1)
    values -= qmax
    values *= scales.astype(work)[:, None]
    return values.astype(np.float32, copy=False).reshape(shape)


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
        codes, scales = quantize(x, self.bits, self.rounding == "stochastic", self.granularity == "per_filter", rng)
        data = pack(codes, self.bits)
        return EncodedTensor({"bits": self.bits, "scales": scales.astype("<f4").tobytes()}, data, data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        bits = meta_int(meta, "bits", MIN_BITS, MAX_BITS)
        n = int(np.prod(shape))
        scales_raw = meta.get("scales")
        require(isinstance(scales_raw, bytes) and len(scales_raw) % 4 == 0, "header field 'scales' missing or malformed")
        scales = np.frombuffer(scales_raw, "<f4")
        slices = shape[0] if len(shape) >= 4 and scales.size == shape[0] and shape[0] != 1 else 1
        require(scales.size == slices and (n % slices == 0), f"{scales.size} scales do not fit a tensor of shape {shape}")
        require(bool(np.all(np.isfinite(scales))), "non-finite quantization scale")
        expect_length(data, packed_size(n, bits), f"int{bits} values")
        return dequantize(unpack(data, n, bits), scales, bits, shape)
