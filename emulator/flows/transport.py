"""TCP dynamics at flow level: the congestion window of a connection shapes the rate of the
messages on it, with no per-segment events.

A connection is one direction between two actors. It keeps its window across messages. A message
is a flow (emulator/flows/links.py) whose rate is its max-min fair share, capped by what the window lets
it send:

- Slow start sends in rounds. Round k may send W_k segments as one burst at the fair share (Linux
  CUBIC does not pace without fq), then waits for the round's first acknowledgement, one RTT after
  the round began. W doubles per round (delayed ACKs with ABC give 2 per ACK of 2) until a round's
  burst lasts the whole RTT: then the window covers the flow's share of the path, and slow start
  ends with W = min(2 W_k, BDP + min(BDP, the flow's part of the bottleneck queue)): Linux grows it
  in slow start only while it is below twice what is in flight, and past BDP + buffer the queue
  would overflow. HyStart's ACK-train test (on by default) ends it earlier, at W_k + BDP/2, once a
  round's ACKs (two segments each, at most 2 ms apart: a share above 12 Mbit/s) last more than
  half the RTT. That is a handful of rate steps, one per RTT.
- Congestion avoidance follows CUBIC's window, W(t) = C (t - K)^3 + W_max, with its TCP-friendly
  floor W_max*beta + 3(1 - beta)/(1 + beta) t/RTT, capped at the receive window (no buffer-overflow
  sawtooth is modelled). A window-limited flow gets its rate W/RTT stepped on whole RTTs each time
  the window has grown by `growth_step`; a flow whose window covers its share has no window events
  at all (Linux grows the window only while it limits the flow, so nothing changes either).
- Random loss: the segments between two losses are drawn from a geometric law (seeded by the
  transfer). A loss costs its segment again (the flow's bits grow by one segment) and, once per
  recovery episode (one RTT), cuts W to beta*W (fast convergence as in Linux); in slow start W is
  the window the ACKs of the round's segments before the lost one have grown it to. While beta*W still
  covers the flow's share of the path (the queue absorbs the cut) the link stays busy and the loss
  costs only its bytes. A loss delays the end of the transfer only near its tail: the last byte
  cannot leave before the retransmission does, one RTT after the loss when at least three segments
  follow it (SACK fast retransmit), 1.25 RTT with one or two (RACK's reordering window), 2 RTT when
  it was the last segment (Linux's tail loss probe). A lost retransmission costs an RTO.
- Idle restart: a connection idle for more than one RTO halves its window per RTO of idleness,
  down to the initial window, and slow-starts back to 3/4 of what it had
  (tcp_slow_start_after_idle=1, Linux's tcp_cwnd_restart). The RTO is Linux's for a steady RTT: 3 RTT
  after the first sample, its variance term decaying by a quarter per RTT to srtt + rto_min.
- Queues: each link has a buffer (seconds of its rate). The part of a flow's window beyond its
  share of the path's BDP stands in the queue of its bottleneck link and adds queueing delay to the
  RTT of every flow through that link.

A path with no delay and no rate limit has no RTT to count rounds in: such flows are not held
back by a window (they behave as in the fluid model)."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable

import numpy as np

INF = math.inf
EPS_BITS = 1e-6


@dataclass(frozen=True)
class TcpParams:
    """Linux defaults: initial window 10 (RFC 6928), CUBIC beta 0.7 and C 0.4 (RFC 9438),
    tcp_slow_start_after_idle=1, a 200 ms minimum RTO. The receive window's ceiling is what Linux's
    autotuning reaches with tcp_rmem[2] = 6 MiB and tcp_adv_win_scale = 1: 3 MiB."""

    initcwnd: int = 10
    beta: float = 0.7
    cubic_c: float = 0.4
    rwnd_bytes: int = 3 * 2**20
    restart_after_idle: bool = True
    rto_min_s: float = 0.2
    growth_step: float = 0.05  # a window-limited flow's rate steps when CUBIC has grown its window by this fraction
    hystart: bool = True  # HyStart's ACK-train test (Linux CUBIC's default): leave slow start at W + BDP/2
    hystart_ack_delta_s: float = 0.002  # ...when delayed ACKs (2 segments) come at most this far apart


# ---- pure window arithmetic ------------------------------------------------------------------
def cubic_window(t: float, w_max: float, origin: float, rtt: float, c: float = 0.4, beta: float = 0.7) -> float:
    """CUBIC's window t seconds into an epoch that began at window `origin` below (or above) the
    last maximum `w_max`: the cubic curve through origin at t = 0, or its TCP-friendly floor."""
    t = max(0.0, t)
    if origin < w_max:
        k = ((w_max - origin) / c) ** (1.0 / 3.0)
        cubic = w_max + c * (t - k) ** 3
    else:
        cubic = origin + c * t**3
    friendly = origin + 3.0 * (1.0 - beta) / (1.0 + beta) * (t / rtt if rtt > 0 else 0.0)
    return max(cubic, friendly)


def idle_restart(cwnd: float, idle_s: float, rto_s: float, initcwnd: float) -> float:
    """Linux's tcp_cwnd_restart: the window halved once per full RTO of idleness past the first,
    never below min(initcwnd, cwnd). Only called when idle_s > rto_s."""
    restart = min(float(initcwnd), cwnd)
    delta = idle_s - rto_s
    while delta > 0 and cwnd > restart:
        cwnd = float(int(cwnd) >> 1)
        delta -= rto_s
    return max(cwnd, restart)


def rto(srtt: float, rto_min_s: float, rtts_measured: float = INF) -> float:
    """Linux's RTO, srtt + rttvar, for a steady RTT (tcp_rtt_estimator): the first sample sets
    rttvar to 2 srtt (an RTO of 3 RTT); once per RTT it moves a quarter of the way to the largest
    deviation of that RTT, which is floored at rto_min, so it decays towards rto_min."""
    first = max(2 * srtt, rto_min_s)
    rounds = max(0.0, rtts_measured - 1) if rtts_measured < INF else INF
    return srtt + rto_min_s + (first - rto_min_s) * (0.75 ** rounds if rounds < INF else 0.0)


def after_loss(cwnd: float, w_max: float, beta: float) -> tuple[float, float]:
    """One congestion event: (new window, new W_max), with CUBIC's fast convergence (a flow that
    lost below its last maximum remembers less than it had)."""
    new_max = cwnd * (1.0 + beta) / 2.0 if cwnd < w_max else cwnd
    return max(2.0, cwnd * beta), new_max


def recovery_delay(rtt: float, segments_after: int) -> float:
    """How long after a loss its retransmission leaves: dupACK/SACK recovery needs three later
    segments, RACK waits a quarter RTT more with fewer, and a lost last segment waits for the tail
    loss probe (2 srtt)."""
    if segments_after >= 3:
        return rtt
    if segments_after >= 1:
        return 1.25 * rtt
    return 2.0 * rtt


# ---- state ------------------------------------------------------------------------------------
@dataclass(slots=True)  # slots: emulator/flows/_flowfill.c reads and writes them in place
class Connection:
    cwnd: float
    ssthresh: float = INF
    w_max: float = 0.0
    origin: float = 0.0
    epoch: float = 0.0
    srtt: float = 0.0
    rtts: float = 0.0  # RTTs of samples the connection has had (its RTO estimate settles with them)
    last_send: float = -INF
    sending_since: float = 0.0
    active: Hashable | None = None
    waiting: deque = field(default_factory=deque)


@dataclass(slots=True)  # slots: emulator/flows/_flowfill.c reads and writes them in place
class TcpState:
    """The window state a flow carries while it sends (its connection holds what persists)."""

    conn: Connection
    rtt_base: float  # propagation RTT plus a segment's serialization at the path's narrowest link
    seg_bits: float  # link bits of one full segment
    mss: int  # payload bytes of one full segment (the receive window counts these)
    loss: float
    rng: np.random.Generator | None
    phase: str = "ss"  # "ss" | "ca" | "open" (no RTT: no window)
    round_end: float = INF
    budget: float = INF  # slow start: bits the current round may still send
    loss_in: float = INF  # bits until the next lost segment leaves
    recovery_until: float = -INF
    floor: float = -INF  # the last byte cannot leave before this (a retransmission)
    limited: bool = False  # congestion avoidance: the window held the rate down at the last rebalance
    resent_bits: float = 0.0
    queues: Any = None  # the flow model, whose standing queues delay this flow (None: no queues)
    fid: Hashable = None
    path: tuple = ()
    # its window as a link of the max-min filling, and the path with it: built once, not at every
    # rebalance (FlowModel._rebalance)
    window_key: Hashable = field(default=None, init=False, repr=False, compare=False)
    window_path: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.window_key = ("window", self.fid)
        self.window_path = (*self.path, self.window_key)

    @property
    def qdelay(self) -> float:
        """Queueing delay on the path, from the standing queues as last updated."""
        return self.queues.path_qdelay(self.path) if self.queues is not None else 0.0

    @property
    def own_qdelay(self) -> float:
        """The part of it that is this flow's own window beyond its BDP."""
        return self.queues.own_qdelay(self.fid) if self.queues is not None else 0.0

    @property
    def rtt(self) -> float:
        return self.rtt_base + self.qdelay


class TcpTransport:
    """The window rules of the module docstring, as hooks the flow model calls."""

    def __init__(self, params: TcpParams | None = None):
        self.p = params or TcpParams()
        self.connections: dict[Hashable, Connection] = {}

    def connection(self, key: Hashable) -> Connection:
        conn = self.connections.get(key)
        if conn is None:
            conn = self.connections[key] = Connection(cwnd=float(self.p.initcwnd))
        return conn

    # -- a flow begins sending (it owns its connection now) --
    def begin(self, flow, now: float) -> None:
        st: TcpState = flow.tcp
        conn = st.conn
        if st.rtt_base <= 0:
            st.phase = "open"
            return
        conn.srtt = conn.srtt or st.rtt_base
        conn.sending_since = now
        idle = now - conn.last_send
        rto_s = rto(conn.srtt, self.p.rto_min_s, conn.rtts)
        if self.p.restart_after_idle and conn.last_send > -INF and idle > rto_s:
            conn.ssthresh = max(conn.ssthresh if conn.ssthresh < INF else 0.0, 0.75 * conn.cwnd)
            conn.cwnd = idle_restart(conn.cwnd, idle, rto_s, self.p.initcwnd)
        if conn.cwnd < conn.ssthresh:
            st.phase = "ss"
            st.budget = conn.cwnd * st.seg_bits
            st.round_end = now + st.rtt
        else:
            self._enter_ca(st, now, conn.cwnd)
        self._draw_loss(st)

    def _draw_loss(self, st: TcpState) -> None:
        st.loss_in = (float(st.rng.geometric(st.loss)) - 0.5) * st.seg_bits if st.loss > 0 and st.rng is not None else INF

    def _enter_ca(self, st: TcpState, now: float, cwnd: float) -> None:
        conn = st.conn
        st.phase = "ca"
        conn.cwnd = cwnd
        conn.origin = cwnd
        conn.epoch = now
        conn.w_max = max(conn.w_max, cwnd)
        st.budget = INF
        st.round_end = now + st.rtt

    def window(self, st: TcpState, now: float, rtt: float | None = None) -> float:
        """`rtt`: st.rtt when the caller has it already (it sums the path's queues)."""
        conn = st.conn
        if st.phase != "ca":
            return conn.cwnd
        return cubic_window(now - conn.epoch, conn.w_max, conn.origin, st.rtt if rtt is None else rtt,
                            self.p.cubic_c, self.p.beta)

    # -- the rate cap the window sets --
    def cap(self, flow, now: float) -> float:
        st: TcpState = flow.tcp
        if st.phase == "open":
            return INF
        if st.phase == "ss":
            return INF if st.budget > EPS_BITS else 0.0
        # the flow's own standing queue is not in the way of its own rate (W over RTT with its own
        # queue in the RTT is its share exactly): only the others' queue slows it
        return st.conn.cwnd * st.seg_bits / (st.rtt - st.own_qdelay)

    def after_rates(self, flow, now: float, limited: bool) -> None:
        """Told whether the window, rather than a link, set the flow's new rate."""
        st: TcpState = flow.tcp
        if st.phase == "ca":
            was = st.limited
            st.limited = limited
            if st.limited and not was:  # growth resumes from here (Linux: only while cwnd-limited)
                st.conn.epoch = now
                st.conn.origin = st.conn.cwnd
                # the rate was just set from the window as it is: the first step keeps it
                self._next_growth_step(st, now, mean=False)

    def next_event(self, flow, now: float) -> float:
        """The earliest of: the last bit, the next loss, the end of the slow-start round's budget,
        the end of the round (a window step). Called for every flow whose rate moved."""
        st: TcpState = flow.tcp
        rate = flow.rate
        phase = st.phase
        due = INF
        if rate > 0:
            if rate < INF:
                due = now + flow.remaining_bits / rate
                if st.loss_in < INF:
                    t = now + st.loss_in / rate
                    if t < due:
                        due = t
                if phase == "ss" and st.budget > EPS_BITS:
                    t = now + st.budget / rate
                    if t < due:
                        due = t
            else:
                due = now
        if (phase == "ss" or (phase == "ca" and st.limited)) and st.round_end < due:
            due = st.round_end
        return due

    def sent(self, flow, bits: float) -> None:
        st: TcpState = flow.tcp
        if st.budget < INF:
            st.budget = max(0.0, st.budget - bits)
        if st.loss_in < INF:
            st.loss_in -= bits

    def instant_bits(self, flow) -> float:
        """Bits an infinitely fast path moves at once: the whole round's budget in slow start."""
        st: TcpState = flow.tcp
        return min(flow.remaining_bits, st.budget) if st.phase == "ss" else flow.remaining_bits

    # -- the flow's event is due --
    def fire(self, flow, now: float, share_bits_per_rtt: float, queue_allowance_bits: float) -> None:
        st: TcpState = flow.tcp
        conn = st.conn
        if st.loss_in <= EPS_BITS:
            self._on_loss(flow, now, share_bits_per_rtt)
        if st.phase == "ss" and now >= st.round_end - 1e-12:
            if self._hystart_fires(st, share_bits_per_rtt):
                # the round's ACK train outlasted half the RTT: HyStart ends slow start with the
                # window grown by the ACKs of that half RTT
                bdp = share_bits_per_rtt / st.seg_bits
                w = min(2 * conn.cwnd, conn.cwnd + bdp / 2, self._rwnd(st))
                conn.ssthresh = w
                self._enter_ca(st, now, w)
            elif st.budget > EPS_BITS:  # the round's burst outlasted the RTT: the window covers the path
                w = min(2 * conn.cwnd, max(conn.cwnd, self._slow_start_exit(st, share_bits_per_rtt, queue_allowance_bits)),
                        self._rwnd(st))
                conn.ssthresh = w
                self._enter_ca(st, now, w)
            else:
                w = min(2 * conn.cwnd, conn.ssthresh, self._rwnd(st))
                conn.cwnd = w
                if w >= conn.ssthresh:
                    self._enter_ca(st, now, w)
                else:
                    st.budget = w * st.seg_bits
                    st.round_end = now + st.rtt
        elif st.phase == "ca" and st.limited and now >= st.round_end - 1e-12:
            self._next_growth_step(st, now)

    def _next_growth_step(self, st: TcpState, now: float, mean: bool = True) -> None:
        """CUBIC's growth of a window-limited flow as rate steps: the next step is the first RTT
        boundary where the window has grown by `growth_step` (at most 64 RTTs on), and until then
        the flow sends with the mean of the window at both ends of the step, so the bits it moves
        match the curve's to second order. It grows only while it limits the flow, so it overshoots
        what covers the path by at most one step."""
        conn = st.conn
        rwnd = self._rwnd(st)
        rtt = st.rtt  # the queues do not move during this call
        start = max(conn.cwnd, min(self.window(st, now, rtt), rwnd)) if now > conn.epoch else conn.cwnd
        end, k = start, 0
        while k < 64 and end < start * (1 + self.p.growth_step) and end < rwnd:
            k += 1
            end = min(self.window(st, now + k * rtt, rtt), rwnd)
        conn.cwnd = max(start, (start + end) / 2) if mean else start
        st.round_end = now + max(1, k) * rtt

    def _slow_start_exit(self, st: TcpState, share_bits_per_rtt: float, queue_allowance_bits: float) -> float:
        """The window slow start ends at once its bursts fill the path (and HyStart did not end it
        before): Linux grows it while it is below twice what is in flight, up to the BDP plus the
        buffer, past which the queue overflows."""
        bdp = share_bits_per_rtt / st.seg_bits
        return bdp + min(queue_allowance_bits / st.seg_bits, bdp)

    def _hystart_fires(self, st: TcpState, share_bits_per_rtt: float) -> bool:
        """HyStart's ACK-train test: the ACKs of this round's burst (two segments each) come at most
        hystart_ack_delta_s apart, which needs a share above 12 Mbit/s, and the train lasts more
        than half the RTT."""
        if not self.p.hystart or st.rtt_base <= 0 or share_bits_per_rtt <= 0:
            return False
        share = share_bits_per_rtt / st.rtt_base
        return 2 * st.seg_bits / share <= self.p.hystart_ack_delta_s and st.conn.cwnd * st.seg_bits / share >= st.rtt / 2

    @staticmethod
    def _sent_this_round(st: TcpState) -> float:
        """Segments the current slow-start round has sent so far: their ACKs grow the window one each."""
        return max(0.0, st.conn.cwnd * st.seg_bits - st.budget) / st.seg_bits

    def _rtts_so_far(self, st: TcpState, now: float) -> float:
        """RTTs of samples the connection has had, the current flow's included."""
        return st.conn.rtts + (now - st.conn.sending_since) / st.rtt

    def _rwnd(self, st: TcpState) -> float:
        return max(float(self.p.initcwnd), self.p.rwnd_bytes / st.mss)

    def _on_loss(self, flow, now: float, share_bits_per_rtt: float) -> None:
        st: TcpState = flow.tcp
        conn = st.conn
        st.resent_bits += st.seg_bits
        flow.remaining_bits += st.seg_bits
        segments_after = int(max(0.0, flow.remaining_bits - st.seg_bits) // st.seg_bits)
        floor = now + recovery_delay(st.rtt, segments_after)
        if st.rng.random() < st.loss:  # the retransmission is lost too: only the RTO recovers it
            floor += rto(st.rtt, self.p.rto_min_s, self._rtts_so_far(st, now))
        st.floor = max(st.floor, floor)
        if now >= st.recovery_until:  # one window cut per recovery episode
            st.recovery_until = now + st.rtt
            cwnd = conn.cwnd  # (CUBIC's growth is applied per RTT, and only while the window limits the flow)
            if st.phase == "ss" and st.budget < INF:
                # seen one RTT later, when the ACKs of the round's segments before the lost one
                # have grown the window by one each (the ones after it are duplicate ACKs)
                cwnd += self._sent_this_round(st)
            new, conn.w_max = after_loss(cwnd, conn.w_max, self.p.beta)
            conn.ssthresh = new
            st.phase = "ca"
            st.budget = INF
            conn.cwnd = new
            conn.origin = new
            conn.epoch = now
            st.round_end = now + st.rtt
            st.limited = False
        self._draw_loss(st)

    def end(self, flow, now: float) -> None:
        st: TcpState = flow.tcp
        conn = st.conn
        if st.phase == "ss" and st.budget < INF:
            # slow start grows the window per ACK: the acknowledgements of this round's segments,
            # still on their way, add one segment each
            conn.cwnd = min(conn.ssthresh, self._rwnd(st), conn.cwnd + self._sent_this_round(st))
        if st.rtt > 0:
            conn.rtts = self._rtts_so_far(st, now) + 1  # its acknowledgements are one more RTT of samples
        conn.last_send = now
        conn.active = None
