"""Who may speak to the network process, and for which actors.

ZeroMQ routing identities are bytes: a peer that connects without naming itself gets a random
binary one. Identities are therefore compared as bytes and only decoded for the peers the conductor
announced. Everything a peer sends that the network refuses is counted per peer and logged at most
once per `log_every_s` per peer; a peer that is not one of the run's, and goes on sending after
`ban_after` refused messages or `ban_after_bytes` refused bytes, is banned: its messages are
dropped unread from then on."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

MAX_TRACKED_STRANGERS = 1024  # past this many, strangers share one tally (their identities are random)


def identity_label(identity: bytes) -> str:
    """A printable name for a routing identity: the peer's name, or its bytes in hex."""
    try:
        text = identity.decode("ascii")
        if text.isprintable() and text:
            return text
    except UnicodeDecodeError:
        pass
    return "0x" + identity.hex()


@dataclass
class Tally:
    refused: int = 0
    refused_bytes: int = 0
    last_logged: float = -float("inf")
    unlogged: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class PeerGuard:
    def __init__(self, assigned: dict[str, list[str]], log: TextIO | None = None, log_every_s: float = 5.0,
                 ban_after: int = 1000, ban_after_bytes: int = 64 * 2**20, clock: Callable[[], float] = time.monotonic):
        self.names = {name.encode(): name for name in assigned}
        self.assigned = {name: frozenset(actors) for name, actors in assigned.items()}
        self.owner: dict[str, str] = {}  # actor -> the peer that claimed it
        self.quiet: dict[str, frozenset[str]] = {}  # actor -> the kinds it declared quiet
        self.greeted: set[str] = set()
        self.tallies: dict[str, Tally] = {}
        self.banned: set[bytes] = set()
        self.log = log if log is not None else sys.stderr
        self.log_every_s = log_every_s
        self.ban_after = ban_after
        self.ban_after_bytes = ban_after_bytes
        self.clock = clock
        self.changed = False  # refusals since the counts were last reported

    def known(self, identity: bytes) -> str | None:
        """The run's name for this identity, or None for a stranger."""
        return self.names.get(identity)

    def refuse(self, identity: bytes, reason: str, nbytes: int = 0) -> None:
        label = self.names.get(identity) or identity_label(identity)
        stranger = identity not in self.names
        if stranger and label not in self.tallies and len(self.tallies) >= MAX_TRACKED_STRANGERS:
            label = "(other strangers)"
        tally = self.tallies.setdefault(label, Tally())
        tally.refused += 1
        tally.refused_bytes += nbytes
        short = reason.split(":")[0][:60]
        tally.reasons[short] = tally.reasons.get(short, 0) + 1
        self.changed = True
        now = self.clock()
        if now - tally.last_logged >= self.log_every_s:
            more = f" ({tally.unlogged} more refused since the last line)" if tally.unlogged else ""
            print(f"[network] refused a message from {label}: {reason}{more}", file=self.log)
            tally.last_logged, tally.unlogged = now, 0
        else:
            tally.unlogged += 1
        if stranger and identity not in self.banned and (tally.refused >= self.ban_after or tally.refused_bytes >= self.ban_after_bytes):
            self.banned.add(identity)
            print(f"[network] {label} is not a peer of this run and keeps sending: banned "
                  f"({tally.refused} messages, {tally.refused_bytes} bytes refused)", file=self.log)

    def expected(self, peer: str) -> int:
        """How many actors the peer was given (a hello in parts may name no more)."""
        return len(self.assigned.get(peer, ()))

    def claim(self, peer: str, actors: list[str], quiet: dict[str, list[str]] | None = None) -> str | None:
        """A hello: bind the actors to the peer, and note the kinds each declares quiet (kind ->
        actors; node/actor.py quiet_kinds). None when accepted, else why it was refused (then
        nothing is bound). A peer says hello once, and only for the actors it was given."""
        quiet = quiet or {}
        if peer in self.greeted:
            return f"{peer} said hello a second time (claiming {sorted(actors)[:5]})"
        named = set(actors)
        if len(named) < len(actors):
            return f"{peer} named an actor twice in its hello"
        strangers = sorted({a for names in quiet.values() for a in names} - named)
        if strangers:
            return f"{peer} declares quiet kinds for {strangers[0]!r}, not one of its actors"
        foreign = sorted(named - self.assigned.get(peer, frozenset()))
        if foreign:
            taken = [a for a in foreign if a in self.owner]
            what = f"actors of another peer ({taken[:5]})" if taken else f"actors it was not given ({foreign[:5]})"
            return f"{peer} claimed {what}"
        self.greeted.add(peer)
        for actor in actors:
            self.owner[actor] = peer
        for kind, names in quiet.items():
            for actor in names:
                self.quiet[actor] = self.quiet.get(actor, frozenset()) | {kind}
        return None

    def counts(self) -> dict[str, object]:
        self.changed = False
        return {"total": sum(t.refused for t in self.tallies.values()),
                "by_peer": {label: {"messages": t.refused, "bytes": t.refused_bytes, "reasons": dict(t.reasons)}
                            for label, t in sorted(self.tallies.items())},
                "banned": sorted(identity_label(i) for i in self.banned)}
