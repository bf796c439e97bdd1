"""`python -m emulator host --connect tcp://ADDR:PORT --key FILE`: join a run as one of its client
hosts from this machine (by hand, or from a Slurm, Kubernetes or Ray job).

The host asks the conductor's lobby for a slot, gets the resolved scenario, rebuilds the world
from it with this machine's data root, checks the world's fingerprint against the run's, and then
runs its share of the clients against the network's TCP socket, as a forked host would."""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import zmq
from zmq.utils.monitor import recv_monitor_message

from node import logs
from protocol import curve, envelope

EXIT_REFUSED = 2  # the run would not have this host (key, slots, a different world)


class JoinError(RuntimeError):
    """Why this host could not join; the message says what to do."""


def ask_to_join(connect: str, key: curve.HostKey, timeout_s: float, slot: str = "") -> dict:
    """The lobby's welcome, or JoinError: refused key, no free slot, nobody answering."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        key.connect(sock)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                          | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sock.connect(connect)
        sock.send(envelope.pack("join", host=socket.gethostname(), pid=os.getpid(), slot=slot))
        deadline = time.monotonic() + timeout_s
        connected = False
        while time.monotonic() < deadline:
            if monitor.poll(0):
                event = recv_monitor_message(monitor)["event"]
                if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    raise JoinError(f"{connect} refused this host's key (CURVE authentication): "
                                    "use a host key file made with the run's conductor.key")
                if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                    raise JoinError(f"{connect} does not speak CURVE with this key (is it a run's --listen address?)")
                connected = connected or event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if sock.poll(100):
                env = envelope.unpack(sock.recv())
                if env["op"] == "join_refused":
                    raise JoinError(f"{connect} refused this host: {env['why']}")
                if env["op"] == "welcome":
                    return env
        raise JoinError(f"no run answered at {connect} within {timeout_s:.0f} s"
                        + (" (connected, but no slot was given)" if connected else " (nothing listening, or the "
                           "run public key in the key file is not this run's)"))
    finally:
        ctx.destroy(linger=0)


def network_endpoint(connect: str, port: int) -> str:
    return f"tcp://{urlsplit(connect).netloc.rsplit(':', 1)[0]}:{port}"


def run_host(connect: str, key_path: Path, data_root: str | None, threads: int | None, timeout_s: float,
             slot: str = "") -> int:
    """Join and run; the process's exit code."""
    from node.processes import host_main  # noqa: PLC0415  (torch: only once the key file is good)
    from node.runtime import Runtime  # noqa: PLC0415
    from .placement import world_fingerprint  # noqa: PLC0415
    from .scenario import Scenario, ScenarioError  # noqa: PLC0415
    from .topology import topology_of  # noqa: PLC0415
    from .world import build_world, usable_cores  # noqa: PLC0415

    try:
        key = curve.read_host_key(key_path)
        welcome = ask_to_join(connect, key, timeout_s, slot)
    except (curve.KeyFileError, JoinError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    peer, index = welcome["peer"], welcome["index"]
    logs.configure(peer)
    endpoint = network_endpoint(connect, welcome["network_port"])
    print(f"[{peer}] joined the run at {connect}; building the world", file=sys.stderr, flush=True)
    resolved = welcome["scenario"]
    root = data_root or os.environ.get("EMULATOR_DATA")
    if root:  # the data root is this machine's own: the conductor's path means nothing here
        resolved = {**resolved, "task": {**resolved["task"], "data_root": root}}
    try:
        sc = Scenario.model_validate(resolved)
        world = build_world(sc)
        mine = world_fingerprint(world)
        if mine != welcome["fingerprint"]:
            raise ScenarioError(f"{peer} built a different world from the run's scenario (fingerprint {mine}, the run's "
                                f"{welcome['fingerprint']}): its data differ; point --data-root at the same data set")
    except Exception as exc:  # the run must hear why, not wait for a host that never says hello
        why = str(exc) if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"
        print(f"[{peer}] error: {why}", file=sys.stderr)
        Runtime.tell_fatal(peer, endpoint, why, secure=key.connect)
        return EXIT_REFUSED
    topo = topology_of(sc.topology, world)
    profiles = [c.profile for c in world.clients if c.host == index]
    host_main(peer, endpoint, profiles, world.task, topo.host_config(), threads or usable_cores(), None, None, index,
              secure=key.connect, silence_s=float(welcome["silence_s"]))
    return 0
