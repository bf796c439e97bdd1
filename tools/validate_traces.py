"""The trace cases of tools/validate_shaping.py (`--traces FILES`): the A->B direction follows a
recorded trace, as Mahimahi's mm-link replays one (tools/delayline.py --trace: a drop-tail queue
before the trace's delivery opportunities, then the one-way delay), and the emulator's flow model
runs the same transfer over the same trace from the same offset, its capacity the trace's mean over
`--bin-ms` bins (the product's default: 100 ms) changed at their boundaries, as the network process
does (emulator/flows/traces.py).

    sudo python tools/validate_shaping.py --traces A.up,B.up --offsets 5 --delays-ms 20 \\
        --sizes 1048576,6920000 --queues-ms 100 --cc cubic --reps 3 --json

Each case is (trace, start offset, one-way delay, payload, queue). The queue is `--queues-ms` of
the trace's mean rate: in packets for the delay line (mm-link's drop-tail limit), in seconds of the
current rate for the model (what a scenario's `queue_ms` means). A repetition waits a second before
it starts, so that the delay line restarts the trace at the offset for its first data packet. The
record gives the kernel's times, the model's (no loss: one value) and their ratio; the summary
line per trace and payload gives the median over offsets of emulated/kernel."""
from __future__ import annotations

import json

import statistics
from pathlib import Path

import numpy as np

from emulator.flows.links import FlowModel, Framing, simulate
from emulator.flows.traces import PACKET_BITS, TraceRates, TraceRef, load_trace
from emulator.flows.transport import TcpParams, TcpTransport

from validate_shaping import HEADER, Testbed, emit, floats, measure

REARM_PAUSE_S = 1.0  # more than the delay line's --rearm-s (0.5 s): each repetition meets the trace afresh


def trace_cases(args) -> list[dict]:
    """Each trace's seeded random offsets (over its period), with every delay, payload and queue."""
    out = []
    for number, path in enumerate(p for p in args.traces.split(",") if p):
        trace = load_trace(TraceRef(path, bin_s=args.bin_ms / 1000.0, loop=True))
        rng = np.random.default_rng([args.seed, number])
        for offset in sorted(float(x) for x in rng.uniform(0, trace.period, args.offsets)):
            for delay in floats(args.delays_ms):
                for size in (int(x) for x in floats(args.sizes)):
                    for queue in floats(args.queues_ms):
                        packets = max(1, round(queue / 1000 * trace.mean_bps / PACKET_BITS))
                        out.append(dict(trace=path, mean_mbps=trace.mean_bps / 1e6, offset_s=round(offset, 3),
                                        delay=delay, size=size, queue=queue, packets=packets))
    return out


def emulated_traced(case: dict, framing: Framing, params: TcpParams, bin_s: float) -> float:
    """The model's time for the case: the payload over the traced link, then the one-byte acknowledgement."""
    up_a, up_b = ("up", "a"), ("up", "b")
    seg_bits = (framing.mss + framing.segment_overhead) * 8.0
    delay_s = case["delay"] / 1000.0
    traces = TraceRates({up_a: TraceRef(case["trace"], offset_s=case["offset_s"], bin_s=bin_s, loop=True)})
    model = FlowModel({}, TcpTransport(params), queue_s={up_a: case["queue"] / 1000.0})
    out = simulate(model, [dict(start=0.0, bits=framing.link_bytes(case["size"] + HEADER) * 8.0, path=[up_a],
                                latency=delay_s, connection="ab", rtt=2 * delay_s, seg_bits=seg_bits, mss=framing.mss),
                           dict(after=0, bits=framing.link_bytes(1) * 8.0, path=[up_b], latency=delay_s, connection="ba",
                                rtt=2 * delay_s, seg_bits=seg_bits, mss=framing.mss)], traces=traces)
    return out[1][1] - out[0][0]


def run(args, bed: Testbed, framing: Framing, params: TcpParams) -> None:
    records = []
    for case in trace_cases(args):
        bed.path(case["delay"], 0.0, args.seed, ("--trace", case["trace"], "--trace-offset-ms", str(1000 * case["offset_s"]),
                                                 "--queue-packets", str(case["packets"])))
        bed.unshape()
        bed.line_report()
        kernel_times = measure(bed, "tcp", case["size"], args.reps, max(args.pause, REARM_PAUSE_S), 0.0)
        late = bed.line_report()
        emulated = emulated_traced(case, framing, params, args.bin_ms / 1000.0)
        kernel = statistics.median(kernel_times)
        rec = {**case, "trace": Path(case["trace"]).name, "trace_path": case["trace"], "cc": args.cc, "reps": len(kernel_times), "kernel_s": kernel,
               "kernel_min_s": min(kernel_times), "kernel_max_s": max(kernel_times), "emulated_s": emulated,
               "ratio": emulated / kernel, "kernel_times": kernel_times,
               "queue_dropped": late.get("queue_dropped"), "delayline_max_late_ms": 1000 * late.get("max_lateness_s", 0.0)}
        records.append(rec)
        show(rec, args.json)
    summary(records, args.json)


def replay(path: Path, framing: Framing, bin_s: float, roots: list[Path] = ()) -> list[dict]:
    """The model's side again for trace records measured earlier (after a change of the model):
    each record with its emulated time and ratio recomputed. A record's trace is found at its
    recorded path, else by its name under `roots`."""
    out = []
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if "summary" in rec:
            continue
        found = [Path(rec.get("trace_path", ""))] + [r / rec["trace"] for r in roots]
        trace = next((str(f) for f in found if f.is_file()), None)
        if trace is None:
            raise SystemExit(f"{path}: trace {rec['trace']} not found (give its folder)")
        emulated = emulated_traced({**rec, "trace": trace}, framing, TcpParams(congestion_control=rec["cc"]), bin_s)
        out.append({**rec, "emulated_s": emulated, "ratio": emulated / rec["kernel_s"]})
    return out


def show(rec: dict, as_json: bool) -> None:
    emit(rec, as_json, f"{rec['trace']:<28} @{rec['offset_s']:>7.1f}s {rec['delay']:>4g} ms q{rec['queue']:>4g} ms "
                       f"{rec['size']:>9,} B {rec['cc']}: kernel {rec['kernel_s']:7.3f} s ({rec['kernel_min_s']:.3f}-"
                       f"{rec['kernel_max_s']:.3f})  emulated {rec['emulated_s']:7.3f} s  ratio {rec['ratio']:.3f}")


def summary(records: list[dict], as_json: bool) -> None:
    """Per trace and payload: the median over offsets of emulated/kernel."""
    groups: dict[tuple, list[float]] = {}
    for rec in records:
        groups.setdefault((rec["trace"], rec["size"], rec["delay"], rec["queue"]), []).append(rec["ratio"])
    for (trace, size, delay, queue), ratios in groups.items():
        line = {"summary": trace, "size": size, "delay_ms": delay, "queue_ms": queue, "offsets": len(ratios),
                "median_ratio": statistics.median(ratios), "ratios": ratios}
        emit(line, as_json, f"{trace} {size:,} B {delay:g} ms q{queue:g}: median over {len(ratios)} offsets "
                            f"{line['median_ratio']:.3f} ({' '.join(f'{r:.2f}' for r in ratios)})")
