"""Fidelity of the link model against Linux kernel traffic shaping (tbf), root only.

    sudo python tools/validate_shaping.py [--rates 10,100,1000] [--sizes 65536,1048576,6920000] [--reps 5]

Creates two network namespaces joined by a veth pair, shapes the sender's side with a token
bucket filter at each rate, sends each payload over TCP (and over ZeroMQ) from one namespace to
the other, and measures the transfer time: from the first byte written until the receiver's one
byte acknowledgement arrives. It runs the emulator's own link model (framing plus the max-min flow
model) for the same payload and rate, and prints both times and the median emulated/kernel ratio
per rate, size and transport. Everything it creates is removed again, also on error or Ctrl-C.
When namespaces cannot be created (not root, no `ip`), it prints SKIPPED with the reason and exits 0.
netem is not available here, so only rate is checked, not delay.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.links import Framing, FlowModel  # noqa: E402

ADDR_A, ADDR_B = "10.213.7.1", "10.213.7.2"
PORT_TCP, PORT_ZMQ = 47011, 47012
ACK = b"k"
BUCKET_S = 100e-6  # tbf bucket: what the rate sends in 100 us (at least two full frames)


# ---- the two ends (run inside the namespaces) ---------------------------------------------------
def serve_tcp(port: int) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(4)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            header = conn.recv(8, socket.MSG_WAITALL)
            if len(header) < 8:
                continue
            size = int.from_bytes(header, "little")
            if size == 0:
                return
            got = 0
            buf = bytearray(1 << 20)
            while got < size:
                n = conn.recv_into(buf, min(len(buf), size - got))
                if n == 0:
                    break
                got += n
            conn.sendall(ACK)


def send_tcp(host: str, port: int, size: int, reps: int, pause: float) -> list[float]:
    payload = os.urandom(size)
    times = []
    for _ in range(reps):
        time.sleep(pause)  # let the token bucket refill and the previous connection drain
        conn = socket.create_connection((host, port))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(size.to_bytes(8, "little"))
        t0 = time.perf_counter()
        conn.sendall(payload)
        conn.recv(1)
        times.append(time.perf_counter() - t0)
        conn.close()
    return times


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


def send_zmq(host: str, port: int, size: int, reps: int, pause: float) -> list[float]:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.connect(f"tcp://{host}:{port}")
    sock.send(b"x")  # connection and ZMTP handshake happen before the clock starts
    sock.recv()
    payload = os.urandom(size)
    times = []
    for _ in range(reps):
        time.sleep(pause)
        t0 = time.perf_counter()
        sock.send(payload, copy=False)
        sock.recv()
        times.append(time.perf_counter() - t0)
    sock.send(b"")
    sock.recv()
    ctx.destroy(linger=0)
    return times


# ---- the model --------------------------------------------------------------------------------
def emulated_seconds(size: int, rate_bps: float, framing: Framing) -> float:
    """The emulator's answer for one transfer of `size` bytes alone on a link of `rate_bps`."""
    flows = FlowModel({("up", "a"): rate_bps, ("down", "b"): float("inf")})
    (fid, done_at, _), = flows.add(0, framing.link_bytes(size) * 8.0, (("up", "a"), ("down", "b")))
    return done_at


# ---- namespaces -------------------------------------------------------------------------------
class Namespaces:
    def __init__(self) -> None:
        tag = os.getpid()
        self.a, self.b = f"flemu-a-{tag}", f"flemu-b-{tag}"
        self.veth_a, self.veth_b = f"fva{tag}"[:15], f"fvb{tag}"[:15]
        self.created: list[str] = []

    def ip(self, *args: str, ns: str | None = None) -> None:
        cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    def __enter__(self) -> "Namespaces":
        for ns in (self.a, self.b):
            self.ip("ip", "netns", "add", ns)
            self.created.append(ns)
        self.ip("ip", "link", "add", self.veth_a, "netns", self.a, "type", "veth", "peer", "name", self.veth_b, "netns", self.b)
        for ns, dev, addr in ((self.a, self.veth_a, ADDR_A), (self.b, self.veth_b, ADDR_B)):
            self.ip("ip", "link", "set", "lo", "up", ns=ns)
            self.ip("ip", "addr", "add", f"{addr}/30", "dev", dev, ns=ns)
            self.ip("ip", "link", "set", dev, "up", ns=ns)
        return self

    def shape(self, rate_mbit: float) -> None:
        """tbf on the sender's egress. A transfer starts with a full bucket, which leaves at line
        rate: the bucket is kept small (BUCKET_S of the rate, at least two full frames) so that
        this head start stays a small fraction of any transfer measured here."""
        burst = max(3028, int(rate_mbit * 1e6 / 8 * BUCKET_S))
        self.ip("tc", "qdisc", "replace", "dev", self.veth_a, "root", "tbf", "rate", f"{rate_mbit}mbit",
                "burst", str(burst), "latency", "200ms", ns=self.a)

    def __exit__(self, *exc) -> None:
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def why_not_possible() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs the ip and tc commands (iproute2)"
    probe = f"flemu-probe-{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def measure(ns: Namespaces, transport: str, size: int, reps: int, pause: float) -> list[float]:
    port = PORT_TCP if transport == "tcp" else PORT_ZMQ
    me = [sys.executable, str(Path(__file__).resolve())]
    server = subprocess.Popen(["ip", "netns", "exec", ns.b, *me, "--serve", transport, str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"receiver did not start: {server.stderr.read()}")
        res = subprocess.run(["ip", "netns", "exec", ns.a, *me, "--send", transport, ADDR_B, str(port), str(size),
                              str(reps), str(pause)], capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise RuntimeError(f"sender failed: {res.stderr}")
        return json.loads(res.stdout)
    finally:
        server.kill()
        server.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10,100,1000", help="Mbit/s, comma-separated")
    ap.add_argument("--sizes", default="65536,1048576,6920000", help="payload bytes, comma-separated")
    ap.add_argument("--transports", default="tcp,zmq")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mss", type=int, default=Framing().mss)
    ap.add_argument("--segment-overhead", type=int, default=Framing().segment_overhead)
    ap.add_argument("--per-transfer-bytes", type=int, default=Framing().per_transfer_bytes)
    ap.add_argument("--json", action="store_true", help="print the results as one JSON list")
    ap.add_argument("--serve", nargs=2, metavar=("TRANSPORT", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--send", nargs=6, metavar=("TRANSPORT", "HOST", "PORT", "SIZE", "REPS", "PAUSE"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.serve:
        (serve_tcp if args.serve[0] == "tcp" else serve_zmq)(int(args.serve[1]))
        return 0
    if args.send:
        transport, host, port, size, reps, pause = args.send
        fn = send_tcp if transport == "tcp" else send_zmq
        print(json.dumps(fn(host, int(port), int(size), int(reps), float(pause))))
        return 0

    reason = why_not_possible()
    if reason:
        print(f"SKIPPED: {reason}")
        return 0
    framing = Framing(args.mss, args.segment_overhead, args.per_transfer_bytes)
    results = []
    with Namespaces() as ns:
        for rate in [float(r) for r in args.rates.split(",")]:
            ns.shape(rate)
            for size in [int(s) for s in args.sizes.split(",")]:
                for transport in args.transports.split(","):
                    kernel = statistics.median(measure(ns, transport, size, args.reps, pause=0.05))
                    model = emulated_seconds(size, rate * 1e6, framing)
                    results.append({"rate_mbit": rate, "bytes": size, "transport": transport, "reps": args.reps,
                                    "kernel_s": kernel, "emulated_s": model, "ratio": model / kernel})
                    if not args.json:
                        r = results[-1]
                        print(f"{rate:>7g} Mbit/s {size:>9,} B {transport:>4}: kernel {1000 * kernel:9.3f} ms  "
                              f"emulated {1000 * model:9.3f} ms  ratio {r['ratio']:.4f}", flush=True)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
