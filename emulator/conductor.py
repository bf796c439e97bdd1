"""The conductor: validate, build the world, fork the network, server and host processes,
supervise them, write the run directory as results arrive, and always clean up."""
from __future__ import annotations

import errno

import gc
import json
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import zmq

from node.device import EXIT_DEVICE
from node.lifecycle import building
from node.processes import host_main
from protocol import envelope
from protocol.reportparts import ReportJoiner
from .netconfig import CONDUCTOR, SERVER, NetworkConfig
from .network import network_main
from .placement import Child, Lobby, Placement, PlacementError, network_listen, ray_node_address, slot_keys
from .topology import TOPOLOGIES, topology_of
from .tracefile import write_trace
from .progress import View
from .remote_hosts import RemoteHosts
from .reports import Reports
from .results import RingRounds, RunWriter
from .scenario import Scenario
from .world import World, build_world, usable_cores

log = logging.getLogger(__name__)
POLL_MS = 100
RSS_EVERY_S = 0.5
STOP_GRACE_S = 3.0


class FreshProcess:
    """A child started as a new interpreter rather than forked, with multiprocessing.Process's
    interface. The network process needs neither torch nor the data; forked, it would carry
    (and count in its RSS) about 0.5 GB of both. Its arguments travel as a pickle on stdin,
    between two processes of one run, never over the network. They are unpickled with the cyclic
    collector off (a population's devices: 0.3 s instead of 1.8 s); the child turns it back on."""

    def __init__(self, module: str, function: str, args: tuple):
        code = f"import gc; gc.disable(); import pickle, sys; from {module} import {function}; {function}(*pickle.load(sys.stdin.buffer))"
        # Its own session: the terminal's Ctrl-C reaches only the conductor, which stops everyone.
        self._popen = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, start_new_session=True)
        self._popen.stdin.write(pickle.dumps(args))
        self._popen.stdin.close()
        self.pid = self._popen.pid

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what timeout, Slurm, Kubernetes and systemd send): stop as on Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def raise_stop_signal(signum: int, _frame: Any) -> None:
    raise StopSignal(signum)


EXIT_CODES = {"completed": 0, "interrupted": 130, "no_clients": 3}
# what a full or failing disk raises: the run stops and keeps what it wrote whole, never a traceback
STORAGE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})


def exit_code(summary: dict) -> int:
    """0 completed, 3 no client ever took part, 128 + the signal when stopped by one, 1 failed."""
    if summary["status"] == "terminated":
        return 128 + int(summary.get("signal", signal.SIGTERM))
    return EXIT_CODES.get(summary["status"], 1)


def population_rows(world: World) -> list[dict]:
    return [{
        "client": c.profile.name, "host": c.host, "device": c.device, "ms_per_sample": c.profile.ms_per_sample,
        "link": c.link_name, "up_mbps": c.link.up_bps / 1e6, "down_mbps": c.link.down_bps / 1e6,
        "latency_ms": c.link.latency_s * 1000, "samples": int(c.profile.indices.size),
        **({"aggregator": c.profile.aggregator} if world.edges else {}),
    } for c in world.clients]


def max_message_bytes(world: World) -> int:
    """The largest frame a peer of this run can have a reason to send: a model as fp32 with room for
    sparse indices, plus the envelope. ZeroMQ disconnects a peer that sends more."""
    model = world.task.build()
    fp32 = 4 * sum(int(v.numel()) for v in model.state_dict().values())
    return 4 * fp32 + envelope.MAX_ENVELOPE_BYTES + 16 * 2**20


def new_run_dir(base: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        candidate = base / (f"{name}-{stamp}" + (f"-{i}" if i else ""))
        if not candidate.exists():
            return candidate
    raise RuntimeError(f"cannot find a free run directory under {base}")


class Conductor(RemoteHosts):
    def __init__(self, sc: Scenario, resolved: dict, run_dir: Path, view: View | None = None,
                 placement: Placement | None = None):
        self.sc = sc
        self.placement = placement or Placement()
        self.lobby: Lobby | None = None
        self.ray_started = False  # the ray launcher started Ray (and shuts it down at the end)
        self.resolved = resolved
        self.run_dir = run_dir
        self.view = view or View(sc.rounds, TOPOLOGIES[sc.topology].peer_traffic)
        self.children: list[Child] = []
        self.t0 = time.monotonic()
        self.peak_rss = 0
        self.peak_pss = 0
        self.startup_s: float | None = None
        self.host_clients: dict[str, list[str]] = {}
        self.ring: RingRounds | None = None  # round rows assembled from the clients' reports (serverless topologies)
        self.saved_ring: RingRounds | None = None
        self.reports = Reports(self)  # what each report from the processes does to the results
        self.report_parts = ReportJoiner()  # reports over one envelope come in parts
        self.storage_failed: str | None = None  # why a write of the results failed (a full disk): the run stopped

    # ---- processes -----------------------------------------------------------------------------
    def _spawn(self, world: World, endpoint: str, restore: Path | None = None, listen: str | None = None,
               run_keys=None) -> None:
        ctx = mp.get_context("fork")  # node processes inherit the imported modules and the loaded data
        # Keep the inherited objects out of the children's garbage collections: a collection touches
        # every tracked object and so copies the page it sits on into each child (copy-on-write).
        gc.collect()
        gc.freeze()
        me = os.getpid()
        topo = self.topology = topology_of(self.sc.topology, world)
        hosts = [f"host{h}" for h in range(world.hosts)]
        clock = self.sc.clock
        peers = {CONDUCTOR: [], **({SERVER: topo.server_actors()} if topo.server_actors() else {}),
                 **{name: [c.profile.name for c in world.clients if c.host == h] for h, name in enumerate(hosts)}}
        net_cfg = NetworkConfig(endpoint, peers, topo.links(), world.framing, me,
                                world.faults, clock.speedup if clock.mode == "realtime" else None,
                                devices={c.profile.name: c.spec for c in world.clients if c.spec is not None},
                                seed=self.sc.seed, rto_s=world.rto_s, groups=world.groups, group_of=world.group_of,
                                tcp=world.tcp, group_queue_s=world.group_queue_s, flow_solver=world.flow_solver,
                                starters=topo.starters(), watchers=topo.watchers(), barrier_group=tuple(topo.barrier_group()),
                                peer_timeout_s=self.sc.run.peer_timeout_s, max_message_bytes=max_message_bytes(world),
                                checkpoint_dir=str(self.run_dir / "checkpoint") if self.sc.run.checkpoint_every else None,
                                restore=str(restore / "network.pkl") if restore else None,
                                listen=network_listen(listen) if listen else None, run_keys=run_keys,
                                slot_keys=slot_keys(run_keys, hosts) if run_keys is not None else {},
                                traces=world.traces, remote_peers=frozenset(hosts if self.placement.remote else ()))
        holders = json.loads((restore / "meta.json").read_text())["actors"] if restore else {}

        def saved(actors: list[str]) -> list[str] | None:
            """The checkpoint files that hold these actors' state."""
            if not restore:
                return None
            return [str(restore / f"{peer}.pkl") for peer, held in sorted(holders.items()) if set(held) & set(actors)]
        self.saved_parts, self.resuming = saved, restore is not None
        specs = [("network", "network", network_main, (net_cfg,))]
        server = topo.server_process(endpoint, me, saved)
        if server is not None:
            specs.append(server)
        client_cfg = topo.host_config()
        self.ring = topo.client_rounds() if self.saved_ring is None else self.saved_ring
        for h, name in enumerate(hosts):
            profiles = [c.profile for c in world.clients if c.host == h]
            self.host_clients[name] = [p.name for p in profiles]
            if self.placement.remote:  # they join over TCP (see run)
                continue
            specs.append((name, "host", host_main,
                          (name, endpoint, profiles, world.task, client_cfg, world.threads_per_host, me,
                           saved([p.name for p in profiles]), h)))
        for name, role, target, args in specs:
            if role == "network":
                proc = FreshProcess("emulator.network", "network_main", args)
            else:
                proc = ctx.Process(target=target, args=args, name=f"flemu-{name}", daemon=False)
                proc.start()
            self.children.append(Child(name, role, proc))
            log.info("[conductor] started %s (pid %s)", name, proc.pid)

    def _stop_children(self) -> None:
        alive = [c.proc for c in self.children if c.proc.is_alive()]
        deadline = time.monotonic() + STOP_GRACE_S
        for p in alive:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in alive:
            if p.is_alive():
                p.terminate()
        for p in alive:
            p.join(timeout=1.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=1.0)

    def _sample_memory(self) -> None:
        rss = pss = 0
        for pid in [os.getpid()] + [c.proc.pid for c in self.children if c.proc.pid is not None and c.proc.is_alive()]:
            try:
                info = psutil.Process(pid).memory_full_info()
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            except (psutil.Error, OSError):
                pass
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)

    # ---- the run -------------------------------------------------------------------------------
    def _open_writer(self, world: World, resume: Path | None) -> RunWriter:
        """The run writer, with what the summary says of the run before it starts (or as it was
        at the checkpoint it resumes from)."""
        saved = None
        if resume is not None:
            with open(resume / "conductor.pkl", "rb") as f:
                saved = pickle.load(f)
            self.reports.last_shortfall = saved["last_shortfall"]
            self.saved_ring = saved.get("ring")  # a ring's round rows in the making (RingRounds)
            self.view.done = len(saved["writer"]["rows"])
        topo = topology_of(self.sc.topology, world)
        writer = RunWriter(self.run_dir, self.resolved, population_rows(world), saved["writer"] if saved else None,
                           **topo.writer_options())
        if saved:
            writer.summary.resumed_from(len(writer.rows))
        codec_time = world.client.codec_time.as_dict() if world.client.codec_time is not None else None
        writer.summary.describe_run(self.sc, world.client.privacy, codec_time, topo.summary())
        return writer

    def run(self, world: World, resume: Path | None = None) -> dict:
        """resume: a checkpoint directory of this run to continue from."""
        writer = self._open_writer(world, resume)
        ipc_dir = tempfile.mkdtemp(prefix="flemu-")
        os.chmod(ipc_dir, 0o700)
        endpoint = f"ipc://{ipc_dir}/network"
        status, reason = "failed", None
        interrupted = False
        ctx = sock = None
        try:
            listen = run_keys = None
            key_files: list[Path] = []
            if self.placement.remote:
                run_keys, key_files = self.placement.run_keys(self.run_dir, world.hosts)
                listen = self.placement.listen or f"tcp://{ray_node_address(self.placement)}:0"
            self._spawn(world, endpoint, resume, listen, run_keys)
            ctx = zmq.Context()
            if self.placement.remote:
                self._open_lobby(ctx, world, listen, run_keys, key_files, writer)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, CONDUCTOR.encode())
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            sock.send(envelope.pack("hello", peer=CONDUCTOR, actors=[]))
            status, reason = self._supervise(sock, writer)
        except PlacementError as exc:
            status, reason = "failed", str(exc)
            self.view.note(f"error: {exc}")
        except OSError as exc:
            if exc.errno not in STORAGE_ERRORS:
                raise
            self.storage_failed = exc.strerror or str(exc)
            status = "failed"
        except KeyboardInterrupt as exc:
            # a second signal must not cut the cleanup short: children and the summary come first
            for signum in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            interrupted = True
            if isinstance(exc, StopSignal):
                name = signal.Signals(exc.signum).name
                status, reason = "terminated", f"stopped by {name}"
                writer.summary.stopped_by(exc.signum)
            else:
                status, reason = "interrupted", "stopped by the user (SIGINT)"
        finally:
            self._wind_down(writer, sock, ctx, ipc_dir, interrupted)
            summary = self._final_summary(world, writer, status, reason)
        return summary

    def _wind_down(self, writer: RunWriter, sock, ctx, ipc_dir: str, interrupted: bool) -> None:
        """Stop the network (and take what it still had to say), then every process of the run."""
        if sock is not None and not interrupted:
            try:
                sock.send(envelope.pack("stop"), zmq.NOBLOCK)
                self._drain_after_stop(sock, writer)
            except zmq.ZMQError:
                pass
        if interrupted:
            for c in self.children:
                if c.proc.is_alive():
                    c.proc.terminate()
        self._stop_children()
        if self.lobby is not None:
            self._note_refusals(self.lobby.refusals(), "conductor", writer)
            self.lobby.close()
        self._release_launcher()
        self.view.close()
        if ctx is not None:
            ctx.destroy(linger=0)
        shutil.rmtree(ipc_dir, ignore_errors=True)

    def _final_summary(self, world: World, writer: RunWriter, status: str, reason: str | None) -> dict:
        if status == "completed":  # nothing left to resume: the checkpoint's pickles would only take space
            shutil.rmtree(self.run_dir / "checkpoint", ignore_errors=True)
            writer.summary.checkpoint_removed()
        if self.storage_failed:
            writer.salvage()
            reason = (f"cannot write the results in {self.run_dir} ({self.storage_failed}): the run stopped after "
                      f"{len(writer.rows)} rounds; its files hold those rounds whole")
        try:
            summary = writer.write_summary(
                status, reason=reason, wall_time_s=time.monotonic() - self.t0, startup_s=self.startup_s,
                peak_rss_mib=self.peak_rss / 2**20, peak_pss_mib=self.peak_pss / 2**20,
                processes={"hosts": world.hosts, "threads_per_host": world.threads_per_host},
                run_dir=str(self.run_dir),
            )
            writer.close()
        except OSError as exc:
            if exc.errno not in STORAGE_ERRORS:
                raise
            writer.salvage()  # summary.json stays as it was after the last round it could be written
            reason = (reason or f"cannot write the results in {self.run_dir} ({exc.strerror})") + \
                "; summary.json could not be written either and is as it was after an earlier round"
            return dict(writer.summary, status="failed", reason=reason, run_dir=str(self.run_dir), storage_failed=True)
        if self.storage_failed:
            return {**summary, "storage_failed": True}
        if self.sc.run.trace:
            write_trace(self.run_dir)  # from the records just closed
        return summary

    def _supervise(self, sock: zmq.Socket, writer: RunWriter) -> tuple[str, str | None]:
        last_rss = 0.0
        rss_every = RSS_EVERY_S
        last_progress = time.monotonic()
        stall = self.sc.run.stall_timeout_s
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if self.lobby is not None:
            poller.register(self.lobby.sock, zmq.POLLIN)
        while True:
            events = dict(poller.poll(POLL_MS))
            if self.lobby is not None and self.lobby.sock in events:
                self._serve_lobby(writer)
            if sock in events:
                last_progress = time.monotonic()
                while sock.poll(0):
                    outcome = self._receive(sock, writer)
                    if outcome is not None:
                        return outcome
            now = time.monotonic()
            if now - last_rss >= rss_every:
                self._sample_memory()
                last_rss = time.monotonic()
                # reading smaps costs time in the size of the processes: at most 2 % of a core
                rss_every = max(RSS_EVERY_S, 50.0 * (last_rss - now))
            for child in self.children:
                code = child.proc.exitcode
                if code is None or child.lost:
                    continue
                how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
                outcome = self._lose(child, how, sock, writer)
                if outcome is not None:
                    return outcome
            if now - last_progress > stall:
                if self.lobby is not None and self.startup_s is None:
                    missing = [c.name for c in self.children if c.role == "host" and c.name not in self.lobby.joined]
                    return "failed", (f"{len(missing)} of {len(self.host_clients)} remote hosts did not join within "
                                      f"{stall:.0f} s (run.stall_timeout_s): {', '.join(missing[:8])}")
                writer.incident(f"no progress for {stall:.0f} s of wall time")
                return "failed", f"stalled: no message for {stall:.0f} s"

    def _drain_after_stop(self, sock: zmq.Socket, writer: RunWriter) -> None:
        """What the network still sends as it stops (its last records and counts), until it exits."""
        network = next((c.proc for c in self.children if c.role == "network"), None)
        deadline = time.monotonic() + STOP_GRACE_S
        while network is not None and network.is_alive() and time.monotonic() < deadline:
            if sock.poll(50):
                while sock.poll(0):
                    self._receive(sock, writer)

    def _receive(self, sock: zmq.Socket, writer: RunWriter) -> tuple[str, str | None] | None:
        """One message from the network process; (status, reason) when the run is over."""
        frames = sock.recv_multipart()
        try:
            env = envelope.unpack(frames[0])
        except envelope.ProtocolError as exc:  # only the network speaks to us; count it, never die of it
            writer.incident("the conductor refused a message from the network process", error=str(exc))
            return None
        body = env.get("body", {})
        if env["op"] == "record":
            for rec in body.get("transfers", []):
                writer.transfer(rec)
                self.view.transfer(rec)
            for rec in body.get("devices", []):
                writer.device(rec)
        elif env["op"] == "report":
            if body.get("type") == "part":
                body = self._joined(body, writer)
                if body is None:
                    return None
            if body.get("type") == "peer_silent":
                return self._declare_lost(body, sock, writer)
            if body.get("type") == "fatal":  # a process that cannot start (its training device): nothing can run
                writer.incident(f"{body.get('peer')} could not start: {body.get('error')}", peer=body.get("peer"))
                return "failed", str(body.get("error"))
            if body.get("type") == "error" and body.get("actor") in self.topology.server_actors():
                # the server's state is no longer to be trusted, and a round may never end: stop now
                self.reports.handle(body, writer)
                first = str(body.get("error", "")).strip().splitlines()[-1:] or ["?"]
                return "failed", f"the {body['actor']} actor raised an exception: {first[0]} (traceback in summary.json incidents)"
            if self.reports.handle(body, writer):
                return self.reports.final_status(body)
        return None

    def _joined(self, part: dict[str, Any], writer: RunWriter) -> dict[str, Any] | None:
        try:
            return self.report_parts.add(part)
        except ValueError as exc:
            writer.incident("the conductor refused a report part", peer=part.get("peer"), error=str(exc))
            return None

    def _declare_lost(self, body: dict[str, Any], sock: zmq.Socket, writer: RunWriter) -> tuple[str, str | None] | None:
        """A peer stopped answering (stopped, deadlocked, swapping): kill it and carry on as if it
        had died."""
        child = next((c for c in self.children if c.name == body.get("peer")), None)
        if child is None or child.lost:
            return None
        wall = time.monotonic() - self.t0
        how = (f"silent for {body['silent_s']:.1f} s (no heartbeat), declared lost at wall {wall:.1f} s, "
               f"emulated {body['t_net']:.3f} s, and killed")
        if child.proc.is_alive():
            child.proc.kill()
            child.proc.join(timeout=2.0)
        return self._lose(child, how, sock, writer, declared_at_emulated_s=body["t_net"])

    def _lose(self, child: Child, how: str, sock: zmq.Socket, writer: RunWriter, **extra: Any) -> tuple[str, str | None] | None:
        """A child process is gone. A host's clients fail from now on; without the network or the
        server the run cannot go on."""
        child.lost = True
        if child.proc.exitcode == EXIT_DEVICE:  # it told the run why; give that message the time to arrive
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if sock.poll(50):
                    while sock.poll(0):
                        outcome = self._receive(sock, writer)
                        if outcome is not None:
                            return outcome
            return "failed", f"{child.name} could not open its training device (exit code {EXIT_DEVICE}; see its stderr)"
        now = time.monotonic()
        emulated = writer.rows[-1]["t_end"] if writer.rows else 0.0
        if child.role != "host":
            self.view.note(f"{child.name} process {how}; the run cannot continue")
            writer.incident(f"{child.name} process {how}; the run cannot continue", process=child.name,
                            emulated_time_s=emulated, wall_time_s=now - self.t0, **extra)
            return "failed", f"{child.name} process {how}"
        if self.startup_s is None:  # the clock waits for every host's hello: it would never start
            writer.incident(f"{child.name} process {how} before the clock started", process=child.name,
                            wall_time_s=now - self.t0, **extra)
            self.view.note(f"{child.name} {how} before the clock started; the run cannot start without it")
            return "failed", f"{child.name} process {how} before the clock started (every host must join first)"
        writer.incident(f"{child.name} process {how}; its clients count as failed from now on",
                        process=child.name, pid=child.proc.pid, wall_time_s=now - self.t0,
                        after_round=writer.rows[-1]["round"] if writer.rows else None, **extra)
        self.view.note(f"{child.name} {how}: its clients are dropped")
        sock.send(envelope.pack("peer_lost", peer=child.name))
        if self.ring is not None:
            for rep in self.ring.lose(self.host_clients.get(child.name, [])):
                self.reports.round_row(rep, writer)
            if not self.ring.expected:
                return "failed", "every host is gone: no ring client is left"
        elif all(c.lost for c in self.children if c.role == "host"):
            self.view.note("every host is gone; the server will finish with no clients")
        return None

class ResumeError(ValueError):
    """A run directory that cannot be resumed; the message says why."""


def resume_run(run_dir: Path, view_for: Any = None, placement: Placement | None = None) -> dict:
    """Continue RUN_DIR from its checkpoint: the world is rebuilt from its scenario.yaml (data,
    models, configuration), then every process takes back its state from the checkpoint. Its hosts
    are forked here, or (placement) join from other machines as for `run`."""
    from .scenario import ScenarioError, load_scenario  # noqa: PLC0415

    placement = placement or Placement()

    checkpoint = run_dir / "checkpoint"
    if not (run_dir / "scenario.yaml").exists():
        raise ResumeError(f"{run_dir}: not a run directory (no scenario.yaml)")
    previous = run_dir / "checkpoint.old"
    if not checkpoint.exists() and (previous / "meta.json").exists():  # stopped between the two renames
        previous.rename(checkpoint)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    if summary.get("status") == "completed":
        raise ResumeError(f"{run_dir}: the run completed; there is nothing to resume")
    if not (checkpoint / "meta.json").exists():
        raise ResumeError(f"{run_dir}: no checkpoint to resume from (set run.checkpoint_every; a checkpoint is taken "
                          "at the end of a round in which no client is still working)")
    try:
        sc, resolved = load_scenario(run_dir / "scenario.yaml", [])
        placement.check()
    except (ScenarioError, PlacementError) as exc:
        raise ResumeError(str(exc)) from None
    meta = json.loads((checkpoint / "meta.json").read_text())
    if meta.get("remote_parts") and not placement.remote:
        raise ResumeError(f"{checkpoint}: {', '.join(meta['remote_parts'])} wrote their part from other machines; a "
                          "part is loaded only by a host that joins: resume with --hosts remote:N --listen (or --launcher ray)")
    sc, resolved = remote_host_count(sc, resolved, placement)
    t0 = time.monotonic()
    world = build_world(sc)
    held = {actor for actors in meta.get("actors", {}).values() for actor in actors}
    expected = [*topology_of(sc.topology, world).server_actors(), *(c.profile.name for c in world.clients)]
    missing = [name for name in expected if name not in held]
    files = [checkpoint / f for f in ("network.pkl", "conductor.pkl", *(f"{peer}.pkl" for peer in meta.get("actors", {})))]
    absent = [f.name for f in files if not f.exists()]
    if missing or absent:
        raise ResumeError(f"{checkpoint}: incomplete checkpoint ("
                          + (f"no state for {missing[:5]}" if missing else f"missing {absent}") + ")")
    view = view_for(sc) if view_for else None
    conductor = Conductor(sc, resolved, run_dir, view, placement)
    conductor.t0 = t0
    conductor.view.t0 = t0
    return conductor.run(world, resume=checkpoint)


def remote_host_count(sc: Scenario, resolved: dict, placement: Placement) -> tuple[Scenario, dict]:
    """Hosts elsewhere build the world from the resolved scenario: their number must be in it."""
    if not placement.remote:
        return sc, resolved
    hosts = min(placement.hosts or sc.population.hosts or usable_cores(), sc.population.clients)
    sc = sc.model_copy(update={"population": sc.population.model_copy(update={"hosts": hosts})})
    return sc, {**resolved, "population": {**resolved["population"], "hosts": hosts}}


def run_scenario(sc: Scenario, resolved: dict, out: Path | None = None, view: View | None = None,
                 placement: Placement | None = None) -> dict:
    """Run a scenario; PlacementError before anything starts when the placement cannot work."""
    t0 = time.monotonic()
    placement = placement or Placement()
    placement.check()
    sc, resolved = remote_host_count(sc, resolved, placement)
    with building():
        world = build_world(sc)
    log.info("[conductor] world built in %.1f s: %d clients on %d hosts, topology %s, %d rounds of %s",
             time.monotonic() - t0, len(world.clients), world.hosts, sc.topology, sc.rounds, sc.algorithm.name)
    if world.client.codec_time is not None:  # what was measured reruns and resumes from the run's scenario.yaml
        resolved = {**resolved, "algorithm": {**resolved["algorithm"], "codec_time": world.client.codec_time.as_dict()}}
    secure = world.server.secure if world.server is not None else None
    if secure is not None and secure.costs is not None:  # the same for secure aggregation's cryptography
        pinned = {**resolved["algorithm"].get("secure_aggregation", {}), "costs": secure.costs.as_dict()}
        resolved = {**resolved, "algorithm": {**resolved["algorithm"], "secure_aggregation": pinned}}
    run_dir = out if out is not None else new_run_dir(Path(sc.output.dir), sc.name)
    conductor = Conductor(sc, resolved, run_dir, view, placement)
    conductor.t0 = t0
    conductor.view.t0 = t0
    return conductor.run(world)
