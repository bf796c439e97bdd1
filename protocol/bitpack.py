"""Dense bit-packing of unsigned integer codes, LSB-first, into exactly ceil(n*b/8) bytes.

pack/unpack: values form one little-endian bit stream; value i occupies bits [i*b, (i+1)*b). The
stream is a sequence of identical records of a few values (see _layout), each assembled in
unsigned words with one vectorised shift/or per value column. np.packbits on bit planes is
several times slower. The sparse codecs use it.

pack_lanes/unpack_lanes: the dense int codecs' layout, in the same number of bytes: blocks of 256
values as 8 interleaved 32-bit lanes, which a vector register packs 8 codes at a time.
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
    """(values per record, bytes per record, word dtype, words per record).

    Where few values suffice, a record fills whole words exactly and the words' bytes are the
    stream (b = 2, 4 in one uint8; b = 12, 20, 28 as 16 values in b/4 uint64 words). Otherwise
    (odd b, b = 6, 10, ...) a record is 8/gcd(b, 8) values in b/gcd(b, 8) bytes, built in the
    narrowest words that hold it and cut out of them: fewer, wider columns beat exact records
    of 32 or 64 values there."""
    if 8 % bits == 0:
        return 8 // bits, 1, np.dtype(np.uint8), 1
    if 64 // math.gcd(bits, 64) <= 16:
        per_record = 64 // math.gcd(bits, 64)
        nwords = per_record * bits // 64
        return per_record, nwords * 8, np.dtype(np.uint64), nwords
    per_record = 8 // math.gcd(bits, 8)
    record_bits = per_record * bits
    if record_bits <= 32:
        return per_record, record_bits // 8, np.dtype(np.uint32), 1
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
    word_bytes = nwords * word.itemsize
    if rows * record_bytes == raw.size and record_bytes == word_bytes:
        record = np.ascontiguousarray(raw).reshape(rows, record_bytes)
    else:
        record = np.zeros((rows, word_bytes), np.uint8)
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


# The int codecs' layout: whole blocks of BLOCK values in LANES interleaved 32-bit lanes.
LANES, LANE_VALUES = 8, 32
BLOCK = LANES * LANE_VALUES


def pack_lanes(codes: np.ndarray, bits: int) -> np.ndarray:
    """The dense int codecs' packing, in the same ceil(n*bits/8) bytes as pack.

    Each whole block of 256 values is 8 interleaved lanes: value 8k + l is the k-th of lane l's 32
    values, whose pack stream is `bits` 32-bit little-endian words, and the lane's word w is the
    block's word 8w + l. Then 8 codes in one vector register pack with one shift and one OR (the
    compiled kernel does so; here each step is one numpy operation over every block's 8 lanes).
    The values after the last whole block follow as pack's stream."""
    _check_bits(bits)
    codes = np.ascontiguousarray(codes).reshape(-1)
    full = codes.size - codes.size % BLOCK
    out = np.empty(packed_size(codes.size, bits), np.uint8)
    head = full * bits // 8
    if full and bits in (8, 16, 32):  # byte-aligned: pack each lane's values as they are, then interleave
        lanes = pack(codes[:full].reshape(-1, LANE_VALUES, LANES).transpose(0, 2, 1), bits)
        np.copyto(out[:head].view("<u4").reshape(-1, bits, LANES),
                  lanes.view("<u4").reshape(-1, LANES, bits).transpose(0, 2, 1))
    elif full:
        values = codes[:full].reshape(-1, LANE_VALUES, LANES)  # [block, k, lane]
        words = np.zeros((values.shape[0], bits, LANES), "<u4")  # [block, w, lane]
        for k in range(LANE_VALUES):
            w, shift = divmod(k * bits, 32)
            column = values[:, k, :].astype(np.uint32)
            words[:, w, :] |= column << np.uint32(shift)
            if shift + bits > 32:
                words[:, w + 1, :] |= column >> np.uint32(32 - shift)
        out[:head] = words.view(np.uint8).reshape(-1)
    out[head:] = pack(codes[full:], bits)
    return out


def unpack_lanes(buf, n: int, bits: int) -> np.ndarray:
    """Inverse of pack_lanes: n codes, in code_dtype(bits), from exactly packed_size(n, bits) bytes."""
    _check_bits(bits)
    raw = buf.reshape(-1).view(np.uint8) if isinstance(buf, np.ndarray) else np.frombuffer(buf, np.uint8)
    if raw.size != packed_size(n, bits):
        raise ValueError(
            f"packed buffer has {raw.size} bytes, expected {packed_size(n, bits)} for {n} values of {bits} bits"
        )
    full = n - n % BLOCK
    head = full * bits // 8
    out = np.empty(n, code_dtype(bits))
    words = np.ascontiguousarray(raw[:head]).view("<u4").reshape(-1, bits, LANES)  # [block, w, lane]
    values = out[:full].reshape(-1, LANE_VALUES, LANES)  # [block, k, lane], a view of out
    if full and bits in (8, 16, 32):
        lanes = unpack(np.ascontiguousarray(words.transpose(0, 2, 1)).view(np.uint8), full, bits)
        np.copyto(values, lanes.reshape(-1, LANES, LANE_VALUES).transpose(0, 2, 1))
    elif full:
        mask = np.uint32((1 << bits) - 1)
        for k in range(LANE_VALUES):
            w, shift = divmod(k * bits, 32)
            column = words[:, w, :] >> np.uint32(shift)
            if shift + bits > 32:
                column |= words[:, w + 1, :] << np.uint32(32 - shift)
            values[:, k, :] = column & mask
    out[full:] = unpack(raw[head:], n - full, bits)
    return out
