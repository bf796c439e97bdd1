"""The tcp transport's window arithmetic against hand-computed values: slow start rounds, idle
decay, loss recovery (cut, regrowth, the queue covering it, a lost tail), the receive window, and
two flows of different RTTs on one bottleneck."""
import math

import pytest

from emulator.flows.links import FlowModel, simulate
from emulator.flows.transport import (TcpParams, TcpTransport, after_loss, cubic_window, idle_restart, recovery_delay,
                                rto)

SEG = 1514 * 8.0  # link bits of a full segment (1448 payload + 66 header bytes)
LINK = ("up", "a")


class Draws:
    """A stand-in for the transfer's random generator with chosen draws: `geometric` gives the
    segments up to and including the next lost one, `random` decides whether a retransmission is
    lost (never, unless told)."""

    def __init__(self, gaps, retransmission_lost=False):
        self.gaps = list(gaps)
        self.lost = retransmission_lost

    def geometric(self, p):
        return self.gaps.pop(0) if self.gaps else 10**12

    def random(self):
        return 0.0 if self.lost else 1.0


def steps_of(fm, fid, due, limit=10**6):
    """Fire a lone flow's events in order; (time, rate, window) after each until it finishes."""
    out = []
    while len(out) < limit:
        t, _ = due[fid]
        fm.advance(t)
        finished, changed = fm.fire(fid)
        if finished:
            break
        due.update({f: (tt, vv) for f, tt, vv in changed})
        flow = fm.flows[fid]
        out.append((t, flow.rate, flow.tcp.conn.cwnd))
    return out


def one_flow(rate, one_way, segments, queue_s=0.1, params=None, rng=None, loss=0.0):
    fm = FlowModel({LINK: rate}, TcpTransport(params or TcpParams()), queue_s={LINK: queue_s})
    (start, end), = simulate(fm, [dict(start=0.0, bits=segments * SEG, path=[LINK], latency=one_way, connection="ab",
                                       rtt=2 * one_way, seg_bits=SEG, loss=loss, rng=rng)])
    return fm, end


# ---- pure functions --------------------------------------------------------------------------
def test_cubic_window_hand_values():
    # K = cbrt((100 - 70) / 0.4) = cbrt(75) = 4.2172 s: the curve is back at W_max then
    k = (30 / 0.4) ** (1 / 3)
    assert cubic_window(0.0, 100, 70, rtt=0.1) == pytest.approx(70)
    assert cubic_window(k, 100, 70, rtt=0.1) == pytest.approx(100)
    assert cubic_window(k + 1, 100, 70, rtt=0.1) == pytest.approx(100.4)
    # early on, the TCP-friendly line 70 + 0.5294 t / RTT is above the flat part of the cubic
    assert cubic_window(2.0, 100, 70, rtt=0.01) == pytest.approx(70 + 3 * 0.3 / 1.7 * 200)
    # above the last maximum (no loss yet): convex growth from the origin
    assert cubic_window(2.0, 50, 60, rtt=10.0) == pytest.approx(60 + 0.4 * 8)


def test_idle_restart_halves_per_rto_down_to_the_initial_window():
    assert idle_restart(80, idle_s=1.0, rto_s=0.3, initcwnd=10) == 10  # 80 -> 40 -> 20 -> 10
    assert idle_restart(80, idle_s=0.5, rto_s=0.3, initcwnd=10) == 40  # one halving
    assert idle_restart(80, idle_s=0.65, rto_s=0.3, initcwnd=10) == 20  # 0.35 and 0.05 past the first RTO
    assert idle_restart(6, idle_s=5.0, rto_s=0.3, initcwnd=10) == 6  # never raised to the initial window
    assert idle_restart(25, idle_s=9.0, rto_s=0.3, initcwnd=10) == 10  # 25 -> 12 -> 6, floored at 10


def test_loss_cut_fast_convergence_rto_and_recovery_delay():
    assert after_loss(100, 0, 0.7) == (pytest.approx(70), 100)
    assert after_loss(80, 100, 0.7) == (pytest.approx(56), pytest.approx(68))  # lost below its last maximum
    assert after_loss(2, 0, 0.7) == (2.0, 2)
    assert rto(0.1, 0.2) == pytest.approx(0.3)  # settled: srtt + rto_min
    assert rto(0.3, 0.2, 0) == pytest.approx(0.9)  # first sample: 3 RTT
    # then rttvar moves a quarter of the way to rto_min per RTT: 0.6 -> 0.5 -> 0.425 ...
    assert rto(0.3, 0.2, 2) == pytest.approx(0.3 + 0.5)
    assert rto(0.3, 0.2, 3) == pytest.approx(0.3 + 0.425)
    assert rto(0.3, 0.2, 60) == pytest.approx(0.5)
    assert recovery_delay(0.1, 5) == pytest.approx(0.1)
    assert recovery_delay(0.1, 2) == pytest.approx(0.125)
    assert recovery_delay(0.1, 0) == pytest.approx(0.2)


# ---- slow start --------------------------------------------------------------------------------
def test_slow_start_10_20_40_segments_over_three_rtts_then_line_rate():
    # 8 Mbit/s, 50 ms one way: RTT = 0.1 s + one segment's serialization (1.514 ms) = 0.101514 s.
    # Bursts of 10, 20, 40 segments take 15, 30, 61 ms < RTT; 80 would take 121 ms > RTT, so from
    # the fourth round the link is busy: 1000 segments arrive at 3 RTT + 930 segments / rate + 50 ms.
    rtt = 0.1 + SEG / 8e6
    fm, end = one_flow(8e6, 0.05, 1000)
    assert end == pytest.approx(3 * rtt + 930 * SEG / 8e6 + 0.05, abs=1e-9)
    fluid = FlowModel({LINK: 8e6})
    (_, fluid_end), = simulate(fluid, [dict(start=0.0, bits=1000 * SEG, path=[LINK], latency=0.05)])
    assert fluid_end == pytest.approx(1000 * SEG / 8e6 + 0.05, abs=1e-9)
    assert end - fluid_end == pytest.approx(3 * rtt - 70 * SEG / 8e6, abs=1e-9)
    # it left slow start with the BDP (67.05 segments) plus its queue (100 ms, 66.05 segments, less
    # than the BDP), less than twice the last burst (160)
    conn = fm.transport.connections["ab"]
    assert conn.cwnd == pytest.approx((8e6 * rtt + 0.1 * 8e6) / SEG) == conn.ssthresh


def test_slow_start_rate_steps_are_bursts_and_pauses():
    fm = FlowModel({LINK: 8e6}, TcpTransport(), queue_s={LINK: 0.1})
    rtt = 0.1 + SEG / 8e6
    due = {fid: (t, v) for fid, t, v in fm.add("f", 1000 * SEG, [LINK], connection="ab", rtt=0.1, seg_bits=SEG)}
    steps = [(0.0, fm.flows["f"].rate)] + [(t, r) for t, r, _ in steps_of(fm, "f", due, limit=11)]
    expected = [(0.0, 8e6), (10 * SEG / 8e6, 0.0), (rtt, 8e6), (rtt + 20 * SEG / 8e6, 0.0), (2 * rtt, 8e6),
                (2 * rtt + 40 * SEG / 8e6, 0.0), (3 * rtt, 8e6)]
    assert [(pytest.approx(t, abs=1e-12), r) for t, r in expected] == steps[:7]


def test_receive_window_caps_the_window():
    # rwnd of 20 segments: 100 segments go 10, 20, 20, 20, 20, 10 per RTT on a 100 Mbit/s link
    params = TcpParams(rwnd_bytes=20 * 1448)
    rtt = 0.1 + SEG / 100e6
    _, end = one_flow(100e6, 0.05, 100, params=params)
    assert end == pytest.approx(5 * rtt + 10 * SEG / 100e6 + 0.05, abs=1e-9)


def test_no_delay_and_no_rate_limit_is_not_held_back():
    fm = FlowModel({}, TcpTransport())
    (_, end), = simulate(fm, [dict(start=1.0, bits=1000 * SEG, path=[LINK], latency=0.0, connection="ab", rtt=0.0)])
    assert end == 1.0


# ---- idle restart --------------------------------------------------------------------------------
def two_transfers(gap, params=None):
    fm = FlowModel({LINK: 8e6}, TcpTransport(params or TcpParams()), queue_s={LINK: 0.1})
    kw = dict(bits=1000 * SEG, path=[LINK], latency=0.05, connection="ab", rtt=0.1, seg_bits=SEG)
    out = simulate(fm, [dict(start=0.0, **kw), dict(after=0, gap=gap, **kw)])
    return out[1][1] - out[1][0]


def test_idle_connection_slow_starts_again():
    rtt = 0.1 + SEG / 8e6
    slow_start = 3 * rtt + 930 * SEG / 8e6 + 0.05
    line_rate = 1000 * SEG / 8e6 + 0.05
    # the window of the first transfer (160) covers the path: a short gap keeps it
    assert two_transfers(0.1) == pytest.approx(line_rate, abs=1e-9)
    # RTO = RTT + 200 ms; 2 s idle halves 160 down to the initial window: slow start again, up to
    # ssthresh = 160, which the fourth round's 80 segments never reach
    assert two_transfers(2.0) == pytest.approx(slow_start, abs=1e-9)
    # the first transfer left slow start at BDP + queue = 133.1 segments. 0.5 s idle is one RTO
    # and 0.2 s past it: one halving, to 66, one segment short of the BDP, so one slow-start round
    # that pauses for the rest of its RTT, then a window that covers the path
    assert two_transfers(0.5) == pytest.approx(rtt + 934 * SEG / 8e6 + 0.05, abs=1e-9)
    # without restart_after_idle the window survives any gap
    assert two_transfers(2.0, TcpParams(restart_after_idle=False)) == pytest.approx(line_rate, abs=1e-9)


# ---- loss --------------------------------------------------------------------------------------
def test_a_loss_the_queue_covers_costs_only_its_segment():
    # 1 s of queue: the window leaves slow start at twice the BDP (134.1 segments); a loss at
    # segment 500 cuts it to 93.9, still above the BDP (67.05), so the link stays busy: the loss
    # costs one segment more to send, nothing else.
    rtt = 0.1 + SEG / 8e6
    fm, end = one_flow(8e6, 0.05, 1000, queue_s=1.0, rng=Draws([500]), loss=0.01)
    assert end == pytest.approx(3 * rtt + 931 * SEG / 8e6 + 0.05, abs=1e-9)
    conn = fm.transport.connections["ab"]
    w_exit = 2 * 8e6 * rtt / SEG
    # CUBIC keeps W_max; both in whole segments, as Linux holds them (134.1 -> 134, 0.7 * 134 -> 93)
    assert conn.cc.w_max == int(w_exit) == 134 and conn.cwnd == int(0.7 * int(w_exit)) == 93


def test_a_loss_the_queue_cannot_cover_holds_the_rate_below_the_link():
    # No queue: slow start ends with the window of the round that outlasted the RTT (80 segments;
    # the BDP is 67). A loss cuts it to 56, below the BDP, so the flow sends at 56 segments per RTT
    # through the recovery (one RTT, no growth) and after; then CUBIC regrows the window, its curve
    # starting when the recovery ends, until it covers the path.
    rtt = 0.1 + SEG / 8e6
    fm = FlowModel({LINK: 8e6}, TcpTransport(), queue_s={LINK: 0.0})
    due = {fid: (t, v) for fid, t, v in fm.add("f", 3000 * SEG, [LINK], connection="ab", rtt=0.1, seg_bits=SEG,
                                                 loss=0.01, rng=Draws([500]))}
    steps = steps_of(fm, "f", due)
    loss_at = next(i for i in range(1, len(steps)) if steps[i][2] < steps[i - 1][2])
    t_loss, rate_after, w_after = steps[loss_at]
    assert steps[loss_at - 1][2] == 80
    # the loss is the 500th segment: 70 went in slow start's first three rounds, 430 at line rate
    assert t_loss == pytest.approx(3 * rtt + 429.5 * SEG / 8e6, abs=1e-9)
    # CUBIC regrows from 56 (W_max 80) from the recovery's end, one RTT after the loss: the first
    # rate step sends with 56 until, k whole RTTs after that, the window is 5 % larger; each later
    # step sends with the mean window of its two ends
    assert w_after == pytest.approx(56) and rate_after == pytest.approx(56 * SEG / rtt)
    k = next(k for k in range(1, 65) if cubic_window(k * rtt, 80, 56, rtt) >= 56 * 1.05)
    regrowth = steps[loss_at:]
    assert regrowth[1][0] == pytest.approx(t_loss + (1 + k) * rtt, abs=1e-9)
    gaps = [(b[0] - a[0]) / rtt for a, b in zip(regrowth, regrowth[1:])]
    assert all(abs(g - round(g)) < 1e-6 and round(g) >= 1 for g in gaps)  # steps fall on whole RTTs
    assert all(b[2] > a[2] and b[1] > a[1] for a, b in zip(regrowth, regrowth[1:]))
    assert regrowth[-1][1] == 8e6 and regrowth[-2][1] < 8e6
    assert len(regrowth) < 15  # a handful of rate steps, not one per RTT


def tail_rtt():
    """RTT of the 1000-segment flow with 1 s of queue once slow start is over: its window of twice
    the BDP holds one BDP in the queue, so the RTT is twice the path's."""
    rtt = 0.1 + SEG / 8e6
    return 2 * rtt


def test_a_lost_last_segment_waits_for_the_tail_loss_probe():
    # the 1000th (last) segment is lost: it is sent again 2 RTT later (TLP) and arrives a one-way
    # delay after that
    rtt = 0.1 + SEG / 8e6
    _, end = one_flow(8e6, 0.05, 1000, queue_s=1.0, rng=Draws([1000]), loss=0.01)
    t_loss = 3 * rtt + 929.5 * SEG / 8e6
    assert end == pytest.approx(t_loss + 2 * tail_rtt() + 0.05, abs=1e-9)


def test_a_lost_retransmission_costs_an_rto():
    rtt = 0.1 + SEG / 8e6
    _, end = one_flow(8e6, 0.05, 1000, queue_s=1.0, rng=Draws([1000], retransmission_lost=True), loss=0.01)
    t_loss = 3 * rtt + 929.5 * SEG / 8e6
    # the RTO after t_loss / RTT round trips of samples (its variance term not yet at the floor)
    assert end == pytest.approx(t_loss + 2 * tail_rtt() + rto(tail_rtt(), 0.2, t_loss / tail_rtt()) + 0.05, abs=1e-9)
    assert rto(tail_rtt(), 0.2, t_loss / tail_rtt()) > tail_rtt() + 0.2


def test_random_loss_costs_grow_with_the_loss_rate_and_are_deterministic():
    import numpy as np

    def run(loss, seed):
        return one_flow(8e6, 0.04, 4600, queue_s=0.05, rng=np.random.default_rng(seed), loss=loss)[1]

    clean = run(0.0, 1)
    light = sorted(run(0.001, s) for s in range(5))
    heavy = sorted(run(0.01, s) for s in range(5))
    assert clean < light[2] < heavy[2]
    assert run(0.01, 3) == run(0.01, 3)


# ---- sharing ---------------------------------------------------------------------------------
def test_two_flows_with_different_rtts_share_a_bottleneck():
    """A short-RTT and a long-RTT flow start together on a 10 Mbit/s link. Whenever the long one is
    held back by its window, the short one gets the rest of the link, and the rates never exceed it."""
    fm = FlowModel({("shared",): 10e6}, TcpTransport(), queue_s={("shared",): 0.1})
    due = {}
    for fid, rtt in (("near", 0.01), ("far", 0.2)):
        due.update({f: (t, v) for f, t, v in fm.add(fid, 2000 * SEG, [("shared",)], connection=fid, rtt=rtt, seg_bits=SEG)})
    finished_at = {}
    saw_leftover = False
    while fm.flows:
        fid = min((f for f in fm.flows if f in due), key=lambda f: due[f][0])
        t, _ = due.pop(fid)
        fm.advance(t)
        done, changed = fm.fire(fid)
        if done:
            finished_at[fid] = t
            _, changed = fm.remove(fid)
        due.update({f: (tt, vv) for f, tt, vv in changed})
        rates = {f: fl.rate for f, fl in fm.flows.items()}
        assert sum(rates.values()) <= 10e6 * (1 + 1e-9)
        if len(rates) == 2 and rates["far"] < 5e6:  # paused between slow-start bursts, or window-limited
            assert rates["near"] == pytest.approx(10e6 - rates["far"])
            saw_leftover = True
    assert saw_leftover
    # the near flow finishes first: the far one spends its first RTTs in slow start
    assert finished_at["near"] < finished_at["far"]
    fluid_both = 2 * 2000 * SEG / 10e6
    assert finished_at["near"] < fluid_both < finished_at["far"] + 1e-9 or math.isclose(finished_at["far"], fluid_both)


def test_messages_on_one_connection_go_in_order():
    fm = FlowModel({LINK: 8e6}, TcpTransport(), queue_s={LINK: 0.1})
    kw = dict(bits=100 * SEG, path=[LINK], latency=0.05, connection="ab", rtt=0.1, seg_bits=SEG)
    (s0, e0), (s1, e1) = simulate(fm, [dict(start=0.0, **kw), dict(start=0.0, **kw)])
    assert s0 == s1 == 0.0
    # the second only starts sending when the first has left, with the window the first grew
    assert e1 > e0
    assert e1 - e0 == pytest.approx(100 * SEG / 8e6, abs=1e-9)


@pytest.mark.parametrize("transport", ["fluid", "tcp"])
def test_late_in_a_run_every_flow_finishes_in_a_bounded_number_of_events(transport):
    """At t ~ 1000 s one ulp of time is 1.1e-13 s: a residue of a few bits must count as sent, or
    its event comes back at the same time for ever (a run once stalled so)."""
    import random

    rng = random.Random(7)
    # at 1 Gbit/s one ulp of time carries 1e-4 bits, more than the model's 1e-6-bit tolerance
    fm = FlowModel({("s",): 1e9, ("a",): 3.7e8}, TcpTransport() if transport == "tcp" else None, queue_s={("s",): 0.1})
    kw = lambda i: dict(connection=i, rtt=0.0731, seg_bits=SEG) if transport == "tcp" else {}  # noqa: E731
    fm.advance(1000.123456789)
    due = {}
    for i in range(40):
        path = [("s",), ("a",)] if i % 3 == 0 else [("s",)]
        due.update({f: t for f, t, _ in fm.add(i, rng.uniform(1e5, 3e7) / 3, path, **kw(i))})
    events = 0
    while fm.flows:
        fid = min((f for f in fm.flows if f in due), key=lambda f: due[f])
        fm.advance(due.pop(fid))
        done, changed = fm.fire(fid)
        if done:
            _, changed = fm.remove(fid)
        due.update({f: t for f, t, _ in changed})
        events += 1
        assert events < 20000, "an event keeps coming back at the same time"


def test_hystart_ends_slow_start_when_a_rounds_ack_train_outlasts_half_the_rtt():
    # 100 Mbit/s, 50 ms one way: delayed ACKs come 0.24 ms apart (< 2 ms). The bursts of 10 ... 320
    # segments last under half the RTT (50 ms); 640 segments last 77.5 ms, so at the end of that
    # round HyStart sets the window to 640 + BDP/2 (BDP = 826.6 segments) and slow start ends.
    rtt = 0.1 + SEG / 100e6
    bdp = 100e6 * rtt / SEG
    fm, end = one_flow(100e6, 0.05, 3000)
    conn = fm.transport.connections["ab"]
    assert conn.ssthresh == pytest.approx(640 + bdp / 2) == conn.cwnd
    # the window covers the path from the eighth round: 1270 segments in seven RTTs, then line rate
    assert end == pytest.approx(7 * rtt + (3000 - 1270) * SEG / 100e6 + 0.05, abs=1e-9)
    # at 8 Mbit/s the ACKs come 3 ms apart: no HyStart, the window doubles until it covers the path
    fm, _ = one_flow(8e6, 0.05, 1000)
    assert fm.transport.connections["ab"].ssthresh == pytest.approx((8e6 * (0.1 + SEG / 8e6) + 0.1 * 8e6) / SEG)


def test_a_transfer_that_ends_in_slow_start_leaves_the_window_its_acks_grow():
    # 100 segments at 8 Mbit/s, 50 ms: rounds of 10, 20, 40, then 30 of the 80-segment round;
    # their acknowledgements add one segment each: the connection keeps 80 + 30 = 110
    fm, _ = one_flow(8e6, 0.05, 100)
    assert fm.transport.connections["ab"].cwnd == pytest.approx(110)


def test_next_event_is_the_earliest_of_its_candidate_times():
    """next_event is written without a list (it runs for every flow whose rate moves): it must be
    the minimum of the last bit, the next loss, the slow-start budget and the round's end, each
    where it applies, over random states including infinite rates and budgets."""
    from types import SimpleNamespace

    import numpy as np

    from emulator.flows.transport import EPS_BITS, INF, Connection, TcpState

    def reference(flow, st, now):
        rate, times = flow.rate, []
        if rate > 0:
            times.append(now + flow.remaining_bits / rate if rate < INF else now)
            if st.loss_in < INF:
                times.append(now + st.loss_in / rate if rate < INF else now)
            if st.phase == "ss" and st.budget > EPS_BITS:
                times.append(now + st.budget / rate if rate < INF else now)
        if st.phase == "ss" or (st.phase == "ca" and st.limited):
            times.append(st.round_end)
        return min(times, default=INF)

    rng = np.random.default_rng(7)
    transport = TcpTransport()
    for _ in range(5000):
        st = TcpState(Connection(cwnd=10.0), 0.05, 12112.0, 1448, 0.0, None)
        st.phase = str(rng.choice(["ss", "ca", "open"]))
        st.limited = bool(rng.integers(2))
        st.loss_in = INF if rng.random() < 0.4 else float(rng.uniform(0, 1e6))
        st.budget = INF if rng.random() < 0.3 else float(rng.choice([0.0, rng.uniform(0, 1e6)]))
        st.round_end = INF if rng.random() < 0.2 else float(rng.uniform(0, 20))
        rate = float(rng.choice([0.0, INF, rng.uniform(1e3, 1e9)]))
        flow = SimpleNamespace(tcp=st, rate=rate, remaining_bits=float(rng.uniform(0, 1e7)))
        now = float(rng.uniform(0, 10))
        assert transport.next_event(flow, now) == reference(flow, st, now)
