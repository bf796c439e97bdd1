"""Secure aggregation's primitives and arithmetic (issue 44, item 1), as pure functions: X25519 agreement,
AES-GCM that refuses a tampered ciphertext, the AES-CTR mask stream, Shamir's t-of-n sharing, the
cohort's shared fixed-point encoding, and masks that cancel in the sum, exactly, with and without
dropped clients (recovered from Shamir shares of their keys, as the server does)."""
import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.secagg import fixedpoint, keys, masking, shamir


def seed(*parts) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


# ---- keys ----------------------------------------------------------------------------------------
def test_both_sides_of_a_pair_agree_and_other_pairs_do_not():
    a, b, c = (keys.private_key(seed(n)) for n in "abc")
    ab = keys.agree(a, keys.public_bytes(b), b"round 0|a|b")
    assert ab == keys.agree(b, keys.public_bytes(a), b"round 0|a|b") and len(ab) == 32
    assert ab != keys.agree(a, keys.public_bytes(c), b"round 0|a|b")
    assert ab != keys.agree(a, keys.public_bytes(b), b"round 1|a|b")  # bound to its context
    assert keys.public_bytes(keys.private_key(seed("a"))) == keys.public_bytes(a)  # the same seed, the same key
    assert keys.public_bytes(keys.restored(keys.private_bytes(a))) == keys.public_bytes(a)


def test_a_tampered_or_misdirected_ciphertext_is_refused():
    key, nonce = seed("k"), seed("n")[:12]
    box = keys.encrypt(key, nonce, b"share of b_u", b"c1->c2|r0")
    assert keys.decrypt(key, nonce, box, b"c1->c2|r0") == b"share of b_u"
    flipped = bytes([box[0] ^ 1]) + box[1:]
    for bad in (lambda: keys.decrypt(key, nonce, flipped, b"c1->c2|r0"),
                lambda: keys.decrypt(key, nonce, box, b"c1->c3|r0"),  # sent to someone else
                lambda: keys.decrypt(seed("other"), nonce, box, b"c1->c2|r0")):
        with pytest.raises(keys.TamperedError):
            bad()


def test_the_mask_stream_is_seeded_uniform_and_has_its_bits():
    a = keys.prg_words(seed("s"), 200_000, 12)
    assert np.array_equal(a, keys.prg_words(seed("s"), 200_000, 12))
    assert not np.array_equal(a, keys.prg_words(seed("t"), 200_000, 12))
    assert a.dtype == np.uint32 and int(a.max()) < 4096
    assert a.mean() == pytest.approx(4095 / 2, rel=0.01)  # uniform on [0, 2^12)
    assert np.array_equal(keys.prg_words(seed("s"), 1000, 12), a[:1000])  # a prefix of the same stream
    with pytest.raises(ValueError):
        keys.prg_words(seed("s"), 10, 33)


# ---- Shamir --------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.integers(2, 9), st.data())
def test_any_threshold_of_the_shares_give_the_secret_back(n, data):
    t = data.draw(st.integers(1, n))
    secret = data.draw(st.binary(min_size=32, max_size=32))
    shares = shamir.split(secret, t, list(range(1, n + 1)), seed(n, t))
    subset = data.draw(st.permutations(sorted(shares)))[:t]
    assert shamir.combine({x: shares[x] for x in subset}) == secret


def test_fewer_shares_than_the_threshold_do_not_give_the_secret():
    secret = seed("secret")
    shares = shamir.split(secret, 3, [1, 2, 3, 4, 5], seed("coeffs"))
    try:
        assert shamir.combine({1: shares[1], 4: shares[4]}) != secret
    except ValueError:
        pass  # or the combination is not even a 32-byte value
    with pytest.raises(ValueError):
        shamir.split(secret, 6, [1, 2, 3], seed("x"))


# ---- fixed point -----------------------------------------------------------------------------------
def test_the_shared_encoding_is_unbiased_and_its_sums_cannot_overflow():
    assert fixedpoint.sum_bits(8, 100) == 15 and fixedpoint.sum_bits(8, 128) == 15 and fixedpoint.sum_bits(8, 129) == 16
    rng = np.random.default_rng(0)
    x = np.array([-2.0, -0.5, 0.0, 0.3, 0.9999, 5.0], np.float32)  # beyond the clip range at both ends
    clip, bits, draws = 1.0, 4, 20_000
    q = np.stack([fixedpoint.encode(x, clip, bits, rng.random(x.size)) for _ in range(draws)])
    assert q.min() >= 0 and q.max() <= 15
    mean = q.mean(axis=0) * fixedpoint.step(clip, bits) - clip
    assert mean == pytest.approx(np.clip(x, -clip, clip), abs=4 * 0.5 * fixedpoint.step(clip, bits) / math.sqrt(draws))
    # the exact integer sum of n vectors decodes to the sum of their decoded values
    total = q[:50].astype(np.uint64).sum(axis=0)
    assert fixedpoint.decode_sum(total, clip, bits, 50) == pytest.approx(
        (q[:50] * fixedpoint.step(clip, bits) - clip).sum(axis=0), abs=1e-4)


# ---- masking, one whole cohort ----------------------------------------------------------------------
def cohort_round(n: int, dropped: set[int], threshold: int, size: int = 5000, bits: int = 8):
    """Every client's keys and seeds, the masked vectors of those that did not drop, and the
    server's unmasking from Shamir shares held by the survivors."""
    rng = np.random.default_rng(n)
    m = fixedpoint.sum_bits(bits, n)
    ids = list(range(1, n + 1))
    secret = {u: keys.private_key(seed("key", u)) for u in ids}
    public = {u: keys.public_bytes(secret[u]) for u in ids}
    self_seed = {u: seed("self", u) for u in ids}
    values = {u: rng.integers(0, 1 << bits, size, dtype=np.uint32) for u in ids}

    def pair(u: int, v: int, key) -> bytes:
        return keys.agree(key, public[v], f"r0|{min(u, v)}|{max(u, v)}".encode())

    # each client shares its self seed and its secret key among all (SecAgg: everyone is a neighbour)
    self_shares = {u: shamir.split(self_seed[u], threshold, ids, seed("s-coef", u)) for u in ids}
    key_shares = {u: shamir.split(keys.private_bytes(secret[u]), threshold, ids, seed("k-coef", u)) for u in ids}
    survivors = [u for u in ids if u not in dropped]
    ys = {u: masking.masked(values[u], m, self_seed[u], {v: pair(u, v, secret[u]) for v in ids if v != u}, u)
          for u in survivors}
    holders = survivors[:threshold]  # the shares the server asks the survivors for
    recovered_self = {u: shamir.combine({h: self_shares[u][h] for h in holders}) for u in survivors}

    def dropped_pairs():
        out = []
        for u in sorted(dropped):  # the dropped client's key, rebuilt from its shares
            key = keys.restored(shamir.combine({h: key_shares[u][h] for h in holders}))
            out += [(v, u, pair(u, v, key)) for v in survivors]
        return out

    total = masking.unmasked_sum(ys, m, recovered_self, dropped_pairs)
    plain = sum(values[u].astype(np.uint64) for u in survivors)
    return total, plain, ys, values


@pytest.mark.parametrize("dropped", [set(), {3}, {2, 6}], ids=["none", "one", "two"])
def test_the_server_gets_the_exact_sum_of_the_survivors_and_nothing_of_each(dropped):
    total, plain, ys, values = cohort_round(7, dropped, threshold=4)
    assert np.array_equal(total.astype(np.uint64), plain)  # exactly, as integers
    for u, y in ys.items():  # a masked vector looks nothing like its values
        assert np.mean(y == values[u]) < 0.01 and y.max() >= (1 << 8)
