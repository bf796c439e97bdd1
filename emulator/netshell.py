"""The network process's socket shell: a ZeroMQ ROUTER that every peer connects to, polled in a
loop that hands each message to the network (emulator/network.py), runs the events the clock allows
in bounded batches, and sends what they produced. It knows frames and peers, not FL."""
from __future__ import annotations

import math
import os
import time
from collections import Counter
from typing import Any

import zmq

from protocol import envelope
from protocol.curve import ZapHandler

from .netconfig import CONDUCTOR

POLL_MS = 200
BATCH = 64  # events run before the socket is looked at again, so replies flow in


def serve(net: Any) -> None:
    cfg = net.cfg
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_bytes)
    sock.bind(cfg.endpoint)
    if cfg.listen:
        _listen(net, ctx, sock)
    waited: Counter[str] = Counter()  # wall seconds the loop waited, by what it waited for
    try:
        while not net.stopping:
            if not _poll_once(net, sock, waited):
                return  # the conductor is gone: nobody to report to
        if net.halt_pending:  # everything up to the end of the run is recorded, however soon the stop came
            while net.step(sock):
                pass
        _say_goodbye(net, sock, waited)
    finally:
        if net.zap is not None:
            net.zap.close()
        ctx.destroy(linger=0)


def _listen(net: Any, ctx: zmq.Context, sock: zmq.Socket) -> None:
    cfg = net.cfg
    net.zap = ZapHandler(ctx, cfg.run_keys.hosts, "network")
    # security options apply to the endpoints bound after them: the local ipc one stays plain
    cfg.run_keys.serve(sock)
    try:
        sock.bind(cfg.listen)
    except zmq.ZMQError as exc:
        net.to_conductor("report", {"type": "fatal", "peer": "network",
                                    "error": f"the network cannot listen on {cfg.listen}: {exc}", "t_net": 0.0})
    else:
        net.to_conductor("report", {"type": "listening", "endpoint": sock.getsockopt_string(zmq.LAST_ENDPOINT),
                                    "t_net": 0.0})


def _poll_once(net: Any, sock: zmq.Socket, waited: Counter) -> bool:
    timeout, pacing = POLL_MS, False
    if net.queue and net.clock.may_run_head():
        timeout, pacing = min(POLL_MS, max(0, math.ceil(net.clock.due_in() * 1000))), True
    waiting = ("realtime" if pacing else waiting_for(net)) if timeout else None
    began = time.monotonic()
    ready = sock.poll(timeout)
    if waiting is not None:
        waited[waiting] += time.monotonic() - began
    if ready:
        while sock.poll(0):
            frames = sock.recv_multipart(copy=False)
            net.receive(bytes(frames[0].buffer), frames[1:])
    elif timeout and net.cfg.parent_pid is not None and os.getppid() != net.cfg.parent_pid:
        return False
    watch_peers(net)
    for _ in range(BATCH):
        if not net.step(sock):
            break
    net._flush(sock)
    return True


def _say_goodbye(net: Any, sock: zmq.Socket, waited: Counter) -> None:
    """The last reports (refusals, the network's own figures), then every peer is told to stop."""
    if net.guard.changed:
        net.to_conductor("report", {"type": "refused_messages", **net.guard.counts(), "t_net": net.now})
    started = net.clock.wall_start
    net.to_conductor("report", {"type": "network_stats", "events": net.clock.events, "t_net": net.now,
                                "cpu_s": time.process_time(), "clock_s": time.monotonic() - (started or time.monotonic()),
                                "waited_s": dict(waited)})
    net._flush(sock)
    for peer in net.peer_actors:
        if peer != CONDUCTOR:
            try:
                sock.send_multipart([peer.encode(), envelope.pack("stop")])
            except zmq.ZMQError:
                pass
    time.sleep(0.05)


def waiting_for(net: Any) -> str:
    """Why the clock stands still while this process waits for a message (and no event is
    only waiting for its wall-clock time, in realtime mode): the run has not started, an actor
    has not answered a delivery yet (its host's reply is on the clock's path), an actor's
    declared work is not finished (real training), or nothing at all is pending."""
    if not net.started:
        return "start"
    if net.holds.unanswered:
        return "answers"
    return "work" if net.holds else "messages"


def watch_peers(net: Any) -> None:
    """Once a second: tell the conductor of refused messages, and of peers gone silent. A peer
    whose last heartbeat said it was in the middle of a long job gets as long again."""
    now = time.monotonic()
    if now - getattr(net, "_last_watch", 0.0) < 1.0:
        return
    net._last_watch = now
    for refusal in net.zap.refusals() if net.zap is not None else []:
        net.to_conductor("report", {"type": "refused_key", "by": "network", **refusal, "t_net": net.now})
    if net.guard.changed:
        net.to_conductor("report", {"type": "refused_messages", **net.guard.counts(), "t_net": net.now})
    if net.cfg.peer_timeout_s is None:
        return
    for peer in net.guard.greeted:
        if peer == CONDUCTOR or peer in net.reported_silent or peer not in net.last_heard:
            continue
        silent = now - net.last_heard[peer]
        if silent > max(net.cfg.peer_timeout_s, 2 * net.busy_for.get(peer, 0.0)):
            net.reported_silent.add(peer)
            net.to_conductor("report", {"type": "peer_silent", "peer": peer, "silent_s": silent, "t_net": net.now})
