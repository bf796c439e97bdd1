"""BBR at flow level (emulator/flows/bbr.py), times by hand: startup doubles per round until three
rounds have not grown the delivery rate by 25 %, then the flow paces at the bottleneck's rate;
random loss costs its bytes and not the rate; a pause costs nothing; the min-RTT probe every 10 s
costs one RTT plus 200 ms at 4 segments; the sender's congestion control is chosen per connection."""
import math

import pytest

from emulator.flows.bbr import (BbrState, after_probe, count_rounds, plateau, probe_window, startup_window,
                                windowed_max)
from emulator.flows.congestion import CONGESTION_CONTROLS
from emulator.flows.links import FlowModel, simulate
from emulator.flows.transport import TcpParams, TcpTransport
from test_transport import Draws

SEG = 1514 * 8.0
LINK = ("up", "a")
INF = float("inf")
# 120 segments per 100 ms: a segment's serialization is 1/1200 s, so a one-way delay of
# (0.1 - 1/1200) / 2 makes the RTT (propagation and one segment) exactly 0.1 s and the BDP 120 segments
RATE = 1200 * SEG
RTT = 0.1
ONE_WAY = (RTT - SEG / RATE) / 2


def run(control, segments, *, loss_at=(), gap=None, rate=RATE, params=None):
    """One transfer of `segments` full segments (and, with `gap`, a second one that long after the
    first arrives) on one connection; the arrivals."""
    params = params or TcpParams()
    fm = FlowModel({LINK: rate}, TcpTransport(params, cc=CONGESTION_CONTROLS.get(control)(params)), queue_s={LINK: 1.0})
    tr = dict(bits=segments * SEG, path=[LINK], latency=ONE_WAY, connection="c", rtt=2 * ONE_WAY, seg_bits=SEG,
              loss=0.01 if loss_at else 0.0, rng=Draws(loss_at))
    transfers = [dict(start=0.0, **tr)]
    if gap is not None:
        transfers.append(dict(after=0, gap=gap, **{**tr, "loss": 0.0}))
    return [end for _, end in simulate(fm, transfers)], fm


# ---- the pure arithmetic --------------------------------------------------------------------------
def test_startup_ends_after_three_rounds_without_25_percent_growth():
    state = BbrState()
    for sample, rounds, filled in ((10, 0, False), (20, 0, False), (24, 1, False), (24.9, 2, False), (24.9, 3, True)):
        plateau(state, sample)
        assert (state.full_bw_rounds, state.filled) == (rounds, filled), sample
    assert state.btlbw == 24.9 and state.full_bw == 20


def test_startup_window_grows_by_what_is_acknowledged_below_its_target():
    # target 2/ln 2 * 100 segments + 3 = 291.5 segments
    assert startup_window(160, 120, 100 * SEG, 1.0, SEG) == 280
    assert startup_window(300, 120, 100 * SEG, 1.0, SEG) == 300
    assert probe_window(100 * SEG, 1.0, SEG) == 203
    assert probe_window(0.0, 1.0, SEG) == 4


def test_the_probe_phase_finds_room_or_follows_the_share_down():
    # room: delivered at 1.25x the estimate, which grows by 25 % and paces the 0.75 phase at 0.75 of it
    state = BbrState(btlbw=100.0, samples=[(0.0, 100.0)])
    assert after_probe(state, 125.0) == pytest.approx(93.75) and state.btlbw == 125.0
    # held at 100 by the link: the probe queued 25 per second, which the 0.75 phase's link delivers
    state = BbrState(btlbw=100.0, samples=[(0.0, 100.0)])
    assert after_probe(state, 100.0) == pytest.approx(100.0) and state.btlbw == 100.0
    # the share fell to 60: the estimate keeps 100 while its sample is within 10 rounds, then follows
    state = BbrState(btlbw=100.0, samples=[(0.0, 100.0)], rounds=9.5)
    after_probe(state, 60.0)
    assert state.btlbw == 100.0
    state.rounds = 10.5
    assert windowed_max(state, 60.0) == 60.0 and state.samples == [(10.5, 60.0)]


def test_the_filter_keeps_falling_samples_within_its_rounds():
    state = BbrState()
    for rounds, sample, best in ((0, 50.0, 50.0), (1, 80.0, 80.0), (2, 70.0, 80.0), (3, 60.0, 80.0), (11.5, 65.0, 70.0),
                                 (12.5, 10.0, 65.0), (21, 5.0, 65.0), (22, 4.0, 10.0)):
        state.rounds = float(rounds)
        assert windowed_max(state, sample) == best, rounds
    # (a sample exactly 10 rounds old still counts, as in Linux's minmax; at 11.5 the one of round 1 is out)
    # only samples that could still become the maximum are kept: falling, within the window
    assert state.samples == [(12.5, 10.0), (21.0, 5.0), (22.0, 4.0)]


def test_rounds_last_the_rtt_as_it_is_and_an_outage_passes_none():
    state = BbrState()
    count_rounds(state, 1.0, 1e6, 0.04, SEG)  # 25 rounds of a 40 ms RTT
    assert state.rounds == pytest.approx(25.0)
    count_rounds(state, 1.0, 1e6, 0.5, SEG)  # a fade: the window waits in the queue, the RTT is 500 ms
    assert state.rounds == pytest.approx(27.0)
    count_rounds(state, 1.0, 0.5 * SEG, 0.04, SEG)  # an outage: not a segment delivered
    assert state.rounds == pytest.approx(27.0)


# ---- a flow, by hand -------------------------------------------------------------------------------
# Startup, in segments per RTT (the link: 120): rounds send 10, 20, 40, 80 (paced at 2/ln 2 of the
# last sample, below the link), then 120 a round, the window 160, 280, 400; the samples 120, 120,
# 120 after 80 do not grow 25 %: the pipe is full at the end of round 7, 0.8 s, with 630 segments
# sent; then the link's rate.
STARTUP_END, STARTUP_SEGMENTS = 0.8, 630


def test_startup_then_the_bottlenecks_rate_by_hand():
    (arrival,), fm = run("bbr", 1830)
    assert arrival == pytest.approx(STARTUP_END + (1830 - STARTUP_SEGMENTS) / 1200 + ONE_WAY, abs=1e-9)
    conn = fm.transport.connections["c"]
    assert conn.cc.filled and conn.cc.btlbw == pytest.approx(RATE)
    assert conn.cwnd == pytest.approx(2 * 120 + 3)  # 2 BDP and the quantization budget


def test_a_transfer_that_ends_in_startup_gets_its_rounds():
    high_gain = 2 / math.log(2)
    # 10 + 20 + 40: the third round's 40 segments paced at 2/ln 2 of the second round's 20 per RTT
    (arrival,), _ = run("bbr", 70)
    assert arrival == pytest.approx(2 * RTT + 40 / (high_gain * 20 / RTT) + ONE_WAY, abs=1e-9)
    # 30 more: the fourth round's, paced at 2/ln 2 of 40 per RTT
    (arrival,), _ = run("bbr", 100)
    assert arrival == pytest.approx(3 * RTT + 30 / (high_gain * 40 / RTT) + ONE_WAY, abs=1e-9)


def test_a_flow_that_resumes_startup_paces_at_the_estimate_not_at_its_window():
    # the first transfer ends in the fourth round with the estimate at 40 segments per RTT and the
    # window at 80 + 30; the second sends its 100 segments in one round, paced at 2/ln 2 x 40 per RTT
    (first, second), _ = run("bbr", 100, gap=2.0)
    high_gain = 2 / math.log(2)
    assert second - (first + 2.0) == pytest.approx(100 / (high_gain * 40 / RTT) + ONE_WAY, abs=1e-9)


def test_random_loss_costs_bbr_its_bytes_not_its_rate():
    # one segment lost in probe bandwidth: one segment more at the link's rate, nothing else
    (clean,), _ = run("bbr", 1830)
    (lossy,), fm = run("bbr", 1830, loss_at=[900])
    assert lossy - clean == pytest.approx(1 / 1200, abs=1e-9)
    assert fm.transport.connections["c"].cc.filled
    # CUBIC cuts its window at the same loss and pays more than its bytes
    (cubic_clean,), _ = run("cubic", 1830)
    (cubic_lossy,), _ = run("cubic", 1830, loss_at=[900])
    assert cubic_lossy - cubic_clean > 5 * (lossy - clean)


def test_a_loss_in_startup_holds_that_rounds_window_packet_conservation():
    # the 100th segment, in round 3 (segments 70-149), is lost: that round's ACKs do not grow the
    # window (80, not 160), so round 4 sends 80 segments, not the link's 120; the estimate then
    # reaches 120 one round later and the pipe is full at 0.9 s with 710 segments sent (the
    # retransmission among them). 40 segments fewer by then, and one more to send: 41/1200 s later
    (clean,), _ = run("bbr", 1830)
    (lossy,), fm = run("bbr", 1830, loss_at=[100])
    assert lossy - clean == pytest.approx(41 / 1200, abs=1e-9)
    assert fm.transport.connections["c"].cc.filled


def test_after_a_pause_bbr_paces_at_once_where_cubic_restarts():
    # 2 s idle (more than the RTO): BBR keeps its window and paces at its estimate, so the second
    # transfer of 1830 segments takes 1.525 s at the link's rate; CUBIC's window decays and slow-starts
    (_, second), _ = run("bbr", 1830, gap=2.0)
    (first,), _ = run("bbr", 1830)
    start = first + 2.0
    assert second - start == pytest.approx(1830 / 1200 + ONE_WAY, abs=1e-9)
    (cubic_first, cubic_second), _ = run("cubic", 1830, gap=2.0)
    assert cubic_second - (cubic_first + 2.0) > second - start + 2 * RTT


def test_the_min_rtt_probe_every_ten_seconds_costs_an_rtt_and_200_ms_at_four_segments():
    # 13,830 segments: 0.8 s of startup, then 11.75 s at the link's rate, less what the probe at
    # 10 s (10 s after the connection's first RTT sample) takes: 0.3 s (one RTT to drain, then
    # 200 ms) at 4 segments per RTT instead of 120
    (arrival,), fm = run("bbr", 13830)
    probe = RTT + 0.2
    sent_in_probe = probe * 4 / RTT  # segments
    expected = STARTUP_END + (13830 - STARTUP_SEGMENTS - sent_in_probe) / 1200 + probe + ONE_WAY
    assert arrival == pytest.approx(expected, abs=1e-9)
    assert fm.transport.connections["c"].cc.rtprop_stamp == pytest.approx(10.0 + probe)


# ---- the sender's congestion control --------------------------------------------------------------
def fade_run(tmp_path, fade_s: float) -> tuple[float, float]:
    """9,000 segments over a traced link of 1,000 segments a second that fades to 100 a second at
    4 s for `fade_s` (40 ms RTT, 100 ms of buffer): (arrival, the arrival at full use of the trace)."""
    from emulator.flows.traces import TraceRates, TraceRef

    trace = tmp_path / f"fade{fade_s}.txt"
    trace.write_text(f"0 12.112\n4 1.2112\n{4 + fade_s} 12.112\n")
    rates = TraceRates({LINK: TraceRef(str(trace), loop=False)})
    fm = FlowModel({}, TcpTransport(TcpParams(congestion_control="bbr")), queue_s={LINK: 0.1})
    (_, arrival), = simulate(fm, [dict(start=0.0, bits=9000 * SEG, path=[LINK], latency=0.02, connection="c", rtt=0.04,
                                       seg_bits=SEG)], traces=rates)
    return arrival, 4 + fade_s + (9000 - 4000 - 100 * fade_s) / 1000 + 0.02


def test_a_short_fade_keeps_the_estimate_and_a_long_one_loses_it(tmp_path):
    """While the fade holds the flow back, its window waits in the queue (RTT up to 140 ms), so 10
    rounds last about 1.4 s: after a fade of 0.5 or 1 s the flow paces at the old rate at once and
    ends within one RTT of full use of the trace (it ended 2.3-2.5 s late when the estimate forgot
    the old rate within a cycle); after 3 s it followed the fade down and regrows 25 % per cycle."""
    for fade in (0.5, 1.0):
        arrival, ideal = fade_run(tmp_path, fade)
        assert ideal <= arrival <= ideal + 0.06, fade
    arrival, ideal = fade_run(tmp_path, 3.0)
    assert arrival > ideal + 1.0


def test_each_connection_runs_its_senders_congestion_control():
    transport = TcpTransport(TcpParams())
    assert type(transport.connection("down", "bbr").control).__name__ == "Bbr"
    assert type(transport.connection("up").control).__name__ == "Cubic"
    assert transport.connection("down", "cubic").control is transport.connection("down").control  # made once
    fm = FlowModel({("up", "s"): RATE, ("down", "c"): RATE}, transport)
    out = simulate(fm, [dict(start=0.0, bits=1830 * SEG, path=[("up", "s"), ("down", "c")], latency=ONE_WAY,
                             connection="srv", rtt=2 * ONE_WAY, seg_bits=SEG, control="bbr"),
                        dict(start=0.0, bits=1830 * SEG, path=[("up", "c")], latency=ONE_WAY, connection="cli",
                             rtt=2 * ONE_WAY, seg_bits=SEG)])
    assert [type(transport.connections[k].control).__name__ for k in ("srv", "cli")] == ["Bbr", "Cubic"]
    assert out[0][1] != out[1][1]  # (HyStart and CUBIC's growth against BBR's plateau)


def test_a_scenario_chooses_the_server_s_and_the_device_s():
    """server.link (downloads) and a device profile (uploads) name their congestion control; the
    network's links carry it to the connections their actors send on (transfers.py)."""
    from pathlib import Path

    from emulator.scenario import ScenarioError, load_scenario
    from emulator.world import build_world

    smoke = Path(__file__).resolve().parent.parent / "scenarios" / "smoke.yaml"
    sc, _ = load_scenario(smoke, ["server.link.congestion_control=bbr", "population.devices[0].congestion_control=reno"])
    world = build_world(sc)
    assert world.server_link.congestion_control == "bbr"
    named = {c.link.congestion_control for c in world.clients if c.device == sc.population.devices[0].name}
    assert named == {"reno"}
    others = {c.link.congestion_control for c in world.clients if c.device != sc.population.devices[0].name}
    assert others <= {None}  # network.tcp.congestion_control's
    with pytest.raises(ScenarioError, match=r"population\.devices\[0\]\.congestion_control: no congestion control named 'vegas'"):
        load_scenario(smoke, ["population.devices[0].congestion_control=vegas"])
