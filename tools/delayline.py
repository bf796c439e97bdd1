"""A user-space delay line between two network namespaces, after Mahimahi's mm-delay. Root only.

    sudo python tools/delayline.py --ns-a A --ns-b B --dev-a tunA --dev-b tunB \\
        --addr-a 10.213.9.1 --addr-b 10.213.9.2 --delay-ms 40 --loss 0.005 --seed 1

This kernel has no netem, so delay and loss come from user space. The process opens one TUN
device for each side (created here, then moved into its namespace, so no setns is needed), gives
them point-to-point addresses, prints `ready`, and from then on forwards every IP packet that one
side's kernel sends to the other side's kernel after `--delay-ms` (one way, both directions; a
constant delay keeps each direction in order). Packets from A to B are dropped with probability
`--loss`, drawn from a generator seeded with `--seed`; B to A (acknowledgements) is never dropped,
since the emulator's loss is a property of the data segments. Rate and queue are not done here:
put `tbf` on A's TUN egress (the packet reaches the delay line after tbf has let it go).

On SIGUSR1 it prints one JSON line with its counters and starts them afresh (so a caller can
tell, case by case, how late it released packets: a starved delay line is a perturbed
measurement); on SIGTERM or SIGINT it prints them and exits; the TUN devices vanish with it. Framing: a TUN device carries bare IP packets, so a full TCP segment of 1448 payload bytes
is 1500 bytes on this link (no Ethernet header).
"""
from __future__ import annotations

import argparse
import fcntl
import heapq
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65536


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")


def place(dev: str, ns: str, addr: str, peer: str) -> None:
    run(["ip", "link", "set", dev, "netns", ns])
    inside = ["ip", "netns", "exec", ns]
    run([*inside, "ip", "addr", "add", addr, "peer", peer, "dev", dev])
    run([*inside, "ip", "link", "set", dev, "up"])
    run([*inside, "ip", "link", "set", "lo", "up"])


class DelayLine:
    """Forwards packets between two file descriptors after a fixed delay, dropping A->B packets
    at random. Pure event loop: select() with microsecond timeouts, one heap of due packets."""

    def __init__(self, fd_a: int, fd_b: int, delay_s: float, loss: float, seed: int):
        self.fd_a, self.fd_b = fd_a, fd_b
        self.delay_s = delay_s
        self.loss = loss
        self.rng = random.Random(seed)
        self.due: list[tuple[float, int, int, bytes]] = []
        self.seq = 0
        self.counts = self.fresh_counts()
        self.running = True
        self.report = False

    @staticmethod
    def fresh_counts() -> dict:
        return {"a_to_b": 0, "b_to_a": 0, "dropped": 0, "bytes_a_to_b": 0, "max_lateness_s": 0.0}

    def _take(self, fd: int, now: float) -> None:
        out = self.fd_b if fd == self.fd_a else self.fd_a
        while True:
            try:
                packet = os.read(fd, MAX_PACKET)
            except BlockingIOError:
                return
            if fd == self.fd_a:
                if self.loss and self.rng.random() < self.loss:
                    self.counts["dropped"] += 1
                    continue
                self.counts["a_to_b"] += 1
                self.counts["bytes_a_to_b"] += len(packet)
            else:
                self.counts["b_to_a"] += 1
            self.seq += 1
            heapq.heappush(self.due, (now + self.delay_s, self.seq, out, packet))

    def _release(self, now: float) -> None:
        while self.due and self.due[0][0] <= now:
            at, _, out, packet = heapq.heappop(self.due)
            self.counts["max_lateness_s"] = max(self.counts["max_lateness_s"], now - at)
            try:
                os.write(out, packet)
            except BlockingIOError:
                pass  # the receiving kernel's queue is full: a drop, as on a real link

    def run(self) -> None:
        fds = [self.fd_a, self.fd_b]
        while self.running:
            now = time.monotonic()
            timeout = max(0.0, self.due[0][0] - now) if self.due else 0.2
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                continue
            now = time.monotonic()
            for fd in ready:
                self._take(fd, now)
            self._release(time.monotonic())
            if self.report:
                self.report = False
                print(json.dumps(self.counts), flush=True)
                self.counts = self.fresh_counts()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns-a", required=True)
    ap.add_argument("--ns-b", required=True)
    ap.add_argument("--dev-a", required=True)
    ap.add_argument("--dev-b", required=True)
    ap.add_argument("--addr-a", required=True)
    ap.add_argument("--addr-b", required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each direction")
    ap.add_argument("--loss", type=float, default=0.0, help="drop probability of an A->B packet")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 0 <= args.loss < 1 or args.delay_ms < 0:
        print(f"delayline: --loss must be in [0, 1) and --delay-ms >= 0, got {args.loss}, {args.delay_ms}", file=sys.stderr)
        return 2

    fd_a, fd_b = open_tun(args.dev_a), open_tun(args.dev_b)
    place(args.dev_a, args.ns_a, args.addr_a, args.addr_b)
    place(args.dev_b, args.ns_b, args.addr_b, args.addr_a)
    line = DelayLine(fd_a, fd_b, args.delay_ms / 1000.0, args.loss, args.seed)

    def stop(*_):
        line.running = False

    def report(*_):
        line.report = True

    signal.signal(signal.SIGUSR1, report)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    line.run()
    print(json.dumps(line.counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
