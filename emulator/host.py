"""`python -m emulator host --connect tcp://ADDR:PORT --key FILE`: join a run as one of its client
hosts from this machine (by hand, or from a Slurm, Kubernetes or Ray job).

The host asks the conductor's lobby for a slot, gets the resolved scenario, rebuilds the world
from it with this machine's data root (or, where the data set is not on this machine, with the
rows its clients hold, which the lobby sends), checks the world's fingerprint against the run's,
and then runs its share of the clients against the network's TCP socket, as a forked host would."""
from __future__ import annotations

import copy
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from node import logs
from protocol import curve, envelope

EXIT_REFUSED = 2  # the run would not have this host (key, slots, a different world)


class JoinError(RuntimeError):
    """Why this host could not join; the message says what to do."""


class LobbyLink:
    """This host's socket to the conductor's lobby: it joins, and (a host without the data set)
    asks for its clients' data on the same socket, which holds its slot."""

    def __init__(self, connect: str, key: curve.HostKey):
        self.connect = connect
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        key.connect(self.sock)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                                    | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.sock.connect(connect)
        self.connected = False

    def close(self) -> None:
        self.ctx.destroy(linger=0)

    def join(self, timeout_s: float, slot: str = "") -> dict:
        """The lobby's welcome (its `restore`: the checkpoint parts of a resumed run, as bytes), or
        JoinError: refused key, no free slot, nobody answering."""
        self.sock.send(envelope.pack("join", host=socket.gethostname(), pid=os.getpid(), slot=slot))
        env, frames = self._answer(timeout_s, ("welcome", "join_refused"))
        if env["op"] == "join_refused":
            raise JoinError(f"{self.connect} refused this host: {env['why']}")
        files = sum(len(f["names"]) for f in env["files"])
        if len(frames) != env["restore"] + files:
            raise JoinError(f"{self.connect} announced {env['restore']} checkpoint parts and {files} files and sent "
                            f"{len(frames)} frames")
        return {**env, "restore": frames[:env["restore"]], "file_frames": frames[env["restore"]:]}

    def data(self, timeout_s: float) -> tuple[dict, list[bytes]]:
        """This slot's clients' data from the lobby (emulator/placement.py's data_shard), or JoinError."""
        self.sock.send(envelope.pack("data"))
        env, frames = self._answer(timeout_s, ("data_shard", "data_refused"), joined=True)
        if env["op"] == "data_refused":
            raise JoinError(f"{self.connect} would not send this host its data: {env['why']}")
        return env, frames

    def _answer(self, timeout_s: float, ops: tuple[str, ...], joined: bool = False) -> tuple[dict, list[bytes]]:
        """The lobby's answer among `ops`; once joined, the lobby going away (the run ended) is JoinError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.monitor.poll(0):
                event = recv_monitor_message(self.monitor)["event"]
                if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    raise JoinError(f"{self.connect} refused this host's key (CURVE authentication): "
                                    "use a host key file made with the run's conductor.key")
                if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                    raise JoinError(f"{self.connect} does not speak CURVE with this key (is it a run's --listen address?)")
                if event == zmq.EVENT_DISCONNECTED and joined:
                    raise JoinError(f"{self.connect} went away before it answered (the run ended)")
                self.connected = self.connected or event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if self.sock.poll(100):
                frames = self.sock.recv_multipart()
                try:
                    env = envelope.unpack(frames[0])
                except envelope.ProtocolError as exc:
                    raise JoinError(f"{self.connect} answered with a message this host cannot read ({exc})") from None
                if env["op"] in ops:
                    return env, frames[1:]
        raise JoinError(f"no run answered at {self.connect} within {timeout_s:.0f} s"
                        + (" (connected, but no answer came)" if self.connected else " (nothing listening, or the "
                           "run public key in the key file is not this run's)"))


def shard_datasets(fields: dict, frames: list[bytes]) -> tuple[Any, Any]:
    """The loaded data set as the lobby sent it: every label, and the samples of the rows this
    host's clients hold (the other rows zero: no client here reads them)."""
    import torch  # noqa: PLC0415  (torch: only once the key file is good)
    from node.data import Dataset  # noqa: PLC0415

    dtype = np.dtype(fields["dtype"])
    users = [np.frombuffer(f, np.int64).copy() for f in frames[6:8]] if fields["users"] else [None, None]
    parts = []
    for k, shape in enumerate((fields["train_shape"], fields["test_shape"])):
        y, rows, x = frames[k], np.frombuffer(frames[2 + 2 * k], np.int64), frames[3 + 2 * k]
        samples = np.zeros(shape, dtype)
        samples[rows] = np.frombuffer(x, dtype).reshape(len(rows), *shape[1:])
        parts.append(Dataset(torch.from_numpy(samples), torch.from_numpy(np.frombuffer(y, np.int64).copy()),
                             int(fields["classes"]), users[k]))
    return parts[0], parts[1]


def network_endpoint(connect: str, port: int) -> str:
    return f"tcp://{urlsplit(connect).netloc.rsplit(':', 1)[0]}:{port}"


def run_host(connect: str, key_path: Path, data_root: str | None, threads: int | None, timeout_s: float,
             slot: str = "", data: str = "auto") -> int:
    """Join and run; the process's exit code. data: where the clients' samples come from: `local`
    (this machine's data root), `lobby` (the conductor sends the rows this host's clients hold),
    `auto` (local where the data set is found there, else the lobby)."""
    from node.processes import host_main  # noqa: PLC0415  (torch: only once the key file is good)
    from node.runtime import Runtime  # noqa: PLC0415
    from .scenario import ScenarioError  # noqa: PLC0415
    from .topology import topology_of  # noqa: PLC0415
    from .world import usable_cores  # noqa: PLC0415

    try:
        key = curve.read_host_key(key_path)
        link = LobbyLink(connect, key)
    except curve.KeyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        welcome = link.join(timeout_s, slot)
        peer = welcome["peer"]
        logs.configure(peer)
        endpoint = network_endpoint(connect, welcome["network_port"])
        print(f"[{peer}] joined the run at {connect}; building the world", file=sys.stderr, flush=True)
        try:
            sc, world = host_world(welcome, link, data_root, data, timeout_s)
        except Exception as exc:  # the run must hear why, not wait for a host that never says hello
            why = str(exc) if isinstance(exc, (ScenarioError, JoinError)) else f"{type(exc).__name__}: {exc}"
            print(f"[{peer}] error: {why}", file=sys.stderr)
            Runtime.tell_fatal(peer, endpoint, why, secure=key.connect)
            return EXIT_REFUSED
    except JoinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        link.close()
    index = welcome["index"]
    topo = topology_of(sc.topology, world)
    profiles = [c.profile for c in world.clients if c.host == index]
    with tempfile.TemporaryDirectory(prefix="flemu-restore-") as folder:  # 0700: the parts are the run's state
        restore = saved_parts(Path(folder), welcome["restore"])
        host_main(peer, endpoint, profiles, world.task, topo.host_config(), threads or usable_cores(), None, restore,
                  index, secure=key.connect, silence_s=float(welcome["silence_s"]))
    return 0


def host_world(welcome: dict, link: LobbyLink, data_root: str | None, data: str, timeout_s: float):
    """The run's scenario and the world built from it here, with the files the scenario names as
    the lobby sent them and this machine's data or the lobby's; ScenarioError where its
    fingerprint is not the run's."""
    from .placement import world_fingerprint  # noqa: PLC0415
    from .scenario import Scenario, ScenarioError  # noqa: PLC0415
    from .world import build_world  # noqa: PLC0415

    peer, resolved = welcome["peer"], welcome["scenario"]
    root = data_root or os.environ.get("EMULATOR_DATA")
    if root:  # the data root is this machine's own: the conductor's path means nothing here
        resolved = {**resolved, "task": {**resolved["task"], "data_root": root}}
    with tempfile.TemporaryDirectory(prefix="flemu-files-") as folder:  # read while the world is built
        resolved = with_files(resolved, welcome["files"], welcome["file_frames"], Path(folder))
        sc = Scenario.model_validate(resolved)
        world = build_world(sc, host_task(sc, link, data, timeout_s, peer))
    mine = world_fingerprint(world)
    if mine != welcome["fingerprint"]:
        raise ScenarioError(f"{peer} built a different world from the run's scenario (fingerprint {mine}, the run's "
                            f"{welcome['fingerprint']}): its data differ; point --data-root at the same data set")
    return sc, world


def host_task(sc, link: LobbyLink, data: str, timeout_s: float, peer: str):
    """The data set and model: this machine's (None: build_world loads them) or the lobby's rows."""
    from node.client import TaskSpec  # noqa: PLC0415
    from .scenario import ScenarioError  # noqa: PLC0415
    from .world import load_task  # noqa: PLC0415

    if data == "local":
        return None
    if data == "auto":
        try:
            return load_task(sc, fetch=False)
        except ScenarioError:
            pass  # not on this machine: the lobby sends it
    fields, frames = link.data(timeout_s)
    train, test = shard_datasets(fields, frames)
    print(f"[{peer}] got its clients' data from the lobby ({sum(len(f) for f in frames) / 2**20:.1f} MiB)",
          file=sys.stderr, flush=True)
    return TaskSpec(sc.task.model, train, test, sc.seed, model_options=dict(sc.task.model_options))


def with_files(resolved: dict, listed: list[dict], frames: list[bytes], folder: Path) -> dict:
    """The resolved scenario naming the files the lobby sent (written to folder) where it named the
    conductor's. A file's name here is the lobby's without any directory or glob character."""
    resolved = copy.deepcopy(resolved)
    data = iter(frames)
    for k, entry in enumerate(listed):
        paths = []
        for j, name in enumerate(entry["names"]):
            safe = "".join("_" if ch in "*?[]" else ch for ch in Path(str(name)).name)
            paths.append(str(folder / f"{k}-{j}-{safe}"))
            Path(paths[-1]).write_bytes(next(data))
        *parents, last = entry["at"]
        holder = resolved
        for key in parents:
            holder = holder[key]
        holder[last] = paths if last == "files" else paths[0]
    return resolved


def saved_parts(folder: Path, parts: list[bytes]) -> list[str] | None:
    """A resumed run's checkpoint parts for this host, as the files a host restores from (None: a
    fresh run). They come from the conductor, which this host trusts already: it runs the
    scenario the conductor sends."""
    if not parts:
        return None
    paths = []
    for i, part in enumerate(parts):
        paths.append(str(folder / f"part-{i}.pkl"))
        Path(paths[-1]).write_bytes(part)
    return paths
