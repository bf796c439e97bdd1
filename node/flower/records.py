"""A Flower message's content on the wire. Each ArrayRecord goes through a Channel (so that the
run's codec, quantization included, applies to Flower apps too) as one encoded state; config
and metric records go as msgpack in the envelope body. Float arrays arrive as float32 (what the
codecs carry), integer arrays as int64."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from protocol.codecs import decode_state
from ..channel import Channel

SCALARS = (bool, int, float, str, bytes)


class RecordError(ValueError):
    """A Flower record this bridge cannot carry, or a body that does not decode; the message says which."""


@dataclass
class WireContent:
    body: dict[str, Any]
    frames: list[Any]
    payload_bytes: int
    fp32_bytes: int
    commit: Callable[[], None]  # count the arrays in the channel's statistics once they really leave


def _plain(record: Any, where: str) -> dict[str, Any]:
    out = {}
    for key, value in record.items():
        if isinstance(value, list):
            if not all(isinstance(v, SCALARS) for v in value):
                raise RecordError(f"{where}[{key!r}]: a list of {sorted({type(v).__name__ for v in value})}")
        elif not isinstance(value, SCALARS):
            raise RecordError(f"{where}[{key!r}]: a {type(value).__name__} (records hold numbers, strings, bytes and lists)")
        out[str(key)] = value
    return out


def encode_content(content: Any, channel: Channel, rng: np.random.Generator) -> WireContent:
    """A RecordDict for the wire."""
    arrays, frames, commits = [], [], []
    payload = fp32 = 0
    for name, record in content.array_records.items():
        state = {str(key): np.asarray(array.numpy()) for key, array in record.items()}
        out = channel.encode(state, rng)
        arrays.append({"name": str(name), "frames": len(out.encoded.frames)})
        frames += out.encoded.frames
        payload += out.encoded.payload_bytes
        fp32 += out.encoded.fp32_bytes
        commits.append(out.commit)
    body = {"arrays": arrays,
            "configs": {str(n): _plain(r, f"ConfigRecord {n!r}") for n, r in content.config_records.items()},
            "metrics": {str(n): _plain(r, f"MetricRecord {n!r}") for n, r in content.metric_records.items()}}

    def commit() -> None:
        for c in commits:
            c()

    return WireContent(body, frames, payload, fp32, commit)


def decode_content(body: dict[str, Any], frames: Sequence[Any]) -> Any:
    """The RecordDict a WireContent carried."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict  # noqa: PLC0415

    records: dict[str, Any] = {}
    at = 0
    try:
        for entry in body["arrays"]:
            count = int(entry["frames"])
            state, _ = decode_state(frames[at:at + count])
            at += count
            records[str(entry["name"])] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()})
        if at != len(frames):
            raise RecordError(f"{len(frames) - at} frames left over after the arrays")
        for name, values in body["configs"].items():
            records[name] = ConfigRecord(values)
        for name, values in body["metrics"].items():
            records[name] = MetricRecord(values)
    except (KeyError, TypeError) as exc:
        raise RecordError(f"a Flower content body without {exc}") from None
    return RecordDict(records)
