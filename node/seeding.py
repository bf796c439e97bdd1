"""Named random streams, made fast and kept small.

The emulator names each random stream by what it is for (a transfer's loss draws, a device's load
in one period, a device's profile), so that no draw depends on the order in which events reached a
process: `np.random.default_rng([seed, ...])`. numpy makes such a generator in about 9.5 us, and
holds it in about 1 KB. Here:
- `pcg64_start(entropy)`: the state default_rng(entropy) starts in, (state, inc) of its PCG64,
  computed by node/_seeding.c (about 0.15 us) or, where that is not built, read from numpy's own
  generator (the same integers: tests/test_seeding.py);
- a *parked* stream is that state as a tuple (state, inc, has_uint32, uinteger): what a long-lived
  stream keeps between its draws (a device's availability, a lossy flow's losses);
- `unpark(parked)` lends the one scratch generator, set to that state, for the draws at hand
  (valid until the next call); `park(generator)` reads its state back.
The draws are numpy's own, from the same state: identical to a generator made by default_rng."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from protocol.native import compiled

_seeding = compiled("node._seeding")
_scratch: np.random.Generator | None = None  # one generator lent to every parked state in turn


def pcg64_start(entropy: Sequence[int]) -> tuple[int, int]:
    """(state, inc) of the PCG64 in np.random.default_rng(entropy), for a sequence of integers."""
    if _seeding is not None:
        try:
            state_high, state_low, inc_high, inc_low = _seeding.pcg64_start(entropy)
            return state_high << 64 | state_low, inc_high << 64 | inc_low
        except (OverflowError, TypeError, ValueError):
            pass  # (an integer of 2**64 or more, or none at all): numpy's path says what it makes of it
    state = np.random.PCG64(np.random.SeedSequence(entropy)).state["state"]
    return state["state"], state["inc"]


def parked(entropy: Sequence[int]) -> tuple:
    """The parked stream np.random.default_rng(entropy) would start."""
    state, inc = pcg64_start(entropy)
    return state, inc, 0, 0


def park(rng: np.random.Generator) -> tuple:
    s = rng.bit_generator.state
    if s["bit_generator"] != "PCG64":
        raise TypeError(f"cannot park a {s['bit_generator']} generator")
    return s["state"]["state"], s["state"]["inc"], s["has_uint32"], s["uinteger"]


def unpark(parked_state: tuple) -> np.random.Generator:
    """A generator in the parked state: the one scratch generator, valid until the next call."""
    global _scratch
    if _scratch is None:
        _scratch = np.random.Generator(np.random.PCG64(0))
    state, inc, has_uint32, uinteger = parked_state
    _scratch.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                                    "has_uint32": has_uint32, "uinteger": uinteger}
    return _scratch


def lend(stream: Any) -> Any:
    """What to draw from `stream`: for a parked state, the scratch generator in it (then `keep` the
    state it leaves); anything else (a generator of its own, a test's scripted draws) is itself."""
    return unpark(stream) if isinstance(stream, tuple) else stream


def keep(stream: Any, rng: Any) -> Any:
    """What to hold of `stream` after drawing from `rng = lend(stream)`."""
    return park(rng) if isinstance(stream, tuple) else stream


def drawing(entropy: Sequence[int]) -> np.random.Generator:
    """default_rng(entropy) for draws made at once: the scratch generator, valid until the next call."""
    return unpark(parked(entropy))
