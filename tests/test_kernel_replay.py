"""The tcp model against kernel CUBIC measurements recorded by `tools/validate_shaping.py --grid
--json` (tools/validation/kernel_grid.jsonl: two namespaces, the TUN delay line, tbf). The model
side is recomputed here for the recorded kernel times, so a change of the model that moves any
case out of the issue's bands fails without root or a kernel. Bands: loss-free payloads of 1 MiB
and more and the idle-gap cases within [0.95, 1.05], loss-free 64 KiB within [0.85, 1.15], lossy
cases within [0.75, 1.33] of the kernel's median."""
import json
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import validate_shaping as vs  # noqa: E402

GRID = REPO / "tools" / "validation" / "kernel_grid.jsonl"
# Measured outside their band, with why (docs/guide/network.md and the issue note give the numbers):
# - after a 1 s idle gap on a 300 ms RTT the kernel restarts with one window halving where the
#   model's RTO estimate (3 RTT decaying to RTT + 200 ms) gives two, so the model is 8 % slow;
# - at 0.1 % loss on 6.9 MB and at 1 % loss on 1 MiB the kernel's times are bimodal (an early
#   first loss holds CUBIC's window near its AIMD equilibrium for the whole transfer, a late one
#   does not): spreads of 1.1 to 12.6 s around medians of 0.7 to 8.4 s, and the median of nine
#   repetitions does not reproduce (20 Mbit/s, 40 ms, 1 %, 1 MiB: 1.42 s in the grid, 3.25 s in
#   tools/validation/kernel_reruns.jsonl). The model's ratio to such a median lands on either side.
# Each is held to a bound of its own, so that the model cannot drift further there unnoticed.
IDLE_AT_300_MS_RTT = [(5.0, 150.0, 0.0, 50.0, 1048576, 1.0, "tcp"), (100.0, 150.0, 0.0, 50.0, 1048576, 1.0, "tcp")]
# (Since windows are whole segments, 100/10/1 %/1000 ms, 5/150/1 %/1000 ms and 100/150/1 %/1000 ms
# on 1 MiB are inside the band and held to it; 100/10/0.1 %/50 ms and 20/40/0.1 %/1000 ms on 6.9 MB
# and 100/150/1 %/50 ms on 1 MiB, with kernel times of 0.66-1.39, 3.2-6.1 and 3.0-12.5 s, left it.)
BIMODAL_LOSSY = [
    (100.0, 40.0, 0.001, 50.0, 6920000, 0.0, "tcp"), (100.0, 150.0, 0.001, 50.0, 6920000, 0.0, "tcp"),
    (100.0, 10.0, 0.001, 50.0, 6920000, 0.0, "tcp"), (20.0, 40.0, 0.001, 1000.0, 6920000, 0.0, "tcp"),
    (100.0, 10.0, 0.01, 50.0, 1048576, 0.0, "tcp"), (5.0, 40.0, 0.01, 50.0, 1048576, 0.0, "tcp"),
    (20.0, 40.0, 0.01, 50.0, 1048576, 0.0, "tcp"), (100.0, 40.0, 0.01, 1000.0, 1048576, 0.0, "tcp"),
    (5.0, 150.0, 0.01, 50.0, 1048576, 0.0, "tcp"), (100.0, 150.0, 0.01, 50.0, 1048576, 0.0, "tcp"),
    (100.0, 150.0, 0.01, 1000.0, 65536, 0.0, "tcp"),
]
KNOWN_OUTSIDE = {**dict.fromkeys(IDLE_AT_300_MS_RTT, (0.95, 1.10)), **dict.fromkeys(BIMODAL_LOSSY, (0.5, 2.0))}


def band(rec):
    if rec["loss"] > 0:
        return 0.75, 1.33
    if rec["idle_s"] > 0 or rec["payload_bytes"] >= 2**20:
        return 0.95, 1.05
    return 0.85, 1.15


def recorded_cases():
    seen = {}
    for line in GRID.read_text().splitlines():
        rec = json.loads(line)
        key = (rec["rate_mbps"], rec["delay_ms"], rec["loss"], rec["queue_ms"], rec["payload_bytes"], rec["idle_s"], rec["path"])
        seen.setdefault(key, rec)
    return seen


def test_the_recorded_grid_is_the_issues_whole_grid():
    """Every case of the grid: 5, 20, 100 Mbit/s x 0, 10, 40, 150 ms x 64 KiB, 1 MiB, 6.9 MB, loss-free
    over TCP and ZeroMQ (queue 50 ms), lossy at 0.1 % and 1 % with queues of 50 and 1000 ms (TCP),
    and the idle-gap case (1 MiB, 1 s) at every rate and delay."""
    rates, delays, sizes = (5.0, 20.0, 100.0), (0.0, 10.0, 40.0, 150.0), (65536, 1048576, 6920000)
    grid = {(r, d, 0.0, 50.0, s, 0.0, p) for r in rates for d in delays for s in sizes for p in ("tcp", "zmq")}
    grid |= {(r, d, loss, q, s, 0.0, "tcp") for r in rates for d in delays for loss in (0.001, 0.01) for q in (50.0, 1000.0)
             for s in sizes}
    grid |= {(r, d, 0.0, 50.0, 1048576, 1.0, "tcp") for r in rates for d in delays}
    cases = recorded_cases()
    assert len(grid) == 228 and set(cases) == grid
    assert all(cases[k]["reps"] >= 9 for k in cases if k[2] > 0)  # lossy: the median of at least nine


@pytest.mark.parametrize("model", ["tcp", "fluid"])
def test_replayed_against_recorded_kernel_times(model):
    class Args:
        pause, seed = 0.05, 1

    outside = {}
    for key, rec in recorded_cases().items():
        case = vs.record_case(rec)
        new = vs.record(case, rec["path"], model, rec["kernel_times"], Args, vs.TUN_FRAMING, vs.TcpParams())
        lo, hi = band(new)
        if not lo <= new["ratio"] <= hi:
            outside[key] = new["ratio"]
    if model == "tcp":
        assert set(outside) <= set(KNOWN_OUTSIDE), {k: v for k, v in outside.items() if k not in KNOWN_OUTSIDE}
        assert all(KNOWN_OUTSIDE[k][0] <= outside[k] <= KNOWN_OUTSIDE[k][1] for k in outside), outside
    else:
        # the fluid model misses wherever slow start or loss matters: the comparison discriminates
        assert len(outside) >= 80


BBR_GRID = REPO / "tools" / "validation" / "kernel_grid_bbr.jsonl"


def bbr_band(rec):
    """The issue's bands for BBR: loss-free 1 MiB and more (and the idle-gap cases) within
    [0.90, 1.10], 64 KiB within [0.80, 1.20], lossy within [0.75, 1.33]."""
    if rec["loss"] > 0:
        return 0.75, 1.33
    if rec["idle_s"] > 0 or rec["payload_bytes"] >= 2**20:
        return 0.90, 1.10
    return 0.80, 1.20


def test_bbr_replayed_against_recorded_kernel_bbr_times():
    """The BBR model against kernel BBR (`validate_shaping.py --grid --cc bbr --models tcp --paths tcp
    --json`: the issue's whole grid over TCP, 192 cases; tools/validation/kernel_grid_bbr.jsonl),
    every case within its band."""
    class Args:
        pause, seed = 0.05, 1

    params = vs.TcpParams(congestion_control="bbr")
    recs = [json.loads(line) for line in BBR_GRID.read_text().splitlines() if line.startswith("{")]
    rates, delays, sizes = (5.0, 20.0, 100.0), (0.0, 10.0, 40.0, 150.0), (65536, 1048576, 6920000)
    grid = {(r, d, 0.0, 50.0, s, 0.0) for r in rates for d in delays for s in sizes}
    grid |= {(r, d, loss, q, s, 0.0) for r in rates for d in delays for loss in (0.001, 0.01) for q in (50.0, 1000.0) for s in sizes}
    grid |= {(r, d, 0.0, 50.0, 1048576, 1.0) for r in rates for d in delays}
    assert {tuple(vs.record_case(r).values()) for r in recs} == grid and len(recs) == 192  # the whole grid, over TCP
    assert all(r["reps"] >= 9 for r in recs if r["loss"] > 0)
    outside = {}
    for rec in recs:
        new = vs.record(vs.record_case(rec), rec["path"], "tcp", rec["kernel_times"], Args, vs.TUN_FRAMING, params)
        lo, hi = bbr_band(new)
        if not lo <= new["ratio"] <= hi:
            outside[tuple(vs.record_case(rec).values())] = round(new["ratio"], 3)
    assert not outside, outside


@pytest.mark.parametrize("cc", ["cubic", "bbr"])
def test_the_model_side_of_several_flows_shares_the_bottleneck(cc):
    """`--flows K`: K fresh connections started together through one bottleneck. Loss-free with no
    delay, they share it fairly and finish together: each after K payloads at the link's rate
    (framed), plus the acknowledgement's own bytes."""
    params = vs.TcpParams(congestion_control=cc)
    size, rate, k = 1_000_000, 20e6, 5
    runs = vs.emulated_flow_times(size, rate, 0.0, 0.0, 0.1, k, 3, vs.TUN_FRAMING, params)
    assert len(runs) == 3 and all(len(r) == k and r == sorted(r) for r in runs)
    by_rank = vs.rank_medians(runs)
    link_s = vs.TUN_FRAMING.link_bytes(size + vs.HEADER) * 8.0 / rate
    ack_s = vs.TUN_FRAMING.link_bytes(1) * 8.0 / rate
    assert by_rank[-1] == pytest.approx(k * link_s + ack_s, rel=1e-3)
    assert by_rank[0] == pytest.approx(by_rank[-1], rel=1e-3)
    assert vs.rank_medians([[1.0, 4.0], [3.0, 2.0], [2.0, 6.0]]) == [2.0, 4.0]


def test_several_flows_replayed_against_recorded_kernel_times():
    """K flows started together through one bottleneck, 6.65 MB each (tools/validation/
    kernel_flows5.jsonl: five through 20 Mbit/s, 30 ms one way; kernel_flows10.jsonl: ten through 50
    Mbit/s, 50 ms; 100 ms of queue): loss-free and lossy (0.5 %, 1 %) BBR and loss-free CUBIC within
    [0.90, 1.10] of the kernel at every rank. Lossy CUBIC is the known gap (docs/2026-12-07-shared-
    loss.md: 0.95-1.13 by rank, the second of ten flows at 0.5 % slow), held to bounds of its
    own."""
    class Args:
        seed = 1

    seen = set()
    for name in ("kernel_flows5.jsonl", "kernel_flows10.jsonl"):
        for line in (REPO / "tools" / "validation" / name).read_text().splitlines():
            rec = json.loads(line)
            case = dict(rate=rec["rate_mbps"], delay=rec["delay_ms"], loss=rec["loss"], queue=rec["queue_ms"],
                        size=rec["payload_bytes"])
            Args.cc = rec["cc"]
            new = vs.flows_record(case, rec["flows"], rec["kernel_runs"], Args, vs.TUN_FRAMING,
                                  vs.TcpParams(congestion_control=rec["cc"]))
            lo, hi = (0.90, 1.15) if rec["cc"] == "cubic" and rec["loss"] > 0 else (0.90, 1.10)
            assert all(lo <= r <= hi for r in new["ratios"]), (rec["flows"], rec["cc"], rec["loss"], new["ratios"])
            seen.add((rec["flows"], rec["cc"], rec["loss"]))
    assert seen >= {(k, cc, loss) for k in (5, 10) for cc in ("cubic", "bbr") for loss in (0.0, 0.005, 0.01)}


def test_trace_cases_replayed_against_recorded_kernel_times():
    """Traces replayed in the kernel as mm-link does (tools/validation/kernel_traces.jsonl: two
    Mahimahi LTE uplinks, one downlink and a Norway 3G series, 1 MiB and 6.9 MB, five random offsets
    each, CUBIC and BBR): for each trace, payload and congestion control, the median over offsets of
    emulated/kernel within [0.85, 1.15]. Needs the traces themselves (../shared/data/traces)."""
    import statistics

    from conftest import SHARED_DATA
    import validate_traces as vt

    roots = [SHARED_DATA / "traces" / "mahimahi", SHARED_DATA / "traces" / "pensieve_cooked"]
    if not all(r.is_dir() for r in roots):
        pytest.skip("the shared test data's traces are not here")
    recs = vt.replay(REPO / "tools" / "validation" / "kernel_traces.jsonl", vs.TUN_FRAMING, 0.1, roots)
    groups: dict = {}
    for rec in recs:
        groups.setdefault((rec["cc"], rec["trace"], rec["size"]), []).append(rec["ratio"])
    assert len(groups) == 16 and all(len(r) == 5 for r in groups.values())  # CUBIC and BBR, 5 offsets each
    medians = {k: statistics.median(r) for k, r in groups.items()}
    outside = {k: m for k, m in medians.items() if not 0.85 <= m <= 1.15}
    assert not outside, outside
