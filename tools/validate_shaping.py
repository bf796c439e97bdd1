"""Fidelity of the link model against Linux kernel TCP, root only.

    sudo python tools/validate_shaping.py --grid [--cc cubic|bbr|reno] [--json]
    sudo python tools/validate_shaping.py --flows 5 --rates 20 --delays-ms 30 --queues-ms 100 --losses 0,0.005 \
        --sizes 6654062 --cc bbr --lossy-reps 4
    sudo python tools/validate_shaping.py --rates 100 --delays-ms 50 --losses 0,0.005 --sizes 6654062 \\
        --queues-ms 50 --idle-s 0,1 --models fluid,tcp --paths tcp,zmq --reps 5 --lossy-reps 9

Two network namespaces, A (sender) and B (receiver), are joined by tools/delayline.py: a
user-space delay line that owns one TUN device on each side and forwards every IP packet after
the one-way delay, dropping A->B packets at random with the given loss (seeded). `tbf` on A's TUN
egress sets the rate, and its `latency` the bottleneck queue. (`--medium veth` joins them by a veth
pair instead, for the no-delay, loss-free cross-check of the delay line.) Both ends use CUBIC,
Linux's default, whatever this host's default is, or the congestion control --cc names (the model
then runs its own of that name: cubic, bbr or reno).

Each case sends a payload from A to B, over a fresh TCP connection per repetition (`tcp` path;
the 8-byte length header goes with the payload) or over one ZeroMQ REQ/REP connection (`zmq`), and
times it from the first byte written until B's one-byte acknowledgement is back. With an idle gap
(`--idle-s`), each repetition sends two payloads on one connection with that gap between the
first's acknowledgement and the second, and times the second. The emulator's link model runs the
same sequence (payload, acknowledgement, gaps) through the same flow model the network process
uses, with the TUN link's framing (1500 bytes per 1448-byte segment), and the printed ratio is
emulated/kernel of the medians. Lossy cases take `--lossy-reps` repetitions (the kernel's spread
is large; it is printed) and the model draws as many seeds.

With `--flows K`, each repetition opens K connections, starts them together through the one
bottleneck and times each until its acknowledgement; the record gives the median of each rank
(fastest, second, ...) for the kernel and the model, and their ratios.

It removes everything it created, also on error or Ctrl-C. Where namespaces or TUN devices cannot
be created (not root, no `ip`/`tc`), it prints SKIPPED with the reason and exits 0.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.flows.links import FlowModel, Framing, simulate  # noqa: E402
from emulator.flows.transport import TcpParams, TcpTransport  # noqa: E402

ADDR_A, ADDR_B = "10.213.7.1", "10.213.7.2"
PORT_TCP, PORT_ZMQ = 47011, 47012
ACK = b"k"
BUCKET_S = 100e-6  # tbf bucket: what the rate sends in 100 us (at least two full frames)
HEADER = 8
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
GRID = {"rates": "5,20,100", "delays_ms": "0,10,40,150", "losses": "0,0.001,0.01", "sizes": "65536,1048576,6920000",
        "lossless_queue_ms": "50", "lossy_queues_ms": "50,1000", "idle_s": "1.0"}
MODEL_DRAWS = 41  # lossy cases on fresh connections: the model's median over this many seeded transfers
TUN_FRAMING = Framing(mss=1448, segment_overhead=52)
VETH_FRAMING = Framing(mss=1448, segment_overhead=66)


# ---- the two ends (run inside the namespaces) ---------------------------------------------------
def serve_tcp(port: int, cc: str) -> None:
    """Each connection in a thread of its own (--flows sends on several at once)."""
    import threading

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
    srv.bind(("0.0.0.0", port))
    srv.listen(64)
    print("ready", flush=True)

    def receive(conn: socket.socket) -> None:
        buf = bytearray(1 << 20)
        with conn:
            while True:  # messages on this connection, until a zero length or its end
                header = conn.recv(HEADER, socket.MSG_WAITALL)
                if len(header) < HEADER:
                    break
                size = int.from_bytes(header, "little")
                if size == 0:
                    os._exit(0)
                got = 0
                while got < size:
                    n = conn.recv_into(buf, min(len(buf), size - got))
                    if n == 0:
                        break
                    got += n
                conn.sendall(ACK)

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=receive, args=(conn,), daemon=True).start()


def send_tcp(host: str, port: int, size: int, reps: int, pause: float, idle: float, cc: str) -> list[float]:
    payload = size.to_bytes(HEADER, "little") + os.urandom(size)
    times = []
    for _ in range(reps):
        time.sleep(pause)  # let the token bucket refill and the previous connection drain
        conn = socket.socket()
        conn.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.connect((host, port))
        for i in range(2 if idle > 0 else 1):
            if i:
                time.sleep(idle)
            t0 = time.perf_counter()
            conn.sendall(payload)
            conn.recv(1)
            elapsed = time.perf_counter() - t0
        times.append(elapsed)
        conn.close()
    stop = socket.create_connection((host, port))
    stop.sendall((0).to_bytes(HEADER, "little"))
    stop.close()
    return times


def send_flows(host: str, port: int, size: int, reps: int, pause: float, k: int, cc: str) -> list[list[float]]:
    """K connections opened first, then started together: per repetition, each one's time from
    the common start until its acknowledgement, sorted."""
    import threading

    payload = size.to_bytes(HEADER, "little") + os.urandom(size)
    out = []
    for _ in range(reps):
        time.sleep(pause)
        conns = []
        for _ in range(k):
            conn = socket.socket()
            conn.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.connect((host, port))
            conns.append(conn)
        go = threading.Barrier(k + 1)
        start = [0.0]
        done = [0.0] * k

        def one(i: int) -> None:
            go.wait()
            conns[i].sendall(payload)
            conns[i].recv(1)
            done[i] = time.perf_counter() - start[0]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        start[0] = time.perf_counter()
        go.wait()
        for t in threads:
            t.join()
        for conn in conns:
            conn.close()
        out.append(sorted(done))
    stop = socket.create_connection((host, port))
    stop.sendall((0).to_bytes(HEADER, "little"))
    stop.close()
    return out


def serve_zmq(port: int) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.bind(f"tcp://0.0.0.0:{port}")
    print("ready", flush=True)
    while True:
        msg = sock.recv(copy=False)
        sock.send(ACK)
        if len(msg) == 0:
            return


def send_zmq(host: str, port: int, size: int, reps: int, pause: float, idle: float, cc: str) -> list[float]:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.connect(f"tcp://{host}:{port}")
    sock.send(b"x")  # connection and ZMTP handshake happen before the clock starts
    sock.recv()
    payload = os.urandom(size)
    times = []
    for _ in range(reps):
        time.sleep(max(pause, idle))
        t0 = time.perf_counter()
        sock.send(payload, copy=False)
        sock.recv()
        times.append(time.perf_counter() - t0)
    sock.send(b"")
    sock.recv()
    ctx.destroy(linger=0)
    return times


# ---- the model --------------------------------------------------------------------------------
def emulated_seconds(model: str, path_kind: str, size: int, rate_bps: float, delay_s: float, loss: float,
                     queue_s: float, idle_s: float, reps: int, pause: float, framing: Framing,
                     params: TcpParams, seed: int = 0) -> list[float]:
    """The emulator's answer for the same sequence the kernel ran: payload A->B then the one-byte
    acknowledgement B->A; per repetition a fresh connection (tcp path) or one connection for all
    (zmq path). Fluid: today's model (max-min rate, a lost segment costs its bytes and an RTO)."""
    up_a, up_b = ("up", "a"), ("up", "b")
    seg_bits = (framing.mss + framing.segment_overhead) * 8.0
    data_bytes = size + (HEADER if path_kind == "tcp" else 9)  # our length header, or ZMTP's frame header
    times = []
    rng = np.random.default_rng([seed, size, int(rate_bps), int(delay_s * 1e6), int(loss * 1e6)])
    conn_model = None
    for rep in range(reps):
        if model == "fluid":
            fm = FlowModel({up_a: rate_bps})
            segments = max(1, -(-data_bytes // framing.mss))
            lost = int(rng.binomial(segments, loss)) if loss else 0
            bits = (framing.link_bytes(data_bytes) + lost * (framing.mss + framing.segment_overhead)) * 8.0
            out = simulate(fm, [dict(start=0.0, bits=bits, path=[up_a], latency=delay_s + lost * params.rto_min_s),
                                dict(after=0, bits=framing.link_bytes(1) * 8.0, path=[up_b], latency=delay_s)])
            first, ack = 0, 1
            times.append(out[ack][1] - out[first][0])
            continue
        fresh = path_kind == "tcp" or conn_model is None
        if fresh:
            conn_model = FlowModel({up_a: rate_bps}, TcpTransport(params), queue_s={up_a: queue_s})
        fm = conn_model
        data = dict(bits=framing.link_bytes(data_bytes) * 8.0, path=[up_a], latency=delay_s, connection="ab",
                    rtt=2 * delay_s, seg_bits=seg_bits, mss=framing.mss, loss=loss, rng=np.random.default_rng([seed, rep, 1]))
        ack = dict(bits=framing.link_bytes(1) * 8.0, path=[up_b], latency=delay_s, connection="ba", rtt=2 * delay_s,
                   seg_bits=seg_bits, mss=framing.mss)
        gap = idle_s if path_kind == "tcp" else max(pause, idle_s)
        t0 = fm.t + (gap if not fresh else 0.0)
        if path_kind == "tcp" and idle_s > 0:
            seq = [dict(start=t0, **data), dict(after=0, **ack), dict(after=1, gap=idle_s, **data), dict(after=2, **ack)]
            first, last = 2, 3
        else:
            seq = [dict(start=t0, **data), dict(after=0, **ack)]
            first, last = 0, 1
        out = simulate(fm, seq)
        times.append(out[last][1] - out[first][0])
    return times


def k_payloads(size: int, delay_s: float, loss: float, k: int, framing: Framing, seed: int, rep: int) -> list[dict]:
    """The K payloads of one repetition of --flows, as `simulate` takes them: fresh connections on
    the one bottleneck ("up", "a"), started together, each with its own seeded loss draws."""
    seg_bits = (framing.mss + framing.segment_overhead) * 8.0
    return [dict(start=0.0, bits=framing.link_bytes(size + HEADER) * 8.0, path=[("up", "a")], latency=delay_s,
                 connection=("ab", i), rtt=2 * delay_s, seg_bits=seg_bits, mss=framing.mss, loss=loss,
                 rng=np.random.default_rng([seed, rep, i, 1])) for i in range(k)]


def emulated_flow_times(size: int, rate_bps: float, delay_s: float, loss: float, queue_s: float, k: int, draws: int,
                        framing: Framing, params: TcpParams, seed: int = 0) -> list[list[float]]:
    """K fresh connections through one bottleneck, started together: per draw, each one's time
    until its acknowledgement is back, sorted (the kernel side of send_flows)."""
    up_a, up_b = ("up", "a"), ("up", "b")
    seg_bits = (framing.mss + framing.segment_overhead) * 8.0
    out = []
    for rep in range(draws):
        fm = FlowModel({up_a: rate_bps}, TcpTransport(params), queue_s={up_a: queue_s})
        seq = k_payloads(size, delay_s, loss, k, framing, seed, rep)
        seq += [dict(after=i, bits=framing.link_bytes(1) * 8.0, path=[up_b], latency=delay_s, connection=("ba", i),
                     rtt=2 * delay_s, seg_bits=seg_bits, mss=framing.mss) for i in range(k)]
        arrivals = simulate(fm, seq)
        out.append(sorted(end for _, end in arrivals[k:]))
    return out


def model_windows(size: int, rate_bps: float, delay_s: float, loss: float, queue_s: float, k: int, framing: Framing,
                  params: TcpParams, seed: int = 0) -> dict:
    """One draw of the model's K flows, watched after every rebalance and every flow event (a window
    step or a cut that moves no other flow's rate changes its flow without a rebalance): the
    time-weighted mean of the flows' total window (segments) and of the link's use, to set beside
    the kernel's (WindowSampler)."""
    up_a = ("up", "a")
    model = FlowModel({up_a: rate_bps}, TcpTransport(params), queue_s={up_a: queue_s})
    samples: list[tuple[float, float, float]] = []
    rebalance, fire = model._rebalance, model.fire

    def sample() -> None:
        flows = [f for f in model.flows.values() if f.active]
        samples.append((model.t, sum(f.tcp.conn.cwnd for f in flows), sum(f.rate for f in flows if f.rate < float("inf"))))

    def watched_rebalance(force=None):
        changed = rebalance(force)
        sample()
        return changed

    def watched_fire(fid):
        out = fire(fid)
        sample()
        return out

    model._rebalance, model.fire = watched_rebalance, watched_fire
    simulate(model, k_payloads(size, delay_s, loss, k, framing, seed, 0))  # the first repetition's draws
    span = samples[-1][0] - samples[0][0] if len(samples) > 1 else 0.0
    if span <= 0:
        return {"mean_total_cwnd": None, "utilisation": None}
    weighted = lambda i: sum(s[i] * (n[0] - s[0]) for s, n in zip(samples, samples[1:])) / span  # noqa: E731
    return {"mean_total_cwnd": weighted(1), "utilisation": weighted(2) / rate_bps}


def rank_medians(runs: list[list[float]]) -> list[float]:
    """The median of each rank (the fastest flow's, the second's, ...) over repetitions."""
    return [statistics.median(r[i] for r in runs) for i in range(len(runs[0]))]


# ---- namespaces -------------------------------------------------------------------------------
class Testbed:
    """Two namespaces joined by the delay line over TUN (or by a veth pair)."""

    def __init__(self, medium: str, cc: str) -> None:
        tag = os.getpid()
        self.medium, self.cc = medium, cc
        self.a, self.b = f"flemu-a-{tag}", f"flemu-b-{tag}"
        self.dev_a, self.dev_b = f"fla{tag}"[:15], f"flb{tag}"[:15]
        self.created: list[str] = []
        self.line: subprocess.Popen | None = None
        self.path_key: tuple | None = None
        self.line_counts: dict = {}

    def ip(self, *args: str, ns: str | None = None) -> None:
        cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    def __enter__(self) -> "Testbed":
        for ns in (self.a, self.b):
            self.ip("ip", "netns", "add", ns)
            self.created.append(ns)
            self.ip("ip", "link", "set", "lo", "up", ns=ns)
        self._congestion_control()
        if self.medium == "veth":
            self.ip("ip", "link", "add", self.dev_a, "netns", self.a, "type", "veth", "peer", "name", self.dev_b, "netns", self.b)
            for ns, dev, addr in ((self.a, self.dev_a, ADDR_A), (self.b, self.dev_b, ADDR_B)):
                self.ip("ip", "addr", "add", f"{addr}/30", "dev", dev, ns=ns)
                self.ip("ip", "link", "set", dev, "up", ns=ns)
        return self

    def _congestion_control(self) -> None:
        """Make `cc` the default inside both namespaces (ZeroMQ cannot set it per socket). A
        namespace may only pick an algorithm the host allows, so allow it for the moment."""
        allowed_key = "net.ipv4.tcp_allowed_congestion_control"
        allowed = subprocess.run(["sysctl", "-n", allowed_key], capture_output=True, text=True).stdout.split()
        if self.cc not in allowed:
            subprocess.run(["sysctl", "-qw", f"{allowed_key}={' '.join(allowed + [self.cc])}"], check=True)
        try:
            for ns in (self.a, self.b):
                self.ip("sysctl", "-qw", f"net.ipv4.tcp_congestion_control={self.cc}", ns=ns)
        finally:
            if self.cc not in allowed:
                subprocess.run(["sysctl", "-qw", f"{allowed_key}={' '.join(allowed)}"], check=True)

    def path(self, delay_ms: float, loss: float, seed: int, trace: tuple[str, ...] = ()) -> None:
        """(Re)start the delay line with this delay and loss (and `trace`: its trace options)."""
        if self.medium == "veth":
            if delay_ms or loss:
                raise ValueError("--medium veth has no delay and no loss")
            return
        if self.path_key == (delay_ms, loss, seed, trace):
            return
        self._stop_line()
        self.line = subprocess.Popen([sys.executable, str(REPO / "tools" / "delayline.py"), "--ns-a", self.a, "--ns-b", self.b,
                                      "--dev-a", self.dev_a, "--dev-b", self.dev_b, "--addr-a", ADDR_A, "--addr-b", ADDR_B,
                                      "--delay-ms", str(delay_ms), "--loss", str(loss), "--seed", str(seed), *trace],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.line.stdout.readline().strip() != "ready":
            raise RuntimeError(f"delay line did not start: {self.line.stderr.read()}")
        self.path_key = (delay_ms, loss, seed, trace)
        self.shaped = None

    def line_report(self) -> dict:
        """The delay line's counters since the last report (its worst lateness in particular)."""
        if self.line is None:
            return {}
        self.line.send_signal(signal.SIGUSR1)
        try:
            return json.loads(self.line.stdout.readline())
        except json.JSONDecodeError:
            return {}

    def _stop_line(self) -> None:
        if self.line is not None:
            self.line.terminate()
            try:
                out, _ = self.line.communicate(timeout=10)
                self.line_counts = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
                self.line.kill()
            self.line = None
            self.path_key = None

    def shape(self, rate_mbit: float, queue_ms: float) -> None:
        """tbf on A's egress: the rate, and a queue of `queue_ms` at that rate. A transfer starts
        with a full bucket, which leaves at line rate: the bucket is kept small (BUCKET_S of the
        rate, at least two full frames) so that this head start is a small part of any transfer."""
        burst = max(3028, int(rate_mbit * 1e6 / 8 * BUCKET_S))
        self.ip("tc", "qdisc", "replace", "dev", self.dev_a, "root", "tbf", "rate", f"{rate_mbit}mbit",
                "burst", str(burst), "latency", f"{queue_ms}ms", ns=self.a)

    def qdisc_drops(self) -> int:
        """Packets tbf has dropped at A's egress so far (its queue overflowed)."""
        out = subprocess.run(["ip", "netns", "exec", self.a, "tc", "-s", "qdisc", "show", "dev", self.dev_a],
                             capture_output=True, text=True).stdout
        found = re.search(r"dropped (\d+)", out)
        return int(found.group(1)) if found else 0

    def tcp_counters(self) -> dict[str, int]:
        """The sender's namespace's TCP counters that say how losses were recovered (nstat's totals)."""
        out = subprocess.run(["ip", "netns", "exec", self.a, "nstat", "-asz"], capture_output=True, text=True).stdout
        values = dict(line.split()[:2] for line in out.splitlines() if line and not line.startswith("#"))
        return {name: int(values.get(name, 0)) for name in LOSS_COUNTERS}

    def unshape(self) -> None:
        """No tbf: a trace-driven delay line is the rate."""
        subprocess.run(["ip", "netns", "exec", self.a, "tc", "qdisc", "del", "dev", self.dev_a, "root"], capture_output=True)

    def __exit__(self, *exc) -> None:
        self._stop_line()
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# recoveries (SACK), retransmission timeouts, tail-loss probes, retransmissions lost again
LOSS_COUNTERS = ("TcpOutSegs", "TcpRetransSegs", "TcpExtTCPSackRecovery", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes",
                 "TcpExtTCPLossProbeRecovery", "TcpExtTCPLostRetransmit", "TcpExtTCPSpuriousRTOs",
                 "TcpExtTCPSackRecoveryFail", "TcpExtTCPFastRetrans", "TcpExtTCPSlowStartRetrans")


def why_not_possible() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs the ip and tc commands (iproute2)"
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun for the delay line"
    probe = f"flemu-probe-{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def exchange(bed: Testbed, path: str, flag: str, lead: list[str], rest: list[str], timeout: float = 1800) -> list:
    """Start the receiver in B, run the sender in A (its hidden command line: `flag`, `lead`, the
    receiver's address and port, `rest`, the congestion control), and return what it printed."""
    port = PORT_TCP if path == "tcp" else PORT_ZMQ
    me = [sys.executable, str(Path(__file__).resolve())]
    server = subprocess.Popen(["ip", "netns", "exec", bed.b, *me, "--serve", path, str(port), bed.cc],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"receiver did not start: {server.stderr.read()}")
        res = subprocess.run(["ip", "netns", "exec", bed.a, *me, flag, *lead, ADDR_B, str(port), *rest, bed.cc],
                             capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"sender failed: {res.stderr}")
        return json.loads(res.stdout)
    finally:
        server.kill()
        server.wait()


def measure(bed: Testbed, path: str, size: int, reps: int, pause: float, idle: float) -> list[float]:
    return exchange(bed, path, "--send", [path], [str(size), str(reps), str(pause), str(idle)])


def measure_flows(bed: Testbed, size: int, reps: int, pause: float, k: int) -> list[list[float]]:
    return exchange(bed, "tcp", "--send-flows", [], [str(size), str(reps), str(pause), str(k)], timeout=3600)


class WindowSampler:
    """Samples the kernel's windows in A while a measurement runs (`ss -tin` every 50 ms): the mean
    of the sending connections' total cwnd (segments) and of their smoothed RTT, over samples with
    any connection sending. A connection counts while it has data unacknowledged: one that has
    finished stays open (and keeps its cwnd) until the repetition's last flow is done."""

    def __init__(self, bed: Testbed, every_s: float = 0.05):
        import threading

        self.bed, self.every_s = bed, every_s
        self.totals: list[float] = []
        self.rtts: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            out = subprocess.run(["ip", "netns", "exec", self.bed.a, "ss", "-tin", "dst", ADDR_B], capture_output=True,
                                 text=True).stdout
            # one block per connection (its address line, then its details); ss shows "unacked:"
            # only while something is in flight
            sending = [block for block in re.split(r"\n(?=ESTAB|SYN|FIN|CLOSE|LAST|TIME)", out) if "unacked:" in block]
            if sending:
                self.totals.append(sum(float(x) for b in sending for x in re.findall(r"\bcwnd:(\d+)", b)))
                self.rtts += [float(x) for b in sending for x in re.findall(r"\brtt:([\d.]+)/", b)]

    def __enter__(self) -> "WindowSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def summary(self) -> dict:
        return {"mean_total_cwnd": statistics.fmean(self.totals) if self.totals else None,
                "mean_rtt_ms": statistics.fmean(self.rtts) if self.rtts else None, "samples": len(self.totals)}


def flows_record(case: dict, k: int, runs: list[list[float]], args, framing: Framing, params: TcpParams) -> dict:
    kernel = rank_medians(runs)
    draws = max(len(runs), MODEL_DRAWS) if case["loss"] > 0 else len(runs)
    emulated = rank_medians(emulated_flow_times(case["size"], case["rate"] * 1e6, case["delay"] / 1000, case["loss"],
                                                case["queue"] / 1000, k, draws, framing, params, args.seed))
    return {"rate_mbps": case["rate"], "delay_ms": case["delay"], "loss": case["loss"], "queue_ms": case["queue"],
            "payload_bytes": case["size"], "flows": k, "cc": args.cc, "reps": len(runs), "kernel_s": kernel,
            "emulated_s": emulated, "ratios": [e / q for e, q in zip(emulated, kernel)], "kernel_runs": runs}


def emit(rec: dict, as_json: bool, line: str) -> None:
    """One record: as JSON, or as its line of the table."""
    print(json.dumps(rec) if as_json else line, flush=True)


def show_flows(rec: dict, as_json: bool) -> None:
    emit(rec, as_json, f"{rec['flows']} flows {rec['cc']} {rec['rate_mbps']:>5g} Mbit/s {rec['delay_ms']:>4g} ms "
                       f"{100 * rec['loss']:>4g} % q{rec['queue_ms']:>5g} ms {rec['payload_bytes']:>9,} B, by rank: kernel "
                       f"{' '.join(f'{t:.2f}' for t in rec['kernel_s'])} s; emulated "
                       f"{' '.join(f'{t:.2f}' for t in rec['emulated_s'])} s; ratios {' '.join(f'{r:.2f}' for r in rec['ratios'])}")


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def cases(args) -> list[dict]:
    """(rate, queue, delay, loss, idle) network settings with their sizes, in an order that
    restarts the delay line as rarely as possible."""
    out = []
    idles = [0.0] + [i for i in floats(args.idle_s) if i > 0] if args.grid else floats(args.idle_s) or [0.0]
    for delay, loss in itertools.product(floats(args.delays_ms), floats(args.losses)):
        queues = floats(args.lossy_queues_ms if loss > 0 else args.lossless_queues_ms) if args.grid else floats(args.queues_ms)
        for rate, queue in itertools.product(floats(args.rates), queues):
            for size in [int(s) for s in floats(args.sizes)]:
                for idle in idles:
                    if args.grid and idle > 0 and not (loss == 0 and size == int(floats(args.sizes)[1])):
                        continue  # the grid's idle-gap cases: loss-free, the middle payload size
                    out.append(dict(rate=rate, queue=queue, delay=delay, loss=loss, size=size, idle=idle))
    # cheap cases first (a long grid that is stopped early has the most cases done), keeping
    # cases of one delay and loss together so that the delay line restarts rarely
    cost = lambda c: (c["loss"] > 0, c["loss"], c["size"] > 2**21, c["delay"])  # noqa: E731
    return sorted(out, key=cost)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", action="store_true", help="the issue's grid: " + json.dumps(GRID))
    ap.add_argument("--rates", default="100", help="Mbit/s, comma-separated")
    ap.add_argument("--delays-ms", default="0", help="one-way delay, comma-separated")
    ap.add_argument("--losses", default="0", help="A->B packet loss probability, comma-separated")
    ap.add_argument("--queues-ms", default="50", help="bottleneck queue (tbf latency), comma-separated")
    ap.add_argument("--sizes", default="1048576", help="payload bytes, comma-separated")
    ap.add_argument("--idle-s", default="0", help="idle gap between two transfers on one connection (0: one transfer)")
    ap.add_argument("--models", default="fluid,tcp", help="the emulator's transport models to compare")
    ap.add_argument("--paths", default="tcp,zmq", help="tcp (a socket per repetition) and/or zmq (one connection)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of a loss-free case")
    ap.add_argument("--lossy-reps", type=int, default=9, help="repetitions of a lossy case")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds between repetitions")
    ap.add_argument("--medium", choices=("tun", "veth"), default="tun")
    ap.add_argument("--cc", default="cubic", help="congestion control of both ends")
    ap.add_argument("--flows", type=int, default=1, help="K > 1: K connections started together through the one "
                                                          "bottleneck (tcp path), each flow's time by rank")
    ap.add_argument("--traces", help="comma-separated trace files: A->B follows each (tools/validate_traces.py), "
                                     "at --offsets seeded random start offsets")
    ap.add_argument("--offsets", type=int, default=5, help="start offsets per trace (--traces)")
    ap.add_argument("--bin-ms", type=float, default=100.0, help="the model's trace bins (--traces; the product's default)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON record per case instead of the table")
    ap.add_argument("--resume", metavar="FILE", help="skip the cases (and paths) that FILE (--json output) already has")
    ap.add_argument("--replay", metavar="FILE", help="recompute the emulated side of the records in FILE (--json output) without the kernel")
    ap.add_argument("--serve", nargs=3, metavar=("PATH", "PORT", "CC"), help=argparse.SUPPRESS)
    ap.add_argument("--send", nargs=8, help=argparse.SUPPRESS)
    ap.add_argument("--send-flows", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.serve:
        path, port, cc = args.serve
        serve_tcp(int(port), cc) if path == "tcp" else serve_zmq(int(port))
        return 0
    if args.send_flows:
        host, port, size, reps, pause, k, cc = args.send_flows
        print(json.dumps(send_flows(host, int(port), int(size), int(reps), float(pause), int(k), cc)))
        return 0
    if args.send:
        path, host, port, size, reps, pause, idle, cc = args.send
        fn = send_tcp if path == "tcp" else send_zmq
        print(json.dumps(fn(host, int(port), int(size), int(reps), float(pause), float(idle), cc)))
        return 0
    if args.grid:
        args.rates, args.delays_ms, args.losses, args.sizes = GRID["rates"], GRID["delays_ms"], GRID["losses"], GRID["sizes"]
        args.lossless_queues_ms, args.lossy_queues_ms, args.idle_s = GRID["lossless_queue_ms"], GRID["lossy_queues_ms"], GRID["idle_s"]

    framing = TUN_FRAMING if args.medium == "tun" else VETH_FRAMING
    from emulator.flows.congestion import CONGESTION_CONTROLS  # noqa: PLC0415

    if args.cc not in CONGESTION_CONTROLS.classes:
        print(f"error: the emulator has no model of {args.cc!r} (it has {', '.join(sorted(CONGESTION_CONTROLS.classes))})")
        return 2
    params = TcpParams(congestion_control=args.cc)  # the model runs the congestion control the kernel runs
    if args.replay:
        return replay(args.replay, args, framing, params)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the namespaces are removed
    reason = why_not_possible()
    if reason:
        print(f"SKIPPED: {reason}")
        return 0
    models = [m for m in args.models.split(",") if m]
    done = measured(args.resume) if args.resume else set()
    if args.traces:
        import validate_traces  # noqa: PLC0415  (it builds on this module)

        with Testbed(args.medium, args.cc) as bed:
            validate_traces.run(args, bed, framing, params)
        return 0
    with Testbed(args.medium, args.cc) as bed:
        for case in cases(args):
            if all((case_key(case), path) in done for path in args.paths.split(",")):
                continue
            bed.path(case["delay"], case["loss"], args.seed)
            bed.shape(case["rate"], case["queue"])
            reps = args.lossy_reps if case["loss"] > 0 else args.reps
            if args.flows > 1:
                drops = bed.qdisc_drops()
                bed.line_report()  # the delay line's counters afresh
                counted = bed.tcp_counters()
                with WindowSampler(bed) as windows:
                    runs = measure_flows(bed, case["size"], reps, args.pause, args.flows)
                after = bed.tcp_counters()
                rec = flows_record(case, args.flows, runs, args, framing, params)
                rec["kernel_windows"] = windows.summary()
                rec["kernel_counters"] = {name: after[name] - counted[name] for name in LOSS_COUNTERS}
                rec["model_windows"] = model_windows(case["size"], case["rate"] * 1e6, case["delay"] / 1000, case["loss"],
                                                     case["queue"] / 1000, args.flows, framing, params, args.seed)
                # where the losses came from: the delay line's random draws, or the queue overflowing
                rec["random_drops"] = bed.line_report().get("dropped", 0)
                rec["queue_drops"] = bed.qdisc_drops() - drops
                show_flows(rec, args.json)
                continue
            for path in args.paths.split(","):
                if args.grid and path == "zmq" and (case["idle"] > 0 or case["loss"] > 0):
                    continue  # the grid runs ZeroMQ on the loss-free cases only (the long lossy ones take TCP)
                if (case_key(case), path) in done:
                    continue
                bed.line_report()  # counters afresh for this case
                kernel_times = measure(bed, path, case["size"], reps, args.pause, case["idle"])
                late = bed.line_report().get("max_lateness_s")
                for model in models:
                    rec = record(case, path, model, kernel_times, args, framing, params)
                    rec["delayline_max_late_ms"] = None if late is None else 1000 * late
                    show(rec, args.json)
    return 0


def record(case: dict, path: str, model: str, kernel_times: list[float], args, framing: Framing, params: TcpParams) -> dict:
    reps = len(kernel_times)
    kernel = statistics.median(kernel_times)
    # Fresh connections are independent draws: with loss the model's median is taken over more of
    # them than the kernel could afford, so that only the kernel's side is noisy (a kept ZeroMQ
    # connection replays the kernel's sequence, repetition for repetition).
    draws = max(reps, MODEL_DRAWS) if path == "tcp" and case["loss"] > 0 else reps
    em = statistics.median(emulated_seconds(model, path, case["size"], case["rate"] * 1e6, case["delay"] / 1000, case["loss"],
                                            case["queue"] / 1000, case["idle"], draws, args.pause, framing, params, args.seed))
    return {"rate_mbps": case["rate"], "delay_ms": case["delay"], "loss": case["loss"], "queue_ms": case["queue"],
            "payload_bytes": case["size"], "idle_s": case["idle"], "model": model, "path": path, "reps": reps,
            "kernel_s": kernel, "kernel_spread_s": max(kernel_times) - min(kernel_times), "kernel_min_s": min(kernel_times),
            "kernel_max_s": max(kernel_times), "emulated_s": em, "ratio": em / kernel, "kernel_times": kernel_times}


def show(rec: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rec), flush=True)
        return
    idle = f" idle {rec['idle_s']:g}s" if rec["idle_s"] else ""
    print(f"{rec['rate_mbps']:>5g} Mbit/s {rec['delay_ms']:>4g} ms {100 * rec['loss']:>4g} % q{rec['queue_ms']:>5g} ms "
          f"{rec['payload_bytes']:>9,} B{idle} {rec['path']:>4} {rec['model']:>5}: kernel {rec['kernel_s']:8.3f} s "
          f"(spread {rec['kernel_spread_s']:.3f})  emulated {rec['emulated_s']:8.3f} s  ratio {rec['ratio']:.3f}", flush=True)


def case_key(case: dict) -> tuple:
    return tuple(float(case[k]) for k in ("rate", "delay", "loss", "queue", "size", "idle"))


def record_case(rec: dict) -> dict:
    return dict(rate=rec["rate_mbps"], delay=rec["delay_ms"], loss=rec["loss"], queue=rec["queue_ms"],
                size=rec["payload_bytes"], idle=rec["idle_s"])


def measured(path: str) -> set:
    if not Path(path).exists():
        return set()
    recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.startswith("{")]
    return {(case_key(record_case(r)), r["path"]) for r in recs}


def replay(path: str, args, framing: Framing, params: TcpParams) -> int:
    """The emulated side again for kernel times measured earlier (after a change of the model)."""
    models = [m for m in args.models.split(",") if m]
    seen = set()
    for line in Path(path).read_text().splitlines():
        if not line.startswith("{"):
            continue
        old = json.loads(line)
        case = record_case(old)
        key = (case_key(case), old["path"])
        if key in seen:
            continue
        seen.add(key)
        for model in models:
            show(record(case, old["path"], model, old["kernel_times"], args, framing, params), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
