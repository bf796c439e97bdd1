"""BBR (v1, as Linux's tcp_bbr.c runs it) at flow level: a model-based congestion control that paces
at its estimate of the bottleneck's rate and ignores random loss.

What Linux does, and what the flow model makes of it:

- Startup: pacing at 2/ln 2 of the bandwidth estimate, the window growing by what is acknowledged
  (so it doubles per round, as slow start does) up to 2/ln 2 of the estimated BDP. Each round's
  delivery rate is a sample; the estimate is their maximum. Once three rounds in a row have not
  grown it by 25 %, the pipe is full. Here: the transport's slow-start rounds, paced, with the
  plateau test at each round's end.
- Drain (pacing at ln 2 / 2 until what is in flight is one BDP) and the probe-bandwidth cycle's
  1.25 and 0.75 phases move bits between the sender and the bottleneck's queue: the queue that
  startup or the 1.25 phase built keeps the link busy while the next phase sends less. A fluid
  model counts bits as the link delivers them, so drain is the same rate as the pipe's; the
  0.75 phase is paced at 0.75 of the estimate plus what the 1.25 phase queued (so a flow the link
  held back keeps its rate, and one that had room delivers 1.25 then 0.75 of its estimate, as
  Linux's does).
- Probe bandwidth: eight phases of one min-RTT each, pacing gains 1.25, 0.75, then 1 six times;
  the window is 2 BDP (+3 segments for TSO quantization). The estimate is the maximum of the
  delivery rates sampled over the last 10 rounds (Linux's windowed max filter), a sample at each
  phase's end: a flow that gets room grows 25 % per cycle, one that loses room follows its share
  down once 10 rounds have passed. Linux counts rounds in deliveries (a round ends when a segment
  sent after it began is acknowledged), so a round lasts the RTT as it is, queueing included: when
  a fade holds the flow back and its window waits in the bottleneck's queue, rounds pass slowly
  and the estimate keeps the rate from before the fade for longer (in an outage, where nothing is
  delivered, no round passes at all).
- Probe RTT: when 10 s have passed without a lower RTT sample (here: since the connection's first
  sample or the last probe), the window is 4 segments for 200 ms after what was in flight
  drained (one RTT), then back to probing bandwidth. Linux skips it when a flow restarts from idle
  and takes the idle restart's sample as the new minimum; so does this.
- Loss: the rate is not cut (a lost segment costs its bytes and, near the tail, its recovery time,
  which the transport adds). In startup, the recovery a loss begins holds the window at what is in
  flight for a round (Linux's packet conservation): that round's window does not grow, which costs
  a lossy startup about a round per loss episode; the round after it completes the recovery and
  grows, so at most every other round is held (else three held rounds in a row would end startup
  at a fraction of the link's rate, which kernel BBR does not do: 100 Mbit/s, 150 ms, 1 %). In probe bandwidth the pacing rate, not the
  window, sets what is in flight, and conservation is not modelled there.
- Idle restart: BBR is a `cong_control` module, so Linux does not cut its window after idleness
  (tcp_slow_start_after_idle skips such modules): a flow after a pause paces at its estimate
  with its window at once.

Not modelled: the standing queue that several BBRv1 flows keep (their 2 BDP windows), the share
BBR takes from CUBIC in a deep buffer, ProbeRTT during startup, and loss from a shallow buffer's
overflow in startup."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .congestion import CONGESTION_CONTROLS, INF, CongestionControl, receive_window

HIGH_GAIN = 2.0 / math.log(2.0)  # startup's pacing and window gain (bbr_high_gain, 2.885)
CWND_GAIN = 2.0  # probe bandwidth's window: 2 BDP
PROBE_GAIN = 1.25  # the cycle's first phase, then 0.75, then 1 for six phases
DRAIN_PHASE_GAIN = 0.75
STEADY_PHASES = 6
FULL_BW_GROWTH = 1.25  # the estimate must grow this much ...
FULL_BW_ROUNDS = 3  # ... within this many rounds, or startup ends
BW_FILTER_ROUNDS = 10.0  # the estimate is the maximum delivery rate over this many rounds (bbr_bw_rtts)
MIN_RTT_WINDOW_S = 10.0  # an RTT sample this old triggers a min-RTT probe
PROBE_RTT_S = 0.2  # the probe holds the window at MIN_CWND this long, after one RTT of draining
MIN_CWND = 4.0  # segments
QUANTIZATION_SEGMENTS = 3.0  # bbr_quantization_budget: 3 TSO segments (of one MSS at these rates)

PROBE, DRAIN_PHASE, STEADY = 0, 1, 2  # the probe-bandwidth cycle's phases, as events


@dataclass(slots=True)
class BbrState:
    """BBR's per-connection state (conn.cc)."""

    btlbw: float = 0.0  # bits/s: the bottleneck bandwidth estimate
    rtprop: float = INF  # s: the path's minimum RTT
    rtprop_stamp: float = -INF  # when the minimum was last sampled afresh
    full_bw: float = 0.0  # startup: the estimate at its last 25 % growth
    full_bw_rounds: int = 0  # startup: rounds since then
    filled: bool = False  # startup found the plateau: the connection probes bandwidth from now on
    cycle: int = STEADY  # the probe-bandwidth phase
    rounds: float = 0.0  # rounds counted in deliveries since the connection began (the filter's clock)
    samples: list = field(default_factory=list)  # the filter: (round, rate), rates falling, within its window
    phase_start: float = 0.0  # when the probe-bandwidth phase now running began
    probe_rtt_until: float = -INF  # while now < this, the window is MIN_CWND
    saved_cwnd: float = 0.0  # the window the min-RTT probe restores
    conserving: bool = False  # startup: a loss began recovery, so this round's ACKs do not grow the window
    conserved: bool = False  # the last round was such a round (the next one repairs and grows)


def startup_window(cwnd: float, acked: float, btlbw: float, rtprop: float, seg_bits: float) -> float:
    """bbr_set_cwnd before the pipe is full: the window grows by what was acknowledged while it is
    below 2/ln 2 of the estimated BDP (plus the quantization budget)."""
    target = HIGH_GAIN * btlbw * rtprop / seg_bits + QUANTIZATION_SEGMENTS if rtprop < INF else INF
    return cwnd + acked if cwnd < target else cwnd


def probe_window(btlbw: float, rtprop: float, seg_bits: float) -> float:
    """The probe-bandwidth window: 2 BDP plus the quantization budget, at least MIN_CWND."""
    return max(MIN_CWND, CWND_GAIN * btlbw * rtprop / seg_bits + QUANTIZATION_SEGMENTS)


def plateau(state: BbrState, sample: float) -> None:
    """One startup round's delivery-rate sample: the estimate is the samples' maximum, and the pipe
    is full once FULL_BW_ROUNDS rounds in a row have not grown it by FULL_BW_GROWTH
    (bbr_check_full_bw_reached)."""
    state.rounds += 1.0
    state.btlbw = max(state.btlbw, windowed_max(state, sample))
    if state.btlbw >= state.full_bw * FULL_BW_GROWTH:
        state.full_bw = state.btlbw
        state.full_bw_rounds = 0
        return
    state.full_bw_rounds += 1
    state.filled = state.full_bw_rounds >= FULL_BW_ROUNDS


def windowed_max(state: BbrState, sample: float) -> float:
    """Add a delivery-rate sample at the current round to the filter and return the maximum over the
    last BW_FILTER_ROUNDS rounds. The filter keeps its samples in falling order (a sample hides every
    older one it is not below), so the oldest kept is the maximum and the list stays short."""
    samples = state.samples
    while samples and samples[-1][1] <= sample:
        samples.pop()
    samples.append((state.rounds, sample))
    horizon = state.rounds - BW_FILTER_ROUNDS
    while samples[0][0] < horizon:
        samples.pop(0)
    return samples[0][1]


def count_rounds(state: BbrState, elapsed: float, rate: float, rtt: float, round_bits: float) -> None:
    """A phase of `elapsed` seconds ended in which the flow delivered at `rate` over an RTT of `rtt`
    (queueing included): the rounds that passed. Where less than `round_bits` (a segment) was
    delivered, as in an outage, no round passed."""
    if rate * elapsed >= round_bits and rtt > 0:
        state.rounds += elapsed / rtt


def after_probe(state: BbrState, delivered: float) -> float:
    """The 1.25 phase ended having delivered at `delivered` bit/s (its rounds counted): the new
    estimate (the filter's maximum), and the 0.75 phase's pacing rate (0.75 of it plus what the
    1.25 phase left queued, which the link delivers meanwhile)."""
    queued = max(0.0, PROBE_GAIN * state.btlbw - delivered)  # bits per second of the phase
    state.btlbw = windowed_max(state, delivered)
    return DRAIN_PHASE_GAIN * state.btlbw + queued


@CONGESTION_CONTROLS.register("bbr")
class Bbr(CongestionControl):
    """BBRv1 as the module docstring describes it."""

    loss_ends_slow_start: ClassVar[bool] = False

    def new_state(self) -> BbrState:
        return BbrState()

    # -- phases -------------------------------------------------------------------------------
    def on_tx_start(self, conn: Any, idle_s: float, rto_s: float) -> None:
        """No window cut after idleness (Linux skips tcp_cwnd_restart for cong_control modules)."""

    def on_flow_start(self, st: Any, now: float) -> None:
        cc = st.conn.cc
        if st.rtt_base < cc.rtprop or now - cc.rtprop_stamp > MIN_RTT_WINDOW_S:
            # a first sample, or an idle restart past the filter's window (no probe: its sample is fresh)
            cc.rtprop = min(cc.rtprop, st.rtt_base) if now - cc.rtprop_stamp <= MIN_RTT_WINDOW_S else st.rtt_base
            cc.rtprop_stamp = now
        if st.phase == "ss":
            # before any sample, Linux paces the initial window over the first RTT (bbr_init_pacing_rate_from_rtt)
            st.pacing = HIGH_GAIN * (cc.btlbw or st.conn.cwnd * st.seg_bits / cc.rtprop)
            st.wakeup = INF
        else:
            self._steady(st, now)

    def slow_start_round(self, st: Any, share_bits_per_rtt: float, queue_allowance_bits: float) -> tuple[float, bool]:
        conn = st.conn
        cc = conn.cc
        sent = max(0.0, conn.cwnd * st.seg_bits - st.budget)
        plateau(cc, sent / st.rtt if st.rtt > 0 else 0.0)
        # packet conservation holds the first round of a recovery; the round after it finishes that
        # recovery (Linux restores the window and grows it again), so at most every other round is held
        held = cc.conserving and not cc.conserved
        acked = 0.0 if held else sent / st.seg_bits
        cc.conserving, cc.conserved = False, held
        window = min(startup_window(conn.cwnd, acked, cc.btlbw, cc.rtprop, st.seg_bits), receive_window(self.p, st.mss))
        st.pacing = max(st.pacing, HIGH_GAIN * cc.btlbw)
        if cc.filled:
            conn.ssthresh = 0.0  # the connection's next flows begin in probe bandwidth
        return window, cc.filled

    def on_ca_start(self, st: Any, now: float) -> None:
        """The pipe is full: probe bandwidth (drain is the same delivered rate; module docstring)."""
        cc = st.conn.cc
        cc.filled = True
        cc.cycle = STEADY
        self._steady(st, now)

    def _steady(self, st: Any, now: float) -> None:
        """Pace at the estimate in the cycle's steady phase, and wake at its end."""
        cc = st.conn.cc
        cc.phase_start = now
        self._probe_cwnd(st)
        st.pacing = cc.btlbw if cc.cycle != PROBE else PROBE_GAIN * cc.btlbw
        if cc.cycle == DRAIN_PHASE:
            cc.cycle = STEADY
        self._wake(st, now, now + (STEADY_PHASES if cc.cycle == STEADY else 1) * cc.rtprop)

    def _probe_cwnd(self, st: Any) -> None:
        """Probe bandwidth's window from the estimate as it is, capped by the receive window."""
        cc = st.conn.cc
        st.conn.cwnd = min(probe_window(cc.btlbw, cc.rtprop, st.seg_bits), receive_window(self.p, st.mss))

    def _wake(self, st: Any, now: float, phase_end: float) -> None:
        """Wake at the phase's end or for the min-RTT probe, whichever comes first."""
        st.wakeup = min(phase_end, st.conn.cc.rtprop_stamp + MIN_RTT_WINDOW_S)

    def on_wakeup(self, st: Any, now: float) -> None:
        conn = st.conn
        cc = conn.cc
        if cc.probe_rtt_until > -INF:
            if now < cc.probe_rtt_until - 1e-12:
                st.wakeup = cc.probe_rtt_until
                return
            # the min-RTT probe is over: a fresh minimum, the window back, the cycle afresh
            cc.probe_rtt_until = -INF
            cc.rtprop_stamp = now
            conn.cwnd = cc.saved_cwnd
            cc.cycle = STEADY
            self._steady(st, now)
            return
        if st.phase != "ca":
            st.wakeup = INF  # (no min-RTT probe during startup: on_ca_start schedules it)
            return
        if now >= cc.rtprop_stamp + MIN_RTT_WINDOW_S - 1e-12:
            cc.saved_cwnd = conn.cwnd
            conn.cwnd = MIN_CWND
            cc.probe_rtt_until = now + st.rtt + max(PROBE_RTT_S, st.rtt)
            st.wakeup = cc.probe_rtt_until
            return
        rate = st.flow_rate
        count_rounds(cc, now - cc.phase_start, rate, st.rtt, st.seg_bits)
        cc.phase_start = now
        if cc.cycle == STEADY:  # the 1.25 phase begins
            cc.btlbw = windowed_max(cc, rate)
            cc.cycle = PROBE
            st.pacing = PROBE_GAIN * cc.btlbw
            self._probe_cwnd(st)
            self._wake(st, now, now + cc.rtprop)
        elif cc.cycle == PROBE:  # the 0.75 phase: what the probe left queued keeps the link busy
            st.pacing = after_probe(cc, rate)
            cc.cycle = DRAIN_PHASE
            self._probe_cwnd(st)
            self._wake(st, now, now + cc.rtprop)
        else:
            cc.btlbw = windowed_max(cc, rate)
            cc.cycle = STEADY
            self._steady(st, now)

    # -- what the window would do (BBR's rate is its pacing; the window only caps what is in flight)
    def window(self, st: Any, now: float, rtt: float) -> float:
        return st.conn.cwnd

    def on_window_limited(self, st: Any, now: float) -> None:
        """Nothing: the cycle runs on its own wake-ups whatever limits the flow."""

    def on_ca_round(self, st: Any, now: float) -> None:
        st.round_end = INF

    def on_loss(self, st: Any, now: float, cwnd: float) -> float:
        """The rate is not cut (BBRv1 ignores random loss). In startup, the recovery it begins holds
        the window at what is in flight for a round (Linux's packet conservation,
        bbr_set_cwnd_to_recover_or_restore): that round's ACKs do not grow it. A new recovery can
        begin only once this one is over, so the round after a held one grows whatever it lost."""
        if st.phase == "ss":
            st.conn.cc.conserving = True
        return st.conn.cwnd
