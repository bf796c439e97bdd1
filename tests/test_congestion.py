"""Congestion control as a plug-in (emulator/flows/congestion.py): CUBIC is the registered default,
a scenario names another by registered name or import path, and a congestion control of one's own
sets the window and the pacing rate that the flow model, compiled or not, holds a flow to. Times by
hand."""
import pytest

from emulator.flows import links as links_module
from emulator.flows.congestion import CONGESTION_CONTROLS, CongestionControl, Cubic
from emulator.flows.links import FlowModel, simulate
from emulator.flows.transport import TcpParams, TcpTransport
from node.plugins import PluginError
from test_transport import Draws  # the 500th segment lost, as there

SEG = 1514 * 8.0
LINK = ("up", "a")
INF = float("inf")


class FixedWindow(CongestionControl):
    """Leaves slow start after its first round with a window of `W` segments and keeps it, loss or
    not; optionally paces at `pace` bits/s from then on."""

    W = 40.0
    pace = INF

    def slow_start_round(self, st, share_bits_per_rtt, queue_allowance_bits):
        st.conn.ssthresh = self.W
        st.pacing = self.pace
        return self.W, True

    def window(self, st, now, rtt):
        return st.conn.cwnd

    def on_window_limited(self, st, now):
        st.round_end = INF  # nothing grows: no window events

    def on_ca_round(self, st, now):
        st.round_end = INF

    def on_loss(self, st, now, cwnd):
        return self.W


class Paced(FixedWindow):
    W = 10_000.0  # never the limit
    pace = 3e6


def one_flow(cc, segments, rate=100e6, one_way=0.02):
    fm = FlowModel({LINK: rate}, TcpTransport(TcpParams(), cc=cc(TcpParams())), queue_s={LINK: 0.0})
    (start, end), = simulate(fm, [dict(start=0.0, bits=segments * SEG, path=[LINK], latency=one_way, connection="c",
                                       rtt=2 * one_way, seg_bits=SEG)])
    return end


@pytest.fixture(params=["compiled", "python"])
def rebalance(request, monkeypatch):
    if request.param == "compiled" and links_module._compiled_rebalance is None:
        pytest.skip("emulator/flows/_flowfill.c is not built here (no C compiler at install)")
    if request.param == "python":
        monkeypatch.setattr(links_module, "_compiled_rebalance", None)
    return request.param


def test_cubic_is_the_registered_default():
    assert CONGESTION_CONTROLS.get("cubic") is Cubic
    assert isinstance(TcpTransport().cc, Cubic)
    assert CONGESTION_CONTROLS.get("emulator.flows.congestion:Cubic") is Cubic  # by import path too
    with pytest.raises(PluginError, match="no congestion control named 'vegas'"):
        CONGESTION_CONTROLS.get("vegas")
    with pytest.raises(PluginError, match="not a subclass of emulator.flows.congestion.CongestionControl"):
        CONGESTION_CONTROLS.get("emulator.flows.links:FlowModel")


def test_a_fixed_window_sends_w_segments_per_rtt(rebalance):
    # 100 Mbit/s, 40 ms + one segment's serialization: the first round sends the initial 10
    # segments and ends one RTT in; then 40 segments per RTT (12.1 Mbit/s, far below the link)
    rtt = 0.04 + SEG / 100e6
    end = one_flow(FixedWindow, 1000)
    assert end == pytest.approx(rtt + 990 * rtt / 40 + 0.02, abs=1e-9)


def test_the_pacing_rate_caps_the_flow(rebalance):
    # the same flow paced at 3 Mbit/s once slow start is left: the rest at exactly that rate
    rtt = 0.04 + SEG / 100e6
    end = one_flow(Paced, 1000)
    assert end == pytest.approx(rtt + 990 * SEG / 3e6 + 0.02, abs=1e-9)


def test_cubic_state_lives_with_the_connection():
    fm = FlowModel({LINK: 8e6}, TcpTransport(), queue_s={LINK: 0.1})
    simulate(fm, [dict(start=0.0, bits=3000 * SEG, path=[LINK], latency=0.05, connection="ab", rtt=0.1, seg_bits=SEG)])
    conn = fm.transport.connections["ab"]
    # it left slow start with a window far above the initial one, which W_max keeps in whole segments
    assert conn.cc.w_max == int(conn.ssthresh) > 10
    assert conn.cc.epoch > 0


def test_a_scenario_names_its_congestion_control():
    from pathlib import Path

    from emulator.scenario import ScenarioError, load_scenario
    from emulator.world import _tcp_params

    smoke = Path(__file__).resolve().parent.parent / "scenarios" / "smoke.yaml"
    sc, _ = load_scenario(smoke, ["network.tcp.congestion_control=emulator.flows.congestion:Cubic"])
    params = _tcp_params(sc)
    assert params.congestion_control == "emulator.flows.congestion:Cubic"
    assert type(TcpTransport(params).cc) is Cubic
    with pytest.raises(ScenarioError, match=r"network\.tcp\.congestion_control: no congestion control named 'vegas'"):
        load_scenario(smoke, ["network.tcp.congestion_control=vegas"])
    assert _tcp_params(load_scenario(smoke, ["network.tcp.congestion_control=reno"])[0]).congestion_control == "reno"


def test_reno_halves_on_loss_and_regrows_one_segment_per_rtt(rebalance):
    """Reno, the second registered congestion control: no queue, so slow start leaves at the
    window of the round that outlasted the RTT (80 segments: the BDP is 67); a loss at the 500th
    segment halves it to 40 (CUBIC would keep 0.7 of it); it holds through the recovery (one RTT);
    then the window grows by one segment per RTT, in rate steps on whole RTTs each 5 % of growth,
    until it covers the path again."""
    rtt = 0.1 + SEG / 8e6
    fm = FlowModel({LINK: 8e6}, TcpTransport(TcpParams(congestion_control="reno")), queue_s={LINK: 0.0})
    due = {fid: (t, v) for fid, t, v in fm.add("f", 3000 * SEG, [LINK], connection="c", rtt=0.1, seg_bits=SEG,
                                                 loss=0.01, rng=Draws([500]))}
    steps = []
    while True:
        t, _ = due["f"]
        fm.advance(t)
        finished, changed = fm.fire("f")
        if finished:
            break
        due.update({f: (tt, vv) for f, tt, vv in changed})
        steps.append((t, fm.flows["f"].rate, fm.flows["f"].tcp.conn.cwnd))
    loss_at = next(i for i in range(1, len(steps)) if steps[i][2] < steps[i - 1][2])
    t_loss, rate_after, w_after = steps[loss_at]
    assert steps[loss_at - 1][2] == 80 and w_after == pytest.approx(40)
    assert rate_after == pytest.approx(40 * SEG / rtt)
    assert fm.transport.connections["c"].ssthresh == pytest.approx(40)
    # the first step keeps 40 through the recovery and until the window is 5 % larger: 2 segments,
    # 2 RTTs after the recovery's (1 a RTT)
    regrowth = steps[loss_at:]
    assert regrowth[1][0] == pytest.approx(t_loss + 3 * rtt, abs=1e-9)
    # each later step sends with the mean of the line 40 + (t - t_loss - RTT) / RTT at its two ends
    line = lambda t: 40 + (t - t_loss - rtt) / rtt  # noqa: E731
    checked = 0
    for (t0, rate, w), (t1, _, _) in zip(regrowth[1:], regrowth[2:]):
        if rate >= 8e6:
            break
        assert w == pytest.approx((line(t0) + line(t1)) / 2, rel=1e-9)
        checked += 1
    assert checked >= 3
    assert regrowth[-1][1] == 8e6
