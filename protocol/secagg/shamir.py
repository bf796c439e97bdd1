"""Shamir's t-of-n secret sharing of 32-byte secrets over GF(p), p = 2^521 - 1 (a Mersenne prime, so
every 256-bit secret is one field element). Written small and tested rather than taken from a
library: it is thirty lines of arithmetic, and the maintained libraries for it share other things
(bytes split into GF(256) pieces) with other share formats. The polynomial's coefficients come from
a seed the caller gives (SHA-256 in counter mode), so a run is reproducible."""
from __future__ import annotations

import hashlib

PRIME = 2**521 - 1
SHARE_BYTES = 66  # a field element, big-endian (521 bits)


def _coefficients(seed: bytes, count: int) -> list[int]:
    out = []
    for i in range(count):
        digest = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big") + j.to_bytes(1, "big")).digest() for j in range(3))
        out.append(int.from_bytes(digest, "big") % PRIME)
    return out


def split(secret: bytes, threshold: int, holders: list[int], seed: bytes) -> dict[int, bytes]:
    """Shares of `secret` for the holders (distinct x coordinates 1 .. p-1): any `threshold` of
    them give it back, fewer tell nothing about it."""
    if not 1 <= threshold <= len(holders):
        raise ValueError(f"threshold {threshold} of {len(holders)} holders")
    if len(set(holders)) != len(holders) or not all(0 < x < PRIME for x in holders):
        raise ValueError("holders must be distinct nonzero field elements")
    value = int.from_bytes(secret, "big")
    if value >= PRIME:
        raise ValueError("the secret is larger than the field")
    poly = [value, *_coefficients(seed, threshold - 1)]
    shares = {}
    for x in holders:
        y = 0
        for c in reversed(poly):  # Horner
            y = (y * x + c) % PRIME
        shares[x] = y.to_bytes(SHARE_BYTES, "big")
    return shares


def combine(shares: dict[int, bytes], size: int = 32) -> bytes:
    """The secret from at least `threshold` shares (Lagrange interpolation at 0). With fewer, or
    with a wrong share, the result is some other value: callers authenticate shares first."""
    points = [(x, int.from_bytes(y, "big")) for x, y in shares.items()]
    total = 0
    for i, (xi, yi) in enumerate(points):
        num = den = 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    if total >= 1 << (8 * size):
        raise ValueError("the shares do not combine to a secret of this size (too few, or not from one split)")
    return total.to_bytes(size, "big")
