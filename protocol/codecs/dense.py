"""Dense codecs: fp32, fp16, and symmetric integer quantization at any bit-length (Eq. 1.2-1.4)."""
from __future__ import annotations

import sys

import numpy as np

from ..bitpack import code_dtype, pack, packed_size, unpack
try:  # the compiled kernels (setup.py); the numpy path below gives the same bytes without them
    from .. import _kernels
except ImportError:  # pragma: no cover - depends on the install
    _kernels = None
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
        torch = sys.modules.get("torch")  # where a process already has it: its F16C conversion, 10x numpy's
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if torch is not None and x.size:
            data = torch.from_numpy(x).to(torch.float16).numpy()
        else:
            data = x.astype("<f2")
        return EncodedTensor({}, data.view(np.uint8), data.nbytes)

    @classmethod
    def decode(cls, meta, data, shape):
        n = int(np.prod(shape))
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


def _scaling(x: np.ndarray, bits: int, per_filter: bool, compiled: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slices, s = qmax/alpha per slice in the working precision, the float32 scales sent)."""
    qmax = (1 << (bits - 1)) - 1
    rows = np.ascontiguousarray(slices_of(np.asarray(x, dtype=np.float32), per_filter))
    if rows.size and _kernels is not None and compiled:  # one integer pass over the bits; the same value
        top = np.empty(rows.shape[0], np.float32)
        _kernels.absmax(rows, top)
        alpha = top.astype(np.float64) + ALPHA_EPSILON
    elif rows.size:  # max |x| without a full-size temporary: the larger of max and -min
        alpha = np.maximum(rows.max(axis=1), -rows.min(axis=1)).astype(np.float64) + ALPHA_EPSILON
    else:
        alpha = np.ones(rows.shape[0])
    if not np.all(np.isfinite(alpha)):
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


def quantize_packed(x: np.ndarray, bits: int, stochastic: bool, per_filter: bool, rng: np.random.Generator,
                    compiled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """pack(quantize(...)): the packed codes and the scales, in one pass where the kernel is built."""
    rows, s, scales = _scaling(x, bits, per_filter, compiled)
    key = dither_key(rng) if stochastic else None
    if _kernels is None or not compiled or rows.size == 0:
        return pack(_codes(rows, s, bits, key), bits), scales
    out = np.empty(packed_size(rows.size, bits), np.uint8)
    _kernels.quantize_pack(rows, s, bits, key is not None, key or 0, out)
    return out, scales


def dequantize(codes: np.ndarray, scales: np.ndarray, bits: int, shape: tuple[int, ...]) -> np.ndarray:
    qmax = (1 << (bits - 1)) - 1
    work = _work_dtype(bits)
    values = codes.astype(work).reshape(scales.size, -1)
    values -= qmax
    values *= scales.astype(work)[:, None]
    return values.astype(np.float32, copy=False).reshape(shape)


def unpack_dequantize(data, scales: np.ndarray, bits: int, shape: tuple[int, ...], compiled: bool = True) -> np.ndarray:
    """dequantize(unpack(...)), in one pass where the kernel is built."""
    n = int(np.prod(shape))
    if _kernels is None or not compiled or n == 0:
        return dequantize(unpack(data, n, bits), scales, bits, shape)
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
        n = int(np.prod(shape))
        scales_raw = meta.get("scales")
        require(isinstance(scales_raw, bytes) and len(scales_raw) % 4 == 0, "header field 'scales' missing or malformed")
        scales = np.frombuffer(scales_raw, "<f4")
        slices = shape[0] if len(shape) >= 4 and scales.size == shape[0] and shape[0] != 1 else 1
        require(scales.size == slices and (n % slices == 0), f"{scales.size} scales do not fit a tensor of shape {shape}")
        require(bool(np.all(np.isfinite(scales))), "non-finite quantization scale")
        expect_length(data, packed_size(n, bits), f"int{bits} values")
        return unpack_dequantize(data, scales, bits, shape)
