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

With `--trace FILE` the A->B direction is a trace-driven bottleneck, as Mahimahi's `mm-link`
replays one: a packet leaves a drop-tail queue of `--queue-packets` only at a delivery opportunity
of the trace (one per 1500 bytes, at its millisecond; a packet larger than what one opportunity
has left takes the next ones too; an opportunity with nothing queued is lost), then takes the
one-way delay. The trace loops. Its clock starts at `--trace-offset-ms` when the first data
packet (1000 bytes or more) arrives, and again at the first one after `--rearm-s` without any, so
every repetition of a measurement meets the same part of the trace. A `time_s Mbit/s` series (the
Pensieve-cooked traces) is turned into opportunities as its rate accumulates 1500 bytes. Put no
`tbf` on A's TUN then: the trace is the rate.

On SIGUSR1 it prints one JSON line with its counters and starts them afresh (so a caller can
tell, case by case, how late it released packets: a starved delay line is a perturbed
measurement); on SIGTERM or SIGINT it prints them and exits; the TUN devices vanish with it. Framing: a TUN device carries bare IP packets, so a full TCP segment of 1448 payload bytes
is 1500 bytes on this link (no Ethernet header).
"""
from __future__ import annotations

import argparse
import bisect
import fcntl
import heapq
import json
import math
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
from collections import deque

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


PACKET_BYTES = 1500  # what one delivery opportunity carries (mm-link)
DATA_BYTES = 1000  # a packet this large is data, not an ACK or a handshake: it may start the trace's clock


def opportunities(text: str) -> list[int]:
    """The delivery opportunities of a trace in ms: Mahimahi's lines as they are, or those of a
    `time_s Mbit/s` series, one each time its rate has carried 1500 more bytes."""
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if all(line.isdigit() for line in lines):
        return [int(line) for line in lines]
    samples = [tuple(float(x) for x in line.replace(",", " ").split()[:2]) for line in lines]
    gap = (samples[-1][0] - samples[0][0]) / max(1, len(samples) - 1)
    out, carried = [], 0.0
    for (t, mbps), end in zip(samples, [s[0] for s in samples[1:]] + [samples[-1][0] + gap]):
        for ms in range(int(round((t - samples[0][0]) * 1000)), int(round((end - samples[0][0]) * 1000))):
            carried += mbps * 1e6 / 8 / 1000
            while carried >= PACKET_BYTES:
                out.append(ms)
                carried -= PACKET_BYTES
    return out


class TraceBottleneck:
    """mm-link's side of A->B: a drop-tail queue before the trace's delivery opportunities."""

    def __init__(self, times_ms: list[int], offset_ms: float, limit: int, rearm_s: float):
        if not times_ms or times_ms[-1] <= 0:
            raise ValueError("the trace has no delivery opportunity after 0 ms")
        self.times, self.period = times_ms, times_ms[-1]
        self.offset_ms, self.limit, self.rearm_s = offset_ms % self.period, limit, rearm_s
        self.queue: deque = deque()  # [bytes still to deliver, packet]
        self.start: float | None = None  # when the trace's clock read offset_ms
        self.last_data = -math.inf
        self.next_at = math.inf  # the next opportunity that has something to deliver
        self.next_index = 0  # its index in the looped sequence of opportunities

    def _opportunity(self, j: int) -> float:
        """Wall time of the j-th opportunity (counted over the looped trace from its start)."""
        n = len(self.times)
        ms = self.times[j % n] + self.period * (j // n)
        return self.start + (ms - self.offset_ms) / 1000.0

    def _first_from(self, now: float) -> None:
        """Point at the first opportunity at or after now."""
        elapsed = (now - self.start) * 1000.0 + self.offset_ms
        loops, within = divmod(elapsed, self.period)
        j = int(loops) * len(self.times) + bisect.bisect_left(self.times, math.ceil(within))
        while self._opportunity(j) < now - 1e-9:
            j += 1
        self.next_index, self.next_at = j, self._opportunity(j)

    def offer(self, packet: bytes, now: float) -> bool:
        """A packet from A: queued (True) or dropped at the tail (False)."""
        if len(packet) >= DATA_BYTES:
            if self.start is None or now - self.last_data > self.rearm_s:
                self.start = now
                self.queue.clear()
            self.last_data = now
        if self.start is None:
            self.start = now
        if len(self.queue) >= self.limit:
            return False
        if not self.queue:
            self._first_from(now)
        self.queue.append([len(packet), packet])
        return True

    def deliver(self, now: float) -> list[tuple[float, bytes]]:
        """The packets whose last byte an opportunity up to now carried, with that opportunity's time."""
        out = []
        while self.queue and self.next_at <= now:
            room = PACKET_BYTES
            while self.queue and room > 0:
                head = self.queue[0]
                take = min(room, head[0])
                head[0] -= take
                room -= take
                if head[0] == 0:
                    out.append((self.next_at, self.queue.popleft()[1]))
            self.next_index += 1
            self.next_at = self._opportunity(self.next_index) if self.queue else math.inf
        return out


class DelayLine:
    """Forwards packets between two file descriptors after a fixed delay, dropping A->B packets
    at random. Pure event loop: select() with microsecond timeouts, one heap of due packets."""

    def __init__(self, fd_a: int, fd_b: int, delay_s: float, loss: float, seed: int,
                 bottleneck: TraceBottleneck | None = None):
        self.fd_a, self.fd_b = fd_a, fd_b
        self.bottleneck = bottleneck
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
        return {"a_to_b": 0, "b_to_a": 0, "dropped": 0, "queue_dropped": 0, "bytes_a_to_b": 0, "max_lateness_s": 0.0}

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
                if self.bottleneck is not None:
                    if not self.bottleneck.offer(packet, now):
                        self.counts["queue_dropped"] += 1
                    continue
            else:
                self.counts["b_to_a"] += 1
            self.seq += 1
            heapq.heappush(self.due, (now + self.delay_s, self.seq, out, packet))

    def _release(self, now: float) -> None:
        if self.bottleneck is not None:
            for left_at, packet in self.bottleneck.deliver(now):
                self.seq += 1
                heapq.heappush(self.due, (left_at + self.delay_s, self.seq, self.fd_b, packet))
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
            wake = min(self.due[0][0] if self.due else math.inf,
                       self.bottleneck.next_at if self.bottleneck is not None else math.inf)
            timeout = max(0.0, wake - now) if wake < math.inf else 0.2
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
    ap.add_argument("--trace", help="A->B follows this trace (mm-link's format, or a time_s Mbit/s series)")
    ap.add_argument("--trace-offset-ms", type=float, default=0.0, help="where in the trace its clock starts")
    ap.add_argument("--queue-packets", type=int, default=1000, help="the trace bottleneck's drop-tail queue")
    ap.add_argument("--rearm-s", type=float, default=0.5, help="a data packet after this long without one restarts the trace")
    args = ap.parse_args()
    if not 0 <= args.loss < 1 or args.delay_ms < 0:
        print(f"delayline: --loss must be in [0, 1) and --delay-ms >= 0, got {args.loss}, {args.delay_ms}", file=sys.stderr)
        return 2

    fd_a, fd_b = open_tun(args.dev_a), open_tun(args.dev_b)
    place(args.dev_a, args.ns_a, args.addr_a, args.addr_b)
    place(args.dev_b, args.ns_b, args.addr_b, args.addr_a)
    bottleneck = None
    if args.trace:
        with open(args.trace) as f:
            bottleneck = TraceBottleneck(opportunities(f.read()), args.trace_offset_ms, args.queue_packets, args.rearm_s)
    line = DelayLine(fd_a, fd_b, args.delay_ms / 1000.0, args.loss, args.seed, bottleneck)

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
