"""Dense bit-packing of unsigned integer codes, LSB-first, into exactly ceil(n*b/8) bytes.

Values form one little-endian bit stream: value i occupies bits [i*b, (i+1)*b).
A record of m = 8/gcd(b, 8) values fills exactly m*b/8 whole bytes, so the stream is a
sequence of identical records. Each record is assembled in the narrowest unsigned words
that hold it (one uint8/uint32/uint64, or up to four uint64 for odd b > 8) with at most
eight vectorised shift/or column operations, then the record bytes are cut out of the
words. np.packbits on bit planes is several times slower.
"""
from __future__ import annotations

import math

import numpy as np

MAX_BITS = 32


def packed_size(n: int, bits: int) -> int:
    return (n * bits + 7) // 8


def code_dtype(bits: int) -> np.dtype:
    """The narrowest unsigned dtype that holds a `bits`-bit code."""
    return np.dtype(np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else np.uint32)


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in [1, {MAX_BITS}], got {bits}")


def _layout(bits: int) -> tuple[int, int, np.dtype, int]:
    """(values per record, bytes per record, word dtype, words per record)."""
    per_record = 8 // math.gcd(bits, 8)
    record_bits = per_record * bits
    for dtype in (np.uint8, np.uint32, np.uint64):
        if record_bits <= np.dtype(dtype).itemsize * 8:
            return per_record, record_bits // 8, np.dtype(dtype), 1
    return per_record, record_bits // 8, np.dtype(np.uint64), -(-record_bits // 64)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack non-negative integer codes (each < 2**bits) into a uint8 array of ceil(n*bits/8) bytes."""
    _check_bits(bits)
    codes = np.ascontiguousarray(codes).reshape(-1)
    n = codes.size
    if n == 0:
        return np.zeros(0, np.uint8)
    if bits in (8, 16, 32):  # byte-aligned: a cast is the packing
        return codes.astype(f"<u{bits // 8}", copy=False).view(np.uint8)
    per_record, record_bytes, word, nwords = _layout(bits)
    width = word.itemsize * 8
    rows = -(-n // per_record)
    if rows * per_record != n:
        padded = np.zeros(rows * per_record, codes.dtype)
        padded[:n] = codes
        codes = padded
    values = codes.reshape(rows, per_record)
    words = np.zeros((rows, nwords), word)
    for j in range(per_record):
        w, shift = divmod(j * bits, width)
        col = values[:, j].astype(word)
        words[:, w] |= (col << word.type(shift)) if shift else col
        if shift + bits > width:
            words[:, w + 1] |= col >> word.type(width - shift)
    record = words.view(np.uint8).reshape(rows, nwords * word.itemsize)
    if record.shape[1] != record_bytes:
        record = record[:, :record_bytes]
    return record.reshape(-1)[: packed_size(n, bits)]


def unpack(buf, n: int, bits: int) -> np.ndarray:
    """Inverse of pack: read n codes from buf, which must hold exactly packed_size(n, bits) bytes.

    Returns codes in code_dtype(bits)."""
    _check_bits(bits)
    raw = buf.reshape(-1).view(np.uint8) if isinstance(buf, np.ndarray) else np.frombuffer(buf, np.uint8)
    if raw.size != packed_size(n, bits):
        raise ValueError(
            f"packed buffer has {raw.size} bytes, expected {packed_size(n, bits)} for {n} values of {bits} bits"
        )
    out_dtype = code_dtype(bits)
    if n == 0:
        return np.zeros(0, out_dtype)
    if bits in (8, 16, 32):
        return raw.view(f"<u{bits // 8}").astype(out_dtype)
    per_record, record_bytes, word, nwords = _layout(bits)
    width = word.itemsize * 8
    rows = -(-n // per_record)
    record = np.zeros((rows, nwords * word.itemsize), np.uint8)
    if rows * record_bytes == raw.size and record.shape[1] == record_bytes:
        record = raw.reshape(rows, record_bytes)
    else:
        padded = np.zeros(rows * record_bytes, np.uint8)
        padded[: raw.size] = raw
        record[:, :record_bytes] = padded.reshape(rows, record_bytes)
    words = record.view(word)
    mask = word.type((1 << bits) - 1)
    out = np.empty((rows, per_record), out_dtype)
    for j in range(per_record):
        w, shift = divmod(j * bits, width)
        col = words[:, w] >> word.type(shift) if shift else words[:, w]
        if shift + bits > width:
            col = col | (words[:, w + 1] << word.type(width - shift))
        out[:, j] = col & mask
    return out.reshape(-1)[:n]
