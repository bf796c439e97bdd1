"""Masks that hide each client's vector and cancel in the cohort's sum (Bonawitz et al. 2017, 4):
y_u = x_u + PRG(b_u) + sum over neighbours v > u of PRG(s_uv) - sum over v < u of PRG(s_uv), in
Z_{2^m}. The pairwise masks cancel between every two clients that both send; the server removes the
survivors' self masks PRG(b_u) (from their shares of b_u) and the dropped clients' pairwise masks
with their surviving neighbours (from shares of the dropped clients' secret keys)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

import numpy as np

from .keys import prg_into


def modulus_mask(bits: int) -> np.uint32:
    return np.uint32((1 << bits) - 1) if bits < 32 else np.uint32(0xFFFFFFFF)


def pair_sign(me: int, other: int) -> int:
    """+1 where the pair's mask is added (the other's index is larger), -1 where it is taken off."""
    return 1 if other > me else -1


def mask_sum(jobs: Sequence[tuple[bytes, int]], count: int, threads: int | None = None) -> np.ndarray:
    """sum of sign x PRG(seed) over the (seed, sign) jobs, as uint32 words mod 2^32: reduced mod
    2^m afterwards it is the sum of the m-bit masks, since 2^m divides 2^32. The streams are
    expanded on `threads` threads (the AES releases the GIL), each into a buffer of its own, and
    uint32 addition gives the same sum in any order."""
    threads = max(1, min(threads or os.cpu_count() or 1, len(jobs)))
    zeros = bytes(4 * count)

    def part(chunk: Sequence[tuple[bytes, int]]) -> np.ndarray:
        total = np.zeros(count, dtype=np.uint32)
        buf = bytearray(4 * count)
        for seed, sign in chunk:
            words = prg_into(seed, zeros, buf)
            (np.add if sign > 0 else np.subtract)(total, words, out=total)
        return total

    if threads == 1:
        return part(jobs)
    with ThreadPoolExecutor(threads) as pool:
        parts = list(pool.map(part, [jobs[i::threads] for i in range(threads)]))
    total = parts[0]
    for other in parts[1:]:
        total += other
    return total


def masked(values: np.ndarray, bits: int, self_seed: bytes, pair_seeds: Mapping[int, bytes], me: int,
           threads: int | None = 1) -> np.ndarray:
    """y_u for client `me`: its encoded values plus its self mask and its pairwise masks, mod 2^bits.
    One thread by default: a client is one device."""
    y = np.asarray(values, dtype=np.uint32).copy()
    jobs = [(self_seed, 1)] + [(seed, pair_sign(me, other)) for other, seed in pair_seeds.items()]
    y += mask_sum(jobs, y.size, threads)
    return y & modulus_mask(bits)


def unmasked_sum(masked_vectors: Mapping[int, np.ndarray], bits: int, self_seeds: Mapping[int, bytes],
                 dropped_pairs: Callable[[], list[tuple[int, int, bytes]]], threads: int | None = None) -> np.ndarray:
    """The sum of the survivors' values from their masked vectors: take off every survivor's self
    mask, and for each (survivor v, dropped u, s_uv) the pairwise mask v added or removed for u,
    which no y_u came to cancel (v added it where u > v: it comes off; else it goes back on)."""
    survivors = sorted(masked_vectors)
    n = next(iter(masked_vectors.values())).size
    total = np.zeros(n, dtype=np.uint32)
    for v in survivors:
        total += masked_vectors[v]
    jobs = [(self_seeds[v], -1) for v in survivors] + [(seed, -pair_sign(v, u)) for v, u, seed in dropped_pairs()]
    total += mask_sum(jobs, n, threads)
    return total & modulus_mask(bits)
