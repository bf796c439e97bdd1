"""What one round of secure aggregation costs, by arithmetic: the payload bytes of every phase's
messages (the record sizes of protocol/secagg/records.py, as node/secure/client.py and server.py
send them) and the host seconds of its cryptography (the cost model of node/secure/config.py),
for n clients of which a share drop out after sharing their keys (before their masked input: the
case that costs the server most). Where the dropouts leave a survivor's neighbourhood short of its
expected size the figures are expectations; with no dropout they are exact (tests check them
against the actors' messages)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from protocol import bitpack
from protocol.secagg import records, shamir
from .config import SecureConfig, SecureCosts

KEY_RECORD = 100  # id, two public keys, a commitment
CIPHER_RECORD = 4 + records.CIPHER_BYTES  # 160
SHARE_RECORD = 4 + 1 + shamir.SHARE_BYTES  # 71
ID_RECORD = 4


@dataclass(frozen=True)
class RoundCost:
    protocol: str
    cohort: int
    dropout: float
    degree: int
    threshold: int
    word_bits: int
    client_up_bytes: float  # one surviving client's payload, every phase
    client_down_bytes: float  # what it receives besides the model
    server_up_bytes: float  # all the clients' payload to the server
    server_down_bytes: float  # all the server's payload to the clients (the model excluded)
    overhead_bytes: float  # all but the b bits of each value the plain sum would send
    client_compute_s: float  # host seconds of one surviving client's cryptography
    server_compute_s: float  # host seconds of the server's unmasking and sum

    def as_dict(self) -> dict:
        return asdict(self)


def round_cost(cfg: SecureConfig, n: int, length: int, dropout: float = 0.0, costs: SecureCosts | None = None) -> RoundCost:
    """A round of `cfg.protocol` for a cohort of n and vectors of `length` values."""
    choice = cfg.graph_for(n)
    k, t = choice.degree, choice.threshold
    m = cfg.word_bits(n) if cfg.masked else cfg.bits
    vector = bitpack.packed_size(length, m)
    gone = round(dropout * n)
    alive = n - gone
    alive_share = alive / n
    if not cfg.masked:
        return RoundCost(cfg.protocol, n, dropout, 0, 0, m, vector, 0, alive * vector, 0, 0,
                         0.0, _seconds(costs, lambda c: c.unmasking_s(length, alive, False)))
    roster = (k + 1 if choice.complete else k) * KEY_RECORD
    survivors = (k + 1) * alive_share * ID_RECORD  # the neighbours (and itself) that sent their masked input
    up = KEY_RECORD + k * CIPHER_RECORD + vector + (k + 1) * SHARE_RECORD
    down = roster + k * CIPHER_RECORD + survivors
    server_up = n * (KEY_RECORD + k * CIPHER_RECORD) + alive * (vector + (k + 1) * SHARE_RECORD)
    server_down = n * (roster + k * CIPHER_RECORD) + alive * survivors
    plain = alive * bitpack.packed_size(length, cfg.bits)
    pairs = gone * k * alive_share  # a dropped client's masks with the survivors, which the server removes

    def client(c: SecureCosts) -> float:
        return c.keys_s() + c.shares_s(k, k + 1, t) + c.masking_s(k, length)

    def server(c: SecureCosts) -> float:  # every client's secret is rebuilt: the survivors' b, the dropped's key
        return c.unmasking_s(length, alive, True, n, t, pairs)

    return RoundCost(cfg.protocol, n, dropout, k, t, m, up, down, server_up, server_down,
                     server_up + server_down - plain, _seconds(costs, client), _seconds(costs, server))


def _seconds(costs: SecureCosts | None, fn) -> float:
    return 0.0 if costs is None else float(fn(costs))


def growth(protocol: str, n: int, length: int) -> tuple[float, float]:
    """Bell et al.'s stated growth of (client, server) communication, up to constants: SecAgg+
    client log n + L, server n log n + n L; SecAgg client n + L, server n^2 + n L."""
    if protocol == "secaggplus":
        return math.log2(n) + length, n * math.log2(n) + n * length
    return n + length, n * n + n * length
