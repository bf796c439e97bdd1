"""Runs a set of actors behind one DEALER socket to the network process.

This is the only node code that touches sockets. It speaks the clock protocol: every delivery
is answered by `done` (with `busy_until` when the actor started modelled work), and the outcome
of that work is sent stamped with its ready time, then the hold is released. Work runs in the
host's work executor (node/executor.py) on a thread of its own, so the socket keeps answering
deliveries meanwhile."""
from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import sys
import threading
import time
import traceback
from typing import Any, Callable

import zmq

from protocol import envelope
from protocol.batch import BatchingDealer
from protocol.reportparts import report_parts
from .actor import Actor, Message, Reaction, moves_clock, quiet_kinds
from .executor import WorkExecutor

log = logging.getLogger(__name__)

POLL_MS = 500
HEARTBEAT_S = 1.0  # the network declares a peer lost after run.peer_timeout_s without a message
LOG_EVERY_S = 5.0
RESUME = "resume:"  # timer tag of a continuation waiting for its emulated time
STOP_JOIN_S = 120.0  # how long a stopping peer waits for the job in progress to end


def _own_copy(frames: list[Any]) -> list[bytearray]:
    """Frames that several messages share, copied for one of them: decoding can return views of
    the frames, and an actor may write into what it decoded."""
    return [bytearray(memoryview(f)) for f in frames]


def _peek(counters: dict[str, itertools.count], name: str) -> int:
    """The next value of a counter, leaving it in place."""
    value = next(counters[name])
    counters[name] = itertools.count(value)
    return value


class Runtime:
    def __init__(self, peer: str, endpoint: str, actors: list[Actor], parent_pid: int | None = None,
                 restore: list[str] | None = None, announce: dict | None = None,
                 run_group: Callable[[list[Callable[[], Any]]], list[Any]] | None = None, group_size: int = 1,
                 secure: Callable[[zmq.Socket], None] | None = None, silence_s: float | None = None):
        self.peer = peer
        # A host on another machine has no parent to outlive: it connects with the run's keys
        # (secure sets the socket's options) and leaves when the network has been silent for
        # silence_s (the network answers every heartbeat).
        self.secure = secure
        self.silence_s = silence_s
        # Cohorts: up to group_size queued jobs marked cohort run together through run_group
        # (which runs each work and returns their outcomes in order), in one wall-clock stretch.
        self._reports: queue.SimpleQueue = queue.SimpleQueue()
        self.work = WorkExecutor(run_group, group_size, lambda size: self._reports.put({"type": "cohort", "size": size}))
        self.announce = announce  # a report sent right after hello (what this process runs on)
        self.endpoint = endpoint
        self.actors = {a.name: a for a in actors}
        self.parent_pid = parent_pid
        self.counters = {name: itertools.count() for name in self.actors}
        if restore is not None:
            self._restore(restore)
        self._wake_closers: list[Callable[[], None]] = []
        self._report_out: queue.SimpleQueue = queue.SimpleQueue()
        self._report_ids = itertools.count()  # a report too large for one envelope goes in parts under its id
        self._resumes: dict[int, tuple[str, Callable[[], Reaction]]] = {}
        self._resume_ids = itertools.count()
        self._shared: tuple[int, list[Any]] = (0, [])  # the shared payload kept (see _shared_payload)
        self.refused = 0
        self._refused_unlogged = 0
        self._last_refusal_log = -float("inf")

    # ---- threads -------------------------------------------------------------------------
    def _signal(self, ctx: zmq.Context, address: str) -> Callable[[], None]:
        """A thread's way to wake the socket loop: a PUSH socket of its own. The loop closes it
        (under the same lock) before it destroys the context, so that a thread still finishing a
        job never sends on a socket being torn down (libzmq aborts the process then: a remote host
        ended with SIGABRT under load)."""
        sock = ctx.socket(zmq.PUSH)
        sock.connect(address)
        lock = threading.Lock()
        is_open = [True]

        def wake() -> None:
            with lock:
                if is_open[0]:
                    try:
                        sock.send(b"", zmq.NOBLOCK)
                    except zmq.ZMQError:
                        pass  # a full queue of wake-ups already wakes the loop

        def close() -> None:
            with lock:
                is_open[0] = False
                sock.close(linger=0)

        self._wake_closers.append(close)
        return wake

    def _reporter(self, wake: Callable[[], None]) -> None:
        while True:
            item = self._reports.get()
            if item is None:
                return
            if isinstance(item, threading.Event):  # a flush: everything queued before it has been handed on
                item.set()
                continue
            try:
                body = item() if callable(item) else item
            except Exception:
                traceback.print_exc()
                body = {"type": "error", "peer": self.peer, "error": traceback.format_exc(limit=3)}
            self._report_out.put(body)
            wake()

    # ---- protocol ------------------------------------------------------------------------
    def _emit(self, sock: zmq.Socket, actor: str, reaction: Reaction, t: float) -> None:
        for send in reaction.sends:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("t=%.6f %s -> %s %s (round %s, %d payload bytes)", t, actor, send.dst, send.kind, send.round,
                          send.payload_bytes)
            notes = {"notes": send.notes} if send.notes else {}
            env = envelope.pack("send", src=actor, dst=send.dst, kind=send.kind, round=send.round, t=t,
                                n=next(self.counters[actor]), body=send.body,
                                payload=send.payload_bytes, fp32=send.fp32_bytes, **notes)
            sock.send_multipart([env, *send.frames], copy=False)
        for at, tag in reaction.timers:
            sock.send(envelope.pack("timer", actor=actor, at=at, tag=tag))
        if reaction.checkpoint is not None:
            sock.send(envelope.pack("checkpoint", actor=actor, at=t, round=reaction.checkpoint))
        if reaction.barrier is not None:
            sock.send(envelope.pack("barrier", actor=actor, at=t, round=reaction.barrier))
        if reaction.halt:
            sock.send(envelope.pack("halt", actor=actor, at=t))
        for report in reaction.reports:
            self._reports.put(report)

    def _start_work(self, sock: BatchingDealer, actor: str, hold: int, reaction: Reaction, t: float) -> None:
        if reaction.work is None:
            sock.send(envelope.pack("done", actor=actor, hold=hold, busy_until=None, busy_s=None))
            return
        ready_at = t + max(0.0, reaction.work_s)
        sock.send(envelope.pack("done", actor=actor, hold=hold, busy_until=ready_at, busy_s=reaction.busy_s))
        # the network waits for this answer: it leaves now, before the work's thread takes the GIL
        # (queued, it could wait a switch interval, 5 ms, for the loop to flush it)
        sock.flush()
        self.work.submit(ready_at, actor, hold, reaction.work, reaction.cohort)

    def _deliver(self, sock: zmq.Socket, env: dict[str, Any], frames: list[Any]) -> None:
        self.work.delivered()
        frames = self._shared_payload(env, frames)  # first: a shared payload is kept whoever it is for
        tag = env["body"].get("tag", "") if env["kind"] == "tick" else ""
        if tag.startswith(RESUME):
            self._resume(sock, env, int(tag[len(RESUME):]))
            return
        actor = self.actors.get(env["dst"])
        if actor is None or frames is None:
            if actor is None:
                self._refuse(f"delivery for unknown actor {env['dst']!r}")
            if not env["quiet"]:
                sock.send(envelope.pack("done", actor=env["dst"], hold=env["hold"], busy_until=None, busy_s=None))
            return
        msg = Message(env["src"], env["dst"], env["kind"], env["round"], env["t"], env["body"], frames, env["device"])
        if log.isEnabledFor(logging.DEBUG):
            log.debug("t=%.6f %s <- %s %s (round %s, %d frames)", msg.t, msg.dst, msg.src, msg.kind, msg.round, len(frames))
        try:
            reaction = actor.react(msg)
        except Exception:
            traceback.print_exc()
            reaction = Reaction(reports=[{"type": "error", "actor": actor.name, "error": traceback.format_exc(limit=3)}])
        if env["quiet"]:  # nobody waits for an answer: there must be nothing to wait for
            moved = moves_clock(reaction)
            if moved:
                reaction = Reaction(reports=[*reaction.reports, {
                    "type": "error", "actor": actor.name,
                    "error": f"{actor.name} declares {msg.kind!r} quiet but reacted to it with {', '.join(moved)}"}])
            self._emit(sock, actor.name, reaction, msg.t)
            return
        self._emit(sock, actor.name, reaction, msg.t)
        self._start_work(sock, actor.name, env["hold"], reaction, msg.t)

    def _shared_payload(self, env: dict[str, Any], frames: list[Any]) -> list[Any] | None:
        """A delivery's payload frames. The payload of a send to several of this process's actors
        comes once (envelope `shared`): kept when it comes, reused by the deliveries after it.
        Each delivery gets its own copy (a memory copy, far cheaper than the socket's), because
        decoding can return views of the frames and an actor may write into what it decoded."""
        shared = env["shared"]
        if not shared:
            return frames
        if frames:
            self._shared = (shared, frames)
        elif self._shared[0] != shared:
            self._refuse(f"a delivery to {env['dst']!r} refers to shared payload {shared}, which this process does not hold")
            return None
        return _own_copy(self._shared[1])

    def _resume(self, sock: zmq.Socket, env: dict[str, Any], rid: int) -> None:
        actor, continuation = self._resumes.pop(rid, (env["dst"], None))
        if continuation is None or actor != env["dst"]:
            sock.send(envelope.pack("done", actor=env["dst"], hold=env["hold"], busy_until=None, busy_s=None))
            return
        try:
            reaction = continuation()
        except Exception:
            traceback.print_exc()
            reaction = Reaction(reports=[{"type": "error", "actor": actor, "error": traceback.format_exc(limit=3)}])
        self._emit(sock, actor, reaction, env["t"])
        self._start_work(sock, actor, env["hold"], reaction, env["t"])

    def run(self) -> None:
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, self.peer.encode())
        raw.setsockopt(zmq.LINGER, 2000)
        if self.secure is not None:
            self.secure(raw)
        raw.connect(self.endpoint)
        sock = BatchingDealer(raw)  # this process's answers: the frameless ones go in batches
        wake_address = f"inproc://wake-{id(self)}"
        wake_sock = ctx.socket(zmq.PULL)
        wake_sock.bind(wake_address)
        threads = [
            threading.Thread(target=self.work.work_loop, args=(self._signal(ctx, wake_address),), daemon=True),
            threading.Thread(target=self._reporter, args=(self._signal(ctx, wake_address),), daemon=True),
        ]
        for th in threads:
            th.start()
        quiet: dict[str, list[str]] = {}
        for name, actor in self.actors.items():
            for kind in sorted(quiet_kinds(actor)):
                quiet.setdefault(kind, []).append(name)
        for part in envelope.hello_parts(self.peer, list(self.actors), quiet):
            raw.send(part)
        if self.announce:
            raw.send(envelope.pack("report", body={"peer": self.peer, **self.announce}))
        poller = zmq.Poller()
        poller.register(raw, zmq.POLLIN)
        poller.register(wake_sock, zmq.POLLIN)
        self._last_beat = last_heard = time.monotonic()
        try:
            while True:
                events = dict(poller.poll(POLL_MS))
                if self.parent_pid is not None and os.getppid() != self.parent_pid:
                    return  # the conductor is gone: never outlive it
                if raw in events:
                    last_heard = time.monotonic()
                elif self.silence_s is not None and time.monotonic() - last_heard > self.silence_s:
                    log.warning("[%s] the network has not answered for %.0f s: leaving the run", self.peer, self.silence_s)
                    return
                self._heartbeat(sock)
                if wake_sock in events:
                    while wake_sock.poll(0):
                        wake_sock.recv()
                    self._drain(sock)
                if raw in events:
                    while raw.poll(0):
                        self._heartbeat(sock)  # a long backlog of deliveries must not look like silence
                        frames = raw.recv_multipart(copy=False)
                        if not self._on_message(sock, frames[0].buffer, frames[1:]):
                            return
                sock.flush()
        finally:
            self.work.stop()
            self._reports.put(None)
            for close in self._wake_closers:
                close()
            ctx.destroy(linger=0)
            self._join(threads)

    def _on_message(self, sock: BatchingDealer, header: Any, frames: list[Any], nested: bool = False) -> bool:
        """One envelope from the network (each part of a batch in turn); False: stop."""
        try:
            env = envelope.unpack(header)
        except envelope.ProtocolError as exc:
            self._refuse(str(exc))
            return True
        op = env["op"]
        if op == "deliver":
            self._deliver(sock, env, frames)
        elif op == "batch" and not nested and not frames:
            for part in env["parts"]:
                if not self._on_message(sock, part, [], nested=True):
                    return False
        elif op == "stop":
            return False
        elif op == "snapshot":
            self._snapshot(sock, env["path"], int(env.get("chunk") or 0))
        elif op == "batch":
            self._refuse("a batch inside a batch" if nested else "a batch with payload frames")
        elif op != "alive_ack":
            self._refuse(f"op {op!r} is not one the network sends")
        return True

    def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for the job in progress to end. A thread left inside a torch operation when the
        interpreter finalizes is ended by pthread_exit on its way back to the GIL, through C++
        frames that cannot unwind: "terminate called without an active exception", SIGABRT (a
        remote host, which exits through the interpreter, ended so in CI). If the job does not end
        in time, the process leaves without finalizing: the run is over, only the exit is left."""
        deadline = time.monotonic() + STOP_JOIN_S
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        if any(th.is_alive() for th in threads):
            log.warning("[%s] a job still running %.0f s after the run stopped: leaving without it", self.peer, STOP_JOIN_S)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    @staticmethod
    def tell_fatal(peer: str, endpoint: str, error: str, linger_ms: int = 2000,
                   secure: Callable[[zmq.Socket], None] | None = None) -> None:
        """Tell the run why this process cannot start (the conductor ends the run with it)."""
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, peer.encode())
            sock.setsockopt(zmq.LINGER, linger_ms)
            if secure is not None:
                secure(sock)
            sock.connect(endpoint)
            # no hello: a peer that will not run must not count as ready (the clock would start without it)
            sock.send(envelope.pack("report", body={"peer": peer, "type": "fatal", "error": error}))
            sock.close()
        finally:
            ctx.term()

    def _heartbeat(self, sock: zmq.Socket) -> None:
        """From this I/O thread, so a peer that trains for minutes still answers."""
        now = time.monotonic()
        if now - self._last_beat >= HEARTBEAT_S:
            sock.send(envelope.pack("alive", busy_s=self.work.busy_for(now)))
            self._last_beat = now

    # ---- checkpoints ---------------------------------------------------------------------
    def _snapshot(self, sock: zmq.Socket, path: str, chunk: int = 0) -> None:
        """Write this process's state for a checkpoint, after handing on every report queued so
        far (so the conductor has them before the checkpoint). Only possible while no work is under
        way: a job or a continuation is code, not data. With no path (a host on another machine)
        the state goes to the network in messages of at most `chunk` bytes, which it writes."""
        if self.work.busy() or self._resumes:
            sock.send(envelope.pack("snapshot_done", ok=False, why=f"{self.peer} has work under way"))
            return
        flushed = threading.Event()
        self._reports.put(flushed)
        flushed.wait()
        self._drain(sock)
        try:
            state = {"peer": self.peer, "counters": {name: _peek(self.counters, name) for name in self.actors},
                     "actors": {name: actor.snapshot() for name, actor in self.actors.items()}}
            if path:
                with open(path, "wb") as f:
                    pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
            else:
                blob = memoryview(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
                step = chunk if chunk > 0 else 64 << 20
                for at in range(0, len(blob), step):
                    sock.send_multipart([envelope.pack("snapshot_part"), blob[at:at + step]])
        except Exception as exc:  # a full disk must not end the run: the checkpoint is skipped
            sock.send(envelope.pack("snapshot_done", ok=False, why=f"{self.peer}: {type(exc).__name__}: {exc}"))
            return
        sock.send(envelope.pack("snapshot_done", ok=True, why=""))

    def _restore(self, paths: list[str]) -> None:
        """Take back this process's actors' state from the checkpoint files that hold them (written
        by whichever processes had them then: the number of hosts may differ)."""
        found = set()
        for path in paths:
            with open(path, "rb") as f:
                state = pickle.load(f)
            for name in set(self.actors) & set(state["actors"]):
                self.actors[name].restore(state["actors"][name])
                self.counters[name] = itertools.count(state["counters"][name])
                found.add(name)
        missing = sorted(set(self.actors) - found)
        if missing:
            raise RuntimeError(f"the checkpoint holds no state for {missing[:5]}")

    def _refuse(self, reason: str) -> None:
        """Count a message this process will not act on; say so at most once per LOG_EVERY_S."""
        self.refused += 1
        now = time.monotonic()
        if now - self._last_refusal_log >= LOG_EVERY_S:
            more = f" ({self._refused_unlogged} more since the last line)" if self._refused_unlogged else ""
            log.warning("[%s] refused a message: %s%s", self.peer, reason, more)
            self._last_refusal_log, self._refused_unlogged = now, 0
        else:
            self._refused_unlogged += 1

    def _drain(self, sock: zmq.Socket) -> None:
        for job, outcome in self.work.finished():
            if callable(outcome):
                # A continuation touches actor state, so it must run at its emulated time, after every
                # delivery before it: ask for a timer at ready_at and run it when that timer fires.
                rid = next(self._resume_ids)
                self._resumes[rid] = (job.actor, outcome)
                sock.send(envelope.pack("timer", actor=job.actor, at=job.ready_at, tag=f"{RESUME}{rid}"))
                sock.send(envelope.pack("done", actor=job.actor, hold=job.hold, busy_until=None, busy_s=None))
                continue
            self._emit(sock, job.actor, outcome, job.ready_at)
            self._start_work(sock, job.actor, job.hold, outcome, job.ready_at)
        while True:
            try:
                body = self._report_out.get_nowait()
            except queue.Empty:
                break
            for part in report_parts(self.peer, body, next(self._report_ids)):
                sock.send(part)
