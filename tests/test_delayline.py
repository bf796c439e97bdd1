"""tools/delayline.py's trace-driven bottleneck (mm-link's replay), without root: the opportunities
of both trace formats, the drop-tail queue, packets sharing and spanning opportunities, the loop,
and the clock that restarts at the offset for each repetition's first data packet. And the flow
model's side of a trace case (links.simulate with traces), by hand."""
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import delayline as dl  # noqa: E402

FULL = bytes(1500)
ACK = bytes(52)


def test_opportunities_of_both_formats():
    assert dl.opportunities("1\n2\n2\n5\n") == [1, 2, 2, 5]
    # 12 Mbit/s is 1500 bytes a millisecond: one opportunity per ms; the last sample holds one gap
    ops = dl.opportunities("0 12\n1 12\n")
    assert ops == list(range(2000))
    # 6 Mbit/s then 12: every other ms, then every ms
    ops = dl.opportunities("0.0, 6\n0.01, 12\n")
    assert ops[:5] == [1, 3, 5, 7, 9] and ops[5:] == list(range(10, 20))


def test_packets_leave_at_opportunities_in_order_and_the_trace_loops():
    b = dl.TraceBottleneck([1, 2, 2, 5], offset_ms=0, limit=10, rearm_s=0.5)
    for i in range(5):
        assert b.offer(FULL + bytes([i]) * 0, now=0.0)
    out = b.deliver(now=1.0)
    assert [round(t * 1000, 6) for t, _ in out] == [1, 2, 2, 5, 6]  # the fifth: the loop's first, 5 + 1 ms
    assert b.next_at == float("inf") and not b.queue


def test_small_packets_share_an_opportunity_and_a_large_one_spans_two():
    b = dl.TraceBottleneck([1, 2, 3, 4], offset_ms=0, limit=10, rearm_s=0.5)
    b.offer(FULL, 0.0)  # starts the clock
    b.offer(bytes(700), 0.0)
    b.offer(bytes(700), 0.0)
    b.offer(bytes(1400), 0.0)  # 100 bytes in the second opportunity, 1300 in the third
    times = [round(t * 1000, 6) for t, _ in b.deliver(1.0)]
    assert times == [1, 2, 2, 3]


def test_the_queue_drops_at_its_tail():
    b = dl.TraceBottleneck([10], offset_ms=0, limit=3, rearm_s=0.5)
    assert [b.offer(FULL, 0.0) for _ in range(5)] == [True, True, True, False, False]


def test_the_clock_starts_at_the_offset_for_each_repetitions_first_data_packet():
    b = dl.TraceBottleneck([1, 2, 3, 1000], offset_ms=500, limit=10, rearm_s=1.0)
    b.offer(ACK, 0.0)  # a handshake does not start the trace for data
    b.offer(FULL, 10.0)  # the first data packet: the trace reads 500 ms now; next opportunity at 1000 ms
    assert b.deliver(10.49) == []
    (t, _), = b.deliver(10.5)
    assert t == pytest.approx(10.5)
    # 0.6 s later, the same repetition: the clock runs on (1100 ms; the next opportunity is the
    # looped trace's 1000 ms, 2000 ms)
    b.offer(FULL, 10.6)
    (t, _), = b.deliver(20.0)
    assert t == pytest.approx(11.5)
    b.offer(FULL, 13.0)  # more than rearm_s without data: a new repetition, the trace at 500 ms again
    (t, _), = b.deliver(20.0)
    assert t == pytest.approx(13.5)


def test_the_flow_model_follows_a_two_level_trace_by_hand(tmp_path):
    """10 Mbit/s for 1 s, then 1 Mbit/s (no loop): 12 Mbit take 1 s + 2 s; from an offset of
    0.5 s, 0.5 s + 7 s; a second transfer sharing the link halves each part."""
    from emulator.flows.links import FlowModel, simulate
    from emulator.flows.traces import TraceRates, TraceRef

    trace = tmp_path / "two.txt"
    trace.write_text("0 10\n1 1\n")
    link = ("up", "a")
    for offset, expected in ((0.0, 3.0), (0.5, 7.5)):
        rates = TraceRates({link: TraceRef(str(trace), offset_s=offset, loop=False)})
        (_, end), = simulate(FlowModel({}), [dict(start=0.0, bits=12e6, path=[link], latency=0.0)], traces=rates)
        assert end == pytest.approx(expected)
    rates = TraceRates({link: TraceRef(str(trace), loop=False)})
    out = simulate(FlowModel({}), [dict(start=0.0, bits=6e6, path=[link], latency=0.0),
                                   dict(start=0.0, bits=6e6, path=[link], latency=0.0)], traces=rates)
    assert [end for _, end in out] == pytest.approx([3.0, 3.0])  # 5 Mbit each in 1 s, then 1 Mbit each at 0.5 Mbit/s
