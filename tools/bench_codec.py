"""Codec throughput on the 1,663,370-parameter MNIST CNN state, one core.

Prints, per bit-length, encode and decode time (median of repeats) and throughput, and the ratio
of encode + decode to a plain numpy copy of the same float32 data timed in the same rounds
(interleaved_medians): the faster of a copy to a new array and one into a ready array. The int codecs use the compiled kernel where it is built (`kernel` says);
`--numpy` measures the numpy path instead.
Usage: python tools/bench_codec.py [--repeats 8] [--numpy] [--json]
--json prints one object: copy_ms and copyto_ms (the two copies timed alone, before the codecs),
copy_beside_ms (the median over codecs of the copy timed beside each), kernel, ratio {codec:
(encode + decode) / the copy timed beside it}, worst, and worst_vs_copy_alone (the worst codec's
time against the faster copy timed alone instead)."""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402,F401  (loaded, as in the hosts and the server: fp16 converts through it)

from protocol.codecs import dense, decode_state, encode_state, make_codec  # noqa: E402

SHAPES = {
    "features.0.weight": (32, 1, 5, 5), "features.0.bias": (32,),
    "features.3.weight": (64, 32, 5, 5), "features.3.bias": (64,),
    "classifier.1.weight": (512, 3136), "classifier.1.bias": (512,),
    "classifier.3.weight": (10, 512), "classifier.3.bias": (10,),
}


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def interleaved_medians(fns, repeats: int, burst: int = 4) -> list[float]:
    """The median time of each of fns, timed in turn, a burst of calls each, in every one of
    `repeats` rounds. A shared VM's speed swings by up to 2x within minutes: a ratio of two medians
    taken minutes apart carries that swing, one taken in the same rounds does not. Within a burst
    the first call is not counted: a copy timed right after other work (or a pause) takes twice
    as long as in a loop of its own, and the baseline is the copy at its fastest."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, into in zip(fns, times):
            fn()
            for _ in range(burst - 1):
                t = time.perf_counter()
                fn()
                into.append(time.perf_counter() - t)
    return [float(np.median(t)) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=8, help="rounds of interleaved bursts (3 timed calls each)")
    ap.add_argument("--numpy", action="store_true", help="measure the numpy path even where the kernel is built")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    if args.numpy:
        dense._kernels = None
    kernel = "c" if dense._kernels is not None else "numpy"
    say = (lambda *a, **k: None) if args.json else print
    rng = np.random.default_rng(0)
    state = {k: (rng.normal(size=s) * 0.05).astype(np.float32) for k, s in SHAPES.items()}
    n = sum(v.size for v in state.values())
    flat = np.concatenate([v.reshape(-1) for v in state.values()])
    copy_s = median_time(lambda: flat.copy(), 3 * args.repeats)
    into = np.empty_like(flat)
    copyto_s = median_time(lambda: np.copyto(into, flat), 3 * args.repeats)  # the memory bus alone: no fresh pages
    say(f"model: {n:,} float32 parameters ({4 * n / 2**20:.2f} MiB); numpy copy: {copy_s * 1e3:.2f} ms "
        f"(into a ready array: {copyto_s * 1e3:.2f} ms); int kernel: {kernel}")
    say(f"{'codec':<28}{'payload B':>12}{'encode ms':>11}{'decode ms':>11}{'total ms':>10}{'MB/s':>8}{'x copy':>8}")
    specs = [{"name": "int", "bits": b} for b in range(2, 33)]
    specs += [{"name": "int", "bits": 8, "rounding": "nearest"}, {"name": "fp16"}, {"name": "bf16"}, {"name": "fp32"}]
    ratios, beside = {}, {}
    for spec in specs:
        codec = make_codec(spec)
        enc = encode_state(state, codec, rng)
        frames = [bytes(memoryview(f)) for f in enc.frames]
        t_copy, t_copyto, t_enc, t_dec = interleaved_medians(
            [lambda: flat.copy(), lambda: np.copyto(into, flat), lambda: encode_state(state, codec, rng),
             lambda: decode_state(frames)], args.repeats)
        base = min(t_copy, t_copyto)  # the stricter: a fresh array's page faults are not the codec's excuse
        total = t_enc + t_dec
        label = codec.describe().replace(",granularity=per_filter", "")
        ratios[label] = round(total / base, 2)
        beside[label] = base
        say(f"{label:<28}{enc.payload_bytes:>12,}{t_enc * 1e3:>11.2f}{t_dec * 1e3:>11.2f}"
              f"{total * 1e3:>10.2f}{4 * n / total / 1e6:>8.0f}{total / base:>8.1f}")
    worst = max(ratios, key=ratios.get)
    copy_beside = float(np.median(list(beside.values())))
    worst_vs_alone = max(r * beside[k] / min(copy_s, copyto_s) for k, r in ratios.items())
    say(f"worst: {worst} at {ratios[worst]:.1f}x the copy timed beside it; that copy took {copy_beside * 1e3:.2f} ms "
        f"(median over codecs) and {min(copy_s, copyto_s) * 1e3:.2f} ms timed alone, against which the worst is "
        f"{worst_vs_alone:.1f}x")
    if args.json:
        print(json.dumps({"copy_ms": round(copy_s * 1e3, 4), "copyto_ms": round(copyto_s * 1e3, 4), "kernel": kernel,
                          "copy_beside_ms": round(copy_beside * 1e3, 4), "ratio": ratios, "worst": max(ratios.values()),
                          "worst_vs_copy_alone": round(worst_vs_alone, 2)}))

if __name__ == "__main__":
    main()
