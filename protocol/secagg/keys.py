"""The primitives, from `cryptography` (X25519, HKDF-SHA256, AES-GCM, AES-CTR): a well-kept library
for what must not be written by hand. Every key and nonce is derived from seeds the caller gives,
so a run is reproducible; none comes from numpy's generators."""
from __future__ import annotations

import hashlib

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
RAW = serialization.Encoding.Raw


class TamperedError(ValueError):
    """A ciphertext did not authenticate: it was changed, or encrypted under another key."""


def private_key(seed: bytes) -> X25519PrivateKey:
    """An X25519 private key from 32 bytes of seed (the caller's cryptographic randomness, or a
    run's seeded stream where reproducibility is wanted)."""
    return X25519PrivateKey.from_private_bytes(hashlib.sha256(b"secagg-key" + seed).digest())


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def restored(raw: bytes) -> X25519PrivateKey:
    """A private key from its 32 raw bytes (what the server rebuilds from a dropped client's shares)."""
    return X25519PrivateKey.from_private_bytes(raw)


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(RAW, serialization.PublicFormat.Raw)


def agree(mine: X25519PrivateKey, theirs: bytes, context: bytes) -> bytes:
    """The pairwise secret: X25519 between the two keys, then HKDF-SHA256 bound to `context` (the
    round and the pair), 32 bytes. Both sides get the same bytes."""
    shared = mine.exchange(X25519PublicKey.from_public_bytes(theirs))
    return HKDF(hashes.SHA256(), KEY_BYTES, salt=None, info=b"secagg-agree:" + context).derive(shared)


def encrypt(key: bytes, nonce: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """AES-256-GCM; `nonce` (12 bytes) must not repeat under one key: the caller derives it from the
    round and the pair. `associated` (sender, receiver, round) is authenticated, not encrypted."""
    return AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, nonce: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, associated)
    except InvalidTag:
        raise TamperedError("the ciphertext does not authenticate") from None


def _ctr(seed: bytes):
    return Cipher(algorithms.AES(hashlib.sha256(b"secagg-prg" + seed).digest()), modes.CTR(bytes(16))).encryptor()


def prg_into(seed: bytes, zeros: bytes, out: bytearray) -> np.ndarray:
    """The same stream as prg_words(seed, len(zeros) // 4, 32), written into `out` (a buffer the
    caller reuses: a fresh one per call costs as much as the AES), as uint32 words over it."""
    _ctr(seed).update_into(zeros, out)
    return np.frombuffer(out, dtype="<u4", count=len(zeros) // 4)


def prg_words(seed: bytes, count: int, bits: int) -> np.ndarray:
    """`count` words uniform in [0, 2^bits) (bits <= 32) from AES-256-CTR keyed by `seed` (32 bytes),
    counter from zero: the mask stream. uint32 words, the top 32 - bits bits cleared."""
    if not 1 <= bits <= 32:
        raise ValueError(f"mask words of 1 to 32 bits, got {bits}")
    stream = _ctr(seed).update(bytes(4 * count))
    words = np.frombuffer(stream, dtype="<u4").astype(np.uint32, copy=True)
    if bits < 32:
        words &= np.uint32((1 << bits) - 1)
    return words
