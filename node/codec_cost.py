"""What a client's codec work costs in emulated time (`algorithm.charge_codec_time`): decoding the
task's model, the privacy stage's noise on the weights, and encoding the update, measured once on
the machine that runs the emulator and scaled to each device by how much slower it trains.

Why it is measured once, before the hosts fork, and not timed as each client works: a client
declares its work's duration before the work runs (node/actor.py), and a run must be a function of
its seed and scenario. The measured table is pinned into the run's scenario.yaml
(`algorithm.codec_time`), so the run directory reruns and resumes to the same emulated times, and a
user can pin a table of their own (e.g. one measured on the real device).

Scaling: a device whose modelled training takes k times the host's per sample is taken to code k
times slower too, `seconds = host codec seconds x device ms_per_sample / host ms_per_sample`. Both
host figures are measured on one thread (the codec kernels are single-threaded)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np
import torch

from protocol.codecs import Codec, decode_state, encode_state
from .models import state_spec, state_to_numpy
from .training import sgd_step


@dataclass(frozen=True)
class CodecTime:
    """Whole-model seconds on the host, keyed by bit-length (0 where the codec has none)."""
    host_ms_per_sample: float  # one training sample's forward and backward pass on the host
    decode_s: Mapping[int, float]  # the task's model, per download bit-length
    encode_s: Mapping[int, float]  # the update, per upload bit-length
    noise_s: float = 0.0  # the local DP stage's noise on the weights (none without it)

    def seconds(self, down_bits: int | None, up_bits: int | None, device_ms_per_sample: float) -> float:
        """The device's full-speed seconds of codec work for one task."""
        host_s = _at(self.decode_s, down_bits) + self.noise_s + _at(self.encode_s, up_bits)
        return host_s * device_ms_per_sample / self.host_ms_per_sample

    def as_dict(self) -> dict:
        return {"host_ms_per_sample": self.host_ms_per_sample, "decode_s": dict(self.decode_s),
                "encode_s": dict(self.encode_s), "noise_s": self.noise_s}


def _at(table: Mapping[int, float], bits: int | None) -> float:
    """The entry for `bits`, or the nearest bit-length measured (a pinned table may be sparse)."""
    key = int(bits or 0)
    if key in table:
        return float(table[key])
    return float(table[min(table, key=lambda b: (abs(b - key), b))]) if table else 0.0


def _at_bits(codec: Codec, bits: int | None) -> Codec:
    return codec.with_bits(bits) if bits is not None and hasattr(codec, "with_bits") else codec


def median_seconds(fn: Callable[[], object], reps: int = 3) -> float:
    """Median wall seconds of fn over reps calls, after one call that warms caches and allocators."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_ms_per_sample(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, reps: int = 3) -> float:
    """One SGD step on the batch, per sample, on one thread: the host's counterpart of a device's
    ms_per_sample (a batch of 32 or more keeps the per-batch overhead small beside it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        params = list(model.parameters())
        loss_fn = torch.nn.CrossEntropyLoss()

        def step() -> None:  # training's own step (lr 0: the model stays as it is)
            for p in params:
                p.grad = None
            loss_fn(model(inputs), labels).backward()
            sgd_step(params, 0.0)

        return median_seconds(step, reps) * 1000.0 / len(inputs)
    finally:
        torch.set_num_threads(threads)


def calibrate(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, down: Codec, up: Codec,
              down_bits: Iterable[int | None], up_bits: Iterable[int | None],
              noise: Callable[[dict, np.random.Generator], object] | None = None, reps: int = 3,
              down_layers: Mapping[str, Codec] | None = None, up_layers: Mapping[str, Codec] | None = None) -> CodecTime:
    """Measure the table for this model and these codecs (with their per-layer codecs) at every
    bit-length the run can use; None stands for a codec without one."""
    state = state_to_numpy(model)
    spec = state_spec(model)
    rng = np.random.default_rng(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        decode_s, encode_s = {}, {}
        for bits in dict.fromkeys(down_bits):
            frames = encode_state(state, _at_bits(down, bits), rng, codec_for=down_layers).frames
            decode_s[int(bits or 0)] = median_seconds(lambda: decode_state(frames, spec), reps)
        for bits in dict.fromkeys(up_bits):
            codec = _at_bits(up, bits)
            encode_s[int(bits or 0)] = median_seconds(lambda: encode_state(state, codec, rng, codec_for=up_layers), reps)
        noise_s = median_seconds(lambda: noise(state, rng), reps) if noise is not None else 0.0
    finally:
        torch.set_num_threads(threads)
    return CodecTime(host_ms_per_sample(model, inputs, labels, reps), decode_s, encode_s, noise_s)
