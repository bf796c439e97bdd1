"""The server half of one round of secure aggregation: a state machine over four phases, each
waiting for the clients that survived the one before, until all of them answered, were lost, or
the phase's timeout (the masked input's: the round's deadline) passed.

  keys    sa_keys from the selected         -> U1; each gets its neighbours' keys (sa_roster)
  shares  sa_shares from U1                 -> U2; each gets the shares sealed for it (sa_relay)
  input   sa_masked from U2                 -> U3; each gets its neighbours in U3 (sa_survivors)
  unmask  sa_unmask from U3                 -> U4; the server rebuilds b_u for U3 and s_sk for
                                               U2 minus U3 from their holders' shares, and sums

A phase that ends with fewer than the threshold t fails the round, naming the phase and how many
were left; so does a neighbourhood that cannot give t shares of a secret the sum needs. A client
whose sealed shares did not authenticate (a neighbour names it) or whose rebuilt secret does not
match its public key or commitment is left out as if it had dropped, with an incident. protocol
plain has the input phase only. Pure of sockets and clocks: the server actor (node/server.py)
delivers messages, timers and losses, and carries out the Steps."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from protocol import bitpack
from protocol.secagg import graph, keys, masking, records, shamir
from ..actor import Send
from .client import context
from .config import SecureConfig
from . import vector

SERVER_KINDS = ("sa_keys", "sa_shares", "sa_masked", "sa_unmask")
PHASES = ("keys", "shares", "input", "unmask")
TIMER = "secure"


@dataclass
class Step:
    sends: list[Send] = field(default_factory=list)
    timers: list[tuple[float, str]] = field(default_factory=list)
    reports: list[dict] = field(default_factory=list)
    failed: bool = False  # the round failed (a report says where)
    # the sum is ready: compute() unmasks it for real (off the actor's thread) in work_s emulated seconds
    work_s: float = 0.0
    compute: Callable[[], tuple[np.ndarray, int, list[dict]] | None] | None = None


class SecureRound:
    def __init__(self, cfg: SecureConfig, index: int, selected: list[str], spec: dict, seed: int, t: float,
                 extras: dict | None = None):
        self.cfg = cfg
        self.extras = extras or {}  # the strategy's arrays beside the model, summed in the same vector
        self.index = index
        self.spec = spec
        self.seed = seed
        self.n = len(selected)
        self.choice = cfg.graph_for(self.n)
        self.word_bits = cfg.word_bits(self.n) if cfg.masked else cfg.bits
        self.phase = "keys" if cfg.masked else "input"
        self.deadline_passed = False
        self.waiting = set(selected)  # who the phase still waits for
        self.answered: list[str] = []  # who answered it, in order
        self.ids: dict[str, int] = {}  # client -> its id (x coordinate of its shares)
        self.names: dict[int, str] = {}
        self.public: dict[int, tuple[bytes, bytes, bytes]] = {}  # id -> c_pk, s_pk, commitment to b
        self.graph: dict[int, list[int]] = {}
        self.sealed: dict[int, list[tuple[int, bytes]]] = {}  # receiver id -> [(sender id, ciphertext)]
        self.inputs: dict[str, Any] = {}  # client -> its masked (or plain) vector's frame
        self.weights: dict[str, float] = {}
        self.excluded: dict[str, str] = {}  # client -> why (an incident each)
        self.reported: set[str] = set()  # the excluded whose incident has gone out
        self.skipped: dict[int, set[int]] = {}  # id -> the neighbours that named it and left it out of their masks
        self.shares: dict[int, dict[int, dict[int, bytes]]] = {records.SELF_MASK: {}, records.MASK_KEY: {}}
        self.phases: list[dict[str, Any]] = [self._opened(self.phase, t, self.n)]

    # ---- what the task carries, and timers --------------------------------------------------------
    def task_fields(self) -> dict[str, Any]:
        c = self.cfg
        return {"protocol": c.protocol, "bits": c.bits, "word_bits": self.word_bits, "clip": c.clip,
                "weighting": c.weighting}

    def _opened(self, phase: str, t: float, entered: int) -> dict[str, Any]:
        return {"phase": phase, "t_start": t, "entered": entered}

    def timers(self, t: float) -> list[tuple[float, str]]:
        if self.phase == "input" and not self.deadline_passed:
            return []  # the round's deadline bounds training
        return [(t + self.cfg.phase_timeout_s, f"{TIMER}:{self.index}:{self.phase}")]

    # ---- events ---------------------------------------------------------------------------------
    def on_message(self, msg) -> Step:
        expected = {"keys": "sa_keys", "shares": "sa_shares", "input": "sa_masked", "unmask": "sa_unmask"}[self.phase]
        if msg.kind != expected or msg.src not in self.waiting:
            return Step()
        self.waiting.discard(msg.src)
        try:
            getattr(self, f"_take_{self.phase}")(msg)
        except (records.RecordError, ValueError, KeyError, IndexError) as exc:
            self.excluded[msg.src] = f"{self.phase}: {exc}"
        else:
            self.answered.append(msg.src)
        return self._advance(msg.t) if not self.waiting else Step()

    def on_timer(self, tag: str, t: float) -> Step:
        if tag != f"{TIMER}:{self.index}:{self.phase}":
            return Step()
        return self._advance(t)

    def on_deadline(self, t: float) -> Step:
        """The round's deadline: the masked input (or an earlier phase) closes with whoever answered;
        a masked input phase opened after it waits phase_timeout_s."""
        self.deadline_passed = True
        return self._advance(t) if self.phase in ("keys", "shares", "input") else Step()

    def on_lost(self, names: set[str], t: float) -> Step:
        if not self.waiting & names:
            return Step()
        self.waiting -= names
        return self._advance(t) if not self.waiting else Step()

    # ---- taking each phase's message ------------------------------------------------------------
    def _take_keys(self, msg) -> None:
        (me, c_pk, s_pk, commit), = records.unpack_keys(msg.frames[0])
        if me in self.names or me == 0:
            raise ValueError(f"id {me} is taken or invalid")
        self.ids[msg.src], self.names[me] = me, msg.src
        self.public[me] = (c_pk, s_pk, commit)

    def _take_shares(self, msg) -> None:
        me = self.ids[msg.src]
        sealed = records.unpack_ciphers(msg.frames[0])
        if sorted(v for v, _ in sealed) != self.graph[me]:
            raise ValueError("sealed shares for other clients than its neighbours")
        for v, ciphertext in sealed:
            self.sealed.setdefault(v, []).append((me, ciphertext))

    def _take_input(self, msg) -> None:
        size = vector.length(self.spec, self.extras)
        frame = bytes(memoryview(msg.frames[0]))
        if len(frame) != bitpack.packed_size(size, self.word_bits):
            raise ValueError(f"{len(frame)} bytes, not {size} words of {self.word_bits} bits")
        self.inputs[msg.src] = frame
        for v in msg.body.get("invalid") or []:  # a neighbour's sealed shares did not authenticate: it masked without it
            name = self.names.get(int(v))
            if name is None:
                continue
            self.skipped.setdefault(int(v), set()).add(self.ids[msg.src])
            self.excluded.setdefault(name, f"shares: its sealed shares to {msg.src} do not authenticate")

    def _take_unmask(self, msg) -> None:
        holder = self.ids[msg.src]
        for owner, which, share in records.unpack_shares(msg.frames[0]):
            self.shares[which].setdefault(owner, {})[holder] = share

    # ---- phase ends -----------------------------------------------------------------------------
    def _advance(self, t: float) -> Step:
        record = self.phases[-1]
        record.update(t_end=t, answered=len(self.answered))
        survivors = [c for c in self.answered if c not in self.excluded]
        reports = [self._excluded_report(c) for c in self.excluded if c not in self.reported]
        self.reported |= set(self.excluded)
        step = self._next(survivors, t)
        step.reports[0:0] = reports
        return step

    def _excluded_report(self, client: str) -> dict:
        return {"type": "secagg_excluded", "round": self.index, "client": client, "phase": self.phase,
                "why": self.excluded[client]}

    def _failed(self, left: int, t: float, why: str = "") -> Step:
        self.phase = "failed"
        return Step(failed=True, reports=[{"type": "secagg_failed", "round": self.index, "phase": self.phases[-1]["phase"],
                                           "left": left, "threshold": self.choice.threshold, "t": t,
                                           **({"why": why} if why else {})}])

    def _next(self, survivors: list[str], t: float) -> Step:
        if self.cfg.masked and len(survivors) < self.choice.threshold:
            return self._failed(len(survivors), t)
        if self.phase == "input" and not survivors:
            return self._failed(0, t)
        if self.phase == "keys":
            return self._open("shares", survivors, t, self._rosters(survivors))
        if self.phase == "shares":
            return self._open("input", survivors, t, self._relays(survivors))
        if self.phase == "input":
            self.u3 = survivors
            if self.cfg.masked:
                return self._open("unmask", survivors, t, self._survivor_lists(survivors))
        return self._finish(t)  # after the input (plain) or the unmasking: the sum of U3

    def _open(self, phase: str, survivors: list[str], t: float, sends: list[Send]) -> Step:
        self.phase = phase
        self.waiting = set(survivors)
        self.answered = []
        self.phases.append(self._opened(phase, t, len(survivors)))
        return Step(sends=sends, timers=self.timers(t))

    def _rosters(self, u1: list[str]) -> list[Send]:
        ids = sorted(self.ids[c] for c in u1)
        self.graph = graph.neighbours(ids, self.choice.degree, hash_seed(self.seed, self.index))
        body = {"threshold": self.choice.threshold}
        if self.choice.complete or self.choice.degree >= len(ids) - 1:  # one roster for all: multicast
            frame = records.pack_keys([(v, *self.public[v]) for v in ids])
            return [Send(sorted(u1), "sa_roster", self.index, body, [frame], len(frame), 0)]
        sends = []
        for u in ids:
            frame = records.pack_keys([(v, *self.public[v]) for v in self.graph[u]])
            sends.append(Send(self.names[u], "sa_roster", self.index, body, [frame], len(frame), 0))
        return sends

    def _relays(self, u2: list[str]) -> list[Send]:
        alive = {self.ids[c] for c in u2}
        sends = []
        for c in u2:
            mine = [(u, ct) for u, ct in self.sealed.get(self.ids[c], []) if u in alive]
            frame = records.pack_ciphers(mine)
            sends.append(Send(c, "sa_relay", self.index, {}, [frame], len(frame), 0))
        self.u2 = sorted(alive)
        return sends

    def _survivor_lists(self, u3: list[str]) -> list[Send]:
        ids = sorted(self.ids[c] for c in u3)
        if self.choice.complete:
            frame = records.pack_ids(ids)
            return [Send(sorted(u3), "sa_survivors", self.index, {}, [frame], len(frame), 0)]
        alive = set(ids)
        sends = []
        for c in u3:
            me = self.ids[c]
            frame = records.pack_ids(sorted((set(self.graph[me]) | {me}) & alive))
            sends.append(Send(c, "sa_survivors", self.index, {}, [frame], len(frame), 0))
        return sends

    # ---- the sum ----------------------------------------------------------------------------------
    def _finish(self, t: float) -> Step:
        """The sum, once its secrets are known to be rebuildable: its emulated cost now, the real
        work in compute()."""
        self.phase = "done"
        contributors = [c for c in self.u3 if c not in self.excluded]
        if self.cfg.masked:
            dropped = sorted(set(self.u2) - {self.ids[c] for c in contributors})
            short = self._short_neighbourhood(contributors, dropped)
            if short is not None:
                return self._failed(short[0], t, short[1])
        self.contributors = contributors
        return Step(work_s=self._server_seconds(contributors), compute=self._compute)

    def _masked_with(self, u: int, alive: set[int]) -> list[int]:
        """The contributors whose vectors carry a pairwise mask with u (all its neighbours among
        them but those that could not open its shares and left it out)."""
        return [v for v in self.graph[u] if v in alive and v not in self.skipped.get(u, ())]

    def _short_neighbourhood(self, contributors: list[str], dropped: list[int]) -> tuple[int, str] | None:
        t = self.choice.threshold
        alive = {self.ids[c] for c in contributors}
        dropped = [u for u in dropped if self._masked_with(u, alive)]  # no mask of theirs to remove: nothing to rebuild
        for which, owners in ((records.SELF_MASK, sorted(alive)), (records.MASK_KEY, dropped)):
            for owner in owners:
                got = len(self.shares[which].get(owner, {}))
                if got < t:
                    what = "self-mask seed" if which == records.SELF_MASK else "mask key"
                    return got, f"{got} shares of client {self.names[owner]}'s {what} came back, {t} needed"
        return None

    def _server_seconds(self, contributors: list[str]) -> float:
        costs = self.cfg.costs
        if costs is None:
            return 0.0
        length = vector.length(self.spec, self.extras)
        if not self.cfg.masked:
            return costs.unmasking_s(length, len(contributors), False)
        alive = {self.ids[c] for c in contributors}
        dropped = [u for u in self.u2 if u not in alive and self._masked_with(u, alive)]
        pairs = sum(len(self._masked_with(u, alive)) for u in dropped)
        return costs.unmasking_s(length, len(alive), True, len(alive) + len(dropped), self.choice.threshold, pairs)

    def _compute(self) -> tuple[np.ndarray, int, list[dict]] | None:
        """The exact integer sum of the contributors' vectors (unmasked), their number, and the
        incidents of shares that did not check out; None if a secret the sum needs cannot be
        rebuilt (its owner is then in self.excluded)."""
        size = vector.length(self.spec, self.extras)
        vectors = {self.ids.get(c, i + 1): bitpack.unpack(self.inputs[c], size, self.word_bits).astype(np.uint32)
                   for i, c in enumerate(self.contributors)}
        if not self.cfg.masked:
            return np.sum(np.stack(list(vectors.values())).astype(np.uint64), axis=0), len(vectors), []
        notes: list[dict] = []
        alive = set(vectors)
        seeds = {u: self._rebuilt(records.SELF_MASK, u, lambda s, u=u: hashlib.sha256(s).digest() == self.public[u][2], notes)
                 for u in vectors}
        dropped = [u for u in self.u2 if u not in alive and self._masked_with(u, alive)]
        secrets = {u: self._rebuilt(records.MASK_KEY, u, lambda s, u=u: keys.public_bytes(keys.restored(s)) == self.public[u][1],
                                    notes) for u in dropped}
        if any(v is None for v in (*seeds.values(), *secrets.values())):
            return None

        def pairs():
            for u in dropped:
                key = keys.restored(secrets[u])
                for v in self._masked_with(u, alive):
                    yield v, u, keys.agree(key, self.public[v][1], context(self.index, u, v, b"mask"))

        total = masking.unmasked_sum(vectors, self.word_bits, seeds, lambda: list(pairs()))
        return total.astype(np.uint64), len(vectors), notes

    def _rebuilt(self, which: int, owner: int, check: Callable[[bytes], bool], notes: list[dict]) -> bytes | None:
        """A secret from t of its shares, checked against what its owner published. Where it does
        not check out, t shares without each holder in turn: the holder whose share was wrong is
        named in an incident. None (and the owner excluded) where no choice checks out."""
        held = sorted(self.shares[which].get(owner, {}).items())
        t = self.choice.threshold
        candidates = [(None, held[:t])] + [(skip, [h for h in held if h[0] != skip][:t]) for skip, _ in held[:t + 1]]
        for skip, chosen in candidates:
            if len(chosen) < t:
                continue
            try:
                secret = shamir.combine(dict(chosen))
            except ValueError:
                continue
            if check(secret):
                if skip is not None:
                    notes.append({"type": "secagg_bad_share", "round": self.index, "client": self.names[skip],
                                  "owner": self.names[owner]})
                return secret
        self.excluded[self.names[owner]] = "unmask: its secret does not rebuild from its neighbours' shares"
        return None


def hash_seed(seed: int, index: int) -> int:
    return int.from_bytes(hashlib.sha256(b"graph:%d:%d" % (seed, index)).digest()[:8], "little")
