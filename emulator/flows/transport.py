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
- Congestion avoidance is the connection's congestion control's (emulator/flows/congestion.py):
  by default CUBIC's window, W(t) = C (t - K)^3 + W_max, with its TCP-friendly
  floor W_max*beta + 3(1 - beta)/(1 + beta) t/RTT, capped at the receive window (no buffer-overflow
  sawtooth is modelled), read in whole segments as Linux holds it. A window-limited flow gets its
  rate W/RTT stepped on whole RTTs each time the window has grown by `growth_step` (a small window:
  by one segment); a flow whose window covers its share has no window events at all (Linux grows
  the window only while it limits the flow, so nothing changes either).
- Random loss: the segments between two losses are drawn from a geometric law (seeded by the
  transfer). A loss costs its segment again (the flow's bits grow by one segment) and, once per
  recovery episode (one RTT), cuts W to beta*W rounded down to whole segments (fast convergence
  as in Linux); in slow start W is
  the window the ACKs of the round's segments before the lost one have grown it to. The window
  grows again only when the recovery has ended, one RTT after the cut (Linux grows it neither in
  Recovery nor in CWR). The cut itself comes at the loss, not one RTT later when the kernel
  detects it (measured: with that delay too the model comes out faster, not slower; see
  docs/2026-12-07-shared-loss.md). While beta*W still
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
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from node.seeding import keep, lend

from .congestion import CONGESTION_CONTROLS, CongestionControl, after_loss, cubic_window, idle_restart, receive_window
from .records import CONNECTION_FIELDS, WINDOW_FIELDS, ConnectionRecord, Record, WindowRecord

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
    congestion_control: str = "cubic"  # registered in congestion.CONGESTION_CONTROLS, or "package.module:Class"


# ---- pure arithmetic every congestion control shares -------------------------------------------
def rto(srtt: float, rto_min_s: float, rtts_measured: float = INF) -> float:
    """Linux's RTO, srtt + rttvar, for a steady RTT (tcp_rtt_estimator): the first sample sets
    rttvar to 2 srtt (an RTO of 3 RTT); once per RTT it moves a quarter of the way to the largest
    deviation of that RTT, which is floored at rto_min, so it decays towards rto_min."""
    first = max(2 * srtt, rto_min_s)
    rounds = max(0.0, rtts_measured - 1) if rtts_measured < INF else INF
    return srtt + rto_min_s + (first - rto_min_s) * (0.75 ** rounds if rounds < INF else 0.0)


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
class Connection(Record, ConnectionRecord):
    """A connection's window (records.py holds its fields): what persists across its messages."""

    __slots__ = ()
    FIELDS = CONNECTION_FIELDS

    def __init__(self, cwnd: float, ssthresh: float = INF, cc: Any = None, control: CongestionControl | None = None):
        self.cwnd = cwnd
        self.ssthresh = ssthresh
        self.srtt = 0.0
        self.rtts = 0.0  # RTTs of samples the connection has had (its RTO estimate settles with them)
        self.last_send = -INF
        self.sending_since = 0.0
        self.active: Hashable | None = None
        # its flows that wait for the one sending (a deque, made when the first waits: an empty deque
        # is about 600 bytes, and a population keeps a connection per device for the whole run)
        self.waiting: deque | None = None
        self.cc = cc  # its congestion control's own state
        self.control = control  # its congestion control (the sender's)


class TcpState(Record, WindowRecord):
    """The window state a flow carries while it sends (its connection holds what persists)."""

    __slots__ = ()
    FIELDS = WINDOW_FIELDS

    def __init__(self, conn: Connection, rtt_base: float, seg_bits: float, mss: int, loss: float,
                 rng: np.random.Generator | tuple | None, *, queues: Any = None, fid: Hashable = None, path: tuple = ()):
        self.conn = conn
        self.rtt_base = rtt_base  # propagation RTT plus a segment's serialization at the path's narrowest link
        self.seg_bits = seg_bits  # link bits of one full segment
        self.mss = mss  # payload bytes of one full segment (the receive window counts these)
        self.loss = loss
        self.rng = rng  # its loss draws: a generator, or a parked stream (node/seeding.py)
        self.phase = "ss"  # "ss" | "ca" | "open" (no RTT: no window)
        self.round_end = INF
        self.budget = INF  # slow start: bits the current round may still send
        self.loss_in = INF  # bits until the next lost segment leaves
        self.recovery_until = -INF
        self.floor = -INF  # the last byte cannot leave before this (a retransmission)
        self.limited = False  # congestion avoidance: the window held the rate down at the last rebalance
        self.resent_bits = 0.0
        self.pacing = INF  # the congestion control's pacing rate, bits/s (INF: it does not pace)
        self.wakeup = INF  # a time the congestion control asked to decide at, whatever limits the flow
        self.queues = queues  # the flow model, whose standing queues delay this flow (None: no queues)
        self.fid = fid
        self.path = path
        # its window as a link of the max-min filling, and the path with it: built once, not at
        # every rebalance (FlowModel._rebalance)
        self.window_key = ("window", fid)
        self.window_path = (*path, self.window_key)

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

    @property
    def flow_rate(self) -> float:
        """The flow's rate as last set (what it delivers now)."""
        return self.queues.flows[self.fid].rate if self.queues is not None else INF


class TcpTransport:
    """The window rules of the module docstring, as hooks the flow model calls; what the window does
    is the congestion control's (`cc`, emulator/flows/congestion.py)."""

    def __init__(self, params: TcpParams | None = None, cc: CongestionControl | None = None):
        self.p = params or TcpParams()
        self.cc = cc or CONGESTION_CONTROLS.get(self.p.congestion_control)(self.p)  # the default sender's
        self.controls: dict[str, CongestionControl] = {}  # the others, by the name a sender gave
        self.connections: dict[Hashable, Connection] = {}

    def control(self, name: str | None) -> CongestionControl:
        """The congestion control a sender names (None: the transport's own)."""
        if name is None:
            return self.cc
        control = self.controls.get(name)
        if control is None:
            control = self.controls[name] = CONGESTION_CONTROLS.get(name)(self.p)
        return control

    def connection(self, key: Hashable, control: str | None = None) -> Connection:
        """The connection `key`, made on first use with the congestion control its sender names."""
        conn = self.connections.get(key)
        if conn is None:
            cc = self.control(control)
            conn = self.connections[key] = Connection(cwnd=float(self.p.initcwnd), cc=cc.new_state(), control=cc)
        return conn

    def on_window_limited(self, st: TcpState, now: float) -> None:
        """The window (or the pacing) began to hold the flow's rate down (the compiled rebalance calls this)."""
        st.conn.control.on_window_limited(st, now)

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
            conn.control.on_tx_start(conn, idle, rto_s)
        if conn.cwnd < conn.ssthresh:
            st.phase = "ss"
            st.budget = conn.cwnd * st.seg_bits
            st.round_end = now + st.rtt
        else:
            self._enter_ca(st, now, conn.cwnd)
        conn.control.on_flow_start(st, now)
        self._draw_loss(st)

    def _draw_loss(self, st: TcpState) -> None:
        if st.loss > 0 and st.rng is not None:
            rng = lend(st.rng)
            st.loss_in = (float(rng.geometric(st.loss)) - 0.5) * st.seg_bits
            st.rng = keep(st.rng, rng)
        else:
            st.loss_in = INF

    def _enter_ca(self, st: TcpState, now: float, cwnd: float) -> None:
        conn = st.conn
        st.phase = "ca"
        conn.cwnd = cwnd
        conn.control.on_ca_start(st, now)
        st.budget = INF
        st.round_end = now + st.rtt

    # -- the rate cap the window and the pacing set --
    def cap(self, flow, now: float) -> float:
        st: TcpState = flow.tcp
        if st.phase == "open":
            return INF
        if st.phase == "ss":
            return st.pacing if st.budget > EPS_BITS else 0.0
        # the flow's own standing queue is not in the way of its own rate (W over RTT with its own
        # queue in the RTT is its share exactly): only the others' queue slows it
        window = st.conn.cwnd * st.seg_bits / (st.rtt - st.own_qdelay)
        return st.pacing if st.pacing < window else window

    def after_rates(self, flow, now: float, limited: bool) -> None:
        """Told whether the window, rather than a link, set the flow's new rate."""
        st: TcpState = flow.tcp
        if st.phase == "ca":
            was = st.limited
            st.limited = limited
            if st.limited and not was:
                st.conn.control.on_window_limited(st, now)

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
        if st.wakeup < due:
            due = st.wakeup
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
        control = conn.control
        if st.loss_in <= EPS_BITS:
            self._on_loss(flow, now)
        if now >= st.wakeup - 1e-12:
            control.on_wakeup(st, now)
        if st.phase == "ss" and now >= st.round_end - 1e-12 and self._sent_this_round(st) < 1.0:
            # not one segment of the round got through (an outage): no ACK has come back, so the
            # round is not over, and the window did not meet the path (slow start goes on)
            st.round_end = now + st.rtt
        elif st.phase == "ss" and now >= st.round_end - 1e-12:
            w, leaves = control.slow_start_round(st, share_bits_per_rtt, queue_allowance_bits)
            if leaves:
                self._enter_ca(st, now, w)
            else:
                conn.cwnd = w
                st.budget = w * st.seg_bits
                st.round_end = now + st.rtt
        elif st.phase == "ca" and st.limited and now >= st.round_end - 1e-12:
            control.on_ca_round(st, now)

    @staticmethod
    def _sent_this_round(st: TcpState) -> float:
        """Segments the current slow-start round has sent so far: their ACKs grow the window one each."""
        return max(0.0, st.conn.cwnd * st.seg_bits - st.budget) / st.seg_bits

    def _rtts_so_far(self, st: TcpState, now: float) -> float:
        """RTTs of samples the connection has had, the current flow's included."""
        return st.conn.rtts + (now - st.conn.sending_since) / st.rtt

    def _on_loss(self, flow, now: float) -> None:
        st: TcpState = flow.tcp
        conn = st.conn
        st.resent_bits += st.seg_bits
        flow.remaining_bits += st.seg_bits
        segments_after = int(max(0.0, flow.remaining_bits - st.seg_bits) // st.seg_bits)
        floor = now + recovery_delay(st.rtt, segments_after)
        rng = lend(st.rng)
        lost_again = rng.random() < st.loss
        st.rng = keep(st.rng, rng)
        if lost_again:  # the retransmission is lost too: only the RTO recovers it
            floor += rto(st.rtt, self.p.rto_min_s, self._rtts_so_far(st, now))
        st.floor = max(st.floor, floor)
        if not conn.control.loss_ends_slow_start:  # (BBR) the control keeps its phase, round and rate
            if now >= st.recovery_until:
                st.recovery_until = now + st.rtt
                conn.cwnd = conn.control.on_loss(st, now, conn.cwnd)
        elif now >= st.recovery_until:  # one window cut per recovery episode
            st.recovery_until = now + st.rtt
            cwnd = conn.cwnd  # (the window's growth is applied per RTT, and only while the window limits the flow)
            if st.phase == "ss" and st.budget < INF:
                # seen one RTT later, when the ACKs of the round's segments before the lost one
                # have grown the window by one each (the ones after it are duplicate ACKs)
                cwnd += self._sent_this_round(st)
            new = conn.control.on_loss(st, now, cwnd)
            conn.ssthresh = new
            st.phase = "ca"
            st.budget = INF
            conn.cwnd = new
            st.round_end = now + st.rtt
            st.limited = False
        self._draw_loss(st)

    def end(self, flow, now: float) -> None:
        st: TcpState = flow.tcp
        conn = st.conn
        if st.phase == "ss" and st.budget < INF:
            # slow start grows the window per ACK: the acknowledgements of this round's segments,
            # still on their way, add one segment each
            conn.cwnd = min(conn.ssthresh, receive_window(self.p, st.mss), conn.cwnd + self._sent_this_round(st))
        if st.rtt > 0:
            conn.rtts = self._rtts_so_far(st, now) + 1  # its acknowledgements are one more RTT of samples
        conn.last_send = now
        conn.active = None


# the window arithmetic moved to congestion.py; these names stay importable from here
__all__ = ["INF", "EPS_BITS", "TcpParams", "Connection", "TcpState", "TcpTransport", "rto", "recovery_delay",
           "cubic_window", "after_loss", "idle_restart"]
