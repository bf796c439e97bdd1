"""Congestion control as a plug-in, in the spirit of ns-3's TcpCongestionOps: the transport
(emulator/flows/transport.py) keeps what every TCP shares (ACK-clocked slow-start rounds, loss draws,
recovery, the RTO, the receive window, idle time) and asks the connection's congestion control what
the window does:

- `on_tx_start`: a flow begins sending on a connection that was idle for `idle_s` (Linux's
  CA_EVENT_TX_START; the default is tcp_cwnd_restart);
- `slow_start_round`: an ACK-clocked slow-start round ended: the next window, and whether slow
  start is over;
- `on_ca_start`: the connection enters congestion avoidance with the window it has;
- `window`: the congestion-avoidance window at a time;
- `on_window_limited` and `on_ca_round`: the window began to hold the flow's rate down, and an
  ACK-clocked round of congestion avoidance ended while it still does (the window grows);
- `on_loss`: a congestion event (the new window and ssthresh, ns-3's GetSsThresh); the transport
  has set `st.recovery_until`, the end of the recovery that follows (one RTT), and Linux does not
  grow the window before it (tcp_cong_control calls cong_avoid only outside CWR and Recovery); a
  control whose `loss_ends_slow_start` is False (BBR) keeps its phase, its round and its rate through it;
- `on_flow_start`: a flow begins sending on the connection (after the transport chose its phase);
- `on_wakeup`: the time the control asked for in `st.wakeup` has come, whatever limits the flow
  (BBR's gain cycle and its min-RTT probe); INF (the default) asks for nothing.
A congestion control writes what it decides into the connection (`cwnd`, `ssthresh`) and the
flow's state (`round_end`, and `pacing`: the rate the sender paces at, bits/s, INF where it does not
pace, as CUBIC without fq): the flow model, compiled or not, reads those and never calls back for them, so the compiled rebalance knows windows and pacing, not CUBIC. Its own per-connection
state lives in `conn.cc` (`new_state`). `network.tcp.congestion_control` names a registered one
(`@CONGESTION_CONTROLS.register("name")`) or your own subclass as "package.module:Class"."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from node.plugins import Registry

INF = math.inf
EPS_BITS = 1e-6


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


def whole_segments(window: float) -> float:
    """A window as Linux holds it: whole segments (snd_cwnd, ssthresh and CUBIC's last maximum are
    integers, and each grows one segment at a time). Below about 20 segments, where loss keeps a
    flow's window, the half segment a fractional window adds on average is 4 % or more of its rate.
    (A product of floats can land a hair below a whole number: 0.7 * 30 = 20.999999999999996.)"""
    return float(math.floor(window + 1e-9))


def after_loss(cwnd: float, w_max: float, beta: float) -> tuple[float, float]:
    """One congestion event: (new window, new W_max) in whole segments, as bictcp_recalc_ssthresh
    computes them from the whole window, with CUBIC's fast convergence (a flow that lost below its
    last maximum remembers less than it had)."""
    cwnd = whole_segments(cwnd)
    new_max = whole_segments(cwnd * (1.0 + beta) / 2.0) if cwnd < w_max else cwnd
    return max(2.0, whole_segments(cwnd * beta)), new_max


def idle_restart(cwnd: float, idle_s: float, rto_s: float, initcwnd: float) -> float:
    """Linux's tcp_cwnd_restart: the window halved once per full RTO of idleness past the first,
    never below min(initcwnd, cwnd). Only called when idle_s > rto_s."""
    restart = min(float(initcwnd), cwnd)
    delta = idle_s - rto_s
    while delta > 0 and cwnd > restart:
        cwnd = float(int(cwnd) >> 1)
        delta -= rto_s
    return max(cwnd, restart)


def receive_window(params: Any, mss: int) -> float:
    """The receive window in segments (at least the initial window)."""
    return max(float(params.initcwnd), params.rwnd_bytes / mss)


# ---- the interface ------------------------------------------------------------------------------
class CongestionControl:
    """The decisions of the module docstring. The defaults are Linux's Reno-style slow start
    (the window doubles per round until a round's burst outlasts the RTT) and its idle restart;
    `window`, `on_loss` and the growth hooks have no default."""

    name: ClassVar[str] = ""
    loss_ends_slow_start: ClassVar[bool] = True  # a loss cuts the window and ends slow start (Reno, CUBIC)

    def __init__(self, params: Any):
        self.p = params

    def new_state(self) -> Any:
        """Its own per-connection state (conn.cc), or None."""
        return None

    def on_tx_start(self, conn: Any, idle_s: float, rto_s: float) -> None:
        """A flow starts on a connection idle for more than an RTO (tcp_slow_start_after_idle=1):
        tcp_cwnd_restart, and slow start back to 3/4 of the window it had."""
        conn.ssthresh = max(conn.ssthresh if conn.ssthresh < INF else 0.0, 0.75 * conn.cwnd)
        conn.cwnd = idle_restart(conn.cwnd, idle_s, rto_s, self.p.initcwnd)

    def slow_start_round(self, st: Any, share_bits_per_rtt: float, queue_allowance_bits: float) -> tuple[float, bool]:
        """A slow-start round ended: (the next window, whether slow start ends with it). A round
        whose burst outlasted the RTT (budget left) means the window covers the path: slow start
        ends there, at most at BDP + the flow's part of the buffer; else the window doubles (delayed
        ACKs with ABC) up to ssthresh."""
        conn = st.conn
        rwnd = receive_window(self.p, st.mss)
        if st.budget > EPS_BITS:
            w = min(2 * conn.cwnd, max(conn.cwnd, self._slow_start_exit(st, share_bits_per_rtt, queue_allowance_bits)), rwnd)
            conn.ssthresh = w
            return w, True
        w = min(2 * conn.cwnd, conn.ssthresh, rwnd)
        return w, w >= conn.ssthresh

    @staticmethod
    def _slow_start_exit(st: Any, share_bits_per_rtt: float, queue_allowance_bits: float) -> float:
        """The window slow start ends at once its bursts fill the path: Linux grows it while it is
        below twice what is in flight, up to the BDP plus the buffer, past which the queue overflows."""
        bdp = share_bits_per_rtt / st.seg_bits
        return bdp + min(queue_allowance_bits / st.seg_bits, bdp)

    def on_ca_start(self, st: Any, now: float) -> None:
        """Congestion avoidance begins with st.conn.cwnd."""

    def on_flow_start(self, st: Any, now: float) -> None:
        """A flow begins sending on st.conn, in the phase the transport chose (st.phase)."""

    def on_wakeup(self, st: Any, now: float) -> None:
        """st.wakeup has come (only a control that sets it is called)."""
        st.wakeup = INF

    def window(self, st: Any, now: float, rtt: float) -> float:
        raise NotImplementedError

    def on_window_limited(self, st: Any, now: float) -> None:
        raise NotImplementedError

    def on_ca_round(self, st: Any, now: float) -> None:
        raise NotImplementedError

    def on_loss(self, st: Any, now: float, cwnd: float) -> float:
        """A congestion event seen with window `cwnd`: the new window (the transport makes it the
        ssthresh as well). The window does not grow before `st.recovery_until`."""
        raise NotImplementedError


@dataclass(slots=True)
class CubicState:
    """CUBIC's per-connection state: the last maximum and the current epoch's start."""

    w_max: float = 0.0
    origin: float = 0.0
    epoch: float = 0.0


CONGESTION_CONTROLS = Registry("congestion control", CongestionControl)


class GrowingWindow(CongestionControl):
    """A congestion control whose window grows along a curve, window(st, now, rtt), from the window
    it had when an epoch began (conn.cc.origin at conn.cc.epoch), while the window limits the flow
    (Linux grows it only then), as rate steps: the next step is the first RTT boundary where the
    window has grown by `growth_step` (at most 64 RTTs on), and until then the flow sends with the
    mean of the window at both ends of the step, so the bits it moves match the curve's to second
    order. It overshoots what covers the path by at most one step. The curve is read in whole
    segments (whole_segments): a small window steps one segment at a time, as Linux's does."""

    @staticmethod
    def growth_resumes(st: Any, now: float) -> float:
        """When a window that would grow from `now` may grow: not before the recovery under way has
        ended (Linux grows it neither in Recovery nor in CWR). An epoch set at a loss or when the
        window begins to limit the flow starts here."""
        return max(now, st.recovery_until)

    def on_window_limited(self, st: Any, now: float) -> None:
        """Growth resumes from here, or from the end of a recovery still under way; the rate was
        just set from the window as it is, so the first step keeps it."""
        cc = st.conn.cc
        cc.epoch = self.growth_resumes(st, now)
        cc.origin = st.conn.cwnd
        self.growth_step(st, now, mean=False)

    def on_ca_round(self, st: Any, now: float) -> None:
        self.growth_step(st, now)

    def growth_step(self, st: Any, now: float, mean: bool = True) -> None:
        conn = st.conn
        rwnd = receive_window(self.p, st.mss)
        rtt = st.rtt  # the queues do not move during this call
        start = conn.cwnd
        if now > conn.cc.epoch:
            start = max(start, min(whole_segments(self.window(st, now, rtt)), rwnd))
        # the steps fall on whole RTTs from when the window may grow (after a recovery, its end)
        base = max(now, conn.cc.epoch)
        end, k = start, 0
        while k < 64 and end < start * (1 + self.p.growth_step) and end < rwnd:
            k += 1
            end = min(whole_segments(self.window(st, base + k * rtt, rtt)), rwnd)
        conn.cwnd = max(start, (start + end) / 2) if mean else start
        st.round_end = base + max(1, k) * rtt


@CONGESTION_CONTROLS.register("cubic")
class Cubic(GrowingWindow):
    """Linux CUBIC (RFC 9438) with HyStart's ACK-train test, as rate steps: congestion avoidance
    follows W(t) = C (t - K)^3 + W_max with its TCP-friendly floor, capped at the receive window; a
    window-limited flow's rate steps on whole RTTs each time the window has grown by `growth_step`;
    a flow whose window covers its share has no window events (Linux grows the window only while it
    limits the flow). No pacing (Linux CUBIC does not pace without fq)."""

    def new_state(self) -> CubicState:
        return CubicState()

    def slow_start_round(self, st: Any, share_bits_per_rtt: float, queue_allowance_bits: float) -> tuple[float, bool]:
        if self._hystart_fires(st, share_bits_per_rtt):
            # the round's ACK train outlasted half the RTT: HyStart ends slow start with the window
            # grown by the ACKs of that half RTT
            conn = st.conn
            bdp = share_bits_per_rtt / st.seg_bits
            w = min(2 * conn.cwnd, conn.cwnd + bdp / 2, receive_window(self.p, st.mss))
            conn.ssthresh = w
            return w, True
        return super().slow_start_round(st, share_bits_per_rtt, queue_allowance_bits)

    def _hystart_fires(self, st: Any, share_bits_per_rtt: float) -> bool:
        """HyStart's ACK-train test: the ACKs of this round's burst (two segments each) come at most
        hystart_ack_delta_s apart, which needs a share above 12 Mbit/s, and the train lasts more
        than half the RTT."""
        if not self.p.hystart or st.rtt_base <= 0 or share_bits_per_rtt <= 0:
            return False
        share = share_bits_per_rtt / st.rtt_base
        return 2 * st.seg_bits / share <= self.p.hystart_ack_delta_s and st.conn.cwnd * st.seg_bits / share >= st.rtt / 2

    def on_ca_start(self, st: Any, now: float) -> None:
        conn = st.conn
        cc = conn.cc
        cc.origin = conn.cwnd
        cc.epoch = now
        cc.w_max = max(cc.w_max, whole_segments(conn.cwnd))

    def window(self, st: Any, now: float, rtt: float) -> float:
        conn = st.conn
        if st.phase != "ca":
            return conn.cwnd
        cc = conn.cc
        return cubic_window(now - cc.epoch, cc.w_max, cc.origin, rtt, self.p.cubic_c, self.p.beta)

    def on_loss(self, st: Any, now: float, cwnd: float) -> float:
        cc = st.conn.cc
        new, cc.w_max = after_loss(cwnd, cc.w_max, self.p.beta)
        cc.origin = new
        cc.epoch = self.growth_resumes(st, now)  # the curve starts when the recovery ends
        return new


@dataclass(slots=True)
class RenoState:
    """Reno's per-connection state: where the current epoch of linear growth began."""

    origin: float = 0.0
    epoch: float = 0.0


@CONGESTION_CONTROLS.register("reno")
class Reno(GrowingWindow):
    """Linux Reno (tcp_reno_cong_avoid with ABC and delayed ACKs): the base's slow start (no
    HyStart: that is CUBIC's), then one segment more per RTT while the window limits the flow, and
    half the window on a loss (ssthresh = max(cwnd / 2, 2)). No pacing."""

    def new_state(self) -> RenoState:
        return RenoState()

    def on_ca_start(self, st: Any, now: float) -> None:
        st.conn.cc.origin = st.conn.cwnd
        st.conn.cc.epoch = now

    def window(self, st: Any, now: float, rtt: float) -> float:
        conn = st.conn
        if st.phase != "ca":
            return conn.cwnd
        return conn.cc.origin + max(0.0, now - conn.cc.epoch) / rtt if rtt > 0 else conn.cwnd

    def on_loss(self, st: Any, now: float, cwnd: float) -> float:
        new = max(2.0, whole_segments(whole_segments(cwnd) / 2.0))  # tcp_reno_ssthresh: max(cwnd >> 1, 2)
        st.conn.cc.origin = new
        st.conn.cc.epoch = self.growth_resumes(st, now)
        return new


from . import bbr  # noqa: E402,F401  (registers "bbr"; it builds on the classes above)
