"""The client half of secure aggregation (Bonawitz et al. 2017, section 4; SecAgg+ on a graph):

1. task (carrying the round's encoding and protocol): make two X25519 key pairs (c: encryption,
   s: masks) and a self-mask seed b; send both public keys and a commitment to b (sa_keys).
2. roster (the neighbours' public keys): Shamir-share s_sk and b among the neighbours and itself,
   seal each neighbour's pair of shares with AES-GCM under the pairwise c key; send them (sa_shares).
3. relay (the sealed shares addressed to it, from the neighbours that sent theirs: U2): open and
   keep them, naming any that do not authenticate; train; send the update in fixed point with its
   self mask and a pairwise mask for every neighbour in U2 (sa_masked).
4. survivors (the neighbours whose masked input arrived: U3): for each neighbour of U2 and itself,
   the share of b if it is in U3, else the share of s_sk, never both (sa_unmask).

protocol plain skips 1, 2 and 4 and sends the fixed-point vector without masks. Keys and seeds
come from the run's seed, the round and the client's id, so a run replays byte for byte; a
deployment draws them from the OS. The operations run for real; their emulated time is the cost
model's (node/secure/config.py), scaled to the device."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol import bitpack
from protocol.secagg import keys, masking, records, shamir
from ..actor import Reaction, Send
from ..strategies.base import SessionPlan
from .config import SecureConfig
from . import vector

CLIENT_KINDS = ("sa_roster", "sa_relay", "sa_survivors")


def _derive(seed: int, round_: int, me: int, label: bytes) -> bytes:
    return hashlib.sha256(b"secagg:%d:%d:%d:" % (seed, round_, me) + label).digest()


def context(round_: int, a: int, b: int, label: bytes) -> bytes:
    """What a pairwise key is bound to: the round, the pair (in order) and its use."""
    lo, hi = min(a, b), max(a, b)
    return b"%s:%d:%d:%d" % (label, round_, lo, hi)


def nonce(round_: int, sender: int, receiver: int) -> bytes:
    return hashlib.sha256(b"nonce:%d:%d:%d" % (round_, sender, receiver)).digest()[:12]


def associated(round_: int, sender: int, receiver: int) -> bytes:
    return b"%d:%d:%d" % (round_, sender, receiver)


@dataclass
class ClientRound:
    task: Any  # the task message, held until training starts
    me: int
    c_key: Any
    s_key: Any
    b_seed: bytes
    threshold: int = 0
    peers: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # neighbour id -> (c_pk, s_pk)
    held: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # owner id -> (share of s_sk, share of b)
    in_u2: list[int] = field(default_factory=list)  # neighbours that shared their secrets


class SecureClient:
    def __init__(self, cfg: SecureConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def _scale(self, client) -> float:
        costs = self.cfg.costs
        return 0.0 if costs is None else client.profile.ms_per_sample / costs.host_ms_per_sample

    def _charged(self, client, seconds: float, now, sends: list[Send]) -> Reaction:
        """`sends` after `seconds` of the host's compute, on this device."""
        busy = seconds * self._scale(client)
        if busy <= 0:
            return Reaction(sends=sends)
        return Reaction(work_s=client.profile.duration(busy, now.t, now.device), busy_s=busy,
                        work=lambda: Reaction(sends=sends))

    # ---- phase 1 --------------------------------------------------------------------------------
    def on_task(self, client, task) -> Reaction:
        spec = task.body["secure"]
        if spec["protocol"] == "plain":
            return client.train_task(task, task, self._plan(client, task, spec, None, []))
        me = client.profile.index + 1
        r = task.round
        state = ClientRound(task, me, keys.private_key(_derive(self.seed, r, me, b"c")),
                            keys.private_key(_derive(self.seed, r, me, b"s")), _derive(self.seed, r, me, b"b"))
        client.secure_round = state
        record = (me, keys.public_bytes(state.c_key), keys.public_bytes(state.s_key), hashlib.sha256(state.b_seed).digest())
        frame = records.pack_keys([record])
        send = Send(client.profile.aggregator, "sa_keys", r, {}, [frame], len(frame), 0)
        costs = self.cfg.costs
        return self._charged(client, costs.keys_s() if costs else 0.0, task, [send])

    def on_message(self, client, msg) -> Reaction | None:
        state: ClientRound | None = getattr(client, "secure_round", None)
        if state is None or state.task.round != msg.round:
            return None
        try:
            if msg.kind == "sa_roster":
                return self._share(client, state, msg)
            if msg.kind == "sa_relay":
                return self._train(client, state, msg)
            if msg.kind == "sa_survivors":
                return self._unmask(client, state, msg)
        except (records.RecordError, ValueError) as exc:
            client.secure_round = None
            return client.reject(msg, f"secure aggregation {msg.kind}: {exc}")
        return None

    # ---- phase 2 --------------------------------------------------------------------------------
    def _share(self, client, state: ClientRound, msg) -> Reaction:
        state.threshold = int(msg.body["threshold"])
        state.peers = {v: (c_pk, s_pk) for v, c_pk, s_pk, _ in records.unpack_keys(msg.frames[0]) if v != state.me}
        holders = [state.me, *sorted(state.peers)]
        if len(holders) < state.threshold:
            client.secure_round = None  # too few to ever rebuild its secrets: it stops here, as Bonawitz's clients abort
            return Reaction()
        r, me = msg.round, state.me
        s_shares = shamir.split(keys.private_bytes(state.s_key), state.threshold, holders, _derive(self.seed, r, me, b"ps"))
        b_shares = shamir.split(state.b_seed, state.threshold, holders, _derive(self.seed, r, me, b"pb"))
        state.held[me] = (s_shares[me], b_shares[me])
        sealed = []
        for v, (c_pk, _) in sorted(state.peers.items()):
            key = keys.agree(state.c_key, c_pk, context(r, me, v, b"enc"))
            ciphertext = keys.encrypt(key, nonce(r, me, v), records.pack_plain(me, v, s_shares[v], b_shares[v]),
                                      associated(r, me, v))
            if client.name in self.cfg.corrupt_clients and not sealed:  # fault injection: its first sealed pair is broken
                ciphertext = ciphertext[:-1] + bytes([ciphertext[-1] ^ 0xFF])
            sealed.append((v, ciphertext))
        frame = records.pack_ciphers(sealed)
        send = Send(client.profile.aggregator, "sa_shares", r, {}, [frame], len(frame), 0)
        costs = self.cfg.costs
        seconds = costs.shares_s(len(state.peers), len(holders), state.threshold) if costs else 0.0
        return self._charged(client, seconds, msg, [send])

    # ---- phase 3 --------------------------------------------------------------------------------
    def _train(self, client, state: ClientRound, msg) -> Reaction:
        r, me = msg.round, state.me
        invalid = []
        for u, ciphertext in records.unpack_ciphers(msg.frames[0]):
            if u not in state.peers:
                invalid.append(u)
                continue
            key = keys.agree(state.c_key, state.peers[u][0], context(r, me, u, b"enc"))
            try:
                sender, receiver, s_share, b_share = records.unpack_plain(
                    keys.decrypt(key, nonce(r, u, me), ciphertext, associated(r, u, me)))
            except (keys.TamperedError, records.RecordError):
                invalid.append(u)
                continue
            if (sender, receiver) != (u, me):
                invalid.append(u)
                continue
            state.held[u] = (s_share, b_share)
        state.in_u2 = sorted({u for u, _ in records.unpack_ciphers(msg.frames[0])} & set(state.peers))
        # a neighbour whose shares it cannot open is left out of its masks: the server could not
        # count on this client's share of that neighbour's key to remove them
        pairs = {v: keys.agree(state.s_key, state.peers[v][1], context(r, me, v, b"mask"))
                 for v in state.in_u2 if v not in invalid}
        return client.train_task(state.task, msg, self._plan(client, state.task, state.task.body["secure"],
                                                             (state, pairs), sorted(set(invalid))))

    def _plan(self, client, task, spec: dict, masks, invalid: list[int]) -> SessionPlan:
        bits, words_bits, clip = int(spec["bits"]), int(spec["word_bits"]), float(spec["clip"])
        n_max = max(1, int(task.body.get("n_max") or 1))
        cfg = self.cfg

        def upload(state, new_state, local, indices, rng, info, up, _bits, extras=None):
            weight = min(1.0, int(indices.size) / n_max) if spec["weighting"] == "samples" else 1.0
            values = vector.encode(vector.client_vector(new_state, state, client.trainer.spec, weight, clip, extras), clip,
                                   bits, rng)
            if masks is None:
                return _Outgoing(bitpack.pack(values, bits), values.size), None
            round_state, pairs = masks
            y = masking.masked(values, words_bits, round_state.b_seed, pairs, round_state.me)
            return _Outgoing(bitpack.pack(y, words_bits), values.size), None

        busy = 0.0
        if cfg.costs is not None and masks is not None:
            length = vector.length(client.trainer.spec, client.cfg.strategy.extras_spec(client.trainer.spec, "up"))
            busy = cfg.costs.masking_s(len(masks[1]), length) * self._scale(client)
        body = {"invalid": invalid} if invalid else {}
        # the weight travels inside the masked vector; the bits are the round's (the server knows them)
        return SessionPlan(upload=upload, kind="sa_masked", busy_s=busy, body=body, hidden=("samples", "bits"))

    # ---- phase 4 --------------------------------------------------------------------------------
    def _unmask(self, client, state: ClientRound, msg) -> Reaction:
        survivors = set(records.unpack_ids(msg.frames[0]))
        if state.me not in survivors:
            client.secure_round = None
            return Reaction()
        out = []
        for owner in sorted(state.held):
            s_share, b_share = state.held[owner]
            if owner in survivors:
                out.append((owner, records.SELF_MASK, b_share))
            elif owner in state.in_u2:
                out.append((owner, records.MASK_KEY, s_share))
        client.secure_round = None
        frame = records.pack_shares(out)
        return Reaction(sends=[Send(client.profile.aggregator, "sa_unmask", msg.round, {}, [frame], len(frame), 0)])


class _Outgoing:
    """A channel output (node/channel.py's Outgoing) for the masked vector: one frame, no state to
    commit (the upload channel's codec and error feedback are not used under secure aggregation)."""
    extras_from = None

    def __init__(self, packed: np.ndarray, values: int):
        frame = packed.tobytes()
        self.encoded = _Encoded([frame], len(frame), 4 * values)

    def commit(self) -> None:
        pass


@dataclass
class _Encoded:
    frames: list
    payload_bytes: int
    fp32_bytes: int = 0
