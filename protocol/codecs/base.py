"""The codec interface and the registry that lets a scenario name a codec."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np


class CodecError(ValueError):
    """Encoded data was rejected; the message names the check that failed."""


@dataclass
class EncodedTensor:
    meta: dict[str, Any]  # what the decoder needs besides the shape (goes into the header frame)
    data: Any  # a buffer: the values on the wire
    payload_bytes: int  # bytes of encoded values only (scales, indices of dense codecs and headers excluded)


class Codec:
    """Encodes one float tensor to a buffer plus a small metadata map, and back.

    Subclasses set `name`, accept their parameters as keyword arguments, and implement
    `encode` and the classmethod `decode`. `encodes_delta` marks codecs that only make sense
    on model updates (sparsifiers): the sender then encodes new - reference. `contractive` marks
    codecs whose error never exceeds what they were given (||x - C(x)|| <= ||x||): error feedback
    needs one, or the residual it carries grows without bound."""

    name: ClassVar[str]
    encodes_delta: ClassVar[bool] = False
    contractive: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        return {}

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> EncodedTensor:
        raise NotImplementedError

    @classmethod
    def decode(cls, meta: dict[str, Any], data: memoryview, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in self.params().items())
        return f"{self.name}({args})" if args else self.name


REGISTRY: dict[str, type[Codec]] = {}


def register(cls: type[Codec]) -> type[Codec]:
    REGISTRY[cls.name] = cls
    return cls


def make_codec(spec: str | dict[str, Any]) -> Codec:
    """Build a codec from a name or a mapping {name: ..., **params}. Errors name the bad key."""
    if isinstance(spec, str):
        spec = {"name": spec}
    spec = dict(spec)
    name = spec.pop("name", None)
    if name not in REGISTRY:
        raise CodecError(f"unknown codec {name!r}; known: {', '.join(sorted(REGISTRY))}")
    try:
        return REGISTRY[name](**spec)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"codec {name!r}: {exc}") from None


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CodecError(message)


# The checks below run for every tensor of every message, so they format a message only on failure.
def meta_int(meta: dict, key: str, low: int, high: int) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CodecError(f"header field {key!r} missing or not an integer")
    if not low <= value <= high:
        raise CodecError(f"header field {key!r}={value} out of range [{low}, {high}]")
    return value


def expect_length(data: memoryview, expected: int, what: str) -> None:
    if len(data) != expected:
        raise CodecError(f"{what}: frame has {len(data)} bytes, header implies {expected}")


def all_finite(values: np.ndarray) -> bool:
    """No NaN or infinity among float32 (or float64) values: one float64 sum, which a NaN or an
    infinity makes non-finite and which no count of finite float32 values can overflow."""
    return math.isfinite(np.add.reduce(values.reshape(-1), dtype=np.float64))
