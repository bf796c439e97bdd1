"""CurveZMQ on a run's TCP sockets: key files, the socket options of either side, and the ZAP
handler that admits only the keys a run knows.

A run has one key pair of its own (the conductor's and the network's server sockets present it)
and a set of host keys it admits. A host's key file holds its own pair and the run's public key;
the conductor's holds the run's pair and the host keys it admits. Keys are Z85 text, as ZeroMQ
writes them; files are JSON, readable by their owner only."""
from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import zmq
import zmq.utils.z85

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq sends authentication requests (RFC 27)
DOMAIN = b"flemu"
CONDUCTOR_FILE = "conductor.key"


class KeyFileError(ValueError):
    """A key file that is missing, unreadable or not of the expected kind; the message names it."""


@dataclass(frozen=True)
class KeyPair:
    public: str  # Z85, 40 characters
    secret: str

    @staticmethod
    def new() -> "KeyPair":
        public, secret = zmq.curve_keypair()
        return KeyPair(public.decode("ascii"), secret.decode("ascii"))


@dataclass(frozen=True)
class RunKeys:
    """The conductor's side: the run's own pair and the host keys it admits."""
    run: KeyPair
    hosts: tuple[str, ...]

    def serve(self, sock: zmq.Socket) -> None:
        """Make a socket, before it binds, a CURVE server of this run (checked by the ZAP handler)."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.run.public.encode("ascii"))
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.run.secret.encode("ascii"))
        sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN)


@dataclass(frozen=True)
class HostKey:
    """A host's side: its own pair and the public key of the run it may join."""
    run_public: str
    host: KeyPair

    def connect(self, sock: zmq.Socket) -> None:
        """Make a socket, before it connects, a CURVE client of the run."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.run_public.encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.host.public.encode("ascii"))
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.host.secret.encode("ascii"))

    def as_dict(self) -> dict:
        return {"kind": "flemu-host", "run_public": self.run_public,
                "public": self.host.public, "secret": self.host.secret}

    @staticmethod
    def from_dict(data: dict, label: str) -> "HostKey":
        if not isinstance(data, dict) or data.get("kind") != "flemu-host":
            raise KeyFileError(f"{label}: not a host key file (kind {data.get('kind') if isinstance(data, dict) else None!r}, "
                               "expected 'flemu-host'; `python -m emulator keys DIR` writes them)")
        try:
            return HostKey(_z85(data, "run_public", label), KeyPair(_z85(data, "public", label), _z85(data, "secret", label)))
        except KeyError as exc:
            raise KeyFileError(f"{label}: key {exc.args[0]!r} missing") from None


def _z85(data: dict, key: str, label: str) -> str:
    value = data[key]
    if not isinstance(value, str) or len(value) != 40:
        raise KeyFileError(f"{label}: {key} is not a 40-character Z85 CURVE key")
    try:
        zmq.utils.z85.decode(value)
    except Exception:
        raise KeyFileError(f"{label}: {key} is not valid Z85") from None
    return value


def _write_private(path: Path, data: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def _read(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise KeyFileError(f"{path}: key file not found") from None
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: cannot read the key file ({exc})") from None


def user_key(frame: zmq.Frame) -> str | None:
    """The CURVE public key (z85) a message came with: the User-Id the ZAP handler gave its
    connection; None without one."""
    try:
        return frame.get("User-Id") or None
    except (zmq.ZMQError, AttributeError):
        return None


def make_keys(folder: Path, hosts: int = 1) -> tuple[RunKeys, list[Path]]:
    """A run key pair and `hosts` host keys, written to folder/conductor.key and folder/host-K.key
    (K from 1). With one key per host slot, host-K.key holds slot host(K-1) (emulator/placement.py's
    slot_keys); one key shared by many host processes binds no slot, and the network still lets each
    speak only for the actors it was given."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    run = KeyPair.new()
    host_keys = [HostKey(run.public, KeyPair.new()) for _ in range(hosts)]
    keys = RunKeys(run, tuple(h.host.public for h in host_keys))
    _write_private(folder / CONDUCTOR_FILE, {"kind": "flemu-conductor", "public": run.public, "secret": run.secret,
                                             "hosts": list(keys.hosts)})
    paths = []
    for k, host in enumerate(host_keys, 1):
        paths.append(folder / f"host-{k}.key")
        _write_private(paths[-1], host.as_dict())
    return keys, paths


def read_run_keys(path: Path) -> RunKeys:
    data = _read(path)
    label = str(path)
    if not isinstance(data, dict) or data.get("kind") != "flemu-conductor":
        raise KeyFileError(f"{label}: not a conductor key file (expected kind 'flemu-conductor')")
    try:
        hosts = data["hosts"]
        if not isinstance(hosts, list) or not hosts:
            raise KeyFileError(f"{label}: hosts must list at least one host public key")
        return RunKeys(KeyPair(_z85(data, "public", label), _z85(data, "secret", label)),
                       tuple(_z85({"k": h}, "k", f"{label}: hosts[{i}]") for i, h in enumerate(hosts)))
    except KeyError as exc:
        raise KeyFileError(f"{label}: key {exc.args[0]!r} missing") from None


def read_host_key(path: Path) -> HostKey:
    return HostKey.from_dict(_read(path), str(path))


class ZapHandler:
    """Answers libzmq's authentication requests for every socket of `ctx` with ZAP_DOMAIN set: a
    CURVE client whose public key is one of `admitted` is let in, anything else is refused and the
    refusal logged (at most once per key and address) and kept for the owner to report. Runs in a
    thread of its own, because a handshake waits for the answer while the owner's loop may be busy."""

    def __init__(self, ctx: zmq.Context, admitted: tuple[str, ...] | list[str], owner: str, log: TextIO | None = None):
        self.admitted = {zmq.utils.z85.decode(k.encode("ascii")) for k in admitted}
        self.owner = owner
        self.log = log if log is not None else sys.stderr
        self._lock = threading.Lock()
        self._refusals: list[dict] = []
        self._logged: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)  # before any CURVE socket binds: without a handler libzmq admits everyone
        self._thread = threading.Thread(target=self._serve, name=f"zap-{owner}", daemon=True)
        self._thread.start()

    def refusals(self) -> list[dict]:
        """The refusals since the last call: {address, key, mechanism, why}."""
        with self._lock:
            taken, self._refusals = self._refusals, []
        return taken

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(100):
                    continue
                frames = self._sock.recv_multipart()
                self._sock.send_multipart(self._answer(frames))
        except zmq.ZMQError:
            pass
        finally:
            self._sock.close(linger=0)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, domain, address, _identity, mechanism = frames[:6]
        key = frames[6] if mechanism == b"CURVE" and len(frames) > 6 else b""
        if mechanism == b"CURVE" and key in self.admitted and domain == DOMAIN:
            return [version, request_id, b"200", b"OK", zmq.utils.z85.encode(key), b""]
        why = ("not a key this run admits" if mechanism == b"CURVE" else
               f"mechanism {mechanism.decode(errors='replace')} (this run speaks CURVE only)")
        shown = zmq.utils.z85.encode(key).decode("ascii") if len(key) == 32 else ""
        where = address.decode(errors="replace")
        refusal = {"address": where, "key": shown, "mechanism": mechanism.decode(errors="replace"), "why": why}
        with self._lock:
            self._refusals.append(refusal)
            first = (where, shown) not in self._logged
            self._logged.add((where, shown))
        if first:
            print(f"[{self.owner}] refused a connection from {where}: {why}" + (f" (key {shown})" if shown else ""),
                  file=self.log, flush=True)
        return [version, request_id, b"400", why.encode(), b"", b""]
