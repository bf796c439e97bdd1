"""Where a run's client hosts run. `local` forks them here (the conductor does that); `remote`
waits for hosts that join over TCP from other machines (`python -m emulator host --connect`, by
hand or from a Slurm or Kubernetes job); `ray` starts those same host commands as Ray tasks.

A remote host joins through the conductor's lobby: a ROUTER socket with CURVE, whose ZAP handler
admits only the run's host keys. The lobby hands each joining host a free host slot (its name and
index), the resolved scenario, a fingerprint of the world built from it, and the port of the
network's TCP socket (also CURVE). The host rebuilds the world itself, from its own data root, and
refuses to run if its fingerprint differs."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import numpy as np
import torch
import zmq

from protocol import curve, envelope
from .world import World

LAUNCHERS = ("local", "remote", "ray")
LOBBY_MAX_MESSAGE = 64 * 1024  # a join is a few dozen bytes
DEFAULT_SILENCE_S = 60.0  # a remote host leaves a run whose network has not answered for this long


class PlacementError(ValueError):
    """Options of run that cannot work together or cannot be met; the message names the option."""


@dataclass
class Placement:
    launcher: str = "local"
    hosts: int | None = None  # remote and ray: how many hosts the run waits for
    listen: str | None = None  # tcp://ADDR:PORT of the lobby; the network listens on PORT + 1 (or any port with 0)
    keys: Path | None = None  # a conductor.key to admit hosts by; None: one made for the run in RUN_DIR/keys
    ray_address: str | None = None
    cpus_per_host: float = 1.0  # ray: the resources one host asks for
    gpus_per_host: float = 0.0
    serve_data_mb: float = 1024.0  # the most data the lobby sends one host without a data set (its clients' rows)

    @property
    def remote(self) -> bool:
        return self.launcher != "local"

    def check(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise PlacementError(f"--launcher {self.launcher!r}: expected one of {', '.join(LAUNCHERS)}")
        if not self.remote:
            if self.listen or self.keys:
                raise PlacementError("--listen and --keys are for hosts on other machines: add --hosts remote:N or --launcher ray")
            return
        if self.launcher == "remote" and not self.listen:
            raise PlacementError("--hosts remote:N needs --listen tcp://ADDR:PORT (where the hosts connect)")
        if self.launcher == "ray" and self.keys:
            raise PlacementError("--launcher ray hands the hosts keys it makes for the run: leave out --keys")
        if self.hosts is not None and self.hosts < 1:
            raise PlacementError(f"--hosts remote:{self.hosts}: at least one host")
        if self.listen:
            split_listen(self.listen)

    def run_keys(self, run_dir: Path, slots: int) -> tuple[curve.RunKeys, list[Path]]:
        """The keys hosts are admitted by, and the host key files a user hands to hosts, one per
        slot (none when the keys came from --keys: the user has them). A resumed run keeps the keys
        made for it, so the hosts it had can join again with the files they hold."""
        if self.keys is not None:
            try:
                return curve.read_run_keys(self.keys), []
            except curve.KeyFileError as exc:
                raise PlacementError(f"--keys: {exc}") from None
        made = run_dir / "keys"
        files = [made / f"host-{k}.key" for k in range(1, slots + 1)]
        if (made / curve.CONDUCTOR_FILE).exists() and all(f.exists() for f in files):
            try:
                keys = curve.read_run_keys(made / curve.CONDUCTOR_FILE)
            except curve.KeyFileError as exc:
                raise PlacementError(f"{made}: {exc}") from None
            if len(keys.hosts) == slots:
                return keys, files
        return curve.make_keys(made, slots)


def split_listen(listen: str) -> tuple[str, int]:
    parts = urlsplit(listen)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise PlacementError(f"--listen {listen!r}: expected tcp://ADDR:PORT (PORT 0: any free port)")
    return parts.hostname, port


def slot_keys(keys: curve.RunKeys, slots: list[str]) -> dict[str, str]:
    """Slot name -> the one host key that may hold it: the K-th key of the run (host-K.key) is slot
    host(K-1)'s. A key file with another number of host keys (one shared by all) binds none."""
    return dict(zip(slots, keys.hosts)) if len(keys.hosts) == len(slots) else {}


def network_listen(listen: str) -> str:
    """The network's TCP endpoint beside the lobby's: PORT + 1, or any free port."""
    addr, port = split_listen(listen)
    return f"tcp://{addr}:{port + 1 if port else '*'}"


def world_fingerprint(world: World) -> str:
    """What a host must rebuild identically: every client's samples (indices into the same data),
    the data's labels and shape, and the clients' hosts. Not the pixel values: hashing them costs
    seconds on a large data set, and the labels already tell two different data sets apart."""
    h = hashlib.sha256()
    for name, data in (("train", world.task.train), ("test", world.task.test)):
        h.update(f"{name}:{tuple(data.x.shape)}".encode())
        h.update(np.ascontiguousarray(data.y.numpy()).tobytes())
    for c in world.clients:
        h.update(f"{c.profile.name}:{c.host}:{c.profile.ms_per_sample!r}".encode())
        h.update(np.ascontiguousarray(c.profile.indices).tobytes())
    return h.hexdigest()[:32]


@dataclass
class Child:
    """A process of the run, as the conductor supervises it."""
    name: str
    role: str  # network | server | host
    proc: Any  # multiprocessing.Process, conductor.FreshProcess or a RemoteHost: the same interface
    lost: bool = False


class RemoteHost:
    """A host process on another machine, with the part of multiprocessing.Process's interface the
    conductor uses. It cannot be killed from here: a host that is given up on is dropped by the
    network, and leaves on its own when the network stops answering it."""
    pid = None

    def __init__(self, name: str):
        self.name = name
        self.gone = False
        self.joined_from: dict[str, Any] | None = None

    def is_alive(self) -> bool:
        return not self.gone

    @property
    def exitcode(self) -> int | None:
        return None

    def join(self, timeout: float | None = None) -> None:
        pass

    def terminate(self) -> None:
        self.gone = True

    def kill(self) -> None:
        self.gone = True


class RayHost(RemoteHost):
    """A host started as a Ray task: its exit is seen (as a local process's is), and it can be cancelled."""

    def __init__(self, name: str, ref: Any):
        super().__init__(name)
        self.ref = ref
        self._code: int | None = None

    def _poll(self, timeout: float = 0.0) -> int | None:
        if self._code is None:
            import ray  # noqa: PLC0415

            ready, _ = ray.wait([self.ref], timeout=timeout)
            if ready:
                try:
                    self._code = int(ray.get(self.ref))
                except Exception:  # a cancelled or crashed task
                    self._code = -9
        return self._code

    def is_alive(self) -> bool:
        return not self.gone and self._poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._poll()

    def join(self, timeout: float | None = None) -> None:
        self._poll(timeout or 0.0)

    def kill(self) -> None:
        import ray  # noqa: PLC0415

        super().kill()
        try:
            ray.cancel(self.ref, force=True)
        except Exception:
            pass

    terminate = kill


class Lobby:
    """The conductor's TCP socket where remote hosts join (see the module's docstring)."""

    def __init__(self, ctx: zmq.Context, listen: str, keys: curve.RunKeys, hosts: list[RemoteHost],
                 welcome: dict[str, Any], bound: dict[str, str] | None = None,
                 restore_for: Callable[[str], list[bytes]] | None = None,
                 data_for: Callable[[str], tuple[dict[str, Any], list[bytes]]] | None = None,
                 files: list[bytes] = ()):
        self.zap = curve.ZapHandler(ctx, keys.hosts, "conductor")
        self.slot_of_key = {key: slot for slot, key in (bound or {}).items()}  # a key -> the one slot it may hold
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, LOBBY_MAX_MESSAGE)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        keys.serve(self.sock)
        try:
            self.sock.bind(listen)
        except zmq.ZMQError as exc:
            self.close()
            raise PlacementError(f"--listen {listen}: cannot listen there ({exc})") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.free: list[RemoteHost] = []  # the slots not yet given (add)
        self.add(hosts)
        self.welcome = welcome  # scenario, fingerprint, silence_s
        self.restore_for = restore_for  # a resumed run: slot -> the checkpoint parts that hold its clients
        self.data_for = data_for  # slot -> its clients' data (data_shard), for a host that has none
        self.files = list(files)  # the files the scenario names, as welcome["files"] lists them
        self.slot_of: dict[bytes, str] = {}  # identity of a joined host's socket -> its slot
        self.network_port: int | None = None
        self.pending: list[tuple[bytes, dict]] = []
        self.joined: list[str] = []

    def add(self, hosts: list[RemoteHost]) -> None:
        self.free += hosts

    def address_for_hosts(self, advertised: str | None = None) -> str:
        """The URL hosts connect to: the bound one, with a wildcard address replaced."""
        addr, port = self.endpoint.rsplit(":", 1)
        host = addr.split("//", 1)[1]
        if host in ("0.0.0.0", "[::]", "*"):
            host = advertised or host
        return f"tcp://{host}:{port}"

    def waiting_note(self, hosts: int, key_files: list[Path]) -> str:
        """What the run says while it waits: the command a host joins with, and its key file."""
        where = (f"{key_files[0].parent}/host-K.key, K = 1..{len(key_files)}, one per host: host-K.key holds slot "
                 f"host(K-1)" if key_files else "HOST_KEY_FILE")
        return (f"waiting for {hosts} host{'s' if hosts != 1 else ''} at {self.endpoint}: python -m emulator host "
                f"--connect {self.address_for_hosts('ADDR')} --key {where}")

    def network_listening(self, endpoint: str) -> list[str]:
        self.network_port = int(endpoint.rsplit(":", 1)[1])
        waiting, self.pending = self.pending, []
        return [note for identity, env in waiting for note in self._admit(identity, env)]

    def receive(self) -> list[str]:
        """Answer what came in; returns lines for the run's log."""
        notes: list[str] = []
        while self.sock.poll(0):
            frames = self.sock.recv_multipart(copy=False)
            if len(frames) != 2:
                continue
            identity, frame = frames[0].bytes, frames[1]
            try:
                env = envelope.unpack(frame.buffer)
            except envelope.ProtocolError as exc:
                notes.append(f"lobby: refused a message ({exc})")
                if isinstance(exc, envelope.VersionError):  # another release of the emulator: say so, in our version
                    self._send(identity, envelope.pack("join_refused", why=f"{exc}: run the same emulator release"))
                continue
            if env["op"] == "data":
                notes += self._serve_data(identity)
                continue
            if env["op"] != "join":
                notes.append(f"lobby: refused op {env['op']!r} (only join and data are spoken here)")
                continue
            env = {**env, "address": _peer_address(frame), "key": curve.user_key(frame)}
            if self.network_port is None:
                self.pending.append((identity, env))
            else:
                notes += self._admit(identity, env)
        return notes

    def _admit(self, identity: bytes, env: dict) -> list[str]:
        who = f"{env['host']} (pid {env['pid']}" + (f", {env['address']})" if env.get("address") else ")")
        if not self.free:
            self._send(identity, envelope.pack("join_refused", why=f"the run has all its {len(self.joined)} hosts"))
            return [f"lobby: refused {who}: every host slot is taken"]
        bound = self.slot_of_key.get(env.get("key") or "")
        if bound is not None and env["slot"] not in ("", bound):
            why = f"its key is host slot {bound!r}'s, not {env['slot']!r}'s"
            self._send(identity, envelope.pack("join_refused", why=why))
            return [f"lobby: refused {who}: {why}"]
        slot = bound or env["slot"]
        wanted = [h for h in self.free if h.name == slot]
        if slot and not wanted:
            self._send(identity, envelope.pack("join_refused", why=f"host slot {slot!r} is not free"))
            return [f"lobby: refused {who}: {'its key holds' if bound else 'it asked for'} slot {slot!r}, which is not free"]
        host = wanted[0] if wanted else self.free[0]
        self.free.remove(host)
        host.joined_from = {"machine": env["host"], "pid": env["pid"], "address": env.get("address")}
        self.joined.append(host.name)
        self.slot_of[identity] = host.name
        index = int(host.name.removeprefix("host"))
        parts = self.restore_for(host.name) if self.restore_for is not None else []
        self._send(identity, envelope.pack("welcome", peer=host.name, index=index, network_port=self.network_port,
                                           restore=len(parts), **self.welcome), *parts, *self.files)
        return [f"{host.name} joined from {who}"]

    def _serve_data(self, identity: bytes) -> list[str]:
        """A joined host asks for its clients' data (it has no data set of its own)."""
        slot = self.slot_of.get(identity)
        if slot is None or self.data_for is None:
            self._send(identity, envelope.pack("data_refused", why="only a host that joined may ask for its data"))
            return ["lobby: refused a data request from a socket that holds no slot"]
        try:
            fields, frames = self.data_for(slot)
        except DataRefused as exc:
            self._send(identity, envelope.pack("data_refused", why=f"{slot}: {exc}"))
            return [f"lobby: refused {slot} its data: {exc}"]
        self._send(identity, envelope.pack("data_shard", **fields), *frames)
        return [f"{slot} got its clients' data from the lobby ({sum(len(f) for f in frames) / 2**20:.1f} MiB)"]

    def _send(self, identity: bytes, message: bytes, *frames: bytes) -> None:
        try:
            self.sock.send_multipart([identity, message, *frames], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # it left before the answer: its slot is not taken back (it may still come)

    def refusals(self) -> list[dict]:
        return self.zap.refusals()

    def close(self) -> None:
        if getattr(self, "sock", None) is not None:
            self.sock.close(linger=0)
        self.zap.close()


# ---- Ray ---------------------------------------------------------------------------------------
def ray_hosts(placement: Placement, names: list[str], connect: str, keys: list[curve.HostKey],
              threads: int) -> tuple[bool, list[RayHost]]:
    """Start one `python -m emulator host` per name as a Ray task with the placement's resources;
    and whether Ray was started here (then the run shuts it down at its end)."""
    try:
        import ray  # noqa: PLC0415
    except ImportError:
        raise PlacementError("--launcher ray: Ray is not installed (pip install -e '.[ray]')") from None
    started = not ray.is_initialized()
    if started:
        address = placement.ray_address or os.environ.get("RAY_ADDRESS")
        here = {"_node_ip_address": ray_node_address(placement)} if ray_head(placement) is not None else {}
        ray.init(address=address, include_dashboard=False, log_to_driver=True, logging_level="warning", **here)
    task = ray.remote(num_cpus=placement.cpus_per_host, num_gpus=placement.gpus_per_host, max_retries=0)(run_host_command)
    data_root = os.environ.get("EMULATOR_DATA")
    return started, [RayHost(name, task.remote(connect, key.as_dict(), threads, data_root, name))
                     for name, key in zip(names, keys)]


def ray_node_address(placement: Placement) -> str:
    """This machine's address as the Ray cluster sees it: the one it reaches the cluster's head
    from. Ray itself guesses by routing towards a public address, which fails on a machine with no
    route out (a private cluster network, a network namespace) and then falls back to the host
    name's address, where no Ray node runs: the driver would wait for ever."""
    head = ray_head(placement)
    if head is not None:
        return local_address_towards(head)
    import ray  # noqa: PLC0415

    return ray.util.get_node_ip_address()


def ray_head(placement: Placement) -> str | None:
    """The host of the Ray cluster the run joins (--ray-address, else $RAY_ADDRESS); None where Ray
    finds or starts its own (no address, `auto`, `local`)."""
    address = placement.ray_address or os.environ.get("RAY_ADDRESS")
    return urlsplit(f"//{address}").hostname if address and address not in ("auto", "local") else None


def local_address_towards(host: str) -> str:
    """The local IP address that packets to HOST leave from (a UDP socket's connect sends nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
        except OSError as exc:
            raise PlacementError(f"--ray-address {host}: no route to the Ray head from here ({exc})") from None
        return s.getsockname()[0]


def run_host_command(connect: str, key: dict, threads: int, data_root: str | None, slot: str = "") -> int:
    """In a Ray worker: the same host entry point a user runs by hand, as a child process (a host
    that crashes must not take the worker with it). Its key travels as the task's argument and is
    written to a file only its user can read."""
    fd, path = tempfile.mkstemp(prefix="flemu-host-", suffix=".key")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(key, f)
        cmd = [sys.executable, "-m", "emulator", "host", "--connect", connect, "--key", path, "--threads", str(threads),
               *(["--slot", slot] if slot else [])]
        env = {**os.environ, **({"EMULATOR_DATA": data_root} if data_root and "EMULATOR_DATA" not in os.environ else {})}
        return subprocess.call(cmd, env=env)
    finally:
        os.unlink(path)


def _peer_address(frame: zmq.Frame) -> str | None:
    """The IP address a TCP peer connected from (ZeroMQ's Peer-Address), None where the transport has none."""
    try:
        return frame.get("Peer-Address") or None
    except (zmq.ZMQError, AttributeError):
        return None


# ---- data for hosts that have none ------------------------------------------------------------
class DataRefused(ValueError):
    """A host's data cannot be served; the message says why and what to do."""


def _raw(array: Any) -> bytes:
    return np.ascontiguousarray(array.numpy() if hasattr(array, "numpy") else array).tobytes()


def data_shard(train: Any, test: Any, train_rows: np.ndarray, test_rows: np.ndarray,
               limit_bytes: int) -> tuple[dict[str, Any], list[bytes]]:
    """What a host without the data set gets from the lobby: every label of the loaded data set
    (it rebuilds the partition from them and checks the world's fingerprint) and the samples of
    the rows its clients hold, train and test; DataRefused past limit_bytes."""
    row_bytes = train.x[:1].numel() * train.x.element_size()
    size = (len(train_rows) + len(test_rows)) * row_bytes + 8 * (len(train.y) + len(test.y))
    if size > limit_bytes:
        raise DataRefused(f"its clients hold {size / 2**20:.1f} MiB of data, over the lobby's limit of "
                          f"{limit_bytes / 2**20:.0f} MiB (run --serve-data-mb): give the host the data set "
                          "(--data-root) or raise the limit")
    users = train.users is not None
    fields = {"classes": int(train.classes), "dtype": str(train.x.dtype).removeprefix("torch."),
              "train_shape": list(train.x.shape), "test_shape": list(test.x.shape), "users": users}
    frames = [_raw(train.y.to(torch.int64)), _raw(test.y.to(torch.int64)),
              _raw(train_rows.astype(np.int64)), _raw(train.x[train_rows]),
              _raw(test_rows.astype(np.int64)), _raw(test.x[test_rows])]
    if users:
        frames += [_raw(train.users.astype(np.int64)), _raw(test.users.astype(np.int64))]
    return fields, frames

