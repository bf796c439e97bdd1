"""A whole model state on the wire: one msgpack header frame, then one data frame per tensor.

Header: {"v": 1, "basis": "weights"|"delta", "tensors": [{"name", "shape", "dtype", "codec", ...codec meta}]}.
Float tensors go through the chosen codec. Integer buffers (BatchNorm's num_batches_tracked and
the like) are counters, not weights: they always travel losslessly as raw little-endian int64
(codec "raw") and count as payload at their real size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import msgpack
import numpy as np

from .base import REGISTRY, Codec, CodecError, expect_length, require

STATE_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 256 * 2**20
MAX_HEADER_BYTES = 4 * 2**20
MAX_TENSORS = 4096
BASES = ("weights", "delta")


@dataclass
class EncodedState:
    frames: list[Any]  # header frame first; buffers suitable for zmq send_multipart(copy=False)
    payload_bytes: int
    fp32_bytes: int  # what the same tensors cost as fp32 (integer buffers at their real size)

    @property
    def frame_bytes(self) -> int:
        return sum(memoryview(f).nbytes for f in self.frames)


def _raw_int(x: np.ndarray) -> tuple[dict, np.ndarray]:
    data = np.ascontiguousarray(x, dtype="<i8").reshape(-1).view(np.uint8)
    return {}, data


def encode_state(
    state: Mapping[str, np.ndarray],
    codec: Codec,
    rng: np.random.Generator,
    basis: str = "weights",
    codec_for: Mapping[str, Codec] | None = None,
) -> EncodedState:
    """Encode every tensor of `state` (name -> array). `codec_for` overrides the codec per tensor."""
    require(basis in BASES, f"basis must be one of {BASES}")
    entries, frames = [], []
    payload = fp32 = 0
    for name, array in state.items():
        array = np.asarray(array)
        entry = {"name": name, "shape": list(array.shape)}
        if array.dtype.kind in "iub":  # integers and booleans
            meta, data = _raw_int(array)
            entry.update(dtype="i8", codec="raw", **meta)
            payload += data.nbytes
            fp32 += data.nbytes
        else:
            chosen = (codec_for or {}).get(name, codec)
            try:
                encoded = chosen.encode(array, rng)
            except ValueError as exc:
                raise CodecError(f"cannot encode tensor {name!r}: {exc}") from None
            entry.update(dtype="f4", codec=chosen.name, **encoded.meta)
            data = encoded.data
            payload += encoded.payload_bytes
            fp32 += 4 * array.size
        entries.append(entry)
        frames.append(data)
    header = msgpack.packb({"v": STATE_VERSION, "basis": basis, "tensors": entries}, use_bin_type=True)
    return EncodedState([header, *frames], payload, fp32)


def _shape(entry: dict, index: int) -> tuple[int, ...]:
    shape = entry.get("shape")
    if not (isinstance(shape, list) and len(shape) <= 8
            and all(type(d) is int and 0 <= d < 2**40 for d in shape)):  # noqa: E721 (a bool is no size)
        raise CodecError(f"tensor {index}: shape missing or malformed")
    return tuple(shape)


def decode_state(
    frames: Sequence[Any],
    expected: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> tuple[dict[str, np.ndarray], str]:
    """Decode frames produced by encode_state. Returns (state, basis).

    `expected` maps tensor name -> (shape, "f4"|"i8"); when given, the names and shapes must
    match it exactly. Every failed check raises CodecError naming the check; nothing larger than
    `max_frame_bytes` is ever allocated."""
    require(len(frames) >= 1, "no header frame")
    views = [memoryview(f).cast("B") for f in frames]
    for i, view in enumerate(views):
        require(view.nbytes <= max_frame_bytes, f"frame {i} is {view.nbytes} bytes, over the limit of {max_frame_bytes}")
    require(views[0].nbytes <= MAX_HEADER_BYTES, f"header frame is {views[0].nbytes} bytes, over {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(views[0], raw=False, strict_map_key=True, max_bin_len=MAX_HEADER_BYTES)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise CodecError(f"header is not valid msgpack ({type(exc).__name__})") from None
    require(isinstance(header, dict), "header is not a map")
    require(header.get("v") == STATE_VERSION, f"state header version {header.get('v')!r} unknown (this receiver speaks {STATE_VERSION})")
    basis = header.get("basis")
    require(basis in BASES, f"basis {basis!r} unknown")
    entries = header.get("tensors")
    require(isinstance(entries, list) and len(entries) <= MAX_TENSORS, "tensor list missing or too long")
    require(len(entries) == len(views) - 1, f"header lists {len(entries)} tensors but {len(views) - 1} data frames follow")
    if expected is not None:
        names = [e.get("name") if isinstance(e, dict) else None for e in entries]
        require(names == list(expected), f"tensor names {names[:4]}... do not match the model's")
    state: dict[str, np.ndarray] = {}
    # Per tensor, a message is formatted only when a check fails: this loop runs for every tensor
    # of every model that arrives.
    for i, (entry, data) in enumerate(zip(entries, views[1:])):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)):
            raise CodecError(f"tensor {i}: entry malformed")
        name = entry["name"]
        if name in state:
            raise CodecError(f"tensor {name!r} appears twice")
        shape = _shape(entry, i)
        n = math.prod(shape)
        if 4 * n > max_frame_bytes * 8:
            raise CodecError(f"tensor {name!r}: {n} values exceed the size limit")
        dtype = entry.get("dtype")
        if expected is not None:
            want_shape, want_dtype = expected[name]
            if shape != tuple(want_shape):
                raise CodecError(f"tensor {name!r}: shape {shape} does not match the model's {tuple(want_shape)}")
            if dtype != want_dtype:
                raise CodecError(f"tensor {name!r}: dtype {dtype!r}, model has {want_dtype!r}")
        codec_name = entry.get("codec")
        if dtype == "i8":
            if codec_name != "raw":
                raise CodecError(f"tensor {name!r}: integer tensors travel raw, got codec {codec_name!r}")
            expect_length(data, 8 * n, f"tensor {name!r}")
            state[name] = np.frombuffer(data, "<i8").reshape(shape)
            continue
        if dtype != "f4":
            raise CodecError(f"tensor {name!r}: dtype {dtype!r} unknown")
        if codec_name not in REGISTRY:
            raise CodecError(f"tensor {name!r}: codec {codec_name!r} unknown to this receiver")
        try:
            state[name] = REGISTRY[codec_name].decode(entry, data, shape)
        except CodecError as exc:
            raise CodecError(f"tensor {name!r}: {exc}") from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise CodecError(f"tensor {name!r}: {codec_name} data malformed ({exc})") from None
    return state, basis
