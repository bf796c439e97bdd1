"""The message envelope: a small msgpack map in the first ZMQ frame; payload frames follow raw.

`op` is the transport verb (what the network does with the message); `kind` is the FL message
kind carried by send/deliver (what the receiving actor does with it)."""
from __future__ import annotations

from typing import Any

import math

import msgpack

VERSION = 2  # 2: the batch op (protocol/batch.py); a peer of version 1 could not read what a network of 2 sends
MAX_ENVELOPE_BYTES = 1 << 20

KINDS = frozenset({"start", "task", "update", "checkin", "stats", "moments", "gossip", "warmup_update", "warmup_model",
                   "tick", "peer_down", "online", "error", "closed",
                   # secure aggregation's phases (node/secure/)
                   "sa_keys", "sa_roster", "sa_shares", "sa_relay", "sa_masked", "sa_survivors", "sa_unmask"})

_STR, _INT, _NUM, _MAP, _LIST = str, int, (int, float), dict, list


class Defaulted:
    """A field that may be left out: unpack fills in its default (a newer field, which senders
    that do not use it need not write)."""

    def __init__(self, kind: Any, default: Any):
        self.kind, self.default = kind, default


# op -> {field: type}; every field listed is required unless Defaulted, no other field is allowed.
SCHEMA: dict[str, dict[str, Any]] = {
    # a peer with more actors than one envelope holds says hello in parts: `more` on all but the last;
    # `quiet` (kind -> actors) names the kinds whose delivery an actor answers with nothing that
    # moves the clock (no send, timer, work, checkpoint, barrier or halt): the network does not wait
    # for their answer, and the peer sends none
    "hello": {"peer": _STR, "actors": _LIST, "more": Defaulted(bool, False), "quiet": Defaulted(_MAP, {})},
    "send": {"src": _STR, "dst": (str, list), "kind": _STR, "round": _INT, "t": _NUM, "n": _INT, "body": _MAP,
             "payload": _INT, "fp32": _INT,
             # the emulator's records of the message (a client's diagnostics): never delivered, never counted
             "notes": Defaulted(_MAP, {})},
    # shared > 0: the payload of a send to several actors, which crosses to a peer once: with frames,
    # the peer keeps them as shared payload `shared` (in place of the one it kept); without, it uses them
    "deliver": {"src": _STR, "dst": _STR, "kind": _STR, "round": _INT, "t": _NUM, "hold": _INT, "body": _MAP,
                "device": (dict, type(None)), "shared": _INT, "quiet": Defaulted(bool, False)},
    "done": {"actor": _STR, "hold": _INT, "busy_until": (int, float, type(None)), "busy_s": (int, float, type(None))},
    "timer": {"actor": _STR, "at": _NUM, "tag": _STR},
    "report": {"body": _MAP},
    "record": {"body": _MAP},
    "peer_lost": {"peer": _STR},
    "alive": {"busy_s": _NUM},  # a heartbeat: wall seconds the peer's current job has run (0: idle)
    "alive_ack": {},  # the network's answer to a heartbeat: a remote host leaves a run that stopped answering
    "checkpoint": {"actor": _STR, "at": _NUM, "round": _INT},  # an actor asks for a checkpoint of the world at `at`
    # the network asks a peer to write its state to path; with path "" (a host on another machine)
    # to send it as snapshot_part messages (one frame of at most chunk bytes each), then snapshot_done
    "snapshot": {"round": _INT, "path": _STR, "chunk": Defaulted(_INT, 0)},
    "snapshot_part": {},
    "snapshot_done": {"ok": bool, "why": _STR},
    # an actor has reached barrier `round` at `at` and waits for its group (a checkpoint of the run follows)
    "barrier": {"actor": _STR, "at": _NUM, "round": _INT},
    "halt": {"actor": _STR, "at": _NUM},  # the server finished the run at `at`: the clock stops there
    "stop": {},
    # envelopes without payload frames sent to one peer in a row, in order (protocol/batch.py); never nested
    "batch": {"parts": _LIST},
    # the conductor's lobby, where a host on another machine joins a run
    "join": {"host": _STR, "pid": _INT, "slot": _STR},  # which machine and process asks, for which slot ("": any)
    "welcome": {"peer": _STR, "index": _INT, "scenario": _MAP, "fingerprint": _STR, "network_port": _INT,
                "silence_s": _NUM,
                # a resumed run: how many frames follow, each a checkpoint part that holds this slot's clients
                "restore": Defaulted(_INT, 0),
                # the files the scenario names, after those parts, one frame each: [{"at": where in the
                # scenario, "names": [file name, ...]}, ...]
                "files": Defaulted(_LIST, [])},
    "join_refused": {"why": _STR},
    # a joined host without the data set asks for its clients' samples; the answer's frames: train and
    # test labels, then the rows and samples its clients hold of each (and the users, where given)
    "data": {},
    "data_shard": {"classes": _INT, "dtype": _STR, "train_shape": _LIST, "test_shape": _LIST, "users": bool},
    "data_refused": {"why": _STR},
}
# numbers that are counts, ids or times: never negative
NONNEGATIVE = frozenset({"n", "payload", "fp32", "hold", "at", "busy_until", "busy_s", "shared", "chunk", "restore"})
INT64 = (-(2**63), 2**63 - 1)


class ProtocolError(ValueError):
    """An envelope failed validation; the message names the failing check."""


class VersionError(ProtocolError):
    """The envelope is of another protocol version: a peer of another release."""


def pack(op: str, **fields: Any) -> bytes:
    return msgpack.packb({"v": VERSION, "op": op, **fields}, use_bin_type=True)


HELLO_PART_ACTORS = 20_000  # actor names per hello part: far under MAX_ENVELOPE_BYTES for names of up to 40 bytes


def hello_parts(peer: str, actors: list[str], quiet: dict[str, list[str]] | None = None) -> list[bytes]:
    """A peer's hello, in as many envelopes as its actors need (a host of 150,000 clients names
    1.2 MB of actors, over the envelope limit); its quiet kinds (kind -> actors) go in the last."""
    chunks = [actors[i:i + HELLO_PART_ACTORS] for i in range(0, len(actors), HELLO_PART_ACTORS)] or [[]]
    last = len(chunks) - 1
    return [pack("hello", peer=peer, actors=chunk,
                 **({"more": True} if k < last else {"quiet": quiet} if quiet else {}))
            for k, chunk in enumerate(chunks)]


def unpack(frame: Any) -> dict[str, Any]:
    """Decode and strictly validate an envelope frame."""
    view = memoryview(frame)
    if view.nbytes > MAX_ENVELOPE_BYTES:
        raise ProtocolError(f"envelope is {view.nbytes} bytes, over the limit of {MAX_ENVELOPE_BYTES}")
    try:
        env = msgpack.unpackb(view, raw=False, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(f"envelope is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(env, dict):
        raise ProtocolError("envelope is not a map")
    if env.get("v") != VERSION:
        raise VersionError(f"protocol version {env.get('v')!r} unknown (this side speaks {VERSION})")
    op = env.get("op")
    schema = SCHEMA.get(op)
    if schema is None:
        raise ProtocolError(f"op {op!r} unknown")
    if not env.keys() <= _ALLOWED[op]:
        raise ProtocolError(f"{op}: unexpected fields {sorted(set(env) - _ALLOWED[op])}")
    for field, kind, default in _FIELDS[op]:
        if field in env:
            value = env[field]
        elif default is _REQUIRED:
            raise ProtocolError(f"{op}: field {field!r} missing")
        else:
            env[field] = default
            continue
        if not isinstance(value, kind) or (value.__class__ is bool and kind is not bool):
            raise ProtocolError(f"{op}: field {field!r} has the wrong type ({type(value).__name__})")
        if isinstance(value, (int, float)) and not (_LOW <= value <= _HIGH and (value >= 0 or field not in _NOT_NEGATIVE)):
            _check_number(op, field, value)  # (says what is wrong: the test above lets only good numbers past)
    _check_contents(op, env)
    return env


def _check_contents(op: str, env: dict[str, Any]) -> None:
    """What the fields hold, once their types are right: known kinds, names where names belong."""
    if "kind" in SCHEMA[op] and env["kind"] not in KINDS:
        raise ProtocolError(f"{op}: message kind {env['kind']!r} unknown")
    if op == "send" and isinstance(env["dst"], list) and not all(isinstance(d, str) for d in env["dst"]):
        raise ProtocolError(f"{op}: dst list must hold actor names")
    if op == "batch" and not all(isinstance(p, bytes) for p in env["parts"]):
        raise ProtocolError("batch: parts must be packed envelopes")
    if op == "hello" and not all(isinstance(a, str) for a in env["actors"]):
        raise ProtocolError("hello: actors must be actor names")
    if op == "hello" and not all(kind in KINDS and isinstance(names, list) and all(isinstance(a, str) for a in names)
                                 for kind, names in env["quiet"].items()):
        raise ProtocolError("hello: quiet must map message kinds to actor names")


_REQUIRED = object()
# each op's fields as unpack checks them: (name, accepted types, default or _REQUIRED), and every key it may carry
_FIELDS = {op: tuple((field, kind.kind, kind.default) if isinstance(kind, Defaulted) else (field, kind, _REQUIRED)
                     for field, kind in schema.items()) for op, schema in SCHEMA.items()}
_ALLOWED = {op: frozenset(schema) | {"v", "op"} for op, schema in SCHEMA.items()}
_LOW, _HIGH = INT64  # a number between them is finite and fits in 64 bits (NaN fails every comparison)
_NOT_NEGATIVE = NONNEGATIVE | {"t"}


def _check_number(op: str, field: str, value: float) -> None:
    """Times must be finite, integers must fit in 64 bits, counts and ids must not be negative."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"{op}: field {field!r} is not finite ({value})")
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        raise ProtocolError(f"{op}: field {field!r} is out of the 64-bit range")
    if value < 0 and field in _NOT_NEGATIVE:
        raise ProtocolError(f"{op}: field {field!r} is negative ({value})")
