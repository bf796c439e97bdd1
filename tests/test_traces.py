"""Trace-driven link capacity (emulator/flows/traces.py): both formats parsed by hand-counted
tables, malformed files named by file and line, and a transfer over a two-level trace through the
network process's own code with its time by hand (fluid transport)."""
import math
from pathlib import Path

import pytest
import zmq

from conftest import greeted_network
from emulator.flows.links import FlowModel, Framing
from emulator.flows.traces import PACKET_BITS, TraceError, TraceRef, parse_trace
from emulator.netconfig import CONDUCTOR, Link, NetworkConfig
from emulator.scenario import ScenarioError, load_scenario
from protocol import envelope

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "traces"


# ---- parsing -------------------------------------------------------------------------------------
def test_a_mahimahi_trace_counts_its_opportunities_per_bin():
    # opportunities at 0, 0, 50 ms (bin 0: 3 packets), 150 ms (bin 1), none in bin 2, 320 ms (bin 3)
    trace = parse_trace("0\n0\n50\n150\n320\n", "t.up", bin_s=0.1)
    assert tuple(trace.rates) == (3 * PACKET_BITS / 0.1, PACKET_BITS / 0.1, 0.0, PACKET_BITS / 0.1)
    assert trace.period == pytest.approx(0.4)  # until the last opportunity, in whole bins
    # it loops: 0.45 s is 0.05 s into the second pass
    assert trace.rate_at(0.45) == trace.rates[0] and trace.rate_at(0.35) == trace.rates[3]


def test_a_rate_series_holds_each_sample_and_averages_over_bins():
    # 10 Mbit/s from 0 to 1 s, 1 Mbit/s for the mean gap (1 s) after it; comma or whitespace
    trace = parse_trace("5.0 10\n6.0,1\n", "s.log", bin_s=0.5)
    assert tuple(trace.rates) == (10e6, 10e6, 1e6, 1e6)
    # a bin across a sample boundary takes the time average
    assert parse_trace("0 10\n0.25 2\n1 2\n", "s.log", bin_s=0.5).rates[0] == pytest.approx((10e6 * 0.25 + 2e6 * 0.25) / 0.5)


def test_the_next_change_skips_bins_of_the_same_rate_and_follows_the_loop():
    trace = parse_trace("0 10\n1 10\n2 1\n", "s.log", bin_s=0.5)  # 10, 10, 10, 10, 1, 1 (3 s)
    assert trace.next_change(0.2) == pytest.approx(2.0)
    assert trace.next_change(2.1) == pytest.approx(3.0)  # back to 10 as it loops
    once = parse_trace("0 10\n1 10\n2 1\n", "s.log", bin_s=0.5, loop=False)
    assert once.next_change(2.1) == math.inf and once.rate_at(99.0) == 1e6


def bins_next_change(rates: list[float], bin_s: float, loop: bool, t: float) -> float:
    """The next change by scanning bins one by one (what a trace of runs must give)."""
    n, k = len(rates), math.floor(max(0.0, t) / bin_s + 1e-9)
    current = rates[k % n if loop else min(k, n - 1)] if k >= n else rates[k]
    for j in range(k + 1, (k + 1 + n if loop else n) + 1):
        if j >= n and not loop:
            return math.inf
        if rates[j % n] != current:
            return j * bin_s
    return math.inf


def test_a_trace_kept_as_runs_answers_as_its_bins_do():
    """A trace is held as runs of equal rates (12 bytes a run): on random traces with repeated
    rates, looped or not, the rate and the next change at random times are the bins' to the bit."""
    import numpy as np

    from emulator.flows.traces import Trace

    rng = np.random.default_rng(5)
    for case in range(300):
        n = int(rng.integers(1, 40))
        rates = [float(x) for x in rng.choice([0.0, 1e6, 2.5e6, 8e6], size=n, p=[0.1, 0.4, 0.3, 0.2])]
        bin_s, loop = float(rng.choice([0.1, 0.25, 1.0])), bool(rng.random() < 0.7)
        trace = Trace("t", bin_s, rates, loop)
        assert list(trace.rates) == rates and trace.period == bin_s * n and trace.mean_bps == float(np.mean(rates))
        assert len(trace.starts) == 1 + sum(a != b for a, b in zip(rates, rates[1:]))
        for t in rng.uniform(0, 3 * n * bin_s, size=20).tolist() + [0.0, bin_s, n * bin_s, (n - 1) * bin_s]:
            k = math.floor(t / bin_s + 1e-9)
            want_rate = rates[k] if k < n else (rates[k % n] if loop else rates[-1])
            assert trace.rate_at(t) == want_rate, (case, t)
            assert trace.next_change(t) == bins_next_change(rates, bin_s, loop, t), (case, t, rates, loop)


@pytest.mark.parametrize("text, fmt, message", [
    ("0\n12\nx\n", "mahimahi", "t:3: expected a delivery time in whole milliseconds, got 'x'"),
    ("0\n20\n10\n", "mahimahi", "t:3: time 10 ms goes back (after 20 ms)"),
    ("", "auto", "t: no delivery opportunity after 0 ms"),
    ("0 1\n1\n", "series", "t:2: expected 'time_s rate_Mbit/s', got '1'"),
    ("0 1\n1 -2\n", "series", "t:2: a time and a rate >= 0 must be finite numbers"),
    ("0 1\n0 2\n", "series", "t:2: time 0.0 s does not come after 0.0 s"),
    ("0 1\n", "series", "t: a rate series needs at least two samples"),
    ("0 1\n", "csv", "t: unknown trace format 'csv'"),
])
def test_a_malformed_trace_is_one_line_naming_file_and_line(text, fmt, message):
    with pytest.raises(TraceError) as err:
        parse_trace(text, "t", fmt)
    assert message in str(err.value)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared trace data are not here")
def test_the_public_traces_parse_to_their_stated_means():
    """The README of ../shared/data/traces states each Mahimahi file's mean; the bins keep it."""
    for name, mean_mbps in (("TMobile-LTE-short.up", 13.32), ("ATT-LTE-driving.up", 0.83), ("Verizon-LTE-short.down", 5.03)):
        trace = parse_trace((SHARED / "mahimahi" / name).read_text(), name)
        assert trace.mean_bps / 1e6 == pytest.approx(mean_mbps, rel=0.01), name
    norway = next((SHARED / "pensieve_cooked").glob("bus.*"))
    assert parse_trace(norway.read_text(), norway.name).mean_bps > 0


# ---- a transfer over a trace, through the network process's code ------------------------------------
PEERS = {CONDUCTOR: [], "server": ["server"], "host0": ["c0"]}


def transfer_end(tmp_path: Path, payload: int, offset_s: float) -> tuple[float, int]:
    """c0 uploads `payload` bytes at t = 0 over an uplink of 10 Mbit/s for 1 s then 1 Mbit/s for 1 s,
    looped (fluid transport, no framing, no latency): when does it arrive, and how many bits crossed
    the link (the payload and the message's header)?"""
    trace = tmp_path / "two_level.log"
    trace.write_text("0 10\n1 1\n")
    links = {"server": Link(), "c0": Link(up_bps=1e6, down_bps=1e6)}
    cfg = NetworkConfig("inproc://unused", PEERS, links, framing=Framing(0, 0, 0),
                        traces={("up", "c0"): TraceRef(str(trace), offset_s, "series", 0.1)})
    net = greeted_network(cfg)
    records = []
    net.record = lambda rec: records.extend(rec.get("transfers", []))
    net.transfers.record = net.record
    net.receive(b"host0", [zmq.Frame(envelope.pack("send", src="c0", dst="server", kind="update", round=0, t=0.0, n=0,
                                                   body={}, payload=payload, fp32=payload)), zmq.Frame(b"x" * payload)])

    class Wire:
        def send_multipart(self, frames, copy=True):
            pass
    while net.step(Wire()):
        pass
    (rec,) = [r for r in records if r["kind"] == "update"]
    assert rec["outcome"] == "ok"
    return rec["t_end"], rec["link_bytes"] * 8


def test_a_transfer_follows_its_links_trace(tmp_path):
    # 3 MB (24 Mbit and the header) from the trace's start: 10 + 1 + 10 + 1 Mbit by 4 s, the rest at 10 Mbit/s
    end, bits = transfer_end(tmp_path, 3_000_000, 0.0)
    assert 24e6 < bits < 24e6 + 8000 and end == pytest.approx(4.0 + (bits - 22e6) / 10e6, abs=1e-9)
    # started 0.95 s into the trace: 0.5 + 1 + 10 + 1 + 10 + 1 Mbit by 5.05 s, then the rest at 10 Mbit/s
    end, bits = transfer_end(tmp_path, 3_000_000, 0.95)
    assert end == pytest.approx(5.05 + (bits - 23.5e6) / 10e6, abs=1e-9)


# ---- the scenario keys -----------------------------------------------------------------------------
SCENARIO = """
name: traced
rounds: 1
task: {dataset: synthetic, model: mlp, synthetic: {samples: 120, test_samples: 40, shape: [1, 28, 28], classes: 10}}
population: {clients: 4, hosts: 1, devices: [{ms_per_sample: 1}],
             links: [{down_mbps: 20, latency_ms: 20, up_trace: {files: %s}}]}
selection: {clients_per_round: 2}
"""


def test_clients_draw_their_trace_and_offset_seeded(tmp_path):
    (tmp_path / "a.log").write_text("0 10\n1 1\n")
    (tmp_path / "b.log").write_text("0 3\n2 5\n")
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO % "'*.log'")
    from emulator.world import build_world

    sc, _ = load_scenario(path)
    first, second = build_world(sc), build_world(sc)
    assert first.traces == second.traces and len(first.traces) == 4  # every uplink, the same draws
    assert {Path(ref.path).name for ref in first.traces.values()} == {"a.log", "b.log"}
    assert len({ref.offset_s for ref in first.traces.values()}) == 4  # each client starts elsewhere
    assert all(("down", c.profile.name) not in first.traces for c in first.clients)
    # the nominal uplink rate is the trace's mean: 5.5 Mbit/s for a, 4 Mbit/s for b
    assert {c.link.up_bps for c in first.clients} <= {5.5e6, 4e6}


def test_a_pool_of_synthetic_traces_is_shared_from_offsets_of_each_clients_own(tmp_path):
    """synthetic.pool: N: the clients of a mix draw one of N generated traces (seeded) and start each
    from its own offset; the network makes each pooled trace once. Without a pool each has its own."""
    from emulator.flows.traces import TraceRates
    from emulator.world import build_world

    path = tmp_path / "s.yaml"
    pooled = SCENARIO.replace("clients: 4", "clients: 40") % "x"
    path.write_text(pooled.replace("up_trace: {files: x}", "up_trace: {synthetic: {mean_mbps: 4, pool: 3}}"))
    sc, _ = load_scenario(path)
    first, second = build_world(sc), build_world(sc)
    assert first.traces == second.traces and len(first.traces) == 40
    assert len({ref.seed for ref in first.traces.values()}) == 3
    assert len({ref.offset_s for ref in first.traces.values()}) == 40
    rates = TraceRates(first.traces)
    for link in first.traces:
        rates.rate(link, 0.0)
    assert len(rates.cache) == 3 and len({id(t) for t in rates.traces.values()}) == 3
    path.write_text(pooled.replace("up_trace: {files: x}", "up_trace: {synthetic: {mean_mbps: 4}}"))
    own = build_world(load_scenario(path)[0])
    assert len({ref.seed for ref in own.traces.values()}) == 40


@pytest.mark.parametrize("files, words", [
    ("'missing/*.log'", "up_trace.files: no trace file matches 'missing/*.log'"),
    ("bad.log", "up_trace: "),
])
def test_a_bad_trace_is_one_line_naming_the_key(tmp_path, files, words):
    (tmp_path / "bad.log").write_text("0 10\n1 x\n")
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO % files)
    from emulator.world import build_world

    with pytest.raises(ScenarioError) as err:
        build_world(load_scenario(path)[0])
    assert words in str(err.value) and "\n" not in str(err.value)
    if files == "bad.log":
        assert "bad.log:2: expected 'time_s rate_Mbit/s'" in str(err.value)


def test_a_capacity_drop_under_tcp_builds_the_queue_and_inflates_the_rtt():
    """A CUBIC flow at 20 Mbit/s (100 ms RTT, 0.5 s of buffer) whose link drops to 2 Mbit/s: its
    window beyond the new BDP stands in the buffer, up to the buffer's size, and every RTT of the
    link grows by that queue (the numbers of transport.py's queue rule, by hand)."""
    from emulator.flows.transport import TcpTransport

    seg = 1514 * 8.0
    link = ("up", "a")
    fm = FlowModel({link: 20e6}, TcpTransport(), queue_s={link: 0.5})
    due = {fid: (t, v) for fid, t, v in fm.add("f", 50_000 * seg, [link], connection="c", rtt=0.1, seg_bits=seg)}
    while min(t for t, _ in due.values()) <= 3.0:  # past slow start: a window that covers the path
        fid = min(due, key=lambda f: due[f][0])
        fm.advance(due[fid][0])
        _, changed = fm.fire(fid)
        due.update({f: (t, v) for f, t, v in changed})
    flow, st = fm.flows["f"], fm.flows["f"].tcp
    assert st.phase == "ca" and flow.rate == 20e6
    fm.advance(3.0)
    fm.set_capacity(link, 2e6)
    excess = st.conn.cwnd * seg - 2e6 * st.rtt_base
    assert flow.rate == 2e6 and excess > 0.5 * 2e6  # more than the buffer holds: it is full
    assert fm.qdelay[link] == pytest.approx(min(excess, 0.5 * 2e6) / 2e6) == pytest.approx(0.5)
    assert st.rtt == pytest.approx(st.rtt_base + 0.5)
    fm.set_capacity(link, 20e6)  # and back: the same window fits again, the queue shrinks with it
    assert flow.rate == 20e6 and fm.qdelay[link] == pytest.approx((st.conn.cwnd * seg - 20e6 * st.rtt_base) / 20e6)


# ---- synthetic traces --------------------------------------------------------------------------------
def test_a_synthetic_trace_has_the_fitted_statistics_and_is_a_function_of_its_seed():
    from emulator.flows.traces import SyntheticFades

    spec = SyntheticFades(5.0)
    for seed in range(4):
        trace = spec.trace([seed], 1.0)
        rel = trace.rates / 5e6
        assert trace.mean_bps == pytest.approx(5e6)  # exactly its mean
        # within the spread of the 13 recordings it is fitted to (tools/trace_stats.py)
        assert 0.05 <= (rel < 0.3).mean() <= 0.25 and (rel == 0).mean() <= 0.09 and 0.35 <= rel.std() <= 0.95
        assert list(spec.trace([seed], 1.0).rates) == list(trace.rates)
    assert list(spec.trace([0], 1.0).rates) != list(spec.trace([1], 1.0).rates)


def test_a_synthetic_trace_is_the_one_it_always_was():
    """The generator's draws (and so every scenario on synthetic traces) do not move when its code
    does: the bins of two traces, as the first version of the generator made them."""
    import hashlib

    from emulator.flows.traces import SyntheticFades

    first = SyntheticFades(mean_mbps=8).trace([0, 0, 3], 0.1)
    second = SyntheticFades(mean_mbps=1.3, fade_share=0.3, outage_share=0.1, good_step_s=0.3,
                            duration_s=61.7).trace([0, 7, 3], 0.25)
    assert hashlib.md5(first.rates.tobytes()).hexdigest() == "f72f4f2ac8bcaf07784d8c5f0a5bb593"
    assert hashlib.md5(second.rates.tobytes()).hexdigest() == "e4104b097a68c91448bf80bac1332765"


def test_a_synthetic_traces_period_and_mean_are_known_without_making_it():
    """The world gives each client its offset and nominal rate without generating its trace (a large
    population's would not fit): the period is the generated one's, the mean the declared one."""
    from emulator.flows.traces import SyntheticFades, TraceRates

    for spec, bin_s in ((SyntheticFades(8.0), 0.1), (SyntheticFades(1.5, duration_s=61.23), 0.25)):
        trace = spec.trace([3], bin_s)
        assert spec.period(bin_s) == trace.period
        assert spec.mean_bps == pytest.approx(trace.mean_bps, rel=1e-12)
        rates = TraceRates({"up": TraceRef("", 1.0, bin_s=bin_s, synthetic=spec, seed=(3,))})
        assert rates.mean("up") == spec.mean_bps and not rates.traces  # (nothing generated to know it)
        assert rates.rate("up", 0.5) == max(1e3, trace.rate_at(1.5)) and rates.traces
    from emulator.flows.traces import load_trace

    once = load_trace(TraceRef("", 0.0, bin_s=0.1, loop=False, synthetic=SyntheticFades(8.0, duration_s=5.0), seed=(1,)))
    assert not once.loop and once.next_change(4.95) == math.inf and once.rate_at(60.0) == once.rates[-1]


def test_synthetic_shares_that_leave_no_good_period_are_refused():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "emulator", "validate", str(ROOT / "scenarios" / "cellular_edge.yaml"),
                          "--set", "population.links=[{profile: lte, down_mbps: 30, up_trace: {synthetic: "
                                   "{mean_mbps: 8, fade_share: 0.6, outage_share: 0.4}}}]"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert "population.links[0].up_trace.synthetic: fade_share + outage_share is 1, not below 1" in res.stderr


def test_a_run_on_synthetic_fading_uplinks_is_a_function_of_its_seed(tmp_path):
    """Real processes: two runs of a scenario whose uplinks each follow their own generated trace
    give the same transfers to the last digit; the same run on static links at the traces' mean does
    not (the fades move the uploads' times)."""
    import hashlib
    import subprocess
    import sys

    base = SCENARIO.replace("rounds: 1", "rounds: 2").replace("clients: 4", "clients: 6")
    traced = base.replace("up_trace: {files: %s}", "up_trace: {synthetic: {mean_mbps: 2}}")
    static = base.replace("up_trace: {files: %s}", "up_mbps: 2")
    digests = []
    for name, text in (("a", traced), ("b", traced), ("static", static)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(text.replace("name: traced", f"name: {name}"))
        out = tmp_path / f"run-{name}"
        res = subprocess.run([sys.executable, "-m", "emulator", "run", str(path), "--quiet", "--out", str(out)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        digests.append(hashlib.md5((out / "transfers.csv").read_bytes()).hexdigest())
    assert digests[0] == digests[1] != digests[2]


def test_a_flow_that_starts_in_an_outage_keeps_slow_start_and_its_rtt(tmp_path):
    """A trace with no capacity for its first 0.5 s, then 12.112 Mbit/s (1000 segments a second):
    nothing gets through the outage, so no ACK ends the first round and slow start goes on when the
    capacity comes (in the kernel the segments wait in the bottleneck's queue); the segment's
    serialization in the flow's RTT is at the trace's mean rate, not at the outage's 1 kbit/s (which
    would put 12 s in every round). The transfer ends within a round of the same one started at
    0.5 s on the static link (the held round ends at its first check after segments got through,
    which is up to an RTT early)."""
    from emulator.flows.links import simulate
    from emulator.flows.traces import TraceRates
    from emulator.flows.transport import INF, TcpParams, TcpTransport

    seg = 1514 * 8.0
    trace = tmp_path / "outage.txt"
    trace.write_text("0 0\n0.5 12.112\n")
    link = ("up", "a")
    transfer = dict(bits=300 * seg, path=[link], latency=0.045, connection="c", rtt=0.09, seg_bits=seg)
    rates = TraceRates({link: TraceRef(str(trace), loop=False)})
    fm = FlowModel({}, TcpTransport(TcpParams(hystart=False)))
    (_, traced), = simulate(fm, [dict(start=0.0, **transfer)], traces=rates)
    assert fm.nominal[link] == pytest.approx(12.112e6 / 2)  # the trace's mean (its two 0.5 s samples)
    assert fm.capacity[link] == pytest.approx(12.112e6)
    conn = fm.transport.connections["c"]
    static = FlowModel({link: 12.112e6}, TcpTransport(TcpParams(hystart=False)))
    (_, alone), = simulate(static, [dict(start=0.5, **transfer)])
    assert abs(traced - alone) <= 0.092 + 1e-9
    assert conn.ssthresh == 160 < INF  # slow start ended where the static link's does, not in the outage (at 10)
