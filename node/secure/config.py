"""What a run's secure aggregation is (the scenario's algorithm.secure_aggregation, resolved), and
what its cryptography costs in emulated time.

Costs: each operation (key generation, key agreement, a Shamir split per holder and per threshold
unit, an AES-GCM seal or open, a mask word, a Shamir combine per threshold unit squared) is timed
once on the machine that runs the emulator, before the hosts fork, like algorithm.charge_codec_time
(node/codec_cost.py), and pinned into the run's scenario.yaml so that the run reruns to the same
emulated times. The protocol's real operations run in the actors; their emulated duration is the
count of each operation times its measured cost, for a client scaled by how much slower its device
trains than this machine (device ms_per_sample / host ms_per_sample), for the server not scaled.
Timing each operation as it runs would make a run depend on the machine's load."""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocol.secagg import fixedpoint, graph, keys, masking, shamir


@dataclass(frozen=True)
class SecureCosts:
    host_ms_per_sample: float  # the machine's training time per sample (scales a client's costs to its device)
    keygen_s: float  # one X25519 key pair
    agree_s: float  # one key agreement with HKDF
    split_s: float  # a Shamir split, per holder and per threshold unit
    seal_s: float  # one AES-GCM seal (or open) of a share pair
    word_s: float  # one mask word: AES-CTR expansion and its add into the vector
    combine_s: float  # a Shamir combine, per threshold unit squared

    def as_dict(self) -> dict:
        return asdict(self)

    # Each phase's cryptography in host seconds: the actors charge these (node/secure/client.py and
    # server.py), and node/secure/analytic.py adds them up for a whole round.
    def keys_s(self) -> float:
        """A client's two key pairs."""
        return 2 * self.keygen_s

    def shares_s(self, neighbours: int, holders: int, threshold: int) -> float:
        """A client's pairwise keys and seals, and its two secrets split among `holders`."""
        return neighbours * (self.agree_s + self.seal_s) + 2 * holders * threshold * self.split_s

    def masking_s(self, neighbours: int, length: int) -> float:
        """A client opening its neighbours' sealed shares, agreeing their mask keys, and expanding
        its self mask and one pairwise mask per neighbour over `length` words."""
        return neighbours * (self.agree_s + self.seal_s) + (neighbours + 1) * length * self.word_s

    def unmasking_s(self, length: int, summed: int, masked: bool, rebuilt: int = 0, threshold: int = 0,
                    pairs: int = 0) -> float:
        """The server adding `summed` vectors; masked, also rebuilding `rebuilt` secrets from
        `threshold` shares each, agreeing `pairs` orphaned mask keys, and expanding the survivors'
        self masks and those pairs' masks."""
        seconds = summed * length * self.word_s
        if masked:
            seconds += rebuilt * threshold * threshold * self.combine_s + pairs * self.agree_s
            seconds += (summed + pairs) * length * self.word_s
        return seconds


def _seconds(fn, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_costs(host_ms_per_sample: float) -> SecureCosts:
    """Each operation timed here, the fastest of a few tries (the others waited for the machine)."""
    key = keys.private_key(b"\x01" * 32)
    other = keys.public_bytes(keys.private_key(b"\x02" * 32))
    secret = hashlib.sha256(b"s").digest()
    holders, t = list(range(1, 33)), 16
    seal_key = keys.agree(key, other, b"cost")
    plain = bytes(140)
    sealed = keys.encrypt(seal_key, bytes(12), plain, b"")
    shares = shamir.split(secret, t, holders, b"seed")
    chosen = dict(list(shares.items())[:t])
    words = 1 << 20
    jobs = [(secret, 1)] * 4

    def mask() -> None:  # as the actors mask and unmask: streams into a reused buffer, added, one thread
        masking.mask_sum(jobs, words, threads=1)

    return SecureCosts(
        host_ms_per_sample=host_ms_per_sample,
        keygen_s=_seconds(lambda: keys.public_bytes(keys.private_key(secret))),
        agree_s=_seconds(lambda: keys.agree(key, other, b"cost")),
        split_s=_seconds(lambda: shamir.split(secret, t, holders, b"seed")) / (len(holders) * t),
        seal_s=_seconds(lambda: keys.decrypt(seal_key, bytes(12), sealed, b"")),
        word_s=_seconds(mask) / (len(jobs) * words),
        combine_s=_seconds(lambda: shamir.combine(chosen)) / (t * t),
    )


PROTOCOLS = ("plain", "secagg", "secaggplus")


@dataclass(frozen=True)
class SecureConfig:
    """algorithm.secure_aggregation. protocol plain is the same fixed-point encoding and sum with no
    masks, keys or shares: the baseline a run with masks is compared against."""
    protocol: str = "secagg"
    bits: int = 16  # b: fixed-point bits per value
    clip: float = 0.1  # c: each (weighted) update value is clipped to [-c, c]
    threshold: int | None = None  # secagg: t; null: the majority of the cohort
    dropout: float = 0.1  # secaggplus: the dropout rate its degree and threshold are chosen for
    corrupt: float = 0.05  # secaggplus: the share of clients that may collude with the server
    sigma: int = 40  # secaggplus: statistical security, bits
    eta: int = 30  # secaggplus: correctness, bits
    phase_timeout_s: float = 60.0  # emulated seconds the server waits for a key or unmasking phase
    weighting: str = "samples"  # samples: FedAvg's weights, travelling in the masked vector; uniform
    corrupt_clients: tuple[str, ...] = ()  # fault injection: these clients send ciphertexts that do not authenticate
    costs: SecureCosts | None = None  # None: the cryptography takes no emulated time
    degree: int | None = None  # secaggplus: k given, not chosen (the threshold then defaults to the majority of k + 1)

    def word_bits(self, clients: int) -> int:
        """m: the masked words' bits for a cohort of `clients` (no sum of theirs can wrap)."""
        return fixedpoint.sum_bits(self.bits, clients)

    def graph_for(self, clients: int) -> graph.GraphChoice:
        if self.protocol == "secaggplus":
            if self.degree is not None and self.degree < clients - 1:
                return graph.GraphChoice(self.degree, self.threshold or graph.majority(self.degree + 1), False)
            choice = graph.choose_secaggplus(clients, self.dropout, self.corrupt, self.sigma, self.eta)
            return choice if self.threshold is None else graph.GraphChoice(choice.degree, self.threshold, choice.complete)
        return graph.choose_secagg(clients, self.threshold and min(self.threshold, clients))

    @property
    def masked(self) -> bool:
        return self.protocol != "plain"


class CostsSpec(BaseModel):
    """The measured cost table (SecureCosts), as a scenario pins it."""
    model_config = ConfigDict(extra="forbid")
    host_ms_per_sample: float = Field(gt=0, description="the measuring machine's training time per sample, one thread")
    keygen_s: float = Field(ge=0, description="one X25519 key pair")
    agree_s: float = Field(ge=0, description="one key agreement with HKDF")
    split_s: float = Field(ge=0, description="a Shamir split, per holder and per threshold unit")
    seal_s: float = Field(ge=0, description="one AES-GCM seal or open of a share pair")
    word_s: float = Field(ge=0, description="one mask word: its AES-CTR expansion and its add")
    combine_s: float = Field(ge=0, description="a Shamir combine, per threshold unit squared")


class SecureAggregationSpec(BaseModel):
    """algorithm.secure_aggregation: the server learns only the cohort's sum (node/secure/)."""
    model_config = ConfigDict(extra="forbid")
    protocol: Literal["none", "plain", "secagg", "secaggplus"] = Field(
        "none", description="secagg: Bonawitz et al. 2017, every pair of the cohort neighbours; secaggplus: Bell et al. "
                            "2020, a random k-regular graph; plain: the same fixed-point sum without masks, keys or "
                            "shares (the baseline); none: each client's update as its codec sends it")
    bits: int = Field(16, ge=2, le=24, description="b: fixed-point bits per value; the masked words have "
                                                   "b + ceil(log2 cohort) bits, at most 32")
    clip: float = Field(0.1, gt=0, description="c: each weighted update value is clipped to [-c, c] before encoding")
    threshold: Optional[int] = Field(None, ge=2, description="t: shares that rebuild a secret; null: secagg the cohort's "
                                                             "majority, secaggplus what dropout, corrupt, sigma, eta give")
    dropout: float = Field(0.1, ge=0, lt=1, description="secaggplus: the dropout rate its degree and threshold tolerate")
    corrupt: float = Field(0.05, ge=0, lt=0.5, description="secaggplus: the share of clients colluding with the server")
    sigma: int = Field(40, ge=1, le=128, description="secaggplus: statistical security in bits")
    eta: int = Field(30, ge=1, le=128, description="secaggplus: correctness in bits (the chance a round fails)")
    phase_timeout_s: float = Field(60.0, gt=0, description="emulated seconds the server waits for a key or unmasking "
                                                           "phase; the masked input waits for round.timeout_s")
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="samples: FedAvg's weights (samples / the cohort's largest), summed in the masked "
                               "vector; uniform: each client counts once")
    charge_compute: bool = Field(True, description="charge the cryptography's time (measured on this machine before "
                                                   "the run, scaled to each device) to emulated time")
    costs: Optional[CostsSpec] = Field(None, description="the measured table; null: measure it (the run's scenario.yaml "
                                                         "pins what was measured)")
    degree: Optional[int] = Field(None, ge=2, description="secaggplus: the graph's degree k (even); null: chosen from "
                                                          "dropout, corrupt, sigma and eta")
    corrupt_clients: list[str] = Field(
        default_factory=list, description="fault injection: these clients seal one neighbour's shares so that they do "
                                          "not authenticate (the round excludes them and goes on)")

    @model_validator(mode="after")
    def _even_degree(self):
        if self.degree is not None and (self.degree % 2 or self.protocol != "secaggplus"):
            raise ValueError(f"degree: an even k for protocol secaggplus, got {self.degree} with {self.protocol}")
        return self

    def build(self, host_ms_per_sample: float | None) -> SecureConfig | None:
        """The run's SecureConfig; costs measured now unless pinned (or not charged)."""
        if self.protocol == "none":
            return None
        costs = None
        if self.charge_compute:
            costs = (SecureCosts(**self.costs.model_dump()) if self.costs is not None
                     else measure_costs(host_ms_per_sample or 1.0))
        return SecureConfig(self.protocol, self.bits, self.clip, self.threshold, self.dropout, self.corrupt, self.sigma,
                            self.eta, self.phase_timeout_s, self.weighting, tuple(self.corrupt_clients), costs,
                            self.degree)
