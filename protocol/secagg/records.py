"""Secure aggregation's messages as bytes: fixed-size records in one frame each, so that what a
phase costs on the wire is what a deployment would send (ids as little-endian u32, keys and shares
raw). A frame that is not a whole number of records, or a record out of range, is refused with
RecordError."""
from __future__ import annotations

import struct

from .keys import KEY_BYTES
from .shamir import SHARE_BYTES

COMMIT_BYTES = 32  # SHA-256 of the self-mask seed: what a rebuilt seed is checked against
_KEYS = struct.Struct(f"<I{KEY_BYTES}s{KEY_BYTES}s{COMMIT_BYTES}s")  # id, c_pk, s_pk, commitment to b
_PLAIN = struct.Struct(f"<II{SHARE_BYTES}s{SHARE_BYTES}s")  # sender, receiver, share of s_sk, share of b
GCM_TAG = 16
CIPHER_BYTES = _PLAIN.size + GCM_TAG
_CIPHER = struct.Struct(f"<I{CIPHER_BYTES}s")  # the other end's id, ciphertext
_SHARE = struct.Struct(f"<IB{SHARE_BYTES}s")  # owner id, which secret (0: b, 1: s_sk), share
_ID = struct.Struct("<I")
SELF_MASK, MASK_KEY = 0, 1


class RecordError(ValueError):
    """A frame that does not hold whole, well-formed records."""


def _records(buf, layout: struct.Struct, what: str) -> list[tuple]:
    data = bytes(buf)
    if len(data) % layout.size:
        raise RecordError(f"{what}: {len(data)} bytes is not a whole number of {layout.size}-byte records")
    return [layout.unpack_from(data, i) for i in range(0, len(data), layout.size)]


def pack_keys(records: list[tuple[int, bytes, bytes, bytes]]) -> bytes:
    return b"".join(_KEYS.pack(*r) for r in records)


def unpack_keys(buf) -> list[tuple[int, bytes, bytes, bytes]]:
    return _records(buf, _KEYS, "keys")


def pack_plain(sender: int, receiver: int, mask_key_share: bytes, self_mask_share: bytes) -> bytes:
    return _PLAIN.pack(sender, receiver, mask_key_share, self_mask_share)


def unpack_plain(data: bytes) -> tuple[int, int, bytes, bytes]:
    if len(data) != _PLAIN.size:
        raise RecordError(f"a share pair of {len(data)} bytes, not {_PLAIN.size}")
    return _PLAIN.unpack(data)


def pack_ciphers(records: list[tuple[int, bytes]]) -> bytes:
    return b"".join(_CIPHER.pack(*r) for r in records)


def unpack_ciphers(buf) -> list[tuple[int, bytes]]:
    return _records(buf, _CIPHER, "ciphertexts")


def pack_shares(records: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(_SHARE.pack(*r) for r in records)


def unpack_shares(buf) -> list[tuple[int, int, bytes]]:
    out = _records(buf, _SHARE, "shares")
    if any(which not in (SELF_MASK, MASK_KEY) for _, which, _ in out):
        raise RecordError("shares: a record names neither secret")
    return out


def pack_ids(ids: list[int]) -> bytes:
    return b"".join(_ID.pack(i) for i in ids)


def unpack_ids(buf) -> list[int]:
    return [r[0] for r in _records(buf, _ID, "ids")]
