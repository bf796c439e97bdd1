"""Masks that hide each client's vector and cancel in the cohort's sum (Bonawitz et al. 2017, 4):
y_u = x_u + PRG(b_u) + sum over neighbours v > u of PRG(s_uv) - sum over v < u of PRG(s_uv), in
Z_{2^m}. The pairwise masks cancel between every two clients that both send; the server removes the
survivors' self masks PRG(b_u) (from their shares of b_u) and the dropped clients' pairwise masks
with their surviving neighbours (from shares of the dropped clients' secret keys)."""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from .keys import prg_words


def modulus_mask(bits: int) -> np.uint32:
    return np.uint32((1 << bits) - 1) if bits < 32 else np.uint32(0xFFFFFFFF)


def pair_sign(me: int, other: int) -> int:
    """+1 where the pair's mask is added (the other's index is larger), -1 where it is taken off."""
    return 1 if other > me else -1


def masked(values: np.ndarray, bits: int, self_seed: bytes, pair_seeds: Mapping[int, bytes], me: int) -> np.ndarray:
    """y_u for client `me`: its encoded values plus its self mask and its pairwise masks, mod 2^bits."""
    y = np.asarray(values, dtype=np.uint32).copy()
    n = y.size
    y += prg_words(self_seed, n, bits)
    for other, seed in pair_seeds.items():
        mask = prg_words(seed, n, bits)
        if pair_sign(me, other) > 0:
            y += mask
        else:
            y -= mask
    return y & modulus_mask(bits)


def unmasked_sum(masked_vectors: Mapping[int, np.ndarray], bits: int, self_seeds: Mapping[int, bytes],
                 dropped_pairs: Callable[[], list[tuple[int, int, bytes]]]) -> np.ndarray:
    """The sum of the survivors' values from their masked vectors: take off every survivor's self
    mask, and for each (survivor v, dropped u, s_uv) the pairwise mask v added or removed for u,
    which no y_u came to cancel."""
    survivors = sorted(masked_vectors)
    n = next(iter(masked_vectors.values())).size
    total = np.zeros(n, dtype=np.uint32)
    for v in survivors:
        total += masked_vectors[v]
        total -= prg_words(self_seeds[v], n, bits)
    for v, u, seed in dropped_pairs():
        mask = prg_words(seed, n, bits)
        if pair_sign(v, u) > 0:  # v added it for u; nobody took it off
            total -= mask
        else:
            total += mask
    return total & modulus_mask(bits)
