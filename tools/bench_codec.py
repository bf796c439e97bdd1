"""Codec throughput on the 1,663,370-parameter MNIST CNN state, one core.

Prints, per bit-length, encode and decode time (median of repeats) and throughput, next to a
plain numpy copy of the same float32 data measured in the same run, and the ratio of encode +
decode to that copy. The int codecs use the compiled kernel where it is built (`kernel` says);
`--numpy` measures the numpy path instead.
Usage: python tools/bench_codec.py [--repeats 15] [--numpy] [--json]
--json prints one object: copy_ms, copyto_ms (a copy into an existing array), kernel, ratio {codec:
(encode + decode) / copy}, worst, and worst_vs_copyto."""
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
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
    copy_s = median_time(lambda: flat.copy(), args.repeats)
    into = np.empty_like(flat)
    copyto_s = median_time(lambda: np.copyto(into, flat), args.repeats)  # the memory bus alone: no fresh pages
    say(f"model: {n:,} float32 parameters ({4 * n / 2**20:.2f} MiB); numpy copy: {copy_s * 1e3:.2f} ms "
        f"(into a ready array: {copyto_s * 1e3:.2f} ms); int kernel: {kernel}")
    say(f"{'codec':<28}{'payload B':>12}{'encode ms':>11}{'decode ms':>11}{'total ms':>10}{'MB/s':>8}{'x copy':>8}")
    specs = [{"name": "int", "bits": b} for b in range(2, 33)]
    specs += [{"name": "int", "bits": 8, "rounding": "nearest"}, {"name": "fp16"}, {"name": "bf16"}, {"name": "fp32"}]
    ratios = {}
    for spec in specs:
        codec = make_codec(spec)
        enc = encode_state(state, codec, rng)
        frames = [bytes(memoryview(f)) for f in enc.frames]
        t_enc = median_time(lambda: encode_state(state, codec, rng), args.repeats)
        t_dec = median_time(lambda: decode_state(frames), args.repeats)
        total = t_enc + t_dec
        label = codec.describe().replace(",granularity=per_filter", "")
        ratios[label] = round(total / copy_s, 2)
        say(f"{label:<28}{enc.payload_bytes:>12,}{t_enc * 1e3:>11.2f}{t_dec * 1e3:>11.2f}"
              f"{total * 1e3:>10.2f}{4 * n / total / 1e6:>8.0f}{total / copy_s:>8.1f}")
    worst = max(ratios, key=ratios.get)
    say(f"worst: {worst} at {ratios[worst]:.1f}x the copy")
    if args.json:
        print(json.dumps({"copy_ms": round(copy_s * 1e3, 4), "copyto_ms": round(copyto_s * 1e3, 4), "kernel": kernel,
                          "ratio": ratios, "worst": max(ratios.values()),
                          "worst_vs_copyto": round(max(ratios.values()) * copy_s / copyto_s, 2)}))


if __name__ == "__main__":
    main()
